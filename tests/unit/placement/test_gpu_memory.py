"""KAI's gpu-memory in placement: a pod asking MiB of one GPU holds that memory's share of the device it
gets (KAI's portion: hundredths, rounded up, of the node's ``nvidia.com/gpu.memory``), goes to the
fullest device with room for it, and never to a node whose GPU memory is unknown."""

from __future__ import annotations

import numpy as np
import pytest

from services.placement.nodes import NodeTable
from shared.kernel import gpumemory
from shared.kernel.events import CapacityChanged, GangPlaced, GpuAssignment, PlacementFailed, PodAssigned, derive_id
from shared.kernel.policy import Policy
from tests.builders import gang, node, pod, pod_set, workload
from tests.builders.placement import PlacementDriver, node_changed, of_type, one

A100 = {"nvidia.com/gpu.memory": "40960"}   # GPU feature discovery's label: KAI reads 40900 MiB per device
H100 = {"nvidia.com/gpu.memory": "81559"}   # 81500 MiB


def memory(key: str, *mibs: int) -> object:
    """One pod set per request, so each pod's memory is explicit."""
    return workload(key, gang_=gang(*(pod_set(f"g{i}", 1, cpu="1", gpu_memory=m) for i, m in enumerate(mibs))))


def test_a_pod_gets_its_memorys_share_of_the_device_and_tells_the_memory() -> None:
    d = PlacementDriver(None, node("a100", gpu="1", labels=A100))
    placed = one(d.dequeue(memory("ns/w", 20480)), GangPlaced)
    assert placed.slots[0].gpu == GpuAssignment(devices=(0,), fraction=0.51, group=derive_id("ns/w", "a100", 0),
                                                memory=20480)


def test_pods_share_a_device_while_its_memory_lasts_fullest_device_first() -> None:
    d = PlacementDriver(None, node("a100", gpu="2", labels=A100))
    first = one(d.dequeue(memory("ns/a", 20450)), GangPlaced)                 # 0.50 on device 0
    second = one(d.dequeue(memory("ns/b", 10225)), GangPlaced)                # 0.25: the fullest that fits, 0
    third = one(d.dequeue(memory("ns/c", 20480)), GangPlaced)                 # 0.51: not on 0 (1.26), on 1
    assert [p.slots[0].gpu.devices for p in (first, second, third)] == [(0,), (0,), (1,)]
    assert one(d.dequeue(memory("ns/d", 10225)), GangPlaced).slots[0].gpu.devices == (0,)   # 0 is now full
    failed = one(d.dequeue(memory("ns/e", 20480)), PlacementFailed)           # 1 has 0.49 left
    assert failed.reason.endswith("1/1 tasks could not be placed: 0/1 nodes are available: 1 Insufficient GPU memory.")


def test_the_share_is_each_nodes_own() -> None:
    d = PlacementDriver(None, node("a100", gpu="1", labels={**A100, "pool": "a"}),
                        node("h100", gpu="1", labels={**H100, "pool": "h"}))
    on_a = workload("ns/a", gang_=gang(pod_set("p", 1, cpu="1", gpu_memory=40000).model_copy(
        update={"node_selector": {"pool": "a"}})))
    on_h = workload("ns/h", gang_=gang(pod_set("p", 1, cpu="1", gpu_memory=40000).model_copy(
        update={"node_selector": {"pool": "h"}})))
    assert one(d.dequeue(on_a), GangPlaced).slots[0].gpu.fraction == 0.98   # 40000/40900
    assert one(d.dequeue(on_h), GangPlaced).slots[0].gpu.fraction == 0.5    # 40000/81500 = 0.4908 -> 0.50


def test_a_node_without_a_known_gpu_memory_takes_no_gpu_memory_pod() -> None:
    d = PlacementDriver(None, node("bare", gpu="1"), node("cpu", cpu="16"))
    failed = one(d.dequeue(memory("ns/w", 1024)), PlacementFailed)
    assert failed.reason.endswith("0/2 nodes are available: 2 node(s) were not GPU nodes or had no "
                                  "nvidia.com/gpu.memory label. It can never fit in the cluster as it is: a g0 "
                                  "pod needs 1024 MiB of one GPU (gpu-memory), no node it may use states its GPU "
                                  "memory (it waits for nodes to join or change).")
    assert failed.capacity_short  # it waits for nodes to change, not for a timer
    d.feed(node_changed(node("bare", gpu="1", labels=A100), "Modified"))   # GPU feature discovery labels it
    assert one(d.dequeue(memory("ns/w", 1024)), GangPlaced).slots[0].node == "bare"


def test_more_memory_than_any_device_waits_saying_so_until_a_larger_gpu_comes() -> None:
    d = PlacementDriver(None, node("a100", gpu="1", labels=A100))
    failed = one(d.dequeue(memory("ns/big", 61440)), PlacementFailed)
    assert failed.reason.endswith("0/1 nodes are available: 1 node(s) had GPUs of less than 61440 MiB. It can "
                                  "never fit in the cluster as it is: a g0 pod needs 61440 MiB of one GPU "
                                  "(gpu-memory), the largest GPU of a node it may use has 40900 MiB (it waits "
                                  "for nodes to join or change).")
    d.add_node("h100", gpu="1", labels=H100)
    placed = one(d.dequeue(memory("ns/big", 61440)), GangPlaced)
    assert (placed.slots[0].node, placed.slots[0].gpu.fraction) == ("h100", 0.76)


def test_capacity_tells_the_least_gpu_memory_a_schedulable_gpu_node_states() -> None:
    d = PlacementDriver()
    assert one(d.add_node("cpu", cpu="8", labels={"nvidia.com/gpu.memory": "1000"}), CapacityChanged).gpu_memory == 0
    assert one(d.add_node("h100", gpu="1", labels=H100), CapacityChanged).gpu_memory == 81500
    assert one(d.add_node("a100", gpu="1", labels=A100), CapacityChanged).gpu_memory == 40900
    cordoned = one(d.feed(node_changed(node("a100", gpu="1", labels=A100, unschedulable=True), "Modified")),
                   CapacityChanged)
    assert cordoned.gpu_memory == 81500


def test_a_bound_pod_tells_its_slot_the_portion_and_keeps_its_shape() -> None:
    d = PlacementDriver(None, node("a100", gpu="1", labels=A100))
    spec = workload("ns/rc", gang_=gang(pod_set("head", 1, cpu="1"), pod_set("w", 1, cpu="1", gpu_memory=20480)))
    out = d.dequeue(spec)
    out += d.run(spec, out)
    assigned = [p for p in of_type(out, PodAssigned) if p.pod_set == "w"]
    assert [p.gpu.fraction for p in assigned] == [0.51]
    # What the binder wrote (devices, portion) does not make the pod another shape: it still fills its slot,
    # and the device holds 0.51, so a 0.5 pod does not fit beside it.
    assert isinstance(d.dequeue(memory("ns/half", 20450))[0], PlacementFailed)


def test_another_schedulers_gpu_memory_pod_holds_its_share_where_it_is_bound() -> None:
    d = PlacementDriver(None, node("a100", gpu="1", labels=A100), node("bare", gpu="1", labels={"pool": "bare"}))
    d.pod(pod("theirs", node_name="a100", annotations={"gpu-memory": "30000"}, scheduler="kai-scheduler",
              phase="Running"))
    d.pod(pod("blind", node_name="bare", annotations={"gpu-memory": "100"}, scheduler="kai-scheduler",
              phase="Running"))
    # a100's device holds 0.74 (30000/40900); bare's is taken whole: its memory is unknown.
    assert isinstance(d.dequeue(memory("ns/w", 20450))[0], PlacementFailed)
    assert one(d.dequeue(memory("ns/x", 10225)), GangPlaced).slots[0].node == "a100"
    tenth = pod_set("p", 1, cpu="1", gpu_share=100).model_copy(update={"node_selector": {"pool": "bare"}})
    assert isinstance(d.dequeue(workload("ns/f", gang_=gang(tenth)))[0], PlacementFailed)


def test_fragmentation_places_a_gpu_memory_pod_by_its_share_on_each_node() -> None:
    d = PlacementDriver(Policy(placement="fragmentation"), node("a100", gpu="2", labels=A100))
    d.pod(pod("other", node_name="a100", annotations={"gpu-fraction": "0.7", "muster.dev/gpu-devices": "0"}))
    one(d.dequeue(workload("ns/m", gang_=gang(pod_set("p", 1, cpu="1", gpu_share=300)))), GangPlaced)
    d.withdraw("ns/m")  # 0.3 pods are in the mix now; device 0 has 0.3 left again
    # 10225 MiB is 0.25 here. On device 0 (gpupack's choice) it would strand 0.05 no 0.3 pod can use; on
    # device 1 it leaves 0.75, room for two: fragmentation measures it with the node's share of it.
    placed = one(d.dequeue(memory("ns/w", 10225)), GangPlaced)
    assert (placed.slots[0].gpu.devices, placed.slots[0].gpu.fraction) == ((1,), 0.25)
    assert isinstance(d.dequeue(memory("ns/x", 61440))[0], PlacementFailed)


@pytest.mark.parametrize("mib", [1, 99, 100, 10225, 20450, 20480, 40899, 40900, 40901, 61440, gpumemory.LARGEST])
def test_the_node_tables_shares_are_the_kernels(mib: int) -> None:
    table = NodeTable()
    for i, label in enumerate(("40960", "81559", "100", "", "42949672960", "999999")):
        table.upsert(f"n{i}", node(f"n{i}", gpu="1", labels={"nvidia.com/gpu.memory": label} if label else {}))
    need = table.memory_need(mib, slice(0, table.n))
    expected = [gpumemory.share(mib, int(m)) or 1 << 40 for m in table.gpu_memory[:table.n]]
    assert need.tolist() == expected
    demand = table.demand({"cpu": 1000, "pods": 1000}, 0, mib)
    assert [table.share_on(i, demand) for i in range(table.n)] == expected
    assert np.array_equal(table.feasible(demand, np.ones(table.n, bool), slice(0, table.n)),
                          np.array([e <= 1000 for e in expected]))
