"""CapacityChanged: node set and allocatable changes; released when schedulable capacity grew."""

from __future__ import annotations

from services.reconciler.ingest import observe
from shared.kernel.events import CapacityChanged, GangPlaced, ObjectChanged, PlacementFailed
from tests.builders import gang, node, pod_set, workload
from tests.builders.placement import PlacementDriver, fits, node_changed, one, ray_pod

GI = 2**30 * 1000


def test_node_added_modified_deleted():
    d = PlacementDriver()
    added = one(d.feed(node_changed(node("n1", cpu="8", memory="32Gi", gpu="2"))), CapacityChanged)
    assert added == CapacityChanged(total={"cpu": 8000, "memory": 32 * GI, "pods": 110_000, "nvidia.com/gpu": 2000},
                                    nodes=1, released=True)
    assert d.feed(node_changed(node("n1", cpu="8", memory="32Gi", gpu="2"), "Modified")) == []
    shrunk = one(d.feed(node_changed(node("n1", cpu="4", memory="32Gi", gpu="2"), "Modified")), CapacityChanged)
    assert (shrunk.total["cpu"], shrunk.released) == (4000, False)
    grown = one(d.feed(node_changed(node("n1", cpu="6", memory="32Gi", gpu="2"), "Modified")), CapacityChanged)
    assert (grown.total["cpu"], grown.released) == (6000, True)
    second = one(d.add_node("n2", cpu="2", memory="1Gi"), CapacityChanged)
    assert (second.total["cpu"], second.total["memory"], second.nodes) == (8000, 33 * GI, 2)
    gone = one(d.feed(node_changed(node("n1"), "Deleted")), CapacityChanged)
    assert gone == CapacityChanged(total={"cpu": 2000, "memory": GI, "pods": 110_000}, nodes=1, released=False)


def test_cordoned_nodes_are_not_schedulable_capacity():
    d = PlacementDriver(None, node("n1", cpu="8"))
    cordoned = one(d.feed(node_changed(node("n1", cpu="8", unschedulable=True), "Modified")), CapacityChanged)
    assert (cordoned.total, cordoned.nodes, cordoned.released) == ({}, 0, False)
    uncordoned = one(d.feed(node_changed(node("n1", cpu="8"), "Modified")), CapacityChanged)
    assert (uncordoned.total["cpu"], uncordoned.nodes, uncordoned.released) == (8000, 1, True)


def test_taint_removed_is_a_release():
    taint = [{"key": "k", "value": "v", "effect": "NoSchedule"}]
    d = PlacementDriver(None, node("n1", taints=taint))
    assert isinstance(d.dequeue(workload("ns/a"))[0], PlacementFailed)
    changed = one(d.feed(node_changed(node("n1"), "Modified")), CapacityChanged)
    assert changed.released is True
    assert isinstance(d.dequeue(workload("ns/a"))[0], GangPlaced)


def test_deleted_node_takes_no_more_pods_and_readding_keeps_its_order():
    d = PlacementDriver(None, node("n1", cpu="8"), node("n2", cpu="8"))
    d.feed(node_changed(node("n1"), "Deleted"))
    assert one(d.dequeue(workload("ns/a")), GangPlaced).slots[0].node == "n2"
    d.add_node("n1", cpu="8")
    placed = one(d.dequeue(workload("ns/b", gang_=gang(pod_set("head", 1, cpu="8")))), GangPlaced)
    assert placed.slots[0].node == "n1"


def _refused(obj: dict, change: str = "Modified") -> ObjectChanged:
    """What ingest sends for ``obj`` once a label value breaks the API server's bounds."""
    bad = {**obj, "metadata": {**obj["metadata"], "labels": {**obj["metadata"].get("labels", {}), "x": "y" * 64}}}
    return observe(change, bad)


def test_a_refused_node_is_left_out_of_scheduling_and_its_pods_stay_charged_until_it_can_be_read():
    d = PlacementDriver(None, node("n1", cpu="8"), node("n2", cpu="4"))
    spec = workload("ns/a", gang_=gang(pod_set("head", 1, cpu="6")))
    placed = d.dequeue(spec)
    assert one(placed, GangPlaced).slots[0].node == "n1"
    d.run(spec, placed)
    out = one(d.feed(_refused(node("n1", cpu="8"))), CapacityChanged)
    assert (out.total["cpu"], out.nodes, out.released) == (4000, 1, False)
    assert d.feed(_refused(node("n1", cpu="8"))) == []  # once
    assert one(d.dequeue(workload("ns/b", gang_=gang(pod_set("head", 1, cpu="4")))), GangPlaced).slots[0].node == "n2"
    assert not fits(d, "1")  # n1 has 2 cpu free, but takes nothing while it cannot be read
    back = one(d.feed(node_changed(node("n1", cpu="8"), "Modified")), CapacityChanged)
    assert (back.total["cpu"], back.nodes, back.released) == (12000, 2, True)
    assert not fits(d, "3")  # n1's pod stayed charged all along: 2 free there, none on n2
    assert fits(d, "2")


def test_a_node_refused_on_first_sight_offers_nothing():
    d = PlacementDriver()
    out = one(d.feed(_refused(node("n1", cpu="8"), "Added")), CapacityChanged)
    assert (out.total, out.nodes) == ({}, 0)
    assert not fits(d, "1")


def test_a_refused_version_of_a_bound_pod_leaves_its_last_readable_version_charged():
    d = PlacementDriver(None, node("n1", cpu="4"))
    spec = workload("ns/a", gang_=gang(pod_set("head", 1, cpu="3")))
    placed = d.dequeue(spec)
    d.run(spec, placed)
    pod = ray_pod("a", "head", 0, namespace="ns", requests={"cpu": "3000m"}, node_name="n1", phase="Running")
    assert d.feed(_refused(pod)) == []
    assert not fits(d, "2")  # still charged: 1 cpu left
    assert fits(d, "1")
