"""Elastic pods in the queue: granted after gangs, one by one within quota and free capacity, charged
until placement releases them, and taken before any whole gang by quota preemption and reclaim."""

from __future__ import annotations

from shared.kernel.events import ElasticGranted, ElasticReleased, ElasticWaiting, GangPlaced, ReclaimRequested, SlotAssignment
from shared.kernel.model import WorkloadSpec
from tests.builders import gang, pod_group, pod_set, queue_spec, workload
from tests.builders.queue import (
    QueueDriver, capacity, defined, failed, job, placed, preempted, running, submitted, updated,
)


def _elastic(key: str, queue: str, elastic: int, *, at: float = 0.0, priority: int = 0, worker_cpu: str = "1",
             workers: int = 1) -> WorkloadSpec:
    """head 1 cpu + ``workers`` workers of ``worker_cpu``, and ``elastic`` workers more the owner wants."""
    worker = pod_set("worker", workers, cpu=worker_cpu).model_copy(update={"elastic": elastic})
    return workload(key, queue=queue, submitted_at=at, priority=priority, gang_=gang(pod_set("head", 1, cpu="1"), worker))


def _admit(d: QueueDriver, spec: WorkloadSpec, at: float) -> list:
    d.step(submitted(spec), at)
    out = d.step(placed(spec.key, spec.queue), at)
    out += d.step(running(spec.key), at)
    return out


def _grants(out: list) -> list[tuple[str, str, int]]:
    return [(x.key, x.pod_set, x.count) for x in out if isinstance(x, ElasticGranted)]


def _released(grant: ElasticGranted, count: int = 1, *, refused: bool = False) -> ElasticReleased:
    return ElasticReleased(key=grant.key, pod_set=grant.pod_set, count=count, admission=grant.admission,
                           reason="no node" if refused else "went away", refused=refused)


def _cluster(cpu: str = "32", limit: str = "6") -> QueueDriver:
    d = QueueDriver()
    d.step(capacity(cpu=cpu, memory="64Gi"), 0.0)
    d.step(defined(queue_spec("q", limit={"cpu": limit})))
    return d


def test_elastic_pods_are_granted_once_placement_holds_the_gang_and_within_the_queue_limit():
    d = _cluster(limit="5")
    spec = _elastic("ns/a", "q", 5)
    assert _grants(d.step(submitted(spec), 1.0)) == []            # reserved, not placed yet: no grant
    out = d.step(placed("ns/a", "q"), 1.0)
    assert _grants(out) == [("ns/a", "worker", 3)]               # 2 + 3 = the limit of 5
    assert d.core.status()["q"]["usage"]["cpu"] == 5000


def test_a_waiting_gang_goes_before_anyones_elastic_pods():
    d = _cluster(limit="6")
    d.step(submitted(job("ns/b", "q", cpu="3", at=0.5)), 0.5)      # admitted, holds 3
    d.step(placed("ns/b", "q"))
    d.step(submitted(_elastic("ns/a", "q", 4)), 1.0)              # a: 2 of its own
    out = d.step(placed("ns/a", "q"), 1.0)
    assert _grants(out) == [("ns/a", "worker", 1)]                # 3 + 2 + 1 = 6
    d.step(submitted(job("ns/c", "q", cpu="1", at=2.0)), 2.0)     # waits: the elastic pod holds the quota
    grant = d.of(ElasticGranted, "ns/a")[0]
    out = d.step(_released(grant), 3.0)                           # the elastic pod went away: in that cycle
    assert [(x.type, x.key) for x in out if x.type in ("Dequeued", "ElasticGranted")] == [("Dequeued", "ns/c")]
    assert d.core.status()["q"]["usage"]["cpu"] == 6000           # c, a gang, took it; a still wants 4 more


def test_holders_of_a_queue_grow_round_robin():
    d = _cluster(limit="7")
    _admit(d, _elastic("ns/a", "q", 0), 1.0)
    _admit(d, _elastic("ns/b", "q", 0, at=2.0), 2.0)              # 4 of 7 held
    d.send(updated(_elastic("ns/a", "q", 5)), 3.0)
    out = d.step(updated(_elastic("ns/b", "q", 5, at=2.0)), 3.0)
    assert _grants(out) == [("ns/a", "worker", 2), ("ns/b", "worker", 1)]


def test_a_refused_grant_waits_for_capacity_and_a_stale_release_changes_nothing():
    d = _cluster(limit="10")
    out = _admit(d, _elastic("ns/a", "q", 2), 1.0)
    grant = next(x for x in out if isinstance(x, ElasticGranted))
    assert grant.count == 2
    assert _grants(d.step(_released(grant, 2, refused=True), 2.0)) == []   # no node: no grant again ...
    assert d.core.status()["q"]["usage"]["cpu"] == 2000
    assert _grants(d.step(capacity(cpu="32", memory="64Gi"), 5.0)) == [("ns/a", "worker", 2)]  # ... until a release
    d.step(preempted("ns/a", "ns/x"), 6.0)                        # the admission ends: its grants go with it
    d.step(placed("ns/a", "q"), 7.0)
    before = d.core.status()["q"]["usage"]["cpu"]
    d.step(_released(grant, 2), 8.0)                              # a release of the old admission's pods
    assert d.core.status()["q"]["usage"]["cpu"] == before


def test_quota_preemption_takes_lower_priority_elastic_pods_before_any_gang():
    d = _cluster(limit="6")
    _admit(d, _elastic("ns/low", "q", 4), 1.0)                    # 2 + 4 elastic = 6 of 6
    out = [x for x in d.step(submitted(job("ns/high", "q", cpu="2", at=10.0, priority=100)), 10.0)
           if isinstance(x, ReclaimRequested)]
    assert len(out) == 1 and out[0].victims == ()
    assert [(v.key, v.pod_set, v.count) for v in out[0].elastic_victims] == [("ns/low", "worker", 2)]
    assert "preempting 2 elastic pod(s) of ns/low (worker) to stay within queue q capability cpu 6" in out[0].reason
    # placement refused it: nothing was given back, the holder's pods stay granted
    d.step(failed("ns/high", "q"), 11.0)
    assert d.core.status()["q"]["usage"]["cpu"] == 6000


def test_quota_preemption_combines_one_workloads_elastic_pods_with_a_newer_whole_one():
    """Neither old's elastic pods (2) nor new alone (4) give back the 6 high needs: both together do,
    so old keeps its gang (KAI's solver: tasks above a job's minimum, then whole jobs)."""
    d = _cluster(limit="8")
    _admit(d, _elastic("ns/old", "q", 2), 1.0)                    # 2 + 2 elastic
    _admit(d, job("ns/new", "q", cpu="4", at=2.0), 2.0)           # 8 of 8
    assert d.core.status()["q"]["usage"]["cpu"] == 8000
    out = [x for x in d.step(submitted(job("ns/high", "q", cpu="6", at=10.0, priority=100)), 10.0)
           if isinstance(x, ReclaimRequested)]
    assert len(out) == 1 and out[0].victims == ("ns/new",)
    assert [(v.key, v.pod_set, v.count) for v in out[0].elastic_victims] == [("ns/old", "worker", 2)]
    assert ("preempting ns/new (priority 0), 2 elastic pod(s) of ns/old (worker) to stay within queue q "
            "capability cpu 8") in out[0].reason


def test_reclaim_takes_elastic_pods_of_a_queue_over_its_share_before_any_gang():
    d = QueueDriver()
    d.step(capacity(cpu="8", memory="64Gi"), 0.0)
    d.step(defined(queue_spec("a")))
    d.step(defined(queue_spec("b")))
    _admit(d, _elastic("ns/big", "a", 6), 1.0)                   # 2 + 6 = the whole cluster
    assert d.core.status()["a"]["usage"]["cpu"] == 8000
    out = [x for x in d.step(submitted(job("ns/b1", "b", cpu="2", at=10.0)), 10.0)
           if isinstance(x, ReclaimRequested)]
    assert len(out) == 1 and out[0].victims == ()
    assert [(v.key, v.pod_set, v.count) for v in out[0].elastic_victims] == [("ns/big", "worker", 2)]
    assert "reclaiming 2 elastic pod(s) of ns/big (worker) from queues over their fair share" in out[0].reason


def _waits(out: list) -> list[str]:
    return [x.reason for x in out if isinstance(x, ElasticWaiting)]


def test_elastic_pods_that_wait_say_why_once_and_again_after_a_grant():
    """Nothing waits without a reason: the quota that stops them, the free capacity, or no node."""
    d = _cluster(limit="5")
    out = _admit(d, _elastic("ns/a", "q", 5), 1.0)
    assert _grants(out) == [("ns/a", "worker", 3)]
    assert _waits(out) == ["2 elastic pod(s) of worker wait: queue q capability cpu 5: used 5, requested 1"]
    assert _waits(d.step(submitted(job("ns/b", "q", cpu="1", at=2.0)), 2.0)) == []   # the same reason: told once
    d = _cluster(cpu="4", limit="10")
    out = _admit(d, _elastic("ns/a", "q", 5), 1.0)
    assert _waits(out) == ["3 elastic pod(s) of worker wait: the cluster's free capacity lacks cpu 1 for one"]
    grant = next(x for x in out if isinstance(x, ElasticGranted))
    refused = d.step(_released(grant, 2, refused=True), 2.0)
    assert _waits(refused) == ["no node; asked again when capacity is released"]


def test_a_pod_group_placed_with_other_members_is_charged_what_runs_and_its_first_pods_become_elastic():
    """Placement ran cheaper members of a pod group in place of its first pods (``as_placed``): the queue
    charges the members placed and grants the first ones as elastic pods."""
    d = _cluster(limit="6")
    group = pod_group(pod_set("pods", 2, cpu="2"), pod_set("pods-2", 0, elastic=2, cpu="1"))
    spec = workload("ns/g", queue="q", kind="PodGroup", gang_=group)
    d.step(submitted(spec), 1.0)
    assert d.core.status()["q"]["usage"]["cpu"] == 4000            # reserved for the first pods
    slots = tuple(SlotAssignment(pod_set="pods-2", index=i, node="n1") for i in range(2))
    out = d.step(GangPlaced(key="ns/g", queue="q", kind="PodGroup", gate="pods", slots=slots, reason="placed"), 1.0)
    assert _grants(out) == [("ns/g", "pods", 2)]                   # 2 x 1 run, the first two are elastic now
    assert d.core.status()["q"]["usage"]["cpu"] == 6000
