"""GPU devices: fractions share a device up to 1000/1000, fullest device first; whole GPUs take free devices."""

from __future__ import annotations

from shared.kernel.events import GangPlaced, GpuAssignment, PlacementFailed, derive_id
from tests.builders import gang, node, pod_set, workload
from tests.builders.placement import PlacementDriver, one

GPU = "nvidia.com/gpu"


def fractional(key: str, *shares: int) -> object:
    """One pod set per share so each pod's fraction is explicit."""
    return workload(key, gang_=gang(*(pod_set(f"g{i}", 1, cpu="1", gpu_share=s) for i, s in enumerate(shares))))


def test_two_half_gpu_workers_share_one_device_with_one_group():
    d = PlacementDriver(None, node("gpu-node-1", cpu="16", gpu="1"))
    w = workload("default/raycluster-half-gpu", gang_=gang(pod_set("head", 1, cpu="1", memory="2Gi"),
                                                            pod_set("shared-gpu", 2, cpu="1", memory="2Gi",
                                                                    gpu_share=500)))
    placed = one(d.dequeue(w), GangPlaced)
    group = derive_id("default/raycluster-half-gpu", "gpu-node-1", 0)
    assert [s.gpu for s in placed.slots] == [None, GpuAssignment(devices=(0,), fraction=0.5, group=group),
                                             GpuAssignment(devices=(0,), fraction=0.5, group=group)]
    assert {s.node for s in placed.slots} == {"gpu-node-1"}


def test_a_device_never_goes_above_one_whole_gpu():
    d = PlacementDriver(None, node("n1", cpu="16", gpu="1"))
    failed = one(d.dequeue(fractional("ns/w", 500, 500, 500)), PlacementFailed)
    assert failed.reason.endswith(f"1/3 tasks could not be placed: 0/1 nodes are available: 1 Insufficient {GPU}.")
    # Nothing was kept: the device is whole again.
    assert one(d.dequeue(fractional("ns/x", 1000)), GangPlaced).slots[0].gpu.devices == (0,)


def test_third_half_goes_to_the_second_device():
    d = PlacementDriver(None, node("n1", cpu="16", gpu="2"))
    placed = one(d.dequeue(fractional("ns/w", 500, 500, 500)), GangPlaced)
    assert [s.gpu.devices for s in placed.slots] == [(0,), (0,), (1,)]
    assert placed.slots[0].gpu.group == placed.slots[1].gpu.group != placed.slots[2].gpu.group


def test_fraction_goes_to_the_fullest_device_that_fits():
    d = PlacementDriver(None, node("n1", cpu="16", gpu="2"))
    assert one(d.dequeue(fractional("ns/a", 500)), GangPlaced).slots[0].gpu.devices == (0,)   # 0: 500
    assert one(d.dequeue(fractional("ns/b", 750)), GangPlaced).slots[0].gpu.devices == (1,)   # 1: 750
    assert one(d.dequeue(fractional("ns/c", 250)), GangPlaced).slots[0].gpu.devices == (1,)   # fullest: 1 -> 1000
    assert one(d.dequeue(fractional("ns/d", 500)), GangPlaced).slots[0].gpu.devices == (0,)   # only 0 has room
    assert isinstance(d.dequeue(fractional("ns/e", 1))[0], PlacementFailed)


def test_gangs_on_one_device_get_different_groups():
    d = PlacementDriver(None, node("n1", cpu="16", gpu="1"))
    a = one(d.dequeue(fractional("ns/a", 300)), GangPlaced).slots[0].gpu
    b = one(d.dequeue(fractional("ns/b", 300)), GangPlaced).slots[0].gpu
    assert a.devices == b.devices == (0,)
    assert (a.group, b.group) == (derive_id("ns/a", "n1", 0), derive_id("ns/b", "n1", 0))


def test_whole_gpus_take_fully_free_devices_only():
    d = PlacementDriver(None, node("n1", cpu="16", gpu="3"))
    one(d.dequeue(fractional("ns/frac", 100)), GangPlaced)  # device 0 is now shared
    whole = workload("ns/whole", gang_=gang(pod_set("worker", 1, cpu="1", **{GPU: "2"})))
    assert one(d.dequeue(whole), GangPlaced).slots[0].gpu == GpuAssignment(devices=(1, 2), fraction=1.0)
    one_more = workload("ns/one", gang_=gang(pod_set("worker", 1, cpu="1", **{GPU: "1"})))
    failed = one(d.dequeue(one_more), PlacementFailed)
    assert failed.reason.endswith(f"0/1 nodes are available: 1 Insufficient {GPU}.")
    # ...while a fraction still fits next to the first one.
    assert one(d.dequeue(fractional("ns/frac2", 900)), GangPlaced).slots[0].gpu.devices == (0,)


def test_fractional_pods_binpack_onto_the_node_with_the_fullest_gpus():
    d = PlacementDriver(None, node("n1", cpu="16", gpu="1"), node("n2", cpu="16", gpu="1"))
    d.dequeue(workload("ns/cpu", gang_=gang(pod_set("head", 1, cpu="1"))))  # n1 is busier in cpu
    one(d.dequeue(fractional("ns/a", 600)), GangPlaced)
    placed = one(d.dequeue(fractional("ns/b", 400)), GangPlaced)
    assert (placed.slots[0].node, placed.slots[0].gpu.devices) == ("n1", (0,))
    spill = one(d.dequeue(fractional("ns/c", 400)), GangPlaced)
    assert (spill.slots[0].node, spill.slots[0].gpu.devices) == ("n2", (0,))


def test_node_without_gpus_never_gets_a_fraction():
    d = PlacementDriver(None, node("cpu-only", cpu="16"))
    failed = one(d.dequeue(fractional("ns/w", 100)), PlacementFailed)
    assert failed.reason.endswith(f"0/1 nodes are available: 1 Insufficient {GPU}. It can never fit in the cluster "
                                  "as it is: a g0 pod needs a share of a GPU, no node it may use has one (it "
                                  "waits for nodes to join or change).")
