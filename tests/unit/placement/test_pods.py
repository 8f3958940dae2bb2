"""Pods: every bound live pod counts; pods of a placed gang fill its slots; GangRunning."""

from __future__ import annotations

from shared.events import (
    CapacityChanged, GangPlaced, GangRunning, GpuAssignment, PlacementFailed, PodAssigned, TimerSet, derive_id,
)
from tests.builders import gang, node, pod, pod_set, workload
from tests.builders.placement import PlacementDriver, bound, node_changed, of_type, one, ray_pod, with_phase

RC = workload("default/rc", gang_=gang(pod_set("head", 1, cpu="1"), pod_set("worker", 2, cpu="1")))


def fits(d: PlacementDriver, cpu: str, key: str = "ns/probe") -> bool:
    out = d.dequeue(workload(key, gang_=gang(pod_set("head", 1, cpu=cpu))))
    if any(isinstance(p, GangPlaced) for p in out):
        d.withdraw(key)
        return True
    return False


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
    w = workload("default/half", gang_=gang(pod_set("worker", 2, cpu="1", gpu_share=500)))
    d.dequeue(w)
    assigned = one(d.pod(ray_pod("half", "worker", 0, gpu_fraction="0.5")), PodAssigned)
    assert assigned.gpu == GpuAssignment(devices=(0,), fraction=0.5, group=derive_id("default/half", "n1", 0))


def test_filled_slots_are_not_counted_twice():
    d = PlacementDriver(None, node("n1", cpu="4"))
    out = d.dequeue(RC)
    d.run(RC, out)
    assert fits(d, "1")
    assert not fits(d, "2")


def test_pods_beyond_the_slots_are_placed_alone_if_they_fit_else_left():
    d = PlacementDriver(None, node("n1", cpu="4"))
    out = d.dequeue(RC)
    d.run(RC, out)
    extra = one(d.pod(ray_pod("rc", "worker", 5)), PodAssigned)
    assert (extra.pod_set, extra.node) == ("worker", "n1")
    assert d.pod(ray_pod("rc", "worker", 6)) == []  # the node is full now
    assert not fits(d, "1")


def test_recreated_pod_gets_the_slot_back_and_capacity_stays_reserved():
    d = PlacementDriver(None, node("n1", cpu="3"), node("n2", cpu="8"))
    out = d.dequeue(RC)
    d.run(RC, out)
    crashed = bound(ray_pod("rc", "worker", 1), "n1", "Failed")
    out = d.pod(crashed, "Modified")
    assert of_type(out, TimerSet) == []  # the slot reserves again: nothing was released
    assert fits(d, "8") and not fits(d, "9")  # n1 stays full, n2 free
    again = one(d.pod(ray_pod("rc", "worker", 9)), PodAssigned)
    assert (again.pod_set, again.node) == ("worker", "n1")


def test_deleted_unbound_assigned_pod_frees_its_slot_for_a_waiting_one():
    d = PlacementDriver(None, node("n1", cpu="3"))
    one(d.dequeue(RC), GangPlaced)
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
    assert d.withdraw(RC.key) == []
    assert fits(d, "2") and not fits(d, "3")
    d.pod(head, "Deleted")
    assert fits(d, "3")
    assert out[0].slots[0].pod_set == "head"


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
    gone = bound(ray_pod("rc", "worker", 0, requests={"cpu": "1000m"}), "n1", "Running")
    d.pod(gone, "Deleted")  # the pod garbage collector removes pods of a gone node
    moved = one(d.pod(ray_pod("rc", "worker", 3)), PodAssigned)
    assert (moved.pod_set, moved.node) == ("worker", "n2")
    assert fits(d, "2") and not fits(d, "3")  # n2 holds the moved slot only
