"""Whole gangs: all or nothing, slots per pod, order, binpack vs spread, the ``pods`` resource."""

from __future__ import annotations

from shared.kernel.events import GangPlaced, PlacementFailed, SlotAssignment
from shared.kernel.policy import Policy, QueuePolicy
from tests.builders import gang, node, pod_set, workload
from tests.builders.placement import PlacementDriver, node_changed, one


def test_gang_placed_with_one_slot_per_pod_head_first_submitter_last():
    d = PlacementDriver(None, node("n1", cpu="16"))
    w = workload("ns/rj", gang_=gang(pod_set("submitter", 1, in_gang=False, cpu="500m"),
                                     pod_set("worker", 2, cpu="1"), pod_set("head", 1, cpu="1")))
    placed = one(d.dequeue(w), GangPlaced)
    assert placed.slots == (
        SlotAssignment(pod_set="head", index=0, node="n1"),
        SlotAssignment(pod_set="worker", index=0, node="n1"),
        SlotAssignment(pod_set="worker", index=1, node="n1"),
        SlotAssignment(pod_set="submitter", index=0, node="n1"),
    )
    assert (placed.key, placed.queue, placed.kind, placed.gate) == ("ns/rj", "default", "RayCluster", "pods")
    assert placed.reason == "4/4 pods placed on 1 node(s) (binpack)"


def test_all_or_nothing_failure_reserves_nothing():
    d = PlacementDriver(None, node("n1", cpu="4"), node("n2", cpu="4"))
    big = workload("ns/big", gang_=gang(pod_set("head", 1, cpu="3"), pod_set("worker", 3, cpu="2")))
    out = d.dequeue(big)
    assert [type(p) for p in out] == [PlacementFailed]
    # Exactly the whole cluster is still free: 8 one-CPU pods fit, a 9th would not.
    exact = workload("ns/exact", gang_=gang(pod_set("worker", 8, cpu="1")))
    assert len(one(d.dequeue(exact), GangPlaced).slots) == 8
    assert [type(p) for p in d.dequeue(workload("ns/more"))] == [PlacementFailed]


def test_binpack_fills_the_most_allocated_node_first():
    d = PlacementDriver(None, node("n1", cpu="8"), node("n2", cpu="8"), node("n3", cpu="8"))
    one(d.dequeue(workload("ns/first", gang_=gang(pod_set("head", 1, cpu="2")))), GangPlaced)  # lands on n1
    d.add_node("n0", cpu="8")
    placed = one(d.dequeue(workload("ns/w", gang_=gang(pod_set("worker", 4, cpu="2")))), GangPlaced)
    assert [s.node for s in placed.slots] == ["n1", "n1", "n1", "n2"]


def test_spread_takes_the_least_allocated_node_ties_by_node_order():
    d = PlacementDriver(Policy(placement="spread"), node("n1", cpu="8"), node("n2", cpu="8"), node("n3", cpu="8"))
    placed = one(d.dequeue(workload("ns/w", gang_=gang(pod_set("worker", 4, cpu="2")))), GangPlaced)
    assert [s.node for s in placed.slots] == ["n1", "n2", "n3", "n1"]
    assert placed.reason == "4/4 pods placed on 3 node(s) (spread)"


def test_strategy_is_chosen_per_queue():
    policy = Policy(queues={"spready": QueuePolicy(placement="spread")})
    d = PlacementDriver(policy, node("n1", cpu="8"), node("n2", cpu="8"))
    packed = one(d.dequeue(workload("ns/a", queue="packy", gang_=gang(pod_set("worker", 2, cpu="1")))), GangPlaced)
    spread = one(d.dequeue(workload("ns/b", queue="spready", gang_=gang(pod_set("worker", 2, cpu="1")))), GangPlaced)
    assert [s.node for s in packed.slots] == ["n1", "n1"]
    assert [s.node for s in spread.slots] == ["n2", "n2"]  # n2 stays the emptier node: 2/8 vs 3/8


def test_binpack_scores_every_requested_resource():
    # n1 is emptier in cpu but fuller in memory than n2: the sum of utilisations decides.
    d = PlacementDriver(None, node("n1", cpu="8", memory="8Gi"), node("n2", cpu="8", memory="64Gi"))
    placed = one(d.dequeue(workload("ns/w", gang_=gang(pod_set("head", 1, cpu="1", memory="4Gi")))), GangPlaced)
    assert placed.slots[0].node == "n1"


def test_pods_resource_counts_one_per_pod():
    d = PlacementDriver(None, node("n1", cpu="64", pods="2"))
    out = d.dequeue(workload("ns/w", gang_=gang(pod_set("worker", 3, cpu="1"))))
    failed = one(out, PlacementFailed)
    assert failed.reason.endswith("1/3 tasks could not be placed: 0/1 nodes are available: 1 Too many pods. It "
                                  "can never fit in the cluster as it is: the gang needs pods 3, the nodes have "
                                  "pods 2 in all (it waits for nodes to join or change).")


def test_node_without_pods_capacity_gets_the_kubelet_default_of_110():
    d = PlacementDriver()
    obj = node("n1", cpu="1000")
    del obj["status"]["allocatable"]["pods"]
    del obj["status"]["capacity"]["pods"]
    d.feed(node_changed(obj))
    assert len(one(d.dequeue(workload("ns/w", gang_=gang(pod_set("worker", 110, cpu="1")))), GangPlaced).slots) == 110
    assert isinstance(d.dequeue(workload("ns/x"))[0], PlacementFailed)


def test_a_dequeued_for_an_admitted_gang_repeats_the_placement_and_reserves_nothing_twice():
    """A copy of the same envelope never reaches the core (``shared.runtime.service.Service`` drops it:
    tests/unit/bus/test_service.py); a new request for a gang already placed is answered again."""
    from tests.builders import envelope
    from shared.kernel.events import Dequeued

    d = PlacementDriver(None, node("n1", cpu="4"))
    w = workload("ns/w")
    first = d.core.handle(envelope(Dequeued(key=w.key, queue="default", workload=w, reason="r")))
    assert [type(p) for p in first] == [GangPlaced]
    again = one(d.dequeue(w), GangPlaced)
    assert again == first[0]
    # Nothing was reserved twice: three more one-CPU pods fit on the 4-CPU node.
    assert isinstance(d.dequeue(workload("ns/x", gang_=gang(pod_set("worker", 3, cpu="1"))))[0], GangPlaced)


def test_same_inputs_same_outputs():
    def play() -> list:
        d = PlacementDriver(None, *(node(f"n{i}", cpu="8", gpu="2") for i in range(5)))
        out = []
        for i in range(6):
            out += d.dequeue(workload(f"ns/w{i}", gang_=gang(pod_set("head", 1, cpu="1"),
                                                             pod_set("gpu", 3, cpu="2", gpu_share=300 + 100 * i))))
        return out

    assert play() == play()
