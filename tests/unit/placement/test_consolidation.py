"""Consolidation: a gang of a KAI queue that waits only because GPU fractions are spread over devices gets
room by moving the fewest running fractional pods, each placed again at once (KAI's consolidation action,
NVIDIA/KAI-Scheduler ``pkg/scheduler/actions/integration_tests/consolidation/consolidationFractional_test.go``:
"consolidate fractional GPUs and insert a whole train job", "can't consolidate fractional GPUs and insert a
whole train job"); nothing moves when a moved pod would find no place again, when it is young, pinned or
of a queue of another dialect."""

from __future__ import annotations

from typing import Any

from services.placement.consolidation import Consolidation
from shared.kernel.events import GangPlaced, PlacementFailed, PodAssigned, PodsMoved, PreemptionRequested, QueueDefined
from shared.kernel.model import WorkloadSpec
from tests.builders import gang, node, pod_set, queue_spec, workload
from tests.builders.placement import PlacementDriver, bound, of_type, one, pod_changed, ray_pod


def fraction(key: str, share: int, **kw: Any) -> WorkloadSpec:
    """A Ray workload of one worker holding ``share`` thousandths of one GPU."""
    return workload(key, queue="q", gang_=gang(pod_set("worker", 1, gpu_share=share, cpu="1")), **kw)


def whole(key: str, gpus: str = "1", **kw: Any) -> WorkloadSpec:
    return workload(key, queue="q", gang_=gang(pod_set("worker", 1, cpu="1", **{"nvidia.com/gpu": gpus})), **kw)


def started(d: PlacementDriver, spec: WorkloadSpec) -> GangPlaced:
    """Place ``spec`` and run its pods; the device each got."""
    out = d.dequeue(spec)
    placed = one(out, GangPlaced)
    d.run(spec, out)
    return placed


def device(placed: GangPlaced) -> tuple[int, ...]:
    gpu = placed.slots[0].gpu
    assert gpu is not None
    return gpu.devices


def gone(d: PlacementDriver, spec: WorkloadSpec) -> None:
    """The workload is deleted: its slots go, then its pod."""
    d.withdraw(spec.key)
    d.pod(bound(ray_pod(spec.name, "worker", 0, namespace=spec.namespace), "n1", "Running"), "Deleted")


def spread(dialect: str = "kai", *, min_runtime: float | None = None, second: int = 500, **kw: Any) -> PlacementDriver:
    """One node of two GPUs: team/job0 holds 0.5 of device 0 from 0s, team/job1 ``second`` of device 1 from
    1s (a filler that shared device 0 with job0 left), as in KAI's test; ``kw`` go to both workloads."""
    d = PlacementDriver(None, node("n1", gpu="2"))
    d.feed(QueueDefined(queue=queue_spec("q", dialect=dialect, min_runtime=min_runtime)))
    job0, filler, job1 = fraction("team/job0", 500, **kw), fraction("team/filler", 500), fraction("team/job1", second, **kw)
    assert device(started(d, job0)) == (0,)
    assert device(started(d, filler)) == (0,)
    d.advance(1.0)
    assert device(started(d, job1)) == (1,)
    gone(d, filler)
    d.advance(10.0)
    d.settle()
    return d


def test_a_whole_gpu_gang_waiting_on_spread_fractions_runs_after_the_fewest_pods_move():
    """KAI's "consolidate fractional GPUs and insert a whole train job": one pod moves onto the other's
    device (the later started one, the in-queue victim order), the gang takes the device it left."""
    d = spread()
    out = d.dequeue(whole("team/big"))
    moved = one(out, PodsMoved)
    assert (moved.key, moved.kind, moved.preemptor, moved.pods) == (
        "team/job1", "RayCluster", "team/big", ("team/job1-worker-worker-0",))
    assert moved.reason == ("pod team/job1-worker-worker-0 was preempted and rescheduled due to bin packing "
                            "(resource consolidation) procedure, to make room for team/big")
    placed = one(out, GangPlaced)
    assert device(placed) == (1,)
    assert placed.reason.endswith("after moving 1 pod(s) of team/job1 (consolidation)")
    assert of_type(out, PreemptionRequested) == []
    # its owner makes the pod again: it is bound to device 0 beside job0's, as the move planned
    d.pod(bound(ray_pod("job1", "worker", 0, namespace="team"), "n1", "Running"), "Deleted")
    assigned = one(d.pod(ray_pod("job1", "worker", 0, namespace="team", name="job1-worker-worker-new")), PodAssigned)
    assert (assigned.pod, assigned.node, assigned.gpu and assigned.gpu.devices) == ("job1-worker-worker-new", "n1", (0,))


def test_nothing_moves_when_a_moved_pod_would_not_fit_again():
    """KAI's "can't consolidate fractional GPUs and insert a whole train job": 0.5 and 0.6 on two devices;
    either moved finds no device with room, so the gang waits and nothing is evicted."""
    d = spread(second=600)
    out = d.dequeue(whole("team/big"))
    assert of_type(out, PodsMoved) == []
    assert of_type(out, GangPlaced) == []
    one(out, PlacementFailed)


def test_the_device_with_the_fewest_movable_pods_is_emptied():
    """Device 0 holds one 0.5 pod, device 1 two 0.25 pods, device 2 a whole-GPU pod: moving the one pod of
    device 0 is enough, though the two of device 1 started later (victim order alone would move both)."""
    d = PlacementDriver(None, node("n1", gpu="3"))
    d.feed(QueueDefined(queue=queue_spec("q", dialect="kai")))
    a, filler = fraction("team/a", 500), fraction("team/filler", 500)
    assert device(started(d, a)) == (0,) and device(started(d, filler)) == (0,)
    d.advance(1.0)
    b = fraction("team/b", 250)
    assert device(started(d, b)) == (1,)
    d.advance(2.0)
    c = fraction("team/c", 250)
    assert device(started(d, c)) == (1,)
    assert device(started(d, whole("team/w"))) == (2,)
    gone(d, filler)
    d.advance(10.0)
    out = d.dequeue(whole("team/big"))
    assert [(m.key, m.pods) for m in of_type(out, PodsMoved)] == [("team/a", ("team/a-worker-worker-0",))]
    assert device(one(out, GangPlaced)) == (0,)


def test_young_pods_wait_for_their_queues_minimum_runtime_and_pinned_ones_never_move():
    """KAI's ``preemptMinRuntime`` on the moved pod's queue: at 10s both are too young; at 60.5s job0 has
    run its minute and moves, job1 (59.5s) stays."""
    d = spread(min_runtime=60.0)
    assert of_type(d.dequeue(whole("team/big")), PodsMoved) == []
    d.withdraw("team/big")
    d.advance(60.5)
    out = d.dequeue(whole("team/big"))
    assert [m.key for m in of_type(out, PodsMoved)] == ["team/job0"]
    assert device(one(out, GangPlaced)) == (0,)
    pinned = spread(preemptible=False)
    assert of_type(pinned.dequeue(whole("team/big")), PodsMoved) == []


def test_only_kai_queues_consolidate_and_only_for_a_preemptible_gang():
    volcano = spread("volcano")
    assert of_type(volcano.dequeue(whole("team/big")), PodsMoved) == []
    kai = spread()
    assert of_type(kai.dequeue(whole("team/big", preemptible=False)), PodsMoved) == []


def test_a_gang_asking_more_gpu_than_is_free_in_all_is_not_tried():
    """KAI's ``IsEnoughGPUsAllocatableForJob``: two GPUs asked, one free in all (however it is spread)."""
    d = spread()
    consolidation: Consolidation = d.core.consolidation
    rec = d.core.workloads["team/job0"]
    assert [w.key for w, _ in consolidation.movable(rec, d.core.workloads, d.now)] == ["team/job1"]
    out = d.dequeue(whole("team/big", gpus="2"))
    assert of_type(out, PodsMoved) == []
    one(out, PlacementFailed)


def test_a_gang_placed_as_it_is_moves_nothing():
    d = spread()
    d.add_node("n2", gpu="1")
    out = d.dequeue(whole("team/big"))
    assert of_type(out, PodsMoved) == []
    assert one(out, GangPlaced).slots[0].node == "n2"


def test_pod_changed_of_a_moved_pod_that_is_still_bound_counts_nothing():
    """Between the eviction and the deletion the old pod's watch events change nothing: its charge went
    with the move, and the device it left is the gang's."""
    d = spread()
    d.dequeue(whole("team/big"))
    old = bound(ray_pod("job1", "worker", 0, namespace="team"), "n1", "Running")
    assert d.feed(pod_changed(old, "Modified")) == []
    assert d.core.nodes.device_row(0)[:2] == [1000, 1000]
