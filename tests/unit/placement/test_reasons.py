"""Failure reasons: Volcano's gang line plus kube-scheduler's node histogram, with exact numbers."""

from __future__ import annotations

from shared.kernel.events import CapacityChanged, GangPlaced, PlacementFailed
from tests.builders import gang, node, pod_set, workload
from tests.builders.placement import PlacementDriver, constrained, one

GANG_31 = gang(pod_set("head", 1, cpu="1"), pod_set("small-group", 30, cpu="1"),
               pod_set("submitter", 1, in_gang=False, cpu="500m", memory="200Mi"))


def test_kube_queue_gang_insufficient_then_a_node_joins():
    d = PlacementDriver(None, *(node(f"node-{c}", cpu="8", memory="32Gi") for c in "abc"))
    job = workload("algorithm-text/rayjob-sample", kind="RayJob", gate="suspend", gang_=GANG_31)
    failed = one(d.dequeue(job), PlacementFailed)
    assert failed.reason == (
        "31/31 tasks in gang unschedulable: pod group is not ready, 31 Pending, 31 minAvailable; "
        "8/32 tasks could not be placed: 0/3 nodes are available: 3 Insufficient cpu. It can never fit in the "
        "cluster as it is: the gang needs cpu 31500m, the nodes have cpu 24 in all (it waits for nodes to join or change).")
    assert failed.capacity_short is True
    joined = one(d.add_node("node-d", cpu="16", memory="64Gi"), CapacityChanged)
    assert joined.released is True and joined.total["cpu"] == 40_000 and joined.nodes == 4
    placed = one(d.dequeue(job), GangPlaced)
    assert len(placed.slots) == 32
    assert [s.node for s in placed.slots].count("node-d") == 8


def test_histogram_counts_each_node_once_per_filter_sorted_as_strings():
    d = PlacementDriver(None,
                        node("t1", taints=[{"key": "team", "value": "a", "effect": "NoSchedule"}]),
                        node("t2", taints=[{"key": "team", "value": "a", "effect": "NoExecute"}]),
                        node("off", unschedulable=True),
                        node("small", cpu="1", memory="1Gi"),
                        node("tiny", cpu="1", memory="64Gi"),
                        node("elsewhere", labels={"zone": "b"}, cpu="1"))
    ps = constrained(pod_set("head", 1, cpu="2", memory="2Gi"), affinity=None)
    failed = one(d.dequeue(workload("ns/w", gang_=gang(ps))), PlacementFailed)
    assert failed.reason == (
        "1/1 tasks in gang unschedulable: pod group is not ready, 1 Pending, 1 minAvailable; "
        "1/1 tasks could not be placed: 0/6 nodes are available: 1 Insufficient memory, 1 node(s) were "
        "unschedulable, 2 node(s) had untolerated taint(s), 3 Insufficient cpu. It can never fit in the "
        "cluster as it is: a head pod needs cpu 2, the largest node it may use has cpu 1 (it waits for nodes to "
        "join or change).")


def test_selector_misses_are_not_capacity_shortages():
    d = PlacementDriver(None, node("n1"), node("n2"))
    ps = constrained(pod_set("head", 1, cpu="1"), node_selector={"zone": "nowhere"})
    failed = one(d.dequeue(workload("ns/w", gang_=gang(ps))), PlacementFailed)
    assert failed.reason.endswith("0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.")
    assert failed.capacity_short is False


def test_histogram_is_taken_when_the_first_pod_failed_and_counts_all_misfits():
    # head fits; 2 of 3 workers fit; the submitter (other shape) fits nowhere either.
    d = PlacementDriver(None, node("n1", cpu="3"))
    g = gang(pod_set("head", 1, cpu="1"), pod_set("worker", 3, cpu="1"),
             pod_set("submitter", 1, in_gang=False, cpu="2"))
    failed = one(d.dequeue(workload("ns/w", gang_=g)), PlacementFailed)
    assert failed.reason == (
        "4/4 tasks in gang unschedulable: pod group is not ready, 4 Pending, 4 minAvailable; "
        "2/5 tasks could not be placed: 0/1 nodes are available: 1 Insufficient cpu. It can never fit in the "
        "cluster as it is: the gang needs cpu 6, the nodes have cpu 3 in all (it waits for nodes to join or change).")


def test_no_nodes_at_all():
    failed = one(PlacementDriver().dequeue(workload("ns/w")), PlacementFailed)
    assert failed.reason.endswith("1/1 tasks could not be placed: 0/0 nodes are available.")


# --------------------------------------------------------------------------- larger than the cluster as it is
NEVER = "It can never fit in the cluster as it is"


def test_a_pod_larger_than_every_node_it_may_use_says_so_and_waits_for_room():
    """The nodes its selector rules out do not count, however large: "the largest node it may use"."""
    d = PlacementDriver(None, node("big", cpu="64", memory="256Gi"),
                        node("small-1", cpu="8", labels={"pool": "small"}), node("small-2", cpu="4", labels={"pool": "small"}))
    ps = constrained(pod_set("worker", 2, cpu="12"), node_selector={"pool": "small"})
    failed = one(d.dequeue(workload("ns/w", gang_=gang(pod_set("head", 1, cpu="1"), ps))), PlacementFailed)
    assert failed.reason.endswith(f"{NEVER}: a worker pod needs cpu 12, the largest node it may use has cpu 8 "
                                  "(it waits for nodes to join or change).")
    assert failed.capacity_short is True and failed.room_key  # a node joining wakes it


def test_a_gang_larger_than_all_nodes_together_says_so_though_each_pod_fits_one():
    d = PlacementDriver(None, node("n1", cpu="8"), node("n2", cpu="8"))
    failed = one(d.dequeue(workload("ns/w", gang_=gang(pod_set("worker", 3, cpu="6")))), PlacementFailed)
    assert failed.reason.endswith(f"{NEVER}: the gang needs cpu 18, the nodes have cpu 16 in all "
                                  "(it waits for nodes to join or change).")
    placed = d.add_node("n3", cpu="8")
    assert one(placed, CapacityChanged).room is None
    assert one(d.dequeue(workload("ns/w", gang_=gang(pod_set("worker", 3, cpu="6")))), GangPlaced)


def test_a_gang_that_only_lacks_free_room_or_a_packing_is_not_said_to_never_fit():
    """Busy nodes, and pods that cannot pack though the totals hold them, may fit later or not at all:
    only what is sure is said."""
    d = PlacementDriver(None, node("n1", cpu="8"), node("n2", cpu="8"))
    first = workload("ns/first", gang_=gang(pod_set("head", 1, cpu="8")))
    one(d.dequeue(first), GangPlaced)
    busy = one(d.dequeue(workload("ns/busy", gang_=gang(pod_set("worker", 2, cpu="8")))), PlacementFailed)
    assert NEVER not in busy.reason
    packing = one(d.dequeue(workload("ns/pack", gang_=gang(pod_set("worker", 3, cpu="5")))), PlacementFailed)
    assert NEVER not in packing.reason  # 15 of 16 CPUs, yet 5 + 5 never fit one node of 8

