"""Elastic pods in placement: a slot of its own per granted pod, placed alone, gone with its pod, and the
first to go when a higher-priority gang (or the queue's reclaim) needs the room."""

from __future__ import annotations

from shared.kernel.events import (
    ElasticGranted, ElasticReleased, ElasticVictim, GangPlaced, GangRunning, PlacementFailed, PodAssigned,
    PreemptionRequested, ReclaimRequested,
)
from shared.kernel.model import WorkloadSpec
from tests.builders import gang, node, pod, pod_set, workload
from tests.builders.placement import PlacementDriver, bound, of_type, one, ray_pod


def _elastic(key: str, elastic: int, *, priority: int = 0, workers: int = 1, queue: str = "q") -> WorkloadSpec:
    worker = pod_set("worker", workers, cpu="1").model_copy(update={"elastic": elastic})
    return workload(key, queue=queue, priority=priority, gang_=gang(pod_set("head", 1, cpu="1"), worker))


def _grant(d: PlacementDriver, spec: WorkloadSpec, count: int, admission: int = 7) -> list:
    return d.feed(ElasticGranted(key=spec.key, queue=spec.queue, pod_set="worker", count=count, admission=admission,
                                 reason="test"))


def _running(d: PlacementDriver, spec: WorkloadSpec, elastic_pods: int) -> list[dict]:
    """Place the gang, run its pods, grant and run ``elastic_pods`` elastic workers; their pod objects."""
    d.run(spec, d.dequeue(spec))
    pods = []
    for i in range(elastic_pods):
        obj = ray_pod(spec.name, "worker", 10 + i)
        pods.append(obj)
        d.pod(obj)
    assigned = of_type(_grant(d, spec, elastic_pods), PodAssigned)
    for obj, a in zip(pods, assigned):
        d.pod(bound(obj, a.node, "Running"), "Modified")
    return pods


def test_a_grant_places_each_pod_alone_and_the_waiting_pods_take_the_slots():
    d = PlacementDriver(None, node("n1", cpu="4"), node("n2", cpu="1"))
    spec = _elastic("default/rc", 4)
    d.run(spec, d.dequeue(spec))                                     # binpack: head on n1, worker fills n2
    for i in range(3):
        d.pod(ray_pod("rc", "worker", 10 + i))
    out = _grant(d, spec, 3)
    assert [(a.pod, a.node) for a in of_type(out, PodAssigned)] == [("rc-worker-worker-10", "n1"),
                                                                    ("rc-worker-worker-11", "n1"),
                                                                    ("rc-worker-worker-12", "n1")]
    assert of_type(out, ElasticReleased) == []
    refused = one(_grant(d, spec, 1), ElasticReleased)               # the fourth: no node has room
    assert (refused.count, refused.refused, refused.admission) == (1, True, 7)
    assert refused.reason.startswith("1 elastic pod(s) of worker could not be placed: 0/2 nodes are available")


def test_a_grant_beyond_what_the_owner_wants_now_goes_back_at_once():
    d = PlacementDriver(None, node("n1", cpu="8"))
    spec = _elastic("default/rc", 1)
    d.run(spec, d.dequeue(spec))
    out = _grant(d, spec, 3)
    back = one(out, ElasticReleased)
    assert (back.count, back.refused, back.reason) == (2, False, "its owner wants fewer pods")


def test_an_elastic_slot_goes_with_its_pod_and_never_counts_for_gang_running():
    d = PlacementDriver(None, node("n1", cpu="8"))
    spec = _elastic("default/rc", 1)
    (extra,) = _running(d, spec, 1)
    gone = d.pod(bound(extra, "n1", "Failed"), "Modified")
    release = one(gone, ElasticReleased)
    assert (release.count, release.reason, release.refused) == (1, "pod rc-worker-worker-10 finished", False)
    assert of_type(d.settle(), GangRunning) == []                    # the gang itself never lost a pod
    assert d.pod(ray_pod("rc", "worker", 20)) == []                  # its replacement asks the queue again


def test_a_higher_priority_gang_takes_the_newest_elastic_pods_before_any_whole_gang():
    d = PlacementDriver(None, node("n1", cpu="6"))
    low = _elastic("default/low", 4)
    pods = _running(d, low, 4)                                       # 2 + 4 = the whole node
    high = workload("default/high", queue="q", priority=100, gang_=gang(pod_set("head", 2, cpu="1")))
    out = d.dequeue(high)
    assert of_type(out, PreemptionRequested) == []
    release = one(out, ElasticReleased)
    assert (release.key, release.count) == ("default/low", 2)
    assert release.evicted == tuple(f"default/{p['metadata']['name']}" for p in pods[:1:-1])  # the newest two
    assert release.reason == "preempted by default/high (priority 100) in queue q"
    assert one(out, GangPlaced).reason == ("2/2 pods placed on 1 node(s) (binpack) after preempting "
                                           "2 elastic pod(s) of default/low (worker)")


def test_a_workload_pinned_in_its_head_alone_gives_its_elastic_workers_but_never_its_gang():
    """Volcano's per-pod ``volcano.sh/preemptable``: the head's "false" keeps the gang, not the workers."""
    d = PlacementDriver(None, node("n1", cpu="6"))
    low = _elastic("default/low", 4).model_copy(update={"preemptible": False, "pinned_pod_sets": ("head",)})
    _running(d, low, 4)                                              # 2 + 4 = the whole node
    high = workload("default/high", queue="q", priority=100, gang_=gang(pod_set("head", 2, cpu="1")))
    out = d.dequeue(high)
    assert of_type(out, PreemptionRequested) == []
    assert (one(out, ElasticReleased).key, one(out, ElasticReleased).count) == ("default/low", 2)
    # a gang that needs more than the elastic workers gives: the pinned gang stays, and nobody is evicted
    d = PlacementDriver(None, node("n1", cpu="6"))
    _running(d, low, 4)
    bigger = workload("default/high", queue="q", priority=100, gang_=gang(pod_set("head", 5, cpu="1")))
    out = d.dequeue(bigger)
    assert of_type(out, PreemptionRequested) == [] and of_type(out, ElasticReleased) == []
    assert "default/low (priority 0) of queue q would make room but is not preemptible" in one(out, PlacementFailed).reason
    # pinned in the workers' pod set, their elastic pods stay too
    d = PlacementDriver(None, node("n1", cpu="6"))
    _running(d, low.model_copy(update={"pinned_pod_sets": ("worker",)}), 4)
    out = d.dequeue(high)
    assert of_type(out, ElasticReleased) == [] and of_type(out, PreemptionRequested) == []


def test_the_queues_elastic_victims_are_evicted_newest_first():
    d = PlacementDriver(None, node("n1", cpu="6"))
    big = _elastic("default/big", 4, queue="a")
    pods = _running(d, big, 4)
    needy = workload("default/needy", queue="b", gang_=gang(pod_set("head", 1, cpu="1")))
    out = d.feed(ReclaimRequested(key=needy.key, queue="b", workload=needy, victims=(), reason="test",
                                  elastic_victims=(ElasticVictim(key="default/big", pod_set="worker", count=1),)))
    release = one(out, ElasticReleased)
    assert release.evicted == (f"default/{pods[-1]['metadata']['name']}",)
    assert release.reason == "reclaimed by default/needy for queue b"
    assert one(out, GangPlaced).key == "default/needy"


def test_fewer_elastic_pods_wanted_drops_idle_slots_at_once():
    d = PlacementDriver(None, node("n1", cpu="8"))
    spec = _elastic("default/rc", 3)
    d.run(spec, d.dequeue(spec))
    _grant(d, spec, 3)                                               # three slots, no pods yet
    out = d.update(_elastic("default/rc", 1))
    release = one(out, ElasticReleased)
    assert (release.count, release.reason) == (2, "its owner wants fewer pods")


def test_a_gang_of_one_pod_is_placed_like_any_other():
    d = PlacementDriver(None, node("n1", cpu="2", gpu="1"))
    notebook = pod("notebook", requests={"cpu": "1"}, annotations={"gpu-fraction": "0.5"})
    d.pod(notebook)
    spec = workload("default/notebook", kind="Pod",
                    gang_=gang(pod_set("pods", 1, gpu_share=500, cpu="1")))
    out = d.dequeue(spec)
    assigned = one(out, PodAssigned)
    assert (assigned.pod, assigned.pod_set, assigned.node, assigned.gpu.fraction) == ("notebook", "pods", "n1", 0.5)
    other = pod("web", requests={"cpu": "1"}, scheduler="default-scheduler")
    assert of_type(d.pod(other), PodAssigned) == []                   # another scheduler's pod: not muster's
    assert isinstance(d.dequeue(workload("default/web", kind="Pod"))[0], (GangPlaced, PlacementFailed))


def test_a_pod_of_another_volcano_task_never_fills_a_tasks_slot_even_of_the_same_shape():
    """minTaskMember: a gang with a launcher slot binds nothing while only workers of that shape wait."""
    d = PlacementDriver(None, node("n1", cpu="8"))
    launcher = pod_set("launcher", 1, cpu="1").model_copy(update={"task": "launcher"})
    worker = pod_set("worker", 1, cpu="1").model_copy(update={"task": "worker"})
    spec = workload("default/mpi", kind="PodGroup", gang_=gang(launcher, worker))

    def member(name: str, task: str) -> dict:
        return pod(name, requests={"cpu": "1"}, annotations={"scheduling.k8s.io/group-name": "mpi",
                                                             "volcano.sh/task-spec": task})

    d.pod(member("w-0", "worker"))
    d.pod(member("w-1", "worker"))
    assert of_type(d.dequeue(spec), PodAssigned) == []          # two workers, no launcher: nothing binds
    assigned = of_type(d.pod(member("l-0", "launcher")), PodAssigned)
    assert [(a.pod, a.pod_set) for a in assigned] == [("w-0", "worker"), ("l-0", "launcher")]


def test_a_running_elastic_pod_takes_the_place_of_a_gang_pod_that_went_away():
    """The Ray autoscaler may delete any worker: the gang is a count of running pods, not particular ones."""
    d = PlacementDriver(None, node("n1", cpu="8"))
    spec = _elastic("default/rc", 1)
    (extra,) = _running(d, spec, 1)
    out = d.pod(bound(ray_pod("rc", "worker", 0), "n1", "Running"), "Deleted")
    release = one(out, ElasticReleased)
    assert release.promoted == (f"default/{extra['metadata']['name']}",)
    assert release.reason == "pod rc-worker-worker-10 takes the gang place of pod rc-worker-worker-0"
    assert of_type(d.settle(), GangRunning) == [] and d.pod(ray_pod("rc", "worker", 20)) == []


def test_elastic_pods_of_one_workload_and_a_newer_whole_one_go_together_where_neither_alone_makes_room():
    """KAI's solver accumulates each victim's pods above its minimum, then whole jobs: so old keeps its
    gang, gives its two elastic pods, and new goes whole — not both gangs."""
    d = PlacementDriver(None, node("n1", cpu="8"))
    old = _elastic("default/old", 2)
    _running(d, old, 2)                                              # 2 + 2 elastic = 4 CPUs
    new = workload("default/new", queue="q", gang_=gang(pod_set("head", 4, cpu="1")))
    d.run(new, d.dequeue(new))                                       # the other 4
    high = workload("default/high", queue="q", priority=100, gang_=gang(pod_set("head", 6, cpu="1")))
    out = d.dequeue(high)
    assert [p.key for p in of_type(out, PreemptionRequested)] == ["default/new"]
    release = one(out, ElasticReleased)
    assert (release.key, release.count) == ("default/old", 2)
    assert one(out, GangPlaced).reason == ("6/6 pods placed on 1 node(s) (binpack) after preempting "
                                           "default/new, 2 elastic pod(s) of default/old (worker)")
