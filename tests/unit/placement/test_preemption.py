"""In-queue priority preemption (fewest victims, lowest priority, newest) and reclaim by the queue."""

from __future__ import annotations

import pytest

from shared.kernel.events import (
    CapacityChanged, GangPlaced, GivingQueue, OfferedVictim, PlacementFailed, PodAssigned, PreemptionRequested, ReclaimOffer,
    ReclaimRequested, TimerSet,
)
from shared.kernel.model import WorkloadSpec
from shared.kernel.policy import Policy
from tests.builders import gang, node, pod_set, workload
from tests.builders.placement import PlacementDriver, bound, of_type, one, ray_pod

GPU = "nvidia.com/gpu"


def ray(key: str, priority: int, queue: str = "team-a", *, cpu: str = "1", preemptible: bool | None = None,
        **worker: str) -> WorkloadSpec:
    g = gang(pod_set("head", 1, cpu="1", memory="2Gi"), pod_set("gpu", 1, cpu="1", memory="4Gi", **worker)) \
        if worker else gang(pod_set("head", 1, cpu=cpu))
    return workload(key, queue=queue, priority=priority, preemptible=preemptible, gang_=g)


def running(d: PlacementDriver, spec: WorkloadSpec) -> None:
    """Admit the workload and bring all its pods up Running."""
    d.run(spec, d.dequeue(spec))


def test_build_preempts_running_train_in_the_same_queue():
    d = PlacementDriver(None, node("gpu-node-1", cpu="8", memory="32Gi", gpu="1"))
    d.now = 1.0
    train = ray("default/train-cluster", 50, **{GPU: "1"})
    running(d, train)
    d.now = 30.0
    build = ray("default/build-cluster", 100, **{GPU: "1"})
    out = d.dequeue(build)
    assert [type(p) for p in out] == [PreemptionRequested, GangPlaced]
    assert out[0] == PreemptionRequested(
        key="default/train-cluster", kind="RayCluster", gate="pods", preemptor="default/build-cluster",
        preemptor_priority=100, reclaim=False,
        pods=("train-cluster-head-0", "train-cluster-gpu-worker-0"),
        reason="preempted by default/build-cluster (priority 100) in queue team-a")
    assert out[1].reason == "2/2 pods placed on 1 node(s) (binpack) after preempting default/train-cluster"
    assert out[1].slots[1].gpu.devices == (0,)
    # The evicted pods no longer count, even while they still report Running; going away releases nothing.
    old = bound(ray_pod("train-cluster", "gpu", 0, requests={"cpu": "1"}), "gpu-node-1", "Running")
    assert d.pod(old, "Modified") == []
    assert of_type(d.pod(old, "Deleted"), TimerSet) == []
    # The build pods come and take their slots; train's recreated pods wait unassigned.
    # (a pod-gated gang is told where to go once a pod waits for each of its slots)
    assert d.pod(ray_pod("build-cluster", "head", 0)) == []
    assigned = of_type(d.pod(ray_pod("build-cluster", "gpu", 0)), PodAssigned)
    assert [(a.pod_set, a.node) for a in assigned] == [("head", "gpu-node-1"), ("gpu", "gpu-node-1")]
    assert d.pod(ray_pod("train-cluster", "gpu", 1)) == []


def test_train_is_placed_again_once_build_is_gone():
    d = PlacementDriver(None, node("n1", cpu="8", gpu="1"))
    train, build = ray("default/train", 50, **{GPU: "1"}), ray("default/build", 100, **{GPU: "1"})
    running(d, train)
    d.run(build, d.dequeue(build))
    assert isinstance(d.dequeue(train)[0], PlacementFailed)
    d.withdraw(build.key)
    for name in ("build-head-0", "build-gpu-worker-0"):
        pod_set = "head" if "head" in name else "gpu"
        d.pod(bound(ray_pod("build", pod_set, 0, requests={"cpu": "1"}), "n1", "Running"), "Deleted")
    assert [type(p) for p in d.dequeue(train)] == [GangPlaced]


@pytest.mark.parametrize("need, victims", [
    ("2", ["ns/b"]),                    # one victim: lowest priority, newest
    ("4", ["ns/b", "ns/a"]),            # both priority-10 workloads before the priority-20 one
    ("6", ["ns/b", "ns/a", "ns/c"]),
])
def test_minimal_victim_set_lowest_priority_newest_first(need, victims):
    d = PlacementDriver(None, node("n1", cpu="6"))
    for t, (key, prio) in enumerate((("ns/a", 10), ("ns/b", 10), ("ns/c", 20))):
        d.now = float(t)
        running(d, ray(key, prio, cpu="2"))
    d.now = 100.0
    out = d.dequeue(ray("ns/boss", 50, cpu=need))
    assert [p.key for p in of_type(out, PreemptionRequested)] == victims
    assert isinstance(out[-1], GangPlaced)


def test_a_gang_admitted_but_not_started_goes_before_one_that_started_after_its_admission():
    """The tie placement and the queue once ordered apart: ns/waiting was admitted at 2 s and has not
    started; ns/running was admitted before it and started at 5 s. Evicting ns/waiting loses no work
    (``shared.kernel.victims.victim_rank``), so it goes, as the queue would name it."""
    d = PlacementDriver(None, node("n1", cpu="4"))
    first = ray("ns/running", 10, cpu="2")
    admitted = d.dequeue(first)
    d.now = 2.0
    d.dequeue(ray("ns/waiting", 10, cpu="2"))
    d.now = 5.0
    d.run(first, admitted)
    d.now = 10.0
    out = d.dequeue(ray("ns/boss", 50, cpu="2"))
    assert [p.key for p in of_type(out, PreemptionRequested)] == ["ns/waiting"]
    assert isinstance(out[-1], GangPlaced)


def test_unneeded_victims_are_pruned():
    # Greedy order takes the 1-CPU workload first, but the 4-CPU one alone is enough.
    d = PlacementDriver(None, node("n1", cpu="5"))
    running(d, ray("ns/small", 1, cpu="1"))
    running(d, ray("ns/large", 2, cpu="4"))
    out = d.dequeue(ray("ns/boss", 50, cpu="4"))
    assert [p.key for p in of_type(out, PreemptionRequested)] == ["ns/large"]


def test_no_preemption_when_even_all_victims_do_not_make_room():
    d = PlacementDriver(None, node("n1", cpu="4"))
    running(d, ray("ns/low", 10, cpu="2"))
    running(d, ray("ns/keep", 10, cpu="1", preemptible=False))
    out = d.dequeue(ray("ns/boss", 50, cpu="4"))
    assert [type(p) for p in out] == [PlacementFailed]
    assert out[0].reason == (
        "1/1 tasks in gang unschedulable: pod group is not ready, 1 Pending, 1 minAvailable; "
        "1/1 tasks could not be placed: 0/1 nodes are available: 1 Insufficient cpu. "
        "Lower-priority ns/keep (priority 10) of queue team-a would make room but is not preemptible.")
    # Rolled back: ns/low still holds its 2 CPU (1 free), and can still be preempted later.
    assert isinstance(d.dequeue(ray("ns/probe", 0, cpu="2"))[0], PlacementFailed)
    assert [p.key for p in of_type(d.dequeue(ray("ns/boss2", 50, cpu="3")), PreemptionRequested)] == ["ns/low"]


@pytest.mark.parametrize("victim", [
    ray("ns/v", 100, cpu="4"),                      # higher priority
    ray("ns/v", 50, cpu="4"),                       # same priority
    ray("ns/v", 10, cpu="4", preemptible=False),    # not preemptible
    ray("ns/v", 10, "other-queue", cpu="4"),        # another queue (that is reclaim's job)
])
def test_never_a_victim(victim):
    d = PlacementDriver(None, node("n1", cpu="4"))
    running(d, victim)
    assert [type(p) for p in d.dequeue(ray("ns/boss", 50, cpu="1"))] == [PlacementFailed]


def test_min_runtime_protects_young_workloads():
    d = PlacementDriver(Policy(min_runtime_seconds=60), node("n1", cpu="4"))
    d.now = 10.0
    running(d, ray("ns/low", 10, cpu="4"))  # GangRunning at t=10
    d.now = 69.0
    out = d.dequeue(ray("ns/boss", 50, cpu="1"))
    failed = one(out, PlacementFailed)
    assert "would not make room" not in failed.reason
    assert failed.reason.endswith(" Preempting ns/low waits for the minimum runtime of queue team-a (until 70s).")
    assert one(out, TimerSet) == TimerSet(key="ripen", at=70.0)
    d.now = 70.0
    assert [p.key for p in of_type(d.dequeue(ray("ns/boss", 50, cpu="1")), PreemptionRequested)] == ["ns/low"]


def test_when_young_victims_ripen_the_queue_hears_a_release():
    """The queue retries at once when the victims reach their minimum runtime, not when a backoff expires."""
    d = PlacementDriver(Policy(min_runtime_seconds=60), node("n1", cpu="4"))
    d.now = 10.0
    running(d, ray("ns/low", 10, cpu="4"))
    d.now = 30.0
    out = d.dequeue(ray("ns/boss", 50, cpu="1"))
    assert one(out, TimerSet) == TimerSet(key="ripen", at=70.0)
    assert of_type(d.dequeue(ray("ns/boss2", 50, cpu="1")), TimerSet) == []  # one timer per time
    released = one(d.advance(70.0) + d.settle(), CapacityChanged)
    assert released.released is True


def test_no_ripening_note_when_even_ripe_victims_would_not_make_room():
    d = PlacementDriver(Policy(min_runtime_seconds=60), node("n1", cpu="4"))
    d.now = 10.0
    running(d, ray("ns/low", 10, cpu="2"))
    d.now = 30.0
    out = d.dequeue(ray("ns/boss", 50, cpu="5"))
    assert "minimum runtime" not in one(out, PlacementFailed).reason and of_type(out, TimerSet) == []


def test_admitted_but_not_running_is_a_victim_only_without_min_runtime():
    strict = PlacementDriver(Policy(min_runtime_seconds=1), node("n1", cpu="4"))
    strict.dequeue(ray("ns/low", 10, cpu="4"))
    assert isinstance(strict.dequeue(ray("ns/boss", 50, cpu="1"))[0], PlacementFailed)
    lax = PlacementDriver(None, node("n1", cpu="4"))
    lax.dequeue(ray("ns/low", 10, cpu="4"))
    out = lax.dequeue(ray("ns/boss", 50, cpu="1"))
    assert one(out, PreemptionRequested).pods == ()  # no pod existed yet


def test_reclaim_evicts_the_named_victims_and_places_the_gang():
    d = PlacementDriver(None, node("n1", cpu="4"))
    running(d, ray("ns/v1", 0, "other", cpu="2"))
    running(d, ray("ns/v2", 0, "other", cpu="2"))
    w = ray("ns/w", 0, "mine", cpu="2")
    out = d.reclaim(w, ("ns/v2", "ns/unknown"))
    assert [type(p) for p in out] == [PreemptionRequested, GangPlaced]
    assert out[0].key == "ns/v2" and out[0].preemptor == "ns/w" and out[0].reclaim is True
    assert out[0].reason == "reclaimed by ns/w for queue mine"
    assert out[0].pods == ("v2-head-0",)
    assert out[1].reason == "1/1 pods placed on 1 node(s) (binpack) after reclaiming ns/v2"


def test_reclaim_that_does_not_make_room_fails_and_evicts_nobody():
    d = PlacementDriver(None, node("n1", cpu="4"))
    running(d, ray("ns/v1", 0, "other", cpu="2"))
    running(d, ray("ns/v2", 0, "other", cpu="2"))
    out = d.reclaim(ray("ns/w", 0, "mine", cpu="3"), ("ns/v1",))
    assert [type(p) for p in out] == [PlacementFailed]
    assert out[0].reason.endswith("0/1 nodes are available: 1 Insufficient cpu.")
    # Nobody was evicted: v1 can still be reclaimed with v2.
    out = d.reclaim(ray("ns/w", 0, "mine", cpu="3"), ("ns/v1", "ns/v2"))
    assert [p.key for p in of_type(out, PreemptionRequested)] == ["ns/v1", "ns/v2"]


def test_a_queue_definition_sets_the_minimum_runtime_of_its_victims():
    from shared.kernel.events import QueueDefined, QueueRemoved
    from tests.builders import queue_spec

    d = PlacementDriver(None, node("n1", cpu="4"))
    d.feed(QueueDefined(queue=queue_spec("team-a", dialect="kai", min_runtime=60.0)))
    d.now = 10.0
    running(d, ray("ns/low", 10, cpu="4"))
    d.now = 30.0
    assert one(d.dequeue(ray("ns/boss", 50, cpu="1")), PlacementFailed).reason.endswith(
        "Preempting ns/low waits for the minimum runtime of queue team-a (until 70s).")
    d.feed(QueueRemoved(name="team-a"))  # back to the policy's default (0)
    d.now = 31.0
    assert [p.key for p in of_type(d.dequeue(ray("ns/boss", 50, cpu="1")), PreemptionRequested)] == ["ns/low"]


def test_a_reclaim_request_naming_victims_of_the_same_queue_is_an_in_queue_preemption():
    """The queue asks for it when the queue's own limit blocks a higher priority (quota preemption)."""
    d = PlacementDriver(None, node("n1", cpu="32"))
    running(d, ray("ns/low", 10, "q", cpu="3"))
    out = d.reclaim(ray("ns/high", 90, "q", cpu="3"), ("ns/low",))
    assert [type(p) for p in out] == [PreemptionRequested, GangPlaced]
    assert (out[0].key, out[0].preemptor, out[0].preemptor_priority, out[0].reclaim) == ("ns/low", "ns/high", 90, False)
    assert out[0].reason == "preempted by ns/high (priority 90) in queue q"
    assert out[0].pods == ("low-head-0",)
    assert out[1].reason == "1/1 pods placed on 1 node(s) (binpack) after preempting ns/low"


def test_a_volcano_non_preemptable_gang_is_never_a_victim():
    """``volcano.sh/preemptable: "false"`` reaches placement as ``preemptible=False``: the higher priority
    waits rather than evicting it, whatever the priorities."""
    d = PlacementDriver(None, node("n1", cpu="8", gpu="1"))
    d.now = 1.0
    running(d, ray("default/pinned", 0, preemptible=False, **{GPU: "1"}))
    d.now = 30.0
    out = d.dequeue(ray("default/urgent", 100000, **{GPU: "1"}))
    assert [type(p) for p in out] == [PlacementFailed] and not of_type(out, PreemptionRequested)


def test_a_workload_that_may_not_preempt_only_waits():
    """A suspended RayJob of a kube-queue or default queue (``preempts=False``) overtakes but evicts nobody."""
    d = PlacementDriver(None, node("n1", cpu="8", gpu="1"))
    d.now = 1.0
    running(d, ray("default/low", 0, **{GPU: "1"}))
    d.now = 30.0
    jumper = ray("default/jumper", 500, **{GPU: "1"}).model_copy(update={"preempts": False, "gate": "suspend"})
    out = d.dequeue(jumper)
    assert [type(p) for p in out] == [PlacementFailed]


# ---------------------------------------------------------------------- reclaim on the nodes that fit
def _racks() -> PlacementDriver:
    """n1 runs ns/a1 and ns/a2, n2 runs ns/a-old (2 CPU each, queue a); 2 CPU are free, on n2."""
    d = PlacementDriver(None, node("n1", cpu="4"))
    running(d, ray("ns/a1", 0, "a", cpu="2"))
    running(d, ray("ns/a2", 0, "a", cpu="2"))
    d.add_node("n2", cpu="4")
    running(d, ray("ns/a-old", 0, "a", cpu="2"))
    return d


def _offer(*keys: str, usage: int = 6000, above: int = 4000) -> ReclaimOffer:
    return ReclaimOffer(victims=tuple(OfferedVictim(key=k, queue="a", demand={"cpu": 2000}) for k in keys),
                        queues=(GivingQueue(name="a", usage={"cpu": usage}, above={"cpu": above}, floor={},
                                            levels=("a",)),))


def _reclaim(d: PlacementDriver, offer: ReclaimOffer | None) -> list:
    b1 = ray("ns/b1", 0, "b", cpu="4")
    return d.feed(ReclaimRequested(key=b1.key, queue="b", workload=b1, victims=("ns/a2",), reason="test", offer=offer))


def test_a_reclaim_takes_the_offered_victim_on_the_node_where_the_gang_then_fits():
    """The queue chose ns/a2 by quota; it frees 2 CPU on n1, where a 4-CPU pod still does not fit. Queue a
    may give one of its three: on n2, ns/a-old is that one (Volcano's reclaim walks node by node)."""
    out = _reclaim(_racks(), _offer("ns/a2", "ns/a1", "ns/a-old"))
    assert [p.key for p in of_type(out, PreemptionRequested)] == ["ns/a-old"]
    placed = one(out, GangPlaced)
    assert [s.node for s in placed.slots] == ["n2"]
    assert placed.reason.endswith("after reclaiming ns/a-old")


def test_a_reclaim_that_no_offered_set_makes_fit_evicts_nothing_and_waits_for_room():
    """Only ns/a1 and ns/a2 are offered, both on n1, and queue a gives one of them: no node holds the gang."""
    out = _reclaim(_racks(), _offer("ns/a2", "ns/a1"))
    assert of_type(out, PreemptionRequested) == []
    failed = one(out, PlacementFailed)
    assert failed.room_key  # not tried again until a release could hold it
    assert "No set of the 2 workload(s) the quota rules let it reclaim makes room" in failed.reason


def test_a_reclaim_without_an_offer_tries_only_the_named_victims():
    out = _reclaim(_racks(), None)
    assert of_type(out, PreemptionRequested) == [] and not one(out, PlacementFailed).room_key
