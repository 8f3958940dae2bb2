"""Status where kubectl users look (services/reconciler/status.py, through the reconciler core)."""

from __future__ import annotations

from typing import Any

import pytest

from services.reconciler.core import ReconcilerCore
from services.reconciler.status import STATUS_TIMER, rfc3339
from shared.kernel.events import (
    BackedOff, Dequeued, ElasticWaiting, Enqueued, GangDisrupted, GangPlaced, GangRunning, KubeEffect, PodAssigned,
    PreemptionRequested, QueueDefined, QueueRejected, QueueRemoved, TimerFired, TimerSet, WorkloadDeleted,
    WorkloadRejected, WorkloadSubmitted, WorkloadWithdrawn,
)
from shared.kernel.footprint import retained
from shared.kernel.model import QueueSource
from shared.kernel.policy import Policy
from tests.builders import envelope, gang, pod_set, queue_spec, workload

VOLCANO = QueueSource(kind="Queue", api_version="scheduling.volcano.sh/v1beta1", name="research")
KAI = QueueSource(kind="Queue", api_version="scheduling.run.ai/v2", name="team-a")
TREE = QueueSource(kind="ElasticQuotaTree", api_version="scheduling.sigs.k8s.io/v1beta1", namespace="kube-system",
                   name="tree")
GANG = gang(pod_set("head", 1, cpu="1", memory="1Gi"), pod_set("worker", 2, cpu="2", memory="1Gi"))


class Driver:
    def __init__(self, names: tuple[str, ...] = ("muster", "volcano", "kai-scheduler")) -> None:
        self.core = ReconcilerCore(Policy(scheduler_names=names))
        self.timers: list[TimerSet] = []

    def feed(self, payload: Any, at: float) -> list[Any]:
        out = self.core.handle(envelope(payload, at=at))
        self.timers += [t for t in out if isinstance(t, TimerSet)]
        return out

    def fire(self) -> list[KubeEffect]:
        """The status timer comes due: what is written."""
        timers, self.timers = [t for t in self.timers if t.key == STATUS_TIMER], []
        out: list[KubeEffect] = []
        for timer in timers:
            out += [e for e in self.core.handle(envelope(TimerFired(key=timer.key), at=timer.at))
                    if isinstance(e, KubeEffect)]
        return out

    def submit(self, key: str, queue: str, at: float, *, admit: bool = False, run: bool = False) -> None:
        spec = workload(key, queue=queue, kind="RayCluster", gang_=GANG)
        self.feed(WorkloadSubmitted(workload=spec), at)
        self.feed(Enqueued(key=key, queue=queue, reason=f"waiting in queue {queue}"), at)
        if admit:
            self.feed(Dequeued(key=key, queue=queue, workload=spec, reason="quota reserved"), at)
            self.feed(GangPlaced(key=key, queue=queue, kind="RayCluster", gate="pods", slots=(), reason="3/3 placed"), at)
        if run:
            self.feed(GangRunning(key=key, reason="3/3 gang pods bound and Running"), at)


def by_target(effects: list[KubeEffect]) -> dict[tuple[str, str, str], dict]:
    return {(e.api_version, e.namespace, e.name): e.status for e in effects if e.op == "status"}


def test_a_volcano_queue_gets_its_state_counts_and_allocation_once_a_second():
    d = Driver()
    out = d.feed(QueueDefined(queue=queue_spec("research", source=VOLCANO)), 0.0)
    assert out == [TimerSet(key=STATUS_TIMER, at=1.0)]
    d.submit("ml/a", "research", 0.5, admit=True, run=True)
    d.submit("ml/b", "research", 0.5, admit=True)
    d.submit("ml/c", "research", 0.5)
    assert len(d.timers) == 1  # one flush for everything that changed meanwhile
    status = by_target(d.fire())[("scheduling.volcano.sh/v1beta1", "", "research")]
    assert status == {"state": "Open", "pending": 1, "inqueue": 1, "running": 1,
                      "allocated": {"cpu": "10", "memory": "6Gi"}}
    assert d.fire() == []  # nothing changed, no timer


def test_the_same_status_is_not_written_twice():
    d = Driver()
    d.feed(QueueDefined(queue=queue_spec("research", source=VOLCANO)), 0.0)
    d.submit("ml/a", "research", 0.0)
    assert d.fire()
    d.feed(BackedOff(key="ml/a", queue="research", requeue_at=9.0, attempts=1, reason="full"), 2.0)
    assert [e for e in d.fire() if e.kind == "Queue"] == []  # still one pending


def test_volcano_and_kai_status_is_left_to_their_controllers_unless_muster_is_their_scheduler():
    d = Driver(names=("muster",))
    d.feed(QueueDefined(queue=queue_spec("research", source=VOLCANO)), 0.0)
    d.feed(QueueDefined(queue=queue_spec("team-a", source=KAI, dialect="kai")), 0.0)
    d.submit("ml/a", "research", 0.0, admit=True)
    assert d.fire() == []


def test_a_kai_queue_gets_allocated_and_requested_with_its_children():
    d = Driver()
    d.feed(QueueDefined(queue=queue_spec("team-a", source=KAI, dialect="kai")), 0.0)
    child = QueueSource(kind="Queue", api_version="scheduling.run.ai/v2", name="team-a-dev")
    d.feed(QueueDefined(queue=queue_spec("team-a-dev", parent="team-a", source=child, dialect="kai")), 0.0)
    d.submit("ml/a", "team-a-dev", 0.0, admit=True)
    d.submit("ml/b", "team-a-dev", 0.0)
    written = by_target(d.fire())
    assert written[("scheduling.run.ai/v2", "", "team-a")] == {
        "allocated": {"cpu": "5", "memory": "3Gi"}, "requested": {"cpu": "10", "memory": "6Gi"}}
    assert written[("scheduling.run.ai/v2", "", "team-a-dev")] == written[("scheduling.run.ai/v2", "", "team-a")]


def test_an_elastic_quota_tree_gets_used_per_node_and_kube_queue_item_details():
    d = Driver(names=("muster",))
    d.feed(QueueDefined(queue=queue_spec("root", source=TREE, dialect="elasticquotatree")), 0.0)
    d.feed(QueueDefined(queue=queue_spec("video", parent="root", source=TREE, dialect="elasticquotatree")), 0.0)
    d.submit("video/a", "video", 0.0, admit=True, run=True)
    d.submit("video/b", "video", 0.0)
    d.submit("video/c", "video", 0.0)
    d.feed(BackedOff(key="video/c", queue="video", requeue_at=30.0, attempts=1, reason="quota"), 0.0)
    (effect,) = d.fire()
    assert (effect.op, effect.kind, effect.api_version, effect.namespace, effect.name) == \
        ("status", "ElasticQuotaTree", "scheduling.sigs.k8s.io/v1beta1", "kube-system", "tree")
    assert effect.status == {"queues": {
        "root": {"used": {"cpu": "5", "memory": "3Gi"}},
        "video": {"used": {"cpu": "5", "memory": "3Gi"},
                  "queueItemDetails": {"active": [{"name": "b", "namespace": "video", "position": 1}],
                                       "backoff": [{"name": "c", "namespace": "video"}]}},
    }}


def test_a_volcano_gangs_podgroup_gets_its_phase_and_the_wait_reason():
    d = Driver()
    d.feed(QueueDefined(queue=queue_spec("research", source=VOLCANO)), 0.0)
    d.submit("ml/a", "research", 3.0)
    d.feed(BackedOff(key="ml/a", queue="research", requeue_at=9.0, attempts=1,
                     reason="3/3 tasks in gang unschedulable"), 3.0)
    group = by_target(d.fire())[("scheduling.volcano.sh/v1beta1", "ml", "ray-a-pg")]
    assert group["phase"] == "Pending"
    (condition,) = group["conditions"]
    assert {k: condition[k] for k in ("type", "status", "reason", "message", "lastTransitionTime")} == {
        "type": "Unschedulable", "status": "True", "reason": "NotEnoughResources",
        "message": "3/3 tasks in gang unschedulable", "lastTransitionTime": "1970-01-01T00:00:03Z"}
    d.feed(Dequeued(key="ml/a", queue="research", workload=workload("ml/a", queue="research", gang_=GANG),
                    reason="r"), 10.0)
    d.feed(GangPlaced(key="ml/a", queue="research", kind="RayCluster", gate="pods", slots=(), reason="placed"), 10.0)
    d.feed(GangRunning(key="ml/a", reason="running"), 12.0)
    group = by_target(d.fire())[("scheduling.volcano.sh/v1beta1", "ml", "ray-a-pg")]
    assert group["phase"] == "Running" and group["conditions"][0]["type"] == "Scheduled"


def test_a_deleted_gang_leaves_nothing_of_its_podgroup_behind():
    """What the reconciler remembers writing on a PodGroup goes with the workload (KubeRay makes a new
    PodGroup for a new incarnation); a sidecar running for months would keep one per gang ever seen."""
    d = Driver()
    d.feed(QueueDefined(queue=queue_spec("research", source=VOLCANO)), 0.0)
    d.submit("ml/b", "research", 0.0)
    d.fire()
    before = retained(d.core, exclude=[d.core._gone]).entries
    d.submit("ml/a", "research", 3.0)
    d.feed(BackedOff(key="ml/a", queue="research", requeue_at=9.0, attempts=1, reason="full"), 3.0)
    assert ("scheduling.volcano.sh/v1beta1", "ml", "ray-a-pg") in by_target(d.fire())
    d.feed(WorkloadDeleted(key="ml/a"), 4.0)
    d.fire()
    # Its tombstone aside, which lasts TOMBSTONE_SECONDS (the test below waits for it to go).
    assert retained(d.core, exclude=[d.core._gone]).entries == before


def _footprint(d: Driver) -> int:
    return retained(d.core).entries


def _late(key: str) -> list[Any]:
    """What the queue and placement may have decided about ``key`` before they heard it was deleted."""
    return [GangPlaced(key=key, queue="research", kind="RayCluster", gate="pods", slots=(), reason="3/3 placed"),
            PodAssigned(key=key, pod_namespace="ml", pod="a-head", pod_set="head", node="n1"),
            GangRunning(key=key, reason="3/3 gang pods bound and Running"),
            GangDisrupted(key=key, reason="pod a-head deleted"),
            ElasticWaiting(key=key, queue="research", pod_set="worker", count=1, reason="no room"),
            BackedOff(key=key, queue="research", requeue_at=9.0, attempts=1, reason="full"),
            PreemptionRequested(key=key, kind="RayCluster", gate="pods", preemptor="ml/x", pods=("ml/a-head",),
                                reason="preempted"),
            WorkloadWithdrawn(key=key, reason="deleted")]


def test_late_events_for_a_deleted_workload_write_nothing_and_keep_nothing():
    """The reconciler's inbox has several writers: what placement or the queue decided before they
    heard of a deletion can come after it. Like kube-scheduler's cache (an update of a pod it does not
    hold is refused) and Kueue's queue manager (no requeue of a workload its cache no longer has),
    the reconciler drops them: nothing is written on the object that is gone, and neither its memory
    of effects nor the status book's view of the workload comes back, for months of such events."""
    d = Driver()
    d.feed(QueueDefined(queue=queue_spec("research", source=VOLCANO)), 0.0)
    d.submit("ml/b", "research", 0.0, admit=True, run=True)
    d.feed(WorkloadDeleted(key="ml/b"), 1.0)
    d.feed(WorkloadWithdrawn(key="ml/b", reason="deleted"), 1.0)
    d.fire()
    before = _footprint(d)
    later = 2 * 3600.0  # long after: what is kept of ml/b's deletion has expired
    d.submit("ml/a", "research", later, admit=True, run=True)
    d.feed(PodAssigned(key="ml/a", pod_namespace="ml", pod="a-head", pod_set="head", node="n1"), later)
    d.fire()
    d.feed(WorkloadDeleted(key="ml/a"), later + 1)
    written: list[Any] = []
    for i, payload in enumerate(_late("ml/a")):
        written += [e for e in d.feed(payload, later + 1 + i) if isinstance(e, KubeEffect)]
        written += d.fire()
    assert _footprint(d) == before
    assert [e for e in written if e.kind != "Queue"] == []


def test_a_new_object_under_a_deleted_name_is_a_new_workload():
    """Only admission starts an incarnation (it drops the watch's own late events of a deleted object):
    a submission or a rejection after the deletion is heard, and what follows it."""
    d = Driver()
    d.feed(QueueDefined(queue=queue_spec("research", source=VOLCANO)), 0.0)
    d.submit("ml/a", "research", 0.0, admit=True, run=True)
    d.feed(WorkloadDeleted(key="ml/a"), 1.0)
    out = d.feed(WorkloadRejected(key="ml/a", kind="RayCluster", reason="bad"), 2.0)
    assert [e.op for e in out if isinstance(e, KubeEffect)] == ["annotate", "event"]
    d.feed(WorkloadDeleted(key="ml/a"), 3.0)
    d.submit("ml/a", "research", 4.0, admit=True)
    assert "muster.dev/dequeued-at" in d.feed(
        GangPlaced(key="ml/a", queue="research", kind="RayCluster", gate="pods", slots=(), reason="again"), 5.0
    )[0].annotations


def test_a_removed_queue_forgets_what_was_written_on_it_and_its_successor_starts_clean():
    """A queue object deleted and made again is a new object with no status: what the reconciler
    wrote on the old one (its status, a rejection) is forgotten with it and written again."""
    d = Driver()
    before = _footprint(d)
    d.feed(QueueRejected(name="research", kind="Queue", reason="bad weight"), 0.0)
    d.feed(QueueDefined(queue=queue_spec("research", source=VOLCANO)), 0.5)
    first = by_target(d.fire())
    assert first
    d.feed(QueueRemoved(name="research"), 2.0)
    d.fire()
    assert _footprint(d) == before
    d.feed(QueueDefined(queue=queue_spec("research", source=VOLCANO)), 4.0)
    assert by_target(d.fire()) == first
    assert [e.op for e in d.feed(QueueRejected(name="research", kind="Queue", reason="bad weight"), 6.0)
            if isinstance(e, KubeEffect)] == ["annotate", "event"]


def test_a_refused_queue_object_deleted_before_it_defined_anything_is_forgotten():
    """Admission's QueueRemoved for a refused object that is gone: what was written on it goes too."""
    d = Driver()
    before = _footprint(d)
    tree = dict(kind="ElasticQuotaTree", object_namespace="kube-system", object_name="tree")
    d.feed(QueueRejected(name="video", reason="min above max", **tree), 0.0)
    d.feed(QueueRejected(name="research", kind="Queue", reason="bad weight"), 0.0)
    d.feed(QueueRemoved(name="video"), 1.0)
    d.feed(QueueRemoved(name="research"), 1.0)
    d.fire()
    assert _footprint(d) == before


def test_a_removed_queue_is_not_written():
    d = Driver()
    d.feed(QueueDefined(queue=queue_spec("research", source=VOLCANO)), 0.0)
    d.feed(QueueRemoved(name="research"), 0.5)
    assert d.fire() == []


@pytest.mark.parametrize("seconds, text", [(0, "1970-01-01T00:00:00Z"), (1_700_000_000.7, "2023-11-14T22:13:20Z"),
                                           (951_782_400, "2000-02-29T00:00:00Z"), (4_107_542_399, "2100-02-28T23:59:59Z")])
def test_event_time_as_a_kubernetes_timestamp(seconds, text):
    assert rfc3339(seconds) == text


def test_the_status_book_keeps_no_pods_of_a_long_lived_gang():
    """A RayCluster that runs for months sees its workers replaced (autoscaling, lost nodes): status
    reads workloads and queues, never pods, so the book keeps none of them."""
    d = Driver()
    d.feed(QueueDefined(queue=queue_spec("research", source=VOLCANO)), 0.0)
    d.submit("ml/a", "research", 0.0, admit=True, run=True)
    d.fire()
    before = retained(d.core.status).entries
    for i in range(20):
        d.feed(PodAssigned(key="ml/a", pod_namespace="ml", pod=f"a-worker-{i}", pod_set="worker", node="n1"), 1.0 + i)
        d.fire()
    assert retained(d.core.status).entries == before


def test_the_status_book_keeps_only_the_last_transition_of_a_long_lived_gang():
    """Status writes a gang's last transition (its PodGroup's condition); a gang that waits or runs for
    months changes phase or reason again and again (a backoff's reason names the usage it met), and
    the book kept every change."""
    d = Driver()
    d.feed(QueueDefined(queue=queue_spec("research", source=VOLCANO)), 0.0)
    d.submit("ml/a", "research", 0.0)
    d.feed(BackedOff(key="ml/a", queue="research", requeue_at=9.0, attempts=1, reason="used 0"), 1.0)
    d.fire()
    before = retained(d.core.status).entries
    for i in range(1, 21):
        d.feed(BackedOff(key="ml/a", queue="research", requeue_at=9.0 + i, attempts=1, reason=f"used {i}"), 1.0 + i)
        written = by_target(d.fire())[("scheduling.volcano.sh/v1beta1", "ml", "ray-a-pg")]
        assert written["conditions"][0]["message"] == f"used {i}"
    assert retained(d.core.status).entries == before
