"""Dynamic priority (kube-queue's "queue jumping"): a waiting workload whose priority changes moves at
once; it evicts running work only where its dialect preempts; decided work never flips."""

from __future__ import annotations

from shared.kernel.events import BackedOff, Dequeued, ReclaimRequested
from tests.builders import queue_spec
from tests.builders.queue import QueueDriver, capacity, defined, finished, job, placed, running, submitted, updated


def _full_queue(dialect: str = "volcano", **holder) -> QueueDriver:
    """Queue q (limit 4 cpu) fully held by ns/x (priority 10 unless given)."""
    d = QueueDriver()
    d.step(capacity(cpu="32", memory="64Gi"), 0.0)
    d.step(defined(queue_spec("q", dialect=dialect, limit={"cpu": "4"})))
    d.step(submitted(job("ns/x", "q", cpu="4", at=0.0, **{"priority": 10, **holder})))
    d.step(placed("ns/x", "q"))
    d.step(running("ns/x"))
    return d


def test_raising_a_waiting_workloads_priority_reorders_its_queue_at_once():
    d = _full_queue()
    d.step(submitted(job("ns/a", "q", cpu="3", at=1.0, priority=0)), 1.0)
    d.step(submitted(job("ns/b", "q", cpu="3", at=2.0, priority=0)), 2.0)
    assert d.core._workloads["ns/a"].order < d.core._workloads["ns/b"].order
    d.step(updated(job("ns/b", "q", cpu="3", at=2.0, priority=5)), 5.0)
    assert d.core._workloads["ns/b"].order < d.core._workloads["ns/a"].order
    out = d.step(finished("ns/x"), 6.0)
    assert [x.key for x in out if isinstance(x, Dequeued)] == ["ns/b"]


def test_a_suspended_workload_that_jumps_a_kube_queue_queue_only_overtakes():
    d = _full_queue("elasticquotatree", gate="suspend")
    jumper = job("ns/j", "q", cpu="4", at=1.0, priority=0, gate="suspend").model_copy(update={"preempts": False})
    d.step(submitted(jumper), 1.0)
    out = d.step(updated(jumper.model_copy(update={"priority": 50})), 5.0)
    assert [x.type for x in out if isinstance(x, (BackedOff, ReclaimRequested, Dequeued))] == ["BackedOff"]
    assert not d.of(ReclaimRequested)          # ns/x keeps running: kube-queue evicts nobody for priority
    out = d.step(finished("ns/x"), 6.0)
    assert [x.key for x in out if isinstance(x, Dequeued)] == ["ns/j"]


def test_in_a_volcano_queue_the_jumper_preempts_the_lower_priority_holder():
    d = _full_queue("volcano", gate="suspend")
    jumper = job("ns/j", "q", cpu="4", at=1.0, priority=0, gate="suspend")
    d.step(submitted(jumper), 1.0)
    out = d.step(updated(jumper.model_copy(update={"priority": 50})), 5.0)
    assert [(x.key, x.victims) for x in out if isinstance(x, ReclaimRequested)] == [("ns/j", ("ns/x",))]


def test_a_class_value_edited_under_running_work_does_not_make_it_a_victim():
    """Delete and re-create a PriorityClass with a lower value: the running workload keeps the priority
    and preemptibility it was admitted with; only its next admission uses the new ones."""
    d = _full_queue("kai", priority=100, preemptible=False)
    d.step(updated(job("ns/x", "q", cpu="4", at=0.0, priority=1, preemptible=True)), 3.0)
    out = d.step(submitted(job("ns/h", "q", cpu="4", at=4.0, priority=50)), 4.0)
    assert [x.type for x in out if isinstance(x, (BackedOff, ReclaimRequested))] == ["BackedOff"]
    assert d.core._workloads["ns/x"].spec.priority == 100
