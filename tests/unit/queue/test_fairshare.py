"""Deserved share: guarantees, weights, priority levels, limits, hierarchy; DRF dominant share."""

from __future__ import annotations

import math

from services.queue.fairshare import deserved, dominant_share, waterfill
from services.queue.tree import QueueTree
from shared.kernel.model import QueueSpec
from tests.builders import queue_spec
from tests.builders.queue import QueueDriver, capacity, defined, job, submitted

CPU = 1000  # one core in milli-units


def _tree(*specs: QueueSpec) -> QueueTree:
    tree = QueueTree("default")
    for spec in specs:
        assert tree.define(spec) is None
    return tree


def _cpu(shares: dict, *names: str) -> list[int]:
    return [shares[n].get("cpu", 0) for n in names]


def test_waterfill_gives_capped_members_their_cap_and_splits_the_rest_by_weight():
    assert waterfill(100, {"a": 10, "b": 100, "c": 100}, {"a": 1, "b": 1, "c": 1}) == {"a": 10, "b": 45, "c": 45}
    assert waterfill(100, {"a": 100, "b": 100}, {"a": 1, "b": 3}) == {"a": 25, "b": 75}
    assert waterfill(100, {"a": 100, "b": 100}, {"a": 0, "b": 1}) == {"a": 0, "b": 100}
    assert waterfill(1000, {"a": 1000, "b": 1000, "c": 1000}, {"a": 1, "b": 1, "c": 1}) == {"a": 334, "b": 333, "c": 333}


def test_guarantee_first_then_weight_among_those_still_short():
    tree = _tree(queue_spec("a", guarantee={"cpu": "10"}, weight=1000), queue_spec("b", weight=3000),
                 queue_spec("c", guarantee={"cpu": "30"}))
    shares = deserved(tree, {"cpu": 100 * CPU}, {"a": {"cpu": 50 * CPU}, "b": {"cpu": 100 * CPU}, "c": {"cpu": 20 * CPU}})
    # a: 10 guaranteed; c: min(30, 20) = 20; the 70 left split 1:3 between a and b
    assert _cpu(shares, "a", "b", "c") == [27500, 52500, 20000]


def test_weights_are_thousandths_so_fractional_kai_weights_split_exactly():
    # overQuotaWeight 0.4 and 1.6 (400 and 1600): 20 CPUs of surplus split 1:4, nothing rounded away
    tree = _tree(queue_spec("light", weight=400), queue_spec("heavy", weight=1600))
    shares = deserved(tree, {"cpu": 20 * CPU}, {"light": {"cpu": 20 * CPU}, "heavy": {"cpu": 20 * CPU}})
    assert _cpu(shares, "light", "heavy") == [4000, 16000]


def test_whole_weights_times_1000_split_exactly_as_whole_weights_did():
    demand = {"a": {"cpu": 100 * CPU}, "b": {"cpu": 100 * CPU}, "c": {"cpu": 100 * CPU}}
    for capacity_cpu in (7, 100, 1001):
        old = waterfill(capacity_cpu * CPU + 1, {n: 100 * CPU for n in "abc"}, {"a": 1, "b": 2, "c": 3})
        new = waterfill(capacity_cpu * CPU + 1, {n: 100 * CPU for n in "abc"}, {"a": 1000, "b": 2000, "c": 3000})
        assert new == old
    # the implicit default queue weighs 1000 like a Volcano queue of weight 1
    tree = _tree(queue_spec("a", weight=1000))
    shares = deserved(tree, {"cpu": 10 * CPU}, {"a": demand["a"], "default": demand["b"]})
    assert _cpu(shares, "a", "default") == [5000, 5000]


def test_higher_queue_priority_level_is_satisfied_before_the_next():
    tree = _tree(queue_spec("hi", priority=1), queue_spec("lo1"), queue_spec("lo2"))
    shares = deserved(tree, {"cpu": 100 * CPU}, {"hi": {"cpu": 70 * CPU}, "lo1": {"cpu": 70 * CPU}, "lo2": {"cpu": 70 * CPU}})
    assert _cpu(shares, "hi", "lo1", "lo2") == [70000, 15000, 15000]


def test_guarantee_counts_before_priority():
    tree = _tree(queue_spec("hi", priority=1), queue_spec("lo", guarantee={"cpu": "40"}))
    shares = deserved(tree, {"cpu": 100 * CPU}, {"hi": {"cpu": 100 * CPU}, "lo": {"cpu": 100 * CPU}})
    assert _cpu(shares, "hi", "lo") == [60000, 40000]


def test_limit_caps_demand_and_the_rest_goes_to_others():
    tree = _tree(queue_spec("a", limit={"cpu": "20"}), queue_spec("b"))
    shares = deserved(tree, {"cpu": 100 * CPU}, {"a": {"cpu": 50 * CPU}, "b": {"cpu": 100 * CPU}})
    assert _cpu(shares, "a", "b") == [20000, 80000]


def test_a_parent_share_is_split_among_its_children():
    tree = _tree(queue_spec("p", limit={"cpu": "60"}), queue_spec("x", parent="p"), queue_spec("y", parent="p", weight=4000),
                 queue_spec("z"))
    shares = deserved(tree, {"cpu": 100 * CPU}, {"x": {"cpu": 50 * CPU}, "y": {"cpu": 50 * CPU}, "z": {"cpu": 100 * CPU}})
    assert _cpu(shares, "p", "z", "x", "y") == [50000, 50000, 10000, 40000]


def test_guarantees_larger_than_the_cluster_are_shared_evenly_up_to_each_guarantee():
    tree = _tree(queue_spec("a", guarantee={"cpu": "8"}), queue_spec("b", guarantee={"cpu": "2"}),
                 queue_spec("c", guarantee={"cpu": "8"}))
    shares = deserved(tree, {"cpu": 10 * CPU}, {"a": {"cpu": 8 * CPU}, "b": {"cpu": 8 * CPU}, "c": {"cpu": 8 * CPU}})
    assert _cpu(shares, "a", "b", "c") == [4000, 2000, 4000]


def test_no_demand_no_share_and_each_resource_is_filled_on_its_own():
    tree = _tree(queue_spec("a"), queue_spec("b"))
    shares = deserved(tree, {"cpu": 10 * CPU, "nvidia.com/gpu": 4 * CPU},
                      {"a": {"cpu": 10 * CPU}, "b": {"nvidia.com/gpu": 4 * CPU, "cpu": 2 * CPU}})
    assert shares["a"] == {"cpu": 8000, "nvidia.com/gpu": 0}
    assert shares["b"] == {"cpu": 2000, "nvidia.com/gpu": 4000}
    assert shares["default"] == {"cpu": 0, "nvidia.com/gpu": 0}


def test_dominant_share_is_the_largest_ratio_over_cpu_memory_and_gpu():
    share = {"cpu": 4000, "memory": 8000, "nvidia.com/gpu": 2000}
    assert dominant_share({"cpu": 6000, "memory": 4000}, share) == 1.5
    assert dominant_share({"cpu": 1000, "nvidia.com/gpu": 1000}, share) == 0.5
    assert dominant_share({"pods": 5000}, share) == 0.0  # only cpu/memory/GPU count
    assert dominant_share({}, {}) == 0.0
    assert dominant_share({"nvidia.com/gpu": 1}, {"cpu": 4000}) == math.inf


def test_status_reports_fair_share_from_usage_plus_pending_demand_against_cluster_capacity():
    d = QueueDriver()
    d.step(capacity(cpu="10"), 0.0)
    d.step(defined(queue_spec("a", guarantee={"cpu": "2"})))
    d.step(defined(queue_spec("b", weight=3000)))
    d.step(submitted(job("ns/a1", "a", cpu="8", at=0.0)))
    d.step(submitted(job("ns/b1", "b", cpu="8", at=0.0)))
    status = d.core.status()
    # a: 2 guaranteed, then the remaining 8 split 1:3 -> a 2 + 2 = 4, b 6
    assert status["a"]["fair_share"] == {"cpu": 4000}
    assert status["b"]["fair_share"] == {"cpu": 6000}


def test_volcano_deserved_comes_before_weights():
    """A queue deserving 4 of 8 gets 4 before weights (1:3) split the rest (capacity plugin)."""
    gpu = "nvidia.com/gpu"
    tree = _tree(queue_spec("a", weight=1000, deserved={gpu: 4000}), queue_spec("b", weight=3000, deserved={gpu: 4000}))
    shares = deserved(tree, {gpu: 8000}, {"a": {gpu: 4000}, "b": {gpu: 8000}})
    assert (shares["a"][gpu], shares["b"][gpu]) == (4000, 4000)
    by_weight = _tree(queue_spec("a", weight=1000), queue_spec("b", weight=3000))
    shares = deserved(by_weight, {gpu: 8000}, {"a": {gpu: 4000}, "b": {gpu: 8000}})
    assert (shares["a"][gpu], shares["b"][gpu]) == (2000, 6000)


def test_the_implicit_default_queue_gives_way_to_a_defined_one_and_comes_back():
    tree = QueueTree("default")
    implicit = tree.get("default")
    assert implicit == QueueSpec(name="default") and tree.get("default") is implicit  # made once
    defined = QueueSpec(name="default", limit={"cpu": 4000})
    tree.define(defined)
    assert tree.get("default") is defined
    tree.remove("default")
    assert tree.get("default") == QueueSpec(name="default") and tree.get("other") is None
