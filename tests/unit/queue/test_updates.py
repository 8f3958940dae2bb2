"""Edits of a workload that holds quota: quota follows what was admitted, a shrink gives quota back."""

from __future__ import annotations

from shared.kernel.events import BackedOff, Dequeued, Enqueued, TimerSet
from tests.builders import gang, pod_set, queue_spec, workload
from tests.builders.queue import (
    QueueDriver, capacity, defined, failed, job, placed, preempted, ray_gang, running, submitted, updated,
)


def _rc(key: str, workers: int, at: float = 0.0, queue: str = "q", **kw):
    """head 1 cpu + ``workers`` x 1 cpu (memory 1Gi each): ``1 + workers`` CPUs of quota."""
    return workload(key, queue=queue, submitted_at=at,
                    gang_=ray_gang(head_cpu="1", head_memory="1Gi", workers=workers, worker_cpu="1"), **kw)


def _running_a(workers: int = 4, limit: str = "6") -> QueueDriver:
    d = QueueDriver()
    d.step(capacity(cpu="32", memory="64Gi"), 0.0)
    d.step(defined(queue_spec("q", limit={"cpu": limit})))
    d.step(submitted(_rc("ns/a", workers)), 1.0)
    d.step(placed("ns/a", "q"))
    d.step(running("ns/a"), 3.0)
    return d


def test_a_shrink_of_an_admitted_workload_gives_its_quota_back_and_wakes_the_waiting():
    d = _running_a(workers=4)  # a holds cpu 5 of 6
    out = d.step(submitted(job("ns/b", "q", cpu="3", at=10.0)), 10.0)
    assert [x.type for x in out] == ["Enqueued", "BackedOff"]
    assert out[-1].reason.endswith("queue q capability cpu 6: used 5, requested 3")
    out = d.step(updated(_rc("ns/a", 1)), 10.2)  # KubeRay goes down to one worker
    assert [(x.type, x.key) for x in out] == [("Dequeued", "ns/b")]  # woken at once, not at its backoff
    assert d.core.status()["q"]["usage"] == {"cpu": 5000, "memory": 2 * 2**30 * 1000}  # a: 2 cpu, 2Gi; b: 3 cpu
    assert d.core.status()["q"]["active"] == ["ns/a", "ns/b"]


def test_a_shrink_counts_per_pod_set_and_keeps_what_was_admitted_elsewhere():
    d = QueueDriver()
    d.step(defined(queue_spec("q", limit={"cpu": "20"})), 0.0)
    two = gang(pod_set("head", 1, cpu="1"), pod_set("small", 4, cpu="1"), pod_set("big", 1, cpu="4"))
    d.step(submitted(workload("ns/a", queue="q", gang_=two)), 0.0)
    d.step(placed("ns/a", "q"))
    assert d.core.status()["q"]["usage"] == {"cpu": 9000}
    # small 4 -> 1 (shrinks), big 1 -> 3 (grows): the grown set keeps its admitted count
    edit = gang(pod_set("head", 1, cpu="1"), pod_set("small", 1, cpu="1"), pod_set("big", 3, cpu="4"))
    d.step(updated(workload("ns/a", queue="q", gang_=edit)), 1.0)
    assert d.core.status()["q"]["usage"] == {"cpu": 6000}
    # a worker group removed from the spec counts 0
    d.step(updated(workload("ns/a", queue="q", gang_=gang(pod_set("head", 1, cpu="1")))), 2.0)
    assert d.core.status()["q"]["usage"] == {"cpu": 1000}


def test_a_grow_of_an_admitted_workload_keeps_its_gang_and_asks_for_elastic_pods_within_quota():
    d = _running_a(workers=1)  # a holds cpu 2 of 6
    out = d.step(updated(_rc("ns/a", 6)), 30.0)  # 5 more workers: elastic, one by one while the quota lasts
    assert [(x.type, x.pod_set, x.count) for x in out] == [("ElasticGranted", "worker", 4), ("ElasticWaiting", "worker", 1)]
    assert out[0].reason == ("quota reserved in queue q for 4 elastic pod(s) of worker "
                             "(cpu 6, memory 6Gi held in all)")
    assert out[1].reason == "1 elastic pod(s) of worker wait: queue q capability cpu 6: used 6, requested 1"
    assert d.core.status()["q"]["usage"]["cpu"] == 6000
    out = d.step(submitted(job("ns/c", "q", cpu="1", at=60.0)), 60.0)   # the elastic pods hold the quota
    assert [x.type for x in out] == ["Enqueued", "BackedOff"]


def test_a_shrink_while_reserved_shrinks_the_reservation():
    d = QueueDriver()
    d.step(defined(queue_spec("q", limit={"cpu": "6"})), 0.0)
    out = d.step(submitted(_rc("ns/a", 4)), 1.0)
    assert [x.type for x in out] == ["Enqueued", "Dequeued"]
    d.step(updated(_rc("ns/a", 2)), 1.5)
    assert d.core.status()["q"]["usage"]["cpu"] == 3000


def test_a_grown_workload_that_goes_back_to_its_queue_waits_with_its_latest_spec():
    d = _running_a(workers=1)
    d.step(updated(_rc("ns/a", 4)), 30.0)
    out = d.step(preempted("ns/a", "ns/other", priority=90), 40.0)
    assert isinstance(out[0], Enqueued)
    again = [x for x in out if isinstance(x, Dequeued)]
    assert len(again) == 1 and again[0].workload.gang.pod_sets[1].count == 4
    assert d.core.status()["q"]["usage"]["cpu"] == 5000
    # the same when placement refuses the (reserved) workload
    out = d.step(failed("ns/a", "q"), 41.0)
    assert [x.type for x in out] == ["BackedOff"]
    retry = [x for x in d.step(updated(_rc("ns/a", 5)), 42.0) if isinstance(x, Dequeued)]
    assert [x.workload.gang.pod_sets[1].count for x in retry] == [5]


def test_an_identical_or_unshrinking_update_of_a_holder_sets_no_timer():
    d = _running_a(workers=2)
    out = d.send(updated(_rc("ns/a", 2)), 30.0)
    assert [x for x in out if isinstance(x, TimerSet)] == []
    out = d.send(updated(_rc("ns/a", 2, priority=5)), 31.0)
    assert out == [] and not d.of(BackedOff)


def test_a_waiting_workload_whose_queue_changes_is_admitted_in_the_new_queue_at_once():
    """It leaves the full queue's index and waits in the new one with a fresh attempt count."""
    d = _running_a(workers=4)  # a holds cpu 5 of q's 6
    d.step(defined(queue_spec("roomy", limit={"cpu": "10"})), 4.0)
    out = d.step(submitted(job("ns/b", "q", cpu="3", at=10.0)), 10.0)
    assert [x.type for x in out] == ["Enqueued", "BackedOff"]
    out = d.step(updated(job("ns/b", "roomy", cpu="3", at=10.0)), 20.0)
    assert [(x.type, x.key, x.queue) for x in out if x.type != "TimerSet"] == [
        ("Enqueued", "ns/b", "roomy"), ("Dequeued", "ns/b", "roomy")]
    assert d.core.status()["q"]["pending"] == [] and d.core.status()["roomy"]["active"] == ["ns/b"]


def test_a_holder_whose_queue_changes_keeps_its_queue_until_its_next_admission():
    """As Kueue refuses the change while a job runs: quota stays booked where it was admitted."""
    d = _running_a(workers=4)
    d.step(defined(queue_spec("roomy", limit={"cpu": "10"})), 4.0)
    out = d.step(updated(_rc("ns/a", 4, queue="roomy")), 10.0)
    assert [x for x in out if x.type != "TimerSet"] == []
    assert d.core.status()["q"]["active"] == ["ns/a"] and d.core.status()["roomy"]["active"] == []
    d.step(preempted("ns/a", "ns/x"), 20.0)  # back in line: it waits with its latest spec, in its new queue
    assert d.core._workloads["ns/a"].queue == "roomy"
