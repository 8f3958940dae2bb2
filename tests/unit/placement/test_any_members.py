"""Pod groups: any ``minMember`` pods that fit together make the gang, each task keeping its own minimum.

The first three cases are Volcano's allocate tests (volcano-sh/volcano
``pkg/scheduler/actions/allocate/allocate_test.go`` ``TestAllocate``), with the gang admission makes
of their pods: the pods that came first are the composition tried first, the others elastic.
"""

from __future__ import annotations

from shared.kernel.events import ElasticGranted, ElasticReleased, GangPlaced, PlacementFailed
from shared.kernel.model import as_placed
from tests.builders import gang, node, pod_group, pod_set, workload
from tests.builders.placement import PlacementDriver, one

MASTER = {"nodeRole": "master"}
WORKER = {"nodeRole": "worker"}


def placed(out: list) -> list[tuple[str, int, str]]:
    return [(s.pod_set, s.index, s.node) for s in one(out, GangPlaced).slots]


def test_a_pod_that_fits_stands_in_for_the_first_one_that_does_not():
    # "prepredicate failed: node selector does not match": minMember 1, p1 (master) first, p2 (worker).
    d = PlacementDriver(None, node("n1", cpu="2", memory="4Gi", labels=WORKER))
    g = pod_group(pod_set("master", 1, task="master", node_selector=MASTER, cpu="1", memory="1G"),
                  pod_set("worker", 0, elastic=1, task="worker", node_selector=WORKER, cpu="1", memory="1G"))
    assert placed(d.dequeue(workload("c1/pg1", kind="PodGroup", gang_=g))) == [("worker", 0, "n1")]


def test_each_task_keeps_its_own_minimum():
    # "prepredicate failed and tasks are not used up, continue on until min member meet".
    d = PlacementDriver(None, node("n1", cpu="1", memory="2Gi", labels=MASTER),
                        node("n2", cpu="1", memory="2Gi", labels=WORKER))
    g = pod_group(pod_set("master", 1, elastic=1, task="master", node_selector=MASTER, cpu="1", memory="1G"),
                  pod_set("worker", 1, elastic=1, task="worker", node_selector=WORKER, cpu="1", memory="1G"),
                  tasks={"master": 1, "worker": 1})
    assert placed(d.dequeue(workload("c1/pg1", kind="PodGroup", gang_=g))) == [("master", 0, "n1"), ("worker", 0, "n2")]


def test_a_task_short_of_its_minimum_is_not_made_up_by_another_task():
    # "master's min member can not be allocated, break from allocating": minTaskMember master 2, one master fits.
    d = PlacementDriver(None, node("n1", cpu="1", memory="2Gi", labels=MASTER),
                        node("n2", cpu="2", memory="2Gi", labels=WORKER))
    g = pod_group(pod_set("master", 2, task="master", node_selector=MASTER, cpu="1", memory="1G"),
                  pod_set("worker", 0, elastic=2, task="worker", node_selector=WORKER, cpu="1", memory="1G"),
                  tasks={"master": 2})
    failed = one(d.dequeue(workload("c1/pg1", kind="PodGroup", gang_=g)), PlacementFailed)
    assert "1/2 tasks could not be placed: 0/2 nodes are available" in failed.reason
    assert fits_all(d, "2")  # nothing stayed reserved


def fits_all(d: PlacementDriver, cpu: str) -> bool:
    out = d.dequeue(workload("ns/probe", gang_=gang(pod_set("head", 1, cpu=cpu, memory="1G", node_selector=WORKER))))
    return any(isinstance(p, GangPlaced) for p in out)


def test_first_pods_on_a_full_node_make_way_for_members_elsewhere():
    d = PlacementDriver(None, node("a", cpu="2", labels={"zone": "a"}), node("b", cpu="2", labels={"zone": "b"}))
    one(d.dequeue(workload("ns/hog", gang_=gang(pod_set("head", 1, cpu="2")))), GangPlaced)  # fills a
    g = pod_group(pod_set("pods", 2, elastic=1, node_selector={"zone": "a"}),
                  pod_set("pods-2", 0, elastic=2, node_selector={"zone": "b"}))
    assert placed(d.dequeue(workload("etl/etl", kind="PodGroup", gang_=g))) == [("pods-2", 0, "b"), ("pods-2", 1, "b")]
    # the gang placement keeps is the one it placed: the first pods are elastic now, the stand-ins its minimum
    kept = d.core.workloads["etl/etl"].spec.gang
    assert [(ps.name, ps.count, ps.elastic) for ps in kept.pod_sets] == [("pods", 0, 3), ("pods-2", 2, 0)]


def test_first_pods_that_fit_stay_and_only_the_missing_ones_are_replaced():
    d = PlacementDriver(None, node("a", cpu="1", labels={"zone": "a"}), node("b", cpu="4", labels={"zone": "b"}))
    g = pod_group(pod_set("pods", 3, node_selector={"zone": "a"}), pod_set("pods-2", 0, elastic=4, node_selector={"zone": "b"}))
    assert placed(d.dequeue(workload("etl/etl", kind="PodGroup", gang_=g))) == [
        ("pods", 0, "a"), ("pods-2", 0, "b"), ("pods-2", 1, "b")]


def test_a_stand_in_never_charges_more_than_the_quota_reserved():
    # The queue reserved 2 x 1 CPU; 2-CPU members would fit the nodes but not the reservation.
    d = PlacementDriver(None, node("a", cpu="1", labels={"zone": "a"}), node("b", cpu="8", labels={"zone": "b"}))
    dear = pod_group(pod_set("pods", 2, cpu="1", node_selector={"zone": "a"}),
                     pod_set("pods-2", 0, elastic=2, cpu="2", node_selector={"zone": "b"}))
    failed = one(d.dequeue(workload("etl/dear", kind="PodGroup", gang_=dear)), PlacementFailed)
    assert "1/2 tasks could not be placed" in failed.reason
    cheap = pod_group(pod_set("pods", 2, cpu="2", node_selector={"zone": "a"}),
                      pod_set("pods-2", 0, elastic=2, cpu="1", node_selector={"zone": "b"}))
    assert placed(d.dequeue(workload("etl/cheap", kind="PodGroup", gang_=cheap))) == [("pods-2", 0, "b"), ("pods-2", 1, "b")]


def test_a_task_short_of_its_minimum_takes_its_own_pods_of_another_shape_first():
    d = PlacementDriver(None, node("a", cpu="1", labels={"zone": "a"}), node("b", cpu="4", labels={"zone": "b"}))
    g = pod_group(pod_set("ps", 1, task="ps", node_selector={"zone": "z"}),  # no such zone
                  pod_set("worker", 1, elastic=3, task="worker", node_selector={"zone": "b"}),
                  pod_set("ps-2", 0, elastic=1, task="ps", node_selector={"zone": "a"}),
                  tasks={"ps": 1})
    assert placed(d.dequeue(workload("ml/mpi", kind="PodGroup", gang_=g))) == [("worker", 0, "b"), ("ps-2", 0, "a")]


def test_a_ray_gang_is_not_made_of_other_pods():
    d = PlacementDriver(None, node("n1", cpu="2", labels=WORKER))
    g = gang(pod_set("head", 1, node_selector=MASTER), pod_set("worker", 0, elastic=2, node_selector=WORKER))
    assert [type(p) for p in d.dequeue(workload("ns/rc", gang_=g))] == [PlacementFailed]


def test_as_placed_moves_the_minimum_and_keeps_what_each_pod_set_wants():
    g = pod_group(pod_set("pods", 2, elastic=1), pod_set("pods-2", 0, elastic=2))
    assert as_placed(g, ["pods", "pods"]) is g
    moved = as_placed(g, ["pods", "pods-2"])
    assert [(ps.count, ps.elastic) for ps in moved.pod_sets] == [(1, 2), (1, 1)]
    assert moved.min_member == 2 and moved.interchangeable
    ray = gang(pod_set("head", 1), pod_set("worker", 0, elastic=2))
    assert as_placed(ray, ["worker"]) is ray


def test_a_grant_for_first_pods_that_went_away_reserves_nothing():
    """Admission still counts the first pods a stand-in replaced; once they are deleted the queue may
    grant them as elastic pods: no pod waits for such a grant, so it goes back and holds no node."""
    d = PlacementDriver(None, node("a", cpu="2", labels={"zone": "a"}), node("b", cpu="2", labels={"zone": "b"}))
    g = pod_group(pod_set("pods", 2, node_selector={"zone": "z"}), pod_set("pods-2", 0, elastic=2, node_selector={"zone": "b"}))
    spec = workload("etl/etl", kind="PodGroup", gang_=g)
    one(d.dequeue(spec), GangPlaced)
    out = d.feed(ElasticGranted(key=spec.key, queue=spec.queue, pod_set="pods", count=2, admission=1, reason="test"))
    back = one(out, ElasticReleased)
    assert (back.count, back.refused) == (2, True)
    assert back.reason == "2 elastic pod(s) of pods could not be placed: no pod of the group waits for them"
    assert [s for s in d.core.workloads[spec.key].slots if s.elastic] == []
