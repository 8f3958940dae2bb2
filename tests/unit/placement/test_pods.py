"""Pods: every bound live pod counts; pods of a placed gang fill its slots; GangRunning."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.placement.disruption import DISRUPTION_GRACE
from services.placement.pods import GPU_DEVICES, pod_facts
from shared.kernel.events import (
    CapacityChanged, GangDisrupted, GangPlaced, GangRunning, GpuAssignment, PlacementFailed, PodAssigned, TimerSet, derive_id,
)
from shared.kernel import kube
from shared.kernel.policy import Policy
from tests.builders import gang, node, pod, pod_set, workload
from tests.builders.placement import PlacementDriver, bound, fits, node_changed, of_type, one, ray_pod, with_phase

RC = workload("default/rc", gang_=gang(pod_set("head", 1, cpu="1"), pod_set("worker", 2, cpu="1")))


def test_unmanaged_bound_pods_count_until_they_finish():
    d = PlacementDriver(None, node("n1", cpu="4"))
    other = pod("daemon", "kube-system", requests={"cpu": "3"}, node_name="n1", scheduler="default-scheduler")
    d.pod(other)
    assert not fits(d, "2")
    assert fits(d, "1")
    d.pod(with_phase(bound(other, "n1"), "Succeeded"), "Modified")
    assert fits(d, "4")


def test_unbound_and_deleted_pods_do_not_count():
    d = PlacementDriver(None, node("n1", cpu="4"))
    d.pod(pod("pending", requests={"cpu": "4"}))
    assert fits(d, "4")
    gone = pod("gone", requests={"cpu": "4"}, node_name="n1")
    d.pod(gone)
    assert not fits(d, "1")
    d.pod(gone, "Deleted")
    assert fits(d, "4")


def test_pod_on_a_node_not_seen_yet_is_counted_when_the_node_arrives():
    d = PlacementDriver()
    d.pod(pod("early", requests={"cpu": "3"}, node_name="late"))
    d.add_node("late", cpu="4")
    assert not fits(d, "2")
    assert fits(d, "1")


def test_existing_unbound_pods_are_assigned_in_observed_order_after_gang_placed():
    d = PlacementDriver(None, node("n1", cpu="8"))
    w1, head, w0 = ray_pod("rc", "worker", 1), ray_pod("rc", "head"), ray_pod("rc", "worker", 0)
    for p in (w1, head, w0):
        assert d.pod(p) == []
    out = d.dequeue(RC)
    assert [type(p) for p in out] == [GangPlaced, PodAssigned, PodAssigned, PodAssigned]
    assert [(p.pod, p.pod_set, p.node) for p in out[1:]] == [
        ("rc-worker-worker-1", "worker", "n1"), ("rc-head-0", "head", "n1"), ("rc-worker-worker-0", "worker", "n1")]
    assert out[1].pod_namespace == "default" and out[1].key == "default/rc"


def test_a_pod_gated_gang_binds_nothing_until_a_pod_waits_for_every_gang_slot():
    """All or nothing for the minimum: plain pods evicted with their gang never come back, so a gang
    admitted again with some of its pods missing must not run with the rest (Volcano's gang plugin:
    a job with fewer valid tasks than minAvailable is not scheduled)."""
    d = PlacementDriver(None, node("n1", cpu="8"))
    assert d.pod(ray_pod("rc", "worker", 0)) == []
    out = d.dequeue(RC)
    assert of_type(out, PodAssigned) == [] and len(one(out, GangPlaced).slots) == 3
    assert d.pod(ray_pod("rc", "head")) == []          # still one worker short
    assigned = of_type(d.pod(ray_pod("rc", "worker", 1)), PodAssigned)
    assert [a.pod for a in assigned] == ["rc-worker-worker-0", "rc-head-0", "rc-worker-worker-1"]
    d.pod(ray_pod("rc", "worker", 0), "Deleted")       # once assembled, a replacement goes as it comes
    assert one(d.pod(ray_pod("rc", "worker", 5)), PodAssigned).pod == "rc-worker-worker-5"


def test_later_pods_get_a_free_slot_as_they_are_observed():
    d = PlacementDriver(None, node("n1", cpu="8"), node("n2", cpu="8"))
    d.dequeue(workload("ns/filler", gang_=gang(pod_set("head", 1, cpu="8"))))  # n1 full
    suspended = RC.model_copy(update={"gate": "suspend"})
    placed = one(d.dequeue(suspended), GangPlaced)
    assert [s.node for s in placed.slots] == ["n2", "n2", "n2"]
    assigned = one(d.pod(ray_pod("rc", "worker", 7)), PodAssigned)
    assert (assigned.pod, assigned.pod_set, assigned.node) == ("rc-worker-worker-7", "worker", "n2")


def test_gpu_assignment_travels_with_the_pod():
    d = PlacementDriver(None, node("n1", cpu="8", gpu="1"))
    w = workload("default/half", gate="suspend", gang_=gang(pod_set("worker", 2, cpu="1", gpu_share=500)))
    d.dequeue(w)
    assigned = one(d.pod(ray_pod("half", "worker", 0, gpu_fraction="0.5")), PodAssigned)
    assert assigned.gpu == GpuAssignment(devices=(0,), fraction=0.5, group=derive_id("default/half", "n1", 0))


def test_filled_slots_are_not_counted_twice():
    d = PlacementDriver(None, node("n1", cpu="4"))
    out = d.dequeue(RC)
    d.run(RC, out)
    assert fits(d, "1")
    assert not fits(d, "2")


def test_pods_beyond_the_slots_are_never_placed():
    """Quota and slots follow what was admitted: a scaled-up cluster's extra pods wait unbound."""
    d = PlacementDriver(None, node("n1", cpu="4"))
    out = d.dequeue(RC)
    d.run(RC, out)
    assert d.pod(ray_pod("rc", "worker", 5)) == []  # room for it on n1, still not placed
    assert d.pod(ray_pod("rc", "worker", 6)) == []
    assert fits(d, "1") and not fits(d, "2")


def test_recreated_pod_gets_the_slot_back_and_capacity_stays_reserved():
    d = PlacementDriver(None, node("n1", cpu="3"), node("n2", cpu="8"))
    out = d.dequeue(RC)
    d.run(RC, out)
    crashed = bound(ray_pod("rc", "worker", 1), "n1", "Failed")
    out = d.pod(crashed, "Modified")
    assert [t.key for t in of_type(out, TimerSet)] == ["disruption"]  # no capacity release: the slot reserves again
    assert fits(d, "8") and not fits(d, "9")  # n1 stays full, n2 free
    again = one(d.pod(ray_pod("rc", "worker", 9)), PodAssigned)
    assert (again.pod_set, again.node) == ("worker", "n1")


def test_deleted_unbound_assigned_pod_frees_its_slot_for_a_waiting_one():
    d = PlacementDriver(None, node("n1", cpu="3"))
    one(d.dequeue(RC.model_copy(update={"gate": "suspend"})), GangPlaced)
    for i in range(3):
        d.pod(ray_pod("rc", "worker", i))  # two get slots; the third waits (no room to place it alone)
    waiting = ray_pod("rc", "worker", 2)
    assigned = one(d.pod(ray_pod("rc", "worker", 0), "Deleted"), PodAssigned)
    assert assigned.pod == waiting["metadata"]["name"]


def test_gang_running_once_when_every_gang_pod_is_bound_and_running():
    d = PlacementDriver(None, node("n1", cpu="8"))
    job = workload("default/rc", gang_=gang(pod_set("head", 1, cpu="1"), pod_set("worker", 1, cpu="1"),
                                            pod_set("submitter", 1, in_gang=False, cpu="500m")))
    out = d.dequeue(job)
    assert of_type(d.run(job, out, phase="Pending"), GangRunning) == []
    head = bound(ray_pod("rc", "head", 0, requests={"cpu": "1000m"}), "n1", "Running")
    assert of_type(d.pod(head, "Modified"), GangRunning) == []
    worker = bound(ray_pod("rc", "worker", 0, requests={"cpu": "1000m"}), "n1", "Running")
    running = one(d.pod(worker, "Modified"), GangRunning)
    assert running.key == "default/rc"
    assert of_type(d.pod(head, "Modified"), GangRunning) == []  # once


def test_withdrawn_workload_drops_its_reservations_but_its_pods_count_until_gone():
    d = PlacementDriver(None, node("n1", cpu="3"))
    out = d.dequeue(RC)
    head = bound(ray_pod("rc", "head", 0, requests={"cpu": "1000m"}), "n1", "Running")
    d.pod(ray_pod("rc", "head", 0, requests={"cpu": "1000m"}))
    d.pod(head, "Modified")
    assert not fits(d, "1")
    assert d.withdraw(RC.key) == [TimerSet(key="capacity", at=0.0)]
    assert fits(d, "2") and not fits(d, "3")
    d.pod(head, "Deleted")
    assert fits(d, "3")
    assert out[0].slots[0].pod_set == "head"


def test_pods_left_behind_by_a_withdrawn_workload_lower_the_total_until_gone():
    """A finished RayJob that keeps its cluster: the queue released its quota, so its pods are like
    any pod outside an admitted workload and the queue must not count their room as free."""
    d = PlacementDriver(None, node("n1", cpu="8"))
    out = d.dequeue(RC)
    d.run(RC, out)
    assert d.settle() == []
    d.withdraw(RC.key)
    lowered = one(d.settle(), CapacityChanged)
    assert (lowered.total["cpu"], lowered.released) == (5000, False)
    d.advance(5.0)
    for slot in out[0].slots:
        d.pod(bound(ray_pod("rc", slot.pod_set, slot.index, requests={"cpu": "1000m"}), "n1", "Running"), "Deleted")
    back = one(d.settle(), CapacityChanged)
    assert (back.total["cpu"], back.released) == (8000, True)
    assert d.core.ledger.foreign == {"cpu": 0, "pods": 0}


def test_a_foreign_pod_that_fills_a_slot_stops_lowering_the_total():
    """A pod bound before its workload was admitted counts once: in the workload's quota, not also as foreign."""
    d = PlacementDriver(None, node("n1", cpu="8"))
    early = bound(ray_pod("rc", "head", 0, requests={"cpu": "1"}), "n1", "Running")
    d.pod(early)
    assert one(d.settle(), CapacityChanged).total["cpu"] == 7000
    d.advance(1.0)
    d.dequeue(RC)
    assert one(d.settle(), CapacityChanged).total["cpu"] == 8000


def test_pods_going_away_release_capacity_once_per_instant():
    d = PlacementDriver(None, node("n1", cpu="8"))
    a = pod("a", requests={"cpu": "1"}, node_name="n1")
    b = pod("b", requests={"cpu": "2"}, node_name="n1")
    d.pod(a)
    d.pod(b)
    d.settle()
    d.now = 5.0
    first = d.pod(a, "Deleted")
    second = d.pod(b, "Deleted")
    assert first == [TimerSet(key="capacity", at=5.0)] and second == []
    out = d.settle()
    assert out == [CapacityChanged(total={"cpu": 8000, "memory": 64 * 2**30 * 1000, "pods": 110_000}, nodes=1,
                                   released=True)]


def test_foreign_pods_lower_the_reported_total():
    d = PlacementDriver(None, node("n1", cpu="8"))
    d.pod(pod("other", requests={"cpu": "3", "memory": "1Gi"}, node_name="n1", scheduler="default-scheduler"))
    changed = one(d.settle(), CapacityChanged)
    assert changed.released is False
    assert changed.total == {"cpu": 5000, "memory": 63 * 2**30 * 1000, "pods": 109_000}


def test_managed_pods_do_not_change_the_total():
    d = PlacementDriver(None, node("n1", cpu="8"))
    d.run(RC, d.dequeue(RC))
    assert d.settle() == []


def test_placement_failed_leaves_existing_pods_alone():
    d = PlacementDriver(None, node("n1", cpu="1"))
    d.pod(ray_pod("rc", "head"))
    assert [type(p) for p in d.dequeue(RC)] == [PlacementFailed]


def test_slot_on_a_deleted_node_moves_when_its_pod_is_recreated():
    d = PlacementDriver(None, node("n1", cpu="3"), node("n2", cpu="3"))
    out = d.dequeue(RC)
    assert [s.node for s in out[0].slots] == ["n1", "n1", "n1"]
    d.run(RC, out)
    d.feed(node_changed(node("n1", cpu="3"), "Deleted"))
    for pod_set, index in (("head", 0), ("worker", 0), ("worker", 1)):  # the pod garbage collector
        d.pod(bound(ray_pod("rc", pod_set, index, requests={"cpu": "1000m"}), "n1", "Running"), "Deleted")
    moved = one(d.pod(ray_pod("rc", "worker", 3)), PodAssigned)
    assert (moved.pod_set, moved.node) == ("worker", "n2")
    assert not fits(d, "1")  # n2 holds the three moved slots, the others' pods still to come


# --------------------------------------------------------------------------- a node leaves under a running gang
WIDE = workload("default/wide", gang_=gang(pod_set("head", 1, cpu="1"), pod_set("worker", 3, cpu="2")))


def _lose_node(d: PlacementDriver, out: list, node_name: str, spec=WIDE) -> list[str]:
    """Delete ``node_name`` and the gang's pods on it (PodGC); returns the pod sets of the lost pods."""
    placed = one(out, GangPlaced)
    d.feed(node_changed(node(node_name, cpu="4"), "Deleted"))
    lost = []
    for slot in placed.slots:
        if slot.node == node_name:
            ps = next(p for p in spec.gang.pod_sets if p.name == slot.pod_set)
            requests = {k: f"{v}m" for k, v in ps.resources.items()}
            d.pod(bound(ray_pod(spec.name, slot.pod_set, slot.index, requests=requests), node_name, "Running"), "Deleted")
            lost.append(slot.pod_set)
    return lost


def _recreate(d: PlacementDriver, pod_sets: list[str], first: int = 10) -> list:
    out: list = []
    for i, ps in enumerate(pod_sets):
        out += d.pod(ray_pod("wide", ps, first + i, requests={"cpu": "2"}))
    return out


def test_pods_recreated_after_their_node_left_are_placed_together_or_not_at_all():
    """Room for one of two lost workers: neither is bound (a gang never half-lands again)."""
    d = PlacementDriver(None, node("n1", cpu="4"), node("n2", cpu="4"), node("n3", cpu="4"))
    out = d.dequeue(WIDE)
    assert [s.node for s in one(out, GangPlaced).slots] == ["n1", "n1", "n2", "n2"]
    d.run(WIDE, out)
    d.pod(pod("other", requests={"cpu": "2"}, node_name="n3", scheduler="default-scheduler"))
    lost = _lose_node(d, out, "n2")
    assert lost == ["worker", "worker"]
    assert of_type(_recreate(d, lost), PodAssigned) == []
    out = d.add_node("n4", cpu="4")  # a replacement node: both go, together
    assigned = of_type(out, PodAssigned)
    assert sorted(p.pod for p in assigned) == ["wide-worker-worker-10", "wide-worker-worker-11"]
    assert sorted(p.node for p in assigned) == ["n3", "n4"]


def test_a_replacement_made_before_its_sibling_is_seen_gone_waits_for_it():
    """Real KubeRay re-creates lost workers one request at a time, and the watch may show the first
    replacement before the second lost pod's deletion: a pod still bound to a node that left is going
    too, so its slot is re-placed with the others, all or none (node-removed-gang-replaced on the real tier)."""
    d = PlacementDriver(None, node("n1", cpu="4"), node("n2", cpu="4"), node("n3", cpu="4"))
    out = d.dequeue(WIDE)
    d.run(WIDE, out)
    d.pod(pod("other", requests={"cpu": "2"}, node_name="n3", scheduler="default-scheduler"))
    placed = one(out, GangPlaced)
    d.feed(node_changed(node("n2", cpu="4"), "Deleted"))
    first, second = [s for s in placed.slots if s.node == "n2"]
    d.pod(bound(ray_pod("wide", "worker", first.index, requests={"cpu": "2"}), "n2", "Running"), "Deleted")
    assert of_type(_recreate(d, ["worker"]), PodAssigned) == []  # room on n3 for it, but not for both
    d.pod(bound(ray_pod("wide", "worker", second.index, requests={"cpu": "2"}), "n2", "Running"), "Deleted")
    assert of_type(_recreate(d, ["worker"], first=11), PodAssigned) == []
    assigned = of_type(d.add_node("n4", cpu="4"), PodAssigned)
    assert sorted((p.pod, p.node) for p in assigned) == [("wide-worker-worker-10", "n3"), ("wide-worker-worker-11", "n4")]


def test_displaced_pods_are_retried_when_capacity_is_released():
    d = PlacementDriver(None, node("n1", cpu="4"), node("n2", cpu="4"), node("n3", cpu="4"))
    out = d.dequeue(WIDE)
    d.run(WIDE, out)
    other = pod("other", requests={"cpu": "2"}, node_name="n3", scheduler="default-scheduler")
    d.pod(other)
    assert of_type(_recreate(d, _lose_node(d, out, "n2")), PodAssigned) == []
    d.pod(other, "Deleted")
    assigned = of_type(d.settle(), PodAssigned)  # at the end of the instant, with the capacity signal
    assert [(p.pod, p.node) for p in assigned] == [("wide-worker-worker-10", "n3"), ("wide-worker-worker-11", "n3")]


def test_a_gang_that_lost_pods_is_placed_again_before_a_new_gang():
    d = PlacementDriver(None, node("n1", cpu="4"), node("n2", cpu="4"), node("n3", cpu="4"))
    out = d.dequeue(WIDE)
    d.run(WIDE, out)
    other = pod("other", requests={"cpu": "2"}, node_name="n3", scheduler="default-scheduler")
    d.pod(other)
    _recreate(d, _lose_node(d, out, "n2"))
    d.pod(other, "Deleted")  # capacity is back, and before the end of the instant ...
    newcomer = workload("default/new", gang_=gang(pod_set("head", 1, cpu="4")))
    out = d.dequeue(newcomer)  # ... the queue sends a new gang: the displaced one goes first
    assert [(p.pod, p.node) for p in of_type(out, PodAssigned)] == [
        ("wide-worker-worker-10", "n3"), ("wide-worker-worker-11", "n3")]
    assert one(out, PlacementFailed).key == "default/new"


def test_a_withdrawn_workload_frees_room_for_displaced_pods():
    d = PlacementDriver(None, node("n1", cpu="4"), node("n2", cpu="4"), node("n3", cpu="4"))
    out = d.dequeue(WIDE)
    d.run(WIDE, out)
    holder = workload("default/holder", gang_=gang(pod_set("head", 1, cpu="4")))
    assert [s.node for s in one(d.dequeue(holder), GangPlaced).slots] == ["n3"]  # reserved, no pod yet
    assert of_type(_recreate(d, _lose_node(d, out, "n2")), PodAssigned) == []
    assigned = of_type(d.withdraw("default/holder"), PodAssigned)
    assert [p.node for p in assigned] == ["n3", "n3"]


# --------------------------------------------------------------------------- plain pod gangs of several shapes
MPI = workload("ml/mpi", kind="PodGroup",
               gang_=gang(pod_set("pods", 1, cpu="1", memory="1Gi"), pod_set("pods-2", 2, cpu="2", memory="1Gi")))


def _gang_member(name: str, cpu: str) -> dict:
    return pod(name, "ml", requests={"cpu": cpu, "memory": "1Gi"},
               labels={"pod-group.scheduling.sigs.k8s.io/name": "mpi"})


def test_a_plain_gang_pod_fills_the_slot_of_its_own_shape():
    """Each pod takes a slot reserved for exactly what it asks, whatever order the pods come in."""
    d = PlacementDriver(None, node("n1", cpu="5"))
    members = [_gang_member("worker-0", "2"), _gang_member("launcher", "1"), _gang_member("worker-1", "2")]
    for m in members:
        d.pod(m)
    out = d.dequeue(MPI)
    assert [(p.pod, p.pod_set) for p in of_type(out, PodAssigned)] == [
        ("worker-0", "pods-2"), ("launcher", "pods"), ("worker-1", "pods-2")]


def test_a_plain_gang_pod_of_no_known_shape_fills_no_slot():
    """It would over-commit its node through a smaller pod's reservation: it is placed on its own, if at all."""
    d = PlacementDriver(None, node("n1", cpu="5"))
    d.pod(_gang_member("launcher", "1"))
    d.pod(_gang_member("worker-1", "2"))
    assert of_type(d.dequeue(MPI), PodAssigned) == []  # worker-0 is missing: the gang binds nothing yet
    assert of_type(d.pod(_gang_member("odd", "3")), PodAssigned) == []  # 5 - 1 - 2 x 2 reserved: no room
    assigned = of_type(d.pod(_gang_member("worker-0", "2")), PodAssigned)
    assert [(p.pod, p.pod_set) for p in assigned] == [("launcher", "pods"), ("worker-1", "pods-2"),
                                                       ("worker-0", "pods-2")]


def test_a_running_gang_that_loses_a_pod_is_disrupted_until_whole_again():
    d = PlacementDriver(None, node("n1", cpu="3"), node("n2", cpu="8"))
    d.run(RC, d.dequeue(RC))
    d.pod(bound(ray_pod("rc", "worker", 1), "n1", "Failed"), "Modified")
    assert of_type(d.settle(), GangDisrupted) == []  # judged after the grace
    d.advance(d.now + DISRUPTION_GRACE)
    disrupted = one(d.settle(), GangDisrupted)
    assert disrupted.reason == ("2/3 gang pods Running: pod rc-worker-worker-1 went away;"
                                " waiting for its replacement to be bound and Running")
    again = one(d.pod(ray_pod("rc", "worker", 9)), PodAssigned)
    out = d.pod(bound(ray_pod("rc", "worker", 9), again.node, "Running"), "Modified")
    assert one(out, GangRunning).reason == "3/3 gang pods bound and Running again"


def test_a_gang_whose_workload_leaves_in_the_same_instant_is_not_disrupted():
    d = PlacementDriver(None, node("n1", cpu="3"), node("n2", cpu="8"))
    d.run(RC, d.dequeue(RC))
    d.pod(bound(ray_pod("rc", "worker", 1), "n1", "Running"), "Deleted")
    d.withdraw(RC.key)
    d.advance(d.now + DISRUPTION_GRACE)
    assert of_type(d.settle(), GangDisrupted) == []


def test_a_gang_whose_workload_leaves_within_the_grace_is_not_disrupted():
    """On a deployment the garbage collector's deletions of the pods come straight from the watch, the
    workload's own through admission and the queue, often later (and after a relist in any order)."""
    d = PlacementDriver(None, node("n1", cpu="3"), node("n2", cpu="8"))
    d.run(RC, d.dequeue(RC))
    for i in range(3):
        d.pod(bound(ray_pod("rc", "worker", i), "n1", "Running"), "Deleted")
    d.advance(d.now + DISRUPTION_GRACE / 2)
    assert RC.key in d.core.disruptions.suspects
    d.withdraw(RC.key)
    d.advance(d.now + DISRUPTION_GRACE)
    assert of_type(d.settle(), GangDisrupted) == []
    assert d.core.disruptions.suspects == {}


def test_pods_of_another_kind_under_the_same_name_are_not_the_workloads():
    """A RayJob and a (rejected) RayCluster may share a name; only the RayJob's pods fill its slots."""
    job = workload("default/rc", kind="RayJob", gate="suspend",
                   gang_=gang(pod_set("head", 1, cpu="1"), pod_set("worker", 2, cpu="1")))
    d = PlacementDriver(None, node("n1", cpu="8"))
    stranger = ray_pod("rc", "worker", 7, requests={"cpu": "3"})
    stranger["metadata"]["labels"].update({kube.RAY_ORIGIN_KIND: "RayCluster", kube.RAY_ORIGIN_NAME: "rc"})
    assert d.pod(stranger) == []
    out = d.dequeue(job)
    assert of_type(out, PodAssigned) == []  # the slots wait for the RayJob's own pods
    own = ray_pod("rc", "worker", 0)
    own["metadata"]["labels"].update({kube.RAY_ORIGIN_KIND: "RayJob", kube.RAY_ORIGIN_NAME: "rc"})
    assert one(d.pod(own), PodAssigned).pod == "rc-worker-worker-0"


def test_pods_for_a_scheduler_muster_does_not_answer_to_are_never_assigned():
    d = PlacementDriver(Policy(scheduler_names=["muster"]), node("n1", cpu="8"))
    theirs = [ray_pod("rc", "head", scheduler="volcano"), ray_pod("rc", "worker", 0, scheduler="volcano"),
              ray_pod("rc", "worker", 1, scheduler="volcano")]
    for p in theirs:
        d.pod(p)
    out = d.dequeue(RC)
    assert [type(p) for p in out] == [GangPlaced]  # left to their scheduler: no PodAssigned
    assert of_type(d.pod(ray_pod("rc", "worker", 1, name="late", scheduler="volcano")), PodAssigned) == []


def test_answering_to_their_scheduler_assigns_them():
    d = PlacementDriver(Policy(scheduler_names=["muster", "volcano"]), node("n1", cpu="8"))
    for p in (ray_pod("rc", "head", scheduler="volcano"), ray_pod("rc", "worker", 0, scheduler="volcano"),
              ray_pod("rc", "worker", 1, scheduler="volcano")):
        d.pod(p)
    assert len(of_type(d.dequeue(RC), PodAssigned)) == 3


def test_pods_another_scheduler_bound_fill_the_slots_where_they_landed():
    d = PlacementDriver(Policy(scheduler_names=["muster"]), node("n1", cpu="4"), node("n2", cpu="4"))
    placed = one(d.dequeue(RC), GangPlaced)
    assert {s.node for s in placed.slots} == {"n1"}
    out = []
    for p in (ray_pod("rc", "head", scheduler="default-scheduler"),
              ray_pod("rc", "worker", 0, scheduler="default-scheduler"),
              ray_pod("rc", "worker", 1, scheduler="default-scheduler")):
        assert of_type(d.pod(p), PodAssigned) == []
        out += d.pod(bound(p, "n2", "Running"), "Modified")
    assert one(out, GangRunning).key == "default/rc"
    assert fits(d, "4")  # n1's reservations went with the slots the pods filled on n2
    two_nodes = workload("ns/two", gang_=gang(pod_set("head", 2, cpu="4")))
    assert of_type(d.dequeue(two_nodes), GangPlaced) == []  # and n2 holds the pods: 3 of its 4 CPU


# --------------------------------------------------------------------------- facts of a later version
_VALUES = st.sampled_from(["1", "2", 1, 1.0, True, 0, False, -0.0, 0.0, None, "ray-a", "ray-b"])
_LABELS = st.dictionaries(st.sampled_from([kube.RAY_CLUSTER, kube.RAY_ORIGIN_KIND, kube.RAY_ORIGIN_NAME,
                                           kube.RAY_NODE_TYPE, kube.POD_GROUP_NAME, "x"]),
                          st.one_of(_VALUES, st.sampled_from(["RayJob", "head", "worker"])), max_size=4)
_ANNOTATIONS = st.dictionaries(st.sampled_from([kube.GPU_FRACTION, kube.VOLCANO_GROUP, GPU_DEVICES]),
                               st.one_of(_VALUES, st.sampled_from(["0.5", "0,1"])), max_size=2)
_VERSION = st.fixed_dictionaries({
    "labels": _LABELS, "annotations": _ANNOTATIONS, "cpu": _VALUES,
    "node": st.sampled_from(["", "n1", "n2"]), "phase": st.sampled_from(["Pending", "Running", "Succeeded"]),
    "scheduler": st.sampled_from(["muster", "volcano", 1, None]), "namespace": st.sampled_from(["ns", "", 1, None]),
})


def _version(v: dict) -> dict:
    obj = pod("p", "ns", requests={"cpu": v["cpu"]}, node_name=v["node"], labels=v["labels"],
              annotations=v["annotations"], phase=v["phase"])
    obj["spec"]["schedulerName"] = v["scheduler"]
    obj["metadata"]["namespace"] = v["namespace"]
    return obj


@settings(max_examples=400, deadline=None)
@given(st.lists(_VERSION, min_size=2, max_size=4), st.sampled_from(["Modified", "Deleted"]))
def test_facts_of_a_later_version_are_those_read_afresh(versions, change):
    """Reading a pod's later version against the facts of the one before (only node, phase and
    liveness read again when the rest is the same text) gives the facts reading it afresh gives,
    whatever the values: ``1``, ``1.0`` and ``true`` are equal but do not read alike."""
    answers = Policy().answers_to
    objects = [_version(v) for v in versions]
    facts = pod_facts("Added", objects[0], "p", "ev", answers)
    for before, obj in zip(objects, objects[1:]):
        fresh = pod_facts(change, obj, "p", "ev", answers)
        facts = pod_facts(change, obj, "p", "ev", answers, before=(facts, before))
        assert facts == fresh


def test_a_later_version_equal_in_text_reuses_what_was_read():
    answers = Policy().answers_to
    first = ray_pod("rc", "head")
    facts = pod_facts("Added", first, "rc-head", "default", answers)
    later = with_phase(bound(first, "n1"), "Running")
    again = pod_facts("Modified", later, "rc-head", "default", answers, before=(facts, first))
    assert again.requests is facts.requests and facts.text_only  # nothing but node and phase read again
    assert (again.node_name, again.phase, again.live) == ("n1", "Running", True)
    relabelled = {**later, "metadata": {**later["metadata"], "labels": {**later["metadata"]["labels"], "x": 1}}}
    assert not pod_facts("Modified", relabelled, "rc-head", "default", answers, before=(again, later)).text_only
