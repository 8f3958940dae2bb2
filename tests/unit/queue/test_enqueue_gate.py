"""Volcano's enqueue gate (services/queue/enqueue.py): a waiting workload of a Volcano queue is placed, reclaims
or preempts only once Volcano's enqueue action would move its PodGroup to Inqueue."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.queue.enqueue import CAPACITY_NOTE, overcommit_block
from shared.kernel.events import BackedOff, Dequeued, ReclaimRequested
from shared.kernel.policy import Policy
from tests.builders import queue_spec
from tests.builders.queue import QueueDriver, capacity, defined, job, placed, running, submitted


def _gpus(n: int) -> dict[str, int]:
    return {"nvidia.com/gpu": n * 1000}


def test_a_minimum_beyond_the_overcommitted_idle_is_not_enqueued_and_the_reason_has_the_numbers():
    # Volcano's deserved-reclaim case: 8 GPUs, all in use, 4 asked; 1.2 x 8 - 8 = 1.6
    why = overcommit_block(_gpus(4), _gpus(8), _gpus(8), 1.2)
    assert why == ("not enqueued: its minimum nvidia.com/gpu 4 does not fit the cluster's overcommitted idle "
                   "nvidia.com/gpu 1.6 (1.2 × 8 less 8 in use or in queue; Volcano's overcommit, factor 1.2)")


def test_within_the_headroom_it_is_enqueued_to_the_last_unit():
    assert overcommit_block(_gpus(2), _gpus(10), _gpus(10), 1.2) is None  # 10 + 2 <= 12
    assert overcommit_block(_gpus(3), _gpus(10), _gpus(10), 1.2) is not None
    assert overcommit_block({"cpu": 3600}, {"cpu": 8000}, {"cpu": 6000}, 1.2) is None  # 6 + 3.6 <= 9.6 exactly


def test_only_the_resources_the_minimum_names_are_compared_first_by_name():
    # memory is over, but the minimum asks for none: LessEqualWithDimension compares what the job requests
    assert overcommit_block({"cpu": 1000}, {"cpu": 4000, "memory": 8}, {"cpu": 0, "memory": 100}, 1.2) is None
    why = overcommit_block({"cpu": 5000, "memory": 4}, {"cpu": 4000, "memory": 4}, {}, 1.2)
    assert why is not None and "its minimum cpu 5 " in why  # cpu before memory


def test_factor_one_leaves_no_headroom_and_an_unknown_cluster_gates_nothing():
    assert overcommit_block({"cpu": 1000}, {"cpu": 4000}, {"cpu": 4000}, 1.0) is not None
    assert overcommit_block({"cpu": 1000}, {"cpu": 4000}, {"cpu": 3000}, 1.0) is None
    assert overcommit_block({"cpu": 1000}, {}, {"cpu": 3000}, 1.2) is None


def test_quota_held_beyond_the_cluster_counts_as_the_cluster_only():
    # a gang whose node left holds its quota, but no node holds its pods: used never exceeds the nodes
    why = overcommit_block(_gpus(1), _gpus(4), _gpus(7), 1.2)
    assert why is not None and "idle nvidia.com/gpu 0.8 (1.2 × 4 less 4 in use" in why


def test_the_factor_is_a_policy_setting_with_volcanos_default_and_never_below_one():
    assert Policy().overcommit_factor == 1.2
    assert Policy(overcommit_factor=2).overcommit_factor == 2.0
    with pytest.raises(ValidationError):
        Policy(overcommit_factor=0.5)


# --------------------------------------------------------------------------- in the queue core
def _full(gated: bool = True, dialect: str = "volcano", one_queue: bool = False, **policy) -> QueueDriver:
    """A 10-CPU cluster filled by two priority-10 holders of 5 CPU, ns/low-a in queue q and ns/low-b in queue
    o (or in q too: ``one_queue``)."""
    d = QueueDriver(Policy(**policy))
    d.step(capacity(cpu="10", memory="64Gi"), 0.0)
    for name in ("q", "o"):
        d.step(defined(queue_spec(name, dialect=dialect, enqueue_gate=gated)))
    for key, queue, at in (("ns/low-a", "q", 1.0), ("ns/low-b", "q" if one_queue else "o", 2.0)):
        d.step(submitted(job(key, queue, cpu="5", at=at, priority=10)), at)
        d.step(placed(key, queue))
        d.step(running(key))
    return d


def _ask(d: QueueDriver, key: str, cpu: str, at: float) -> list:
    return [x for x in d.step(submitted(job(key, "q", cpu=cpu, at=at, priority=1000)), at)
            if isinstance(x, (Dequeued, ReclaimRequested, BackedOff))]


def test_a_large_waiting_job_of_a_volcano_queue_goes_to_placement_only_once_enqueued():
    out = _ask(_full(), "ns/big", "4", 20.0)  # 10 + 4 > 12: placement never sees it, so nobody is preempted
    assert [x.type for x in out] == ["BackedOff"]
    assert out[0].reason.endswith("not enqueued: its minimum cpu 4 does not fit the cluster's overcommitted idle "
                                  "cpu 2 (1.2 × 10 less 10 in use or in queue; Volcano's overcommit, factor 1.2)")
    out = _ask(_full(), "ns/small", "2", 20.0)  # 10 + 2 <= 12, and q's 5 + 2 <= 10: placement may preempt for it
    assert [x.type for x in out] == ["Dequeued"]


def test_a_queue_that_holds_the_whole_cluster_enqueues_nothing_more():
    # the capacity plugin's realCapability is the cluster when the queue names no capability: 10 + 2 > 10
    out = _ask(_full(one_queue=True), "ns/small", "2", 20.0)
    assert [x.type for x in out] == ["BackedOff"]
    assert out[0].reason.endswith("not enqueued: queue q would hold cpu 12 of the cluster's 10 (its minimum 2 with "
                                  "10 in use or in queue; Volcano's capacity plugin: a queue's realCapability is at "
                                  "most the cluster)")


def test_a_larger_factor_lets_it_in_and_other_dialects_have_no_gate():
    assert [x.type for x in _ask(_full(overcommit_factor=2.0), "ns/big", "4", 20.0)] == ["Dequeued"]
    assert [x.type for x in _ask(_full(gated=False), "ns/big", "4", 20.0)] == ["Dequeued"]
    assert [x.type for x in _ask(_full(gated=False, dialect="kai"), "ns/big", "4", 20.0)] == ["Dequeued"]
    assert [x.type for x in _ask(_full(gated=False, one_queue=True), "ns/small", "2", 20.0)] == ["Dequeued"]


def test_the_volcano_dialect_gates_and_the_others_do_not():
    from services.admission.dialects import DIALECTS

    assert {name: row.gates_enqueue for name, row in DIALECTS.items()} == {
        "volcano": True, "kai": False, "elasticquotatree": False, "builtin": False}


def test_a_minimum_beyond_its_queues_capability_preempts_nobody_in_a_gating_queue():
    # the capacity plugin's JobEnqueueable: 3 allocated + 3 asked > capability 4, so high stays Pending
    d = QueueDriver(Policy())
    d.step(capacity(cpu="32", memory="64Gi"), 0.0)
    d.step(defined(queue_spec("q", dialect="volcano", limit={"cpu": "4"}, enqueue_gate=True)))
    d.step(submitted(job("ns/low", "q", cpu="3", at=1.0, priority=10)), 1.0)
    d.step(placed("ns/low", "q"))
    d.step(running("ns/low"))
    out = [x for x in d.step(submitted(job("ns/high", "q", cpu="3", at=30.0, priority=90)), 30.0)
           if isinstance(x, (Dequeued, ReclaimRequested, BackedOff))]
    assert [x.type for x in out] == ["BackedOff"]
    assert out[0].reason.endswith("queue q capability cpu 4: used 3, requested 3. " + CAPACITY_NOTE)
    assert d.core.status()["q"]["active"] == ["ns/low"]
