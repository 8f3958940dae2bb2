"""Preferred node affinity (kube-scheduler's NodeAffinity score): the weights of the terms a node matches,
normalised to the highest as ``DefaultNormalizeScore`` does, added to the strategy's score at
NodeAffinity's default weight against NodeResourcesFit's (``nodeaffinity/node_affinity_test.go``
``TestNodeAffinityPriority``)."""

from __future__ import annotations

import numpy as np

from services.placement.gang import pod_demand
from shared.kernel.events import GangPlaced
from shared.kernel.model import PodSet, PreferredTerm
from shared.kernel.policy import Policy
from shared.runtime.statecodec import decode, encode
from tests.builders import gang, node, pod_set, workload
from tests.builders.placement import PlacementDriver, expr, one


def _preferring(ps: PodSet, *terms: tuple[int, list]) -> PodSet:
    return ps.model_copy(update={"preferred": tuple(PreferredTerm(weight=w, expressions=tuple(e)) for w, e in terms)})


def test_weights_are_summed_per_node_and_normalised_to_the_highest_in_integers() -> None:
    # TestNodeAffinityPriority's "all nodes matches the preferred scheduling requirements of pod but with
    # different priorities": weights 2, 4, 5 over three nodes give 18, 36, 100 after normalising.
    d = PlacementDriver(None, node("m1", labels={"foo": "bar"}),
                        node("m2", labels={"key": "value"}),
                        node("m3", labels={"foo": "bar", "key": "value", "az": "az1"}))
    ps = _preferring(pod_set("p", 1), (2, [expr("foo", "In", "bar")]), (4, [expr("key", "In", "value")]),
                     (5, [expr("foo", "In", "bar"), expr("key", "In", "value"), expr("az", "In", "az1")]))
    prefer = d.core.nodes.preference(ps)
    assert prefer is not None and prefer.tolist() == [0.18, 0.36, 1.0]


def test_an_empty_preference_matches_every_node_and_none_matching_adds_nothing() -> None:
    d = PlacementDriver(None, node("n1"), node("n2", labels={"zone": "a"}))
    assert d.core.nodes.preference(_preferring(pod_set("p", 1), (3, []))).tolist() == [1.0, 1.0]
    assert d.core.nodes.preference(_preferring(pod_set("p", 1), (3, [expr("zone", "In", "b")]))).tolist() == [0.0, 0.0]
    assert d.core.nodes.preference(pod_set("p", 1)) is None  # no preference: no new code runs


def test_a_preferred_node_wins_over_the_fuller_one() -> None:
    d = PlacementDriver(None, node("n1", cpu="8", labels={"zone": "a"}), node("n2", cpu="8", labels={"zone": "b"}))
    one(d.dequeue(workload("ns/first", gang_=gang(pod_set("head", 1, cpu="4")))), GangPlaced)  # binpack: n1
    ps = _preferring(pod_set("worker", 2, cpu="1"), (10, [expr("zone", "In", "b")]))
    placed = one(d.dequeue(workload("ns/w", gang_=gang(ps))), GangPlaced)
    assert [s.node for s in placed.slots] == ["n2", "n2"]


def test_among_equally_preferred_nodes_the_strategy_still_decides() -> None:
    nodes = [node("n1", cpu="8", labels={"zone": "a"}), node("n2", cpu="8", labels={"zone": "b"}),
             node("n3", cpu="8", labels={"zone": "b"})]
    ps = _preferring(pod_set("worker", 3, cpu="2"), (10, [expr("zone", "In", "b")]))
    packed = PlacementDriver(None, *nodes)
    one(packed.dequeue(workload("ns/first", gang_=gang(pod_set("head", 1, cpu="2")))), GangPlaced)  # n1
    one(packed.dequeue(workload("ns/second", gang_=gang(
        _preferring(pod_set("head", 1, cpu="2"), (1, [expr("zone", "In", "b")]))))), GangPlaced)  # n2
    placed = one(packed.dequeue(workload("ns/w", gang_=gang(ps))), GangPlaced)
    assert [s.node for s in placed.slots] == ["n2", "n2", "n2"]  # the fuller of the preferred nodes
    spread = PlacementDriver(Policy(placement="spread"), *nodes)
    placed = one(spread.dequeue(workload("ns/w", gang_=gang(ps))), GangPlaced)
    assert [s.node for s in placed.slots] == ["n2", "n3", "n2"]


def test_a_weak_preference_gives_way_to_a_strong_packing_difference() -> None:
    # The weights are normalised to the highest among the nodes the static filters leave: n3 (too small for
    # the pod, but not ruled out by a constraint) makes n2's 3 worth 30 of 100, 2 x 0.3 x 2 parts = 1.2,
    # less than what packing onto n1 gains (1.875 against n2's 0.375). kube-scheduler normalises over the
    # nodes that fit, where n2 would get 100 and win.
    def driver() -> PlacementDriver:
        d = PlacementDriver(None, node("n1", cpu="8", labels={"zone": "a"}), node("n2", cpu="8", labels={"zone": "b"}),
                            node("n3", cpu="1", labels={"zone": "b", "disk": "nvme"}))
        one(d.dequeue(workload("ns/first", gang_=gang(pod_set("head", 1, cpu="6", memory="48Gi")))), GangPlaced)
        return d

    d = driver()
    ps = _preferring(pod_set("worker", 1, cpu="2", memory="8Gi"), (3, [expr("zone", "In", "b")]),
                     (7, [expr("disk", "In", "nvme")]))
    assert d.core.nodes.preference(ps).tolist() == [0.0, 0.3, 1.0]
    placed = one(d.dequeue(workload("ns/w", gang_=gang(ps))), GangPlaced)
    assert [s.node for s in placed.slots] == ["n1"]
    strong = _preferring(pod_set("worker", 1, cpu="2", memory="8Gi"), (3, [expr("zone", "In", "b")]))
    placed = one(driver().dequeue(workload("ns/v", gang_=gang(strong))), GangPlaced)
    assert [s.node for s in placed.slots] == ["n2"]  # now 100 of 100: 4 outweighs the packing


def test_kept_vectors_equal_a_full_scan_with_a_preference() -> None:
    d = PlacementDriver(None, *(node(f"n{i}", cpu="8", labels={"zone": "ab"[i % 2]}) for i in range(6)))
    table = d.core.nodes
    ps = _preferring(pod_set("worker", 1, cpu="1"), (7, [expr("zone", "In", "b")]))
    for strategy in ("binpack", "spread"):
        for k in range(5):
            one(d.dequeue(workload(f"ns/{strategy}{k}", queue=strategy, gang_=gang(ps))), GangPlaced)
            demand = pod_demand(table, ps)
            static = table.static_mask(ps)
            full = np.where(table.feasible(demand, static, slice(0, table.n)),
                            table.score(demand, strategy, slice(0, table.n), table.preference(ps)), -np.inf)
            assert np.array_equal(table.scores(demand, ps, strategy), full)
            for i in range(table.n):
                assert table.fit_score(demand, static, strategy, i, table.preference(ps)) == full[i]


def test_preferences_survive_a_snapshot_round_trip() -> None:
    d = PlacementDriver(None, node("n1", labels={"zone": "a"}), node("n2", labels={"zone": "b"}))
    ps = _preferring(pod_set("worker", 1), (5, [expr("zone", "In", "b")]))
    one(d.dequeue(workload("ns/w", gang_=gang(ps))), GangPlaced)
    restored = decode(encode(d.core))
    assert restored.nodes.preference(ps).tolist() == d.core.nodes.preference(ps).tolist() == [0.0, 1.0]
