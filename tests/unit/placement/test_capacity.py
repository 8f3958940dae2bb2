"""CapacityChanged: node set and allocatable changes; released when schedulable capacity grew."""

from __future__ import annotations

from shared.events import CapacityChanged, GangPlaced, PlacementFailed
from tests.builders import gang, node, pod_set, workload
from tests.builders.placement import PlacementDriver, node_changed, one

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
