"""What a gpu-memory pod charges its queue, as KAI charges it: its share of a GPU device. Before it has a
device, the share of the smallest one any node states (KAI's MinNodeGPUMemory: the most it can take);
once placed, the share of the device it got (KAI's accepted resources of an allocated pod)."""

from __future__ import annotations

from shared.kernel.events import BackedOff, Dequeued, GangPlaced, GpuAssignment, SlotAssignment
from tests.builders import gang, pod_set, queue_spec, workload
from tests.builders.queue import QueueDriver, capacity, defined, names, preempted, submitted

GPU = "nvidia.com/gpu"
A100, H100 = 40900, 81500   # MiB per device, as KAI reads GPU feature discovery's labels


def memory_job(key: str, mib: int, count: int = 1) -> object:
    return workload(key, queue="team", gang_=gang(pod_set("head", 1, cpu="1"),
                                                  pod_set("w", count, cpu="1", gpu_memory=mib)))


def driver(least: int = A100, limit: str = "1") -> QueueDriver:
    d = QueueDriver()
    d.send(defined(queue_spec("team", dialect="kai", limit={GPU: limit})), 0.0)
    d.send(capacity(gpu_memory=least, cpu="64", memory="256Gi", **{GPU: "4"}))
    d.settle()
    return d


def placed_on(key: str, *fractions: float, mib: int) -> GangPlaced:
    slots = (SlotAssignment(pod_set="head", index=0, node="n"),) + tuple(
        SlotAssignment(pod_set="w", index=i, node="n", gpu=GpuAssignment(devices=(0,), fraction=f, group="g", memory=mib))
        for i, f in enumerate(fractions))
    return GangPlaced(key=key, queue="team", kind="RayCluster", gate="pods", slots=slots, reason="placed")


def test_a_waiting_pod_is_charged_its_share_of_the_smallest_gpu_a_node_states() -> None:
    d = driver()
    out = d.step(submitted(memory_job("ns/a", 20480)), 1.0)
    dequeued = out[1]
    assert isinstance(dequeued, Dequeued) and dequeued.gpu_memory == A100
    assert dequeued.reason == f"quota reserved in queue team (cpu 2, {GPU} 510m)"   # 20480/40900 -> 0.51
    second = d.step(submitted(memory_job("ns/b", 20480)), 2.0)
    assert isinstance(second[1], BackedOff)
    assert second[1].reason.endswith(f"queue team limit {GPU} 1: used 510m, requested 510m")


def test_once_placed_it_is_charged_what_its_pods_hold_and_the_rest_comes_back() -> None:
    d = driver()
    d.step(submitted(memory_job("ns/a", 20480)), 1.0)
    d.step(submitted(memory_job("ns/b", 20480)), 2.0)                 # waits: 510m + 510m > 1
    out = d.step(placed_on("ns/a", 0.26, mib=20480), 3.0)               # it got an H100: 20480/81500 -> 0.26
    assert d.core.status()["team"]["usage"][GPU] == 260 + 510
    assert names(out)[-1] == ("Dequeued", "ns/b")                         # the quota that came back lets b in


def test_a_smaller_gpu_joining_charges_waiting_pods_more_and_holders_as_reserved() -> None:
    d = driver(least=H100, limit="2")
    d.step(submitted(memory_job("ns/a", 40000, count=2)), 1.0)           # reserved at 81500: 2 x 0.50
    assert d.core.status()["team"]["usage"][GPU] == 1000
    d.step(capacity(gpu_memory=A100, cpu="64", **{GPU: "5"}), 2.0)      # an A100 node came
    waiting = d.step(submitted(memory_job("ns/b", 40000, count=2)), 3.0)  # 2 x 0.98 now: over the limit
    assert isinstance(waiting[1], BackedOff)
    assert waiting[1].reason.endswith(f"queue team limit {GPU} 2: used 1, requested 1960m")
    assert d.core.status()["team"]["usage"][GPU] == 1000                # the holder keeps what it reserved
    out = d.step(capacity(gpu_memory=H100, cpu="64", **{GPU: "4"}), 4.0)  # it left: b asks 2 x 0.50 again
    assert names(out)[-1] == ("Dequeued", "ns/b")


def test_while_no_node_states_gpu_memory_it_charges_no_gpu_and_placement_says_why() -> None:
    d = driver(least=0)
    out = d.step(submitted(memory_job("ns/a", 20480)), 1.0)
    assert isinstance(out[1], Dequeued) and (out[1].gpu_memory, out[1].reason) == (
        0, "quota reserved in queue team (cpu 2)")


def test_preempted_it_is_charged_at_the_smallest_gpu_again() -> None:
    d = driver()
    d.step(submitted(memory_job("ns/a", 20480)), 1.0)
    d.step(placed_on("ns/a", 0.26, mib=20480), 2.0)
    assert d.core.status()["team"]["usage"][GPU] == 260
    again = d.step(preempted("ns/a", "ns/boss"), 3.0)   # nothing else waits: it is reserved again at once
    assert names(again)[-1] == ("Dequeued", "ns/a")
    assert again[-1].reason.endswith(f"quota reserved in queue team (cpu 2, {GPU} 510m)")   # the most it can take
    assert d.core.status()["team"]["usage"][GPU] == 510
