"""Stale gangs: a running gang of a KAI queue that stays below its minimum past the staleness grace
period is evicted (KAI's ``stalegangeviction`` action, NVIDIA/KAI-Scheduler
``pkg/scheduler/actions/stalegangeviction``: "Don't evict recently stale job", "Evict long-ago stale job",
"Don't evict non-stale job"); in any other queue it keeps its place until it is whole again."""

from __future__ import annotations

from services.placement.disruption import DISRUPTION_GRACE
from shared.kernel.events import GangDisrupted, GangEvicted, GangPlaced, GangRunning, PodAssigned, QueueDefined
from shared.kernel.policy import Policy
from tests.builders import gang, node, pod_set, queue_spec, workload
from tests.builders.placement import PlacementDriver, bound, fits, node_changed, of_type, one, ray_pod

# head + 2 workers: the head on n2, the workers on n1 (binpack fills the node each pod leaves fullest)
RC = workload("team/rc", queue="q", gang_=gang(pod_set("head", 1, cpu="2"), pod_set("worker", 2, cpu="2")))
REPLACEMENT = ray_pod("rc", "head", 7, namespace="team", requests={"cpu": "2"})


def running(dialect: str, policy: Policy | None = None) -> PlacementDriver:
    """RC Running on n2 (head) and n1 (workers), in a queue of ``dialect``; n2 leaves at 10s and takes the
    head with it; the recreated head finds no room (n1 is full)."""
    d = PlacementDriver(policy, node("n1", cpu="4"), node("n2", cpu="2"))
    d.feed(QueueDefined(queue=queue_spec("q", dialect=dialect)))
    out = d.dequeue(RC)
    assert [s.node for s in one(out, GangPlaced).slots] == ["n2", "n1", "n1"]
    d.run(RC, out)
    d.advance(10.0)
    d.feed(node_changed(node("n2", cpu="2"), "Deleted"))
    d.pod(bound(ray_pod("rc", "head", 0, namespace="team", requests={"cpu": "2"}), "n2", "Running"), "Deleted")
    assert of_type(d.pod(REPLACEMENT), PodAssigned) == []
    d.advance(10.0 + DISRUPTION_GRACE)
    one(d.settle(), GangDisrupted)
    return d


def test_a_kai_gang_below_its_minimum_keeps_its_place_within_the_grace_then_is_evicted():
    d = running("kai")
    d.advance(69.0)
    assert of_type(d.settle(), GangEvicted) == []         # "Don't evict recently stale job"
    assert not fits(d, "2", key="team/probe")              # its workers still hold n1
    d.advance(70.0)                                        # 60s after the loss: "Evict long-ago stale job"
    evicted = one(d.settle(), GangEvicted)
    assert (evicted.key, evicted.kind, evicted.gate) == ("team/rc", "RayCluster", "pods")
    assert sorted(evicted.pods) == ["rc-worker-worker-0", "rc-worker-worker-1"]
    assert evicted.reason == ("stale gang evicted: 2 pods are active, minMember is 3, for 60s "
                              "(its queue's staleness grace period)")
    assert fits(d, "4", key="team/probe")                  # n1 is free again


def test_a_gang_whole_again_within_the_grace_is_not_evicted():
    """KAI's "Don't evict non-stale job": its replacement bound before the grace is over."""
    d = running("kai")
    d.advance(40.0)
    assigned = one(d.add_node("n3", cpu="2"), PodAssigned)   # room comes: the recreated head goes there
    out = d.pod(bound(REPLACEMENT, assigned.node, "Running"), "Modified")
    one(out, GangRunning)
    d.advance(200.0)
    assert of_type(d.settle(), GangEvicted) == []


def test_a_gang_whose_replacement_is_being_bound_is_not_evicted():
    """A pod that holds its slot counts (KAI counts Allocated and Binding pods as active), Running or not."""
    d = running("kai")
    d.advance(69.0)
    one(d.add_node("n3", cpu="2"), PodAssigned)
    d.advance(70.0)
    assert of_type(d.settle(), GangEvicted) == []


def test_a_gang_withdrawn_within_the_grace_is_not_evicted():
    d = running("kai")
    d.advance(30.0)
    d.withdraw(RC.key)
    d.advance(200.0)
    assert of_type(d.settle(), GangEvicted) == []


def test_a_volcano_gang_below_its_minimum_keeps_its_place():
    d = running("volcano")
    d.advance(600.0)
    assert of_type(d.settle(), GangEvicted) == []
    assert not fits(d, "2", key="team/probe")


def test_the_grace_is_the_policys_and_a_queue_may_have_its_own():
    d = running("kai", Policy.from_mapping({"default_staleness_grace_period": "20s"}))
    d.advance(30.0)
    one(d.settle(), GangEvicted)
    d = running("kai", Policy.from_mapping({"queues": {"q": {"staleness_grace_period": "-1s"}}}))  # never
    d.advance(600.0)
    assert of_type(d.settle(), GangEvicted) == []


def test_a_grace_shorter_than_the_judgement_evicts_when_the_gang_is_judged():
    d = PlacementDriver(Policy.from_mapping({"default_staleness_grace_period": 0}), node("n1", cpu="4"),
                        node("n2", cpu="2"))
    d.feed(QueueDefined(queue=queue_spec("q", dialect="kai")))
    out = d.dequeue(RC)
    d.run(RC, out)
    d.feed(node_changed(node("n2", cpu="2"), "Deleted"))
    d.pod(bound(ray_pod("rc", "head", 0, namespace="team", requests={"cpu": "2"}), "n2", "Running"), "Deleted")
    d.advance(DISRUPTION_GRACE)
    settled = d.settle()
    one(settled, GangDisrupted)
    assert "for 2s" in one(settled, GangEvicted).reason  # judged first: a deletion within 2s is no disruption
