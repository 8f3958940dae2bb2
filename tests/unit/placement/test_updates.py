"""Edits of an admitted workload: slots follow what was admitted; a shrink drops the surplus slots."""

from __future__ import annotations

from services.placement.disruption import DISRUPTION_GRACE
from shared.kernel.events import CapacityChanged, GangDisrupted, GangRunning, PodAssigned, TimerSet
from tests.builders import gang, node, pod_set, workload
from tests.builders.placement import PlacementDriver, bound, fits, of_type, one, ray_pod


def rc(workers: int, key: str = "default/rc"):
    return workload(key, gang_=gang(pod_set("head", 1, cpu="1"), pod_set("worker", workers, cpu="1")))


def worker(i: int, node_name: str = "n1", phase: str = "Running") -> dict:
    return bound(ray_pod("rc", "worker", i, requests={"cpu": "1000m"}), node_name, phase)


def _running(cpu: str = "5", workers: int = 4) -> tuple[PlacementDriver, list]:
    d = PlacementDriver(None, node("n1", cpu=cpu))
    out = d.dequeue(rc(workers))
    d.run(rc(workers), out)
    d.settle()
    return d, out


def test_a_shrink_drops_filled_surplus_slots_when_kuberay_deletes_their_pods():
    d, _ = _running()
    assert not fits(d, "1")
    out = d.update(rc(1))
    assert out == [TimerSet(key="capacity", at=0.0)]  # a release: what waits may retry
    assert one(d.settle(), CapacityChanged).released
    d.now = 1.0
    for i in (1, 2, 3):
        gone = d.pod(worker(i), "Deleted")
        assert [t.key for t in of_type(gone, TimerSet)] in ([], ["capacity"])  # never "disruption"
    out = d.settle()
    assert of_type(out, GangDisrupted) == [] and one(out, CapacityChanged).released
    assert fits(d, "3") and not fits(d, "4")  # nothing re-reserved for replacements that never come


def test_pods_deleted_before_the_update_arrives_leave_no_reservation_and_no_disruption():
    d, _ = _running()
    d.now = 1.0
    for i in (1, 2, 3):
        d.pod(worker(i), "Deleted")  # KubeRay acts on the edit before placement hears of it
    assert not fits(d, "1")  # for now the freed slots wait for replacements
    d.update(rc(1))
    out = d.settle()
    assert of_type(out, GangDisrupted) == [] and one(out, CapacityChanged).released
    assert fits(d, "3") and not fits(d, "4")


def test_unfilled_surplus_slots_go_first_and_release_their_reservations():
    d = PlacementDriver(None, node("n1", cpu="8"))
    d.dequeue(rc(4))  # reserves 5
    for obj in (ray_pod("rc", "head", 0, requests={"cpu": "1000m"}), ray_pod("rc", "worker", 0, requests={"cpu": "1000m"})):
        d.pod(obj)
        d.pod(bound(obj, "n1", "Running"), "Modified")
    assert fits(d, "3") and not fits(d, "4")
    d.update(rc(2))  # two of the three unfilled worker slots go at once
    assert fits(d, "5") and not fits(d, "6")
    assert one(d.pod(ray_pod("rc", "worker", 7)), PodAssigned).node == "n1"  # the one slot left
    assert d.pod(ray_pod("rc", "worker", 8)) == []  # beyond the slots: waits unbound
    assert fits(d, "5") and not fits(d, "6")


def test_a_grow_keeps_the_admitted_slots_and_the_pods_beyond_them_wait_unbound():
    d, _ = _running(cpu="8", workers=1)
    assert d.update(rc(4)) == []
    d.now = 30.0
    for i in (5, 6, 7):
        assert d.pod(ray_pod("rc", "worker", i)) == []  # never placed by muster: no PodAssigned, no quota
    assert fits(d, "6") and not fits(d, "7")


def test_an_update_of_a_workload_placement_does_not_hold_changes_nothing():
    d = PlacementDriver(None, node("n1", cpu="2"))
    assert d.update(rc(1)) == []
    d.dequeue(rc(4))  # does not fit: not admitted
    assert d.update(rc(1)) == []
    assert fits(d, "2")


def test_dropping_the_missing_member_makes_a_disrupted_gang_whole_again():
    d, _ = _running()
    d.now = 1.0
    d.pod(worker(3, phase="Failed"), "Modified")
    d.advance(1.0 + DISRUPTION_GRACE)
    assert one(d.settle(), GangDisrupted).reason.startswith("4/5 gang pods Running")
    d.now = 4.0
    out = d.update(rc(3))
    assert one(out, GangRunning).reason == "4/4 gang pods bound and Running again"
    assert fits(d, "1") and not fits(d, "2")
