from shared.kernel.events import (
    WorkloadDeleted,
    WorkloadSubmitted,
    BackedOff, Enqueued, GangEvicted, GangPlaced, GangRunning, GpuAssignment, KubeEffect, ObjectChanged, PodAssigned,
    PreemptionRequested, QueueRejected, SlotAssignment, TimerFired, TimerSet, WorkloadRejected, WorkloadSubmitted,
    WorkloadWarned,
)
from services.reconciler.core import ReconcilerCore, gpu_annotations, seconds
from shared.kernel.policy import Policy
from tests.builders import envelope, workload

KEY = "default/rj"


class EffectsOnly(ReconcilerCore):
    """The core without its status timers (tests/unit/reconciler/test_status.py covers those)."""

    def handle(self, env):  # type: ignore[no-untyped-def]
        return [e for e in super().handle(env) if not isinstance(e, TimerSet)]


def core() -> ReconcilerCore:
    return EffectsOnly(Policy())


def placed(key: str = KEY, *, kind: str = "RayJob", gate: str = "suspend", queue: str = "q",
           reason: str = "placed 2 pods") -> GangPlaced:
    slots = (SlotAssignment(pod_set="head", index=0, node="n1"), SlotAssignment(pod_set="worker", index=0, node="n2"))
    return GangPlaced(key=key, queue=queue, kind=kind, gate=gate, slots=slots, reason=reason)


def enqueued(key: str = KEY, reason: str = "waiting in queue q") -> Enqueued:
    return Enqueued(key=key, queue="q", reason=reason)


def backed_off(key: str = KEY, reason: str = "queue q capability cpu 4: used 3, requested 3") -> BackedOff:
    return BackedOff(key=key, queue="q", requeue_at=5.0, attempts=1, reason=reason)


def preempted(key: str = KEY, *, kind: str = "RayJob", gate: str = "suspend",
              pods: tuple[str, ...] = ()) -> PreemptionRequested:
    return PreemptionRequested(key=key, kind=kind, gate=gate, preemptor="default/big", pods=pods,
                               reason="preempted by default/big (priority 100) in queue q")


def eff(op: str, kind: str = "RayJob", name: str = "rj", **fields) -> KubeEffect:
    return KubeEffect(op=op, kind=kind, namespace="default", name=name, **fields)


def test_gang_placed_unsuspends_annotates_and_records_an_event():
    out = core().handle(envelope(placed(), at=12.5))
    assert out == [
        eff("unsuspend"),
        eff("annotate", annotations={"muster.dev/dequeued-at": "12.5", "muster.dev/queue": "q",
                                     "muster.dev/status": "Admitted: placed 2 pods"}),
        eff("event", reason="Scheduled", message="placed 2 pods", event_type="Normal"),
    ]


def test_gang_placed_pod_gated_does_not_unsuspend():
    out = core().handle(envelope(placed(kind="RayCluster", gate="pods"), at=3.0))
    assert [e.op for e in out] == ["annotate", "event"]
    assert out[0].kind == "RayCluster" and out[0].annotations["muster.dev/dequeued-at"] == "3"


def test_duplicate_envelope_yields_nothing():
    c = core()
    env = envelope(placed(), at=1.0)
    assert len(c.handle(env)) == 3
    assert c.handle(env) == []


def test_identical_effects_are_not_emitted_twice():
    c = core()
    c.handle(envelope(placed(), at=1.0))
    # Same decision redelivered under another id at the same time: nothing new to write.
    assert c.handle(envelope(placed(), at=1.0)) == []
    # Later: only the time changed.
    assert c.handle(envelope(placed(), at=2.0)) == [eff("annotate", annotations={"muster.dev/dequeued-at": "2"})]


def test_enqueued_annotates_before_the_kind_is_known():
    out = core().handle(envelope(enqueued(), at=1.0))
    assert out == [KubeEffect(op="annotate", kind="", namespace="default", name="rj",
                              annotations={"muster.dev/enqueued-at": "1", "muster.dev/queue": "q",
                                           "muster.dev/status": "Queued: waiting in queue q"}),
                   KubeEffect(op="event", kind="", namespace="default", name="rj", reason="Queued",
                              message="waiting in queue q", event_type="Normal")]


def test_enqueued_uses_the_kind_once_known():
    c = core()
    c.handle(envelope(WorkloadRejected(key=KEY, kind="RayJob", reason="bad"), at=0.0))
    out = c.handle(envelope(enqueued(), at=1.0))
    assert [(e.op, e.kind) for e in out] == [("annotate", "RayJob"), ("event", "RayJob")]


def test_backed_off_writes_status_and_a_warning_event_once():
    c = core()
    c.handle(envelope(enqueued(), at=1.0))
    out = c.handle(envelope(backed_off(), at=2.0))
    reason = "queue q capability cpu 4: used 3, requested 3"
    assert out == [
        KubeEffect(op="annotate", kind="", namespace="default", name="rj",
                   annotations={"muster.dev/status": f"Queued: {reason}"}),
        KubeEffect(op="event", kind="", namespace="default", name="rj", reason="Unschedulable", message=reason,
                   event_type="Warning"),
    ]
    assert c.handle(envelope(backed_off(), at=3.0)) == []


def test_enqueued_at_is_written_only_the_first_time():
    c = core()
    first = c.handle(envelope(backed_off(), at=4.0))
    assert first[0].annotations["muster.dev/enqueued-at"] == "4"
    c.handle(envelope(placed(), at=5.0))
    c.handle(envelope(preempted(), at=9.0))
    again = c.handle(envelope(enqueued(reason="preempted by default/big; waiting in queue q"), at=9.0))
    assert again == [eff("annotate", annotations={
        "muster.dev/status": "Queued: preempted by default/big; waiting in queue q"}),
        eff("event", reason="Queued", message="preempted by default/big; waiting in queue q", event_type="Normal")]


def test_a_deleted_and_recreated_object_is_a_new_object():
    c = core()
    c.handle(envelope(enqueued(), at=1.0))
    c.handle(envelope(placed(), at=2.0))
    assert c.handle(envelope(WorkloadDeleted(key=KEY), at=20.0)) == []
    assert c.handle(envelope(WorkloadSubmitted(workload=workload(KEY, kind="RayJob", queue="q")), at=30.0)) == []
    out = c.handle(envelope(enqueued(), at=30.0))
    assert out == [eff("annotate", annotations={"muster.dev/enqueued-at": "30", "muster.dev/queue": "q",
                                                "muster.dev/status": "Queued: waiting in queue q"}),
                   eff("event", reason="Queued", message="waiting in queue q", event_type="Normal")]
    assert c.handle(envelope(placed(), at=31.0))[0] == eff("unsuspend")


def test_pod_assigned_binds_with_gpu_annotations():
    c = core()
    gpu = GpuAssignment(devices=(0,), fraction=0.5, group="g1")
    out = c.handle(envelope(PodAssigned(key=KEY, pod_namespace="default", pod="rj-w-1", pod_set="w", node="n1",
                                        gpu=gpu)))
    assert out == [KubeEffect(op="bind", kind="Pod", namespace="default", name="rj-w-1", node="n1",
                              annotations={"gpu-fraction": "0.5", "muster.dev/gpu-devices": "0",
                                           "muster.dev/gpu-group": "g1"})]


def test_a_gpu_memory_pod_is_bound_with_what_kais_binder_writes_and_no_gpu_fraction():
    """KAI's binder marks it ``received-resource-type: Fraction`` and gives it its portion (two decimals);
    a ``gpu-fraction`` beside its ``gpu-memory`` would make it a pod KAI refuses."""
    c = core()
    gpu = GpuAssignment(devices=(1,), fraction=0.51, group="g2", memory=20480)
    out = c.handle(envelope(PodAssigned(key=KEY, pod_namespace="default", pod="rj-w-2", pod_set="w", node="n1",
                                        gpu=gpu)))
    assert out == [KubeEffect(op="bind", kind="Pod", namespace="default", name="rj-w-2", node="n1",
                              annotations={"received-resource-type": "Fraction", "muster.dev/gpu-portion": "0.51",
                                           "muster.dev/gpu-devices": "1", "muster.dev/gpu-group": "g2"})]
    assert gpu_annotations(GpuAssignment(devices=(0,), fraction=0.5, group="g", memory=20450))[
        "muster.dev/gpu-portion"] == "0.50"


def test_pod_assigned_without_gpu_binds_plainly_and_only_once():
    c = core()
    payload = PodAssigned(key=KEY, pod_namespace="team", pod="p", pod_set="head", node="n2")
    assert c.handle(envelope(payload)) == [KubeEffect(op="bind", kind="Pod", namespace="team", name="p", node="n2")]
    assert c.handle(envelope(payload)) == []


def test_a_pods_delayed_claims_ride_on_its_bind_so_they_are_written_first():
    """VolumeBinding's PreBind comes before its Bind: the claims travel on the bind effect itself, so the
    link can never bind the pod before the node is written on them, and a repeat writes nothing again."""
    c = core()
    payload = PodAssigned(key=KEY, pod_namespace="team", pod="p", pod_set="head", node="n2", claims=("p-scratch", "data"))
    assert c.handle(envelope(payload)) == [KubeEffect(op="bind", kind="Pod", namespace="team", name="p", node="n2",
                                                      claims=("p-scratch", "data"))]
    assert c.handle(envelope(payload)) == []


def test_gpu_annotations_whole_gpus():
    """No ``gpu-fraction`` on a whole-GPU pod: KAI refuses one of 1 or more (its gpu-request validator)."""
    assert gpu_annotations(GpuAssignment(devices=(1, 3), fraction=1.0)) == {"muster.dev/gpu-devices": "1,3"}
    assert gpu_annotations(None) == {}


def test_gang_running_annotates_status():
    c = core()
    c.handle(envelope(placed(), at=1.0))
    assert c.handle(envelope(GangRunning(key=KEY, reason="3/3 pods running"), at=4.0)) == [
        eff("annotate", annotations={"muster.dev/status": "Running: 3/3 pods running"})]


def test_preemption_of_pod_gated_workload_evicts_each_pod():
    c = core()
    out = c.handle(envelope(preempted(kind="RayCluster", gate="pods", pods=("rc-head-abcde", "rc-w-worker-fghjk")),
                            at=7.0))
    reason = "preempted by default/big (priority 100) in queue q"
    assert out == [
        eff("evict", "Pod", "rc-head-abcde"),
        eff("evict", "Pod", "rc-w-worker-fghjk"),
        eff("annotate", "RayCluster", annotations={"muster.dev/status": f"Preempted: {reason}"}),
        eff("event", "RayCluster", reason="Preempted", message=reason, event_type="Warning"),
    ]
    # Redelivered under a new id: the pods are already evicted.
    assert c.handle(envelope(preempted(kind="RayCluster", gate="pods",
                                       pods=("rc-head-abcde", "rc-w-worker-fghjk")), at=8.0)) == []


def test_a_stale_gang_is_evicted_as_a_preempted_one_with_kais_event():
    reason = "stale gang evicted: 2 pods are active, minMember is 3, for 60s (its queue's staleness grace period)"
    out = core().handle(envelope(GangEvicted(key=KEY, kind="RayCluster", gate="pods", reason=reason,
                                             pods=("rc-w-worker-fghjk", "rc-w-worker-lmnop")), at=90.0))
    assert out == [
        eff("evict", "Pod", "rc-w-worker-fghjk"),
        eff("evict", "Pod", "rc-w-worker-lmnop"),
        eff("annotate", "RayCluster", annotations={"muster.dev/status": f"Preempted: {reason}"}),
        eff("event", "RayCluster", reason="StaleJob", message=reason, event_type="Warning"),
    ]
    suspended = core().handle(envelope(GangEvicted(key=KEY, kind="RayJob", gate="suspend", pods=(), reason=reason)))
    assert [e.op for e in suspended] == ["suspend", "annotate", "event"]


def test_preemption_of_suspend_gated_workload_resuspends_and_replacement_unsuspends():
    c = core()
    c.handle(envelope(placed(), at=1.0))
    out = c.handle(envelope(preempted(), at=60.0))
    assert [e.op for e in out] == ["suspend", "annotate", "event"]
    assert out[0] == eff("suspend")
    again = c.handle(envelope(placed(), at=90.0))
    assert again[0] == eff("unsuspend")


def test_bind_after_evict_of_same_pod_is_emitted():
    c = core()
    assign = PodAssigned(key=KEY, pod_namespace="default", pod="p", pod_set="pods", node="n1")
    c.handle(envelope(assign))
    c.handle(envelope(preempted(kind="PodGroup", gate="pods", pods=("p",))))
    assert c.handle(envelope(assign)) == [eff("bind", "Pod", "p", node="n1")]


def test_a_pod_made_again_under_its_name_after_its_deletion_is_bound_again():
    """A StatefulSet's ``web-0`` in a pod gang, deleted and made again: placement assigns the new pod,
    maybe to the same node, and it must be bound (the old one's bind was written on a pod that is
    gone). The deletion's watch event says so, and the pod is forgotten (``topology``: a pod's
    deletion goes to the reconciler)."""
    c = core()
    assign = PodAssigned(key=KEY, pod_namespace="default", pod="web-0", pod_set="pods", node="n1")
    assert c.handle(envelope(assign)) == [eff("bind", "Pod", "web-0", node="n1")]
    gone = ObjectChanged(change="Deleted", kind="Pod", api_version="v1", namespace="default", name="web-0",
                         object={"kind": "Pod", "metadata": {"name": "web-0", "namespace": "default"}})
    assert c.handle(envelope(gone)) == []
    assert c.handle(envelope(assign)) == [eff("bind", "Pod", "web-0", node="n1")]


def test_workload_rejected_annotates_and_warns():
    out = core().handle(envelope(WorkloadRejected(key=KEY, kind="RayCluster", reason="queue x does not exist")))
    assert out == [
        eff("annotate", "RayCluster", annotations={"muster.dev/status": "Rejected: queue x does not exist"}),
        eff("event", "RayCluster", reason="Rejected", message="queue x does not exist", event_type="Warning"),
    ]


def test_workload_warned_is_a_warning_event_on_the_object_told_once_and_leaves_its_status():
    c = core()
    warned = WorkloadWarned(key=KEY, kind="RayCluster", cause="QueueLabelIgnored",
                            reason="label volcano.sh/queue is not read by muster; it is in queue default")
    assert c.handle(envelope(warned)) == [
        eff("event", "RayCluster", reason="QueueLabelIgnored", message=warned.reason, event_type="Warning")]
    assert c.handle(envelope(warned, at=1.0)) == []  # the same event again is the same event


def test_a_warning_for_another_kind_under_a_taken_name_goes_to_that_object():
    c = core()
    c.handle(envelope(WorkloadSubmitted(workload=workload(KEY, kind="RayJob"))))
    warned = WorkloadWarned(key=KEY, kind="RayCluster", cause="QueueLabelIgnored", reason="label x is not read")
    assert c.handle(envelope(warned)) == [
        eff("event", "RayCluster", reason="QueueLabelIgnored", message="label x is not read", event_type="Warning")]
    assert c.handle(envelope(warned, at=1.0)) == [  # not remembered as the RayJob's
        eff("event", "RayCluster", reason="QueueLabelIgnored", message="label x is not read", event_type="Warning")]


def test_pod_group_workloads_get_no_annotations():
    out = core().handle(envelope(placed(key="default/pg", kind="PodGroup", gate="pods")))
    assert [(e.op, e.kind, e.name) for e in out] == [("event", "PodGroup", "pg")]


def test_queue_rejected_addresses_the_queue_object():
    out = core().handle(envelope(QueueRejected(name="team-a", kind="Queue", reason="parent x does not exist")))
    assert out == [
        KubeEffect(op="annotate", kind="Queue", namespace="", name="team-a",
                   annotations={"muster.dev/status": "Rejected: parent x does not exist"}),
        KubeEffect(op="event", kind="Queue", namespace="", name="team-a", reason="Rejected",
                   message="parent x does not exist", event_type="Warning"),
    ]


def test_queue_rejected_for_a_quota_tree_node_addresses_the_tree_object():
    bad = QueueRejected(name="research", kind="ElasticQuotaTree", reason="min cpu 50 exceeds parent min 40",
                        object_namespace="kube-system", object_name="elasticquotatree")
    out = core().handle(envelope(bad))
    assert [(e.op, e.kind, e.namespace, e.name) for e in out] == [
        ("annotate", "ElasticQuotaTree", "kube-system", "elasticquotatree"),
        ("event", "ElasticQuotaTree", "kube-system", "elasticquotatree")]


def test_workload_submitted_teaches_the_kind_and_emits_nothing():
    c = core()
    assert c.handle(envelope(WorkloadSubmitted(workload=workload(KEY, kind="RayJob", gate="suspend")))) == []
    assert c.handle(envelope(enqueued(), at=2.0))[0].kind == "RayJob"


def test_other_payloads_are_ignored():
    assert core().handle(envelope(TimerFired(key="cycle"))) == []


def test_seconds_formatting():
    assert [seconds(0.0), seconds(12.0), seconds(12.25), seconds(1e7)] == ["0", "12", "12.25", "10000000"]


def test_a_rejected_claim_of_another_kind_is_annotated_on_that_object_only():
    c = core()
    c.handle(envelope(WorkloadSubmitted(workload=workload(KEY, kind="RayCluster", queue="q")), at=1.0))
    out = c.handle(envelope(WorkloadRejected(key=KEY, kind="RayJob", reason="name taken"), at=2.0))
    assert {(e.op, e.kind) for e in out} == {("annotate", "RayJob"), ("event", "RayJob")}
    assert c.handle(envelope(enqueued(), at=3.0))[0].kind == "RayCluster"


def test_elastic_pods_evicted_for_another_workload_are_evicted_and_told_on_the_workload():
    from shared.kernel.events import ElasticReleased

    c = core()
    reason = "preempted by default/big (priority 100) in queue q"
    released = ElasticReleased(key="default/rc", pod_set="worker", count=2, admission=3, reason=reason,
                               evicted=("default/rc-worker-worker-a", "default/rc-worker-worker-b"))
    out = c.handle(envelope(released, at=7.0))
    assert out == [
        eff("evict", "Pod", "rc-worker-worker-a"),
        eff("evict", "Pod", "rc-worker-worker-b"),
        KubeEffect(op="event", kind="", namespace="default", name="rc", reason="Preempted",
                   message=f"2 elastic pod(s) of worker evicted: {reason}", event_type="Warning"),
    ]
    quiet = released.model_copy(update={"evicted": (), "reason": "went away"})
    assert c.handle(envelope(quiet, at=8.0)) == []          # a pod that went away by itself: nothing to do


def test_an_elastic_pod_that_took_a_gang_place_loses_its_elastic_mark():
    from shared.kernel.events import ElasticReleased

    c = core()
    bind = c.handle(envelope(PodAssigned(key="default/rc", pod_namespace="default", pod="rc-w-x", pod_set="w",
                                         node="n1", elastic=True), at=1.0))
    assert bind == [eff("bind", "Pod", "rc-w-x", node="n1", annotations={"muster.dev/elastic": "true"})]
    promoted = ElasticReleased(key="default/rc", pod_set="w", count=1, admission=2, reason="took a place",
                               promoted=("default/rc-w-x",))
    assert c.handle(envelope(promoted, at=2.0)) == [eff("annotate", "Pod", "rc-w-x",
                                                        annotations={"muster.dev/elastic": "false"})]


def test_moved_pods_are_evicted_once_and_their_replacements_bound_where_placement_says():
    """Consolidation: the moved pod is evicted (its owner makes it again), told on the workload with a
    Normal ``Evict`` as KAI records it; the same event again writes nothing; the new pod is bound to
    the device the move planned. The workload's status is left as it is: it runs on."""
    from shared.kernel.events import PodsMoved

    c = core()
    reason = ("pod default/rc-worker-a was preempted and rescheduled due to bin packing (resource consolidation)"
              " procedure, to make room for default/big")
    moved = PodsMoved(key="default/rc", kind="RayCluster", preemptor="default/big", pods=("default/rc-worker-a",),
                      reason=reason)
    out = c.handle(envelope(moved, at=20.0))
    assert out == [
        eff("evict", "Pod", "rc-worker-a"),
        KubeEffect(op="event", kind="RayCluster", namespace="default", name="rc", reason="Evict", message=reason,
                   event_type="Normal"),
    ]
    assert c.handle(envelope(moved, at=20.0)) == []
    gpu = GpuAssignment(devices=(0,), fraction=0.5, group="g")
    bind = PodAssigned(key="default/rc", pod_namespace="default", pod="rc-worker-b", pod_set="worker", node="n1",
                       gpu=gpu)
    assert c.handle(envelope(bind, at=21.0)) == [eff("bind", "Pod", "rc-worker-b", node="n1",
                                                     annotations=gpu_annotations(gpu))]
