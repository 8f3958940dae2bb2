"""The fragmentation measure (FGD) on hand-computed cases, and the ``fragmentation`` strategy's choices.

Definitions (Weng et al., USENIX ATC '23, §3): a node's fragment for a pod shape is the free GPU
share the shape cannot use there: all of it when the shape asks no GPU or does not fit (cpu,
memory, devices with room), else the free shares of devices with less room than the shape needs per
device. A node's fragmentation is the sum over the mix, weighted by how many pods had each shape.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from services.placement import fragmentation as fr
from shared.kernel.events import GangPlaced, PlacementFailed
from shared.kernel.policy import Policy, QueuePolicy
from tests.builders import gang, node, pod, pod_set, workload
from tests.builders.placement import PlacementDriver, one

HALF = (1000, 0, 0, 500)      # 1 cpu, half a GPU
WHOLE = (1000, 0, 1, 0)       # 1 cpu, one whole GPU
CPU_ONLY = (1000, 0, 0, 0)    # 1 cpu, no GPU
MIX = {HALF: 2, WHOLE: 1, CPU_ONLY: 1}


def measure(rooms: list[list[int]], cpu: list[int], counts: dict, memory: list[int] | None = None) -> list[float]:
    free = np.array(rooms, np.int64)
    mem = np.array(memory if memory is not None else [10**12] * len(rooms), np.int64)
    return fr.fragmentation(free, np.array(cpu, np.int64), mem, fr.mix_arrays(counts)).tolist()


def test_a_fitting_shape_strands_only_devices_with_less_room_than_it_needs():
    # rooms 1000 and 300: the half fits (device 0), stranding 300; the whole fits, stranding 300;
    # the cpu-only pod uses no GPU, so all 1300 are its fragment. 2*300 + 1*300 + 1*1300.
    assert measure([[1000, 300]], [8000], MIX) == [2200.0]


def test_a_shape_that_does_not_fit_strands_every_free_share():
    # Only half a cpu free: neither GPU shape fits, every one of the 1300 free thousandths is a fragment.
    assert measure([[1000, 300]], [500], MIX) == [4 * 1300.0]
    # Rooms 400 and 300: no device can take half a GPU, none is free for a whole one.
    assert measure([[400, 300]], [8000], MIX) == [4 * 700.0]
    # Memory counts like cpu: a shape asking more memory than the node has left does not fit.
    assert measure([[1000, 300]], [8000], {(1000, 5000, 0, 500): 1}, memory=[4000]) == [1300.0]


def test_a_full_or_gpu_less_node_has_no_fragment():
    assert measure([[0, 0], [0, 0]], [8000, 0], MIX) == [0.0, 0.0]


def test_whole_gpu_shapes_need_as_many_fully_free_devices():
    two = (1000, 0, 2, 0)
    assert measure([[1000, 1000, 500]], [8000], {two: 1}) == [500.0]
    assert measure([[1000, 900, 500]], [8000], {two: 1}) == [2400.0]


def test_the_mix_counts_each_workload_once_and_forgets_the_oldest_beyond_its_window():
    mix = fr.Mix(window=4)
    mix.observe("ns/a", [(HALF, 2)])
    mix.observe("ns/a", [(HALF, 2)])          # the same workload asked again (a retry)
    assert mix.counts == {HALF: 2}
    mix.observe("ns/b", [(WHOLE, 1), (CPU_ONLY, 1)])
    mix.observe("ns/c", [(WHOLE, 2)])          # 6 pods > 4: ns/a leaves
    assert (mix.counts, mix.pods) == ({WHOLE: 3, CPU_ONLY: 1}, 4)
    mix.observe("ns/a", [(HALF, 2)])           # gone from the window: it counts again
    assert mix.counts == {HALF: 2, WHOLE: 2}


def test_the_measure_keeps_the_most_frequent_gpu_shapes_and_ties_go_by_shape():
    counts = {HALF: 50, WHOLE: 45, CPU_ONLY: 3, (2000, 0, 0, 0): 2, (1000, 0, 0, 250): 45}
    assert fr.kept(counts, limit=2) == {CPU_ONLY: 3, (2000, 0, 0, 0): 2, HALF: 50, (1000, 0, 0, 250): 45}


def test_increase_picks_the_device_that_leaves_the_least_fragment():
    mix = fr.mix_arrays({(0, 0, 0, 600): 1})
    free = np.array([[1000, 900]], np.int64)
    cpu, mem = np.array([8000]), np.array([10**12])
    # 0.3 on device 0 leaves 700 and 900: both still take 0.6 (rise 0); on device 1, 600: also 0.
    # Equal rises: the fullest device wins (KAI's gpupack).
    rise, device = fr.increase(free, cpu, mem, mix, 0, 0, 0, 300)
    assert (rise.tolist(), device.tolist()) == ([0.0], [1])
    # 0.5 on device 0 leaves 500 (stranded: rise 500); on device 1, 400 (stranded: rise 400).
    rise, device = fr.increase(free, cpu, mem, mix, 0, 0, 0, 500)
    assert (rise.tolist(), device.tolist()) == ([400.0], [1])
    # A whole GPU takes the free device 0; 500 stays stranded for 0.6 as before: rise 0.
    rise, device = fr.increase(np.array([[1000, 500]]), cpu, mem, mix, 0, 0, 1, 0)
    assert (rise.tolist(), device.tolist()) == ([0.0], [-1])


def test_a_cpu_pod_that_leaves_too_little_cpu_for_the_gpu_pods_raises_fragmentation():
    mix = fr.mix_arrays({(4000, 0, 1, 0): 1})
    free = np.array([[1000, 1000], [0, 0]], np.int64)
    rise, _ = fr.increase(free, np.array([6000, 6000]), np.array([10**12] * 2), mix, 3000, 0, 0, 0)
    assert rise.tolist() == [2000.0, 0.0]   # the GPU node strands both devices; the other has none


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from([HALF, WHOLE, CPU_ONLY, (2000, 0, 0, 500), (2000, 1000, 2, 0),
                                                     (3000, 0, 0, 250)]), st.integers(1, 3)),
                         min_size=1, max_size=3), min_size=1, max_size=30),
       st.integers(1, 12), st.integers(1, 6))
def test_the_mix_counted_in_place_measures_as_one_built_afresh(arrivals, window, limit):
    free = np.array([[1000, 500, 250], [700, 0, 0], [1000, 1000, 0]], np.int64)
    cpu, mem = np.array([1000, 3000, 8000]), np.array([0, 1000, 5000])
    mix = fr.Mix(window=window, limit=limit)
    for n, pods in enumerate(arrivals):
        mix.observe(f"ns/w{n}", pods)
        assert fr.fragmentation(free, cpu, mem, mix.arrays()).tolist() == \
            fr.fragmentation(free, cpu, mem, fr.mix_arrays(mix.counts, limit)).tolist()


shapes = st.tuples(st.sampled_from([0, 1000, 2000]), st.sampled_from([0, 1000]),
                   st.sampled_from([(0, 0), (1, 0), (2, 0), (0, 250), (0, 500), (0, 600)]))
rooms = st.sampled_from([0, 100, 250, 500, 750, 1000])


def reference(room: list[int], cpu: int, mem: int, counts: dict) -> int:
    """The definition, one shape at a time."""
    total = 0
    for (c, m, whole, share), w in counts.items():
        need, devices = (share, 1) if share else (1000, whole)
        fits = cpu >= c and mem >= m and sum(r >= need for r in room) >= devices
        total += w * (sum(r for r in room if r < need) if fits and (whole or share) else sum(room))
    return total


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(rooms, min_size=3, max_size=3), st.sampled_from([0, 1000, 3000]),
                          st.sampled_from([0, 1000])), min_size=1, max_size=4),
       st.dictionaries(shapes, st.integers(1, 5), min_size=1, max_size=5),
       st.sampled_from([0, 1000]), st.sampled_from([(0, 0), (1, 0), (2, 0), (0, 300), (0, 500)]))
def test_vectorised_measure_and_increase_match_the_definition(nodes, raw, pod_cpu, pod_gpu):
    counts = {(c, m, whole, share): w for (c, m, (whole, share)), w in raw.items()}
    kept = counts
    mix = fr.mix_arrays(counts)
    free = np.array([n[0] for n in nodes], np.int64)
    cpu = np.array([n[1] for n in nodes], np.int64)
    mem = np.array([n[2] for n in nodes], np.int64)
    assert fr.fragmentation(free, cpu, mem, mix).tolist() == [reference(r, c, m, kept)
                                                               for r, c, m in zip(free.tolist(), cpu, mem)]
    whole, share = pod_gpu
    ok = cpu >= pod_cpu
    ok &= ((free == 1000).sum(axis=1) >= whole) if whole else (free >= share).any(axis=1)
    rows = np.flatnonzero(ok)
    if not rows.size:
        return
    rise, device = fr.increase(free[rows], cpu[rows], mem[rows], mix, pod_cpu, 0, whole, share)
    for j, i in enumerate(rows.tolist()):
        room, c, m = free[i].tolist(), int(cpu[i]), int(mem[i])
        before = reference(room, c, m, kept)
        if share:
            best = min((reference(room[:d] + [r - share] + room[d + 1:], c - pod_cpu, m, kept) - before, r, d)
                       for d, r in enumerate(room) if r >= share)
            assert (rise[j], device[j]) == (best[0], best[2])
        else:
            after, left = list(room), whole
            for d, r in enumerate(after):
                if left and r == 1000:
                    after[d], left = 0, left - 1
            assert rise[j] == reference(after, c - pod_cpu, m, kept) - before


# ---------------------------------------------------------------------------- the strategy in the core
def fraction(key: str, share: int, **selector: str) -> object:
    ps = pod_set("p", 1, cpu="1", gpu_share=share)
    if selector:
        ps = ps.model_copy(update={"node_selector": selector})
    return workload(key, gang_=gang(ps))


def sequence(policy: Policy) -> list[object]:
    """Two nodes hold 0.3 each, a third is free; then 0.6, 0.3, 0.6, 0.6 arrive, one workload each."""
    d = PlacementDriver(policy, *(node(n, cpu="8", gpu="1", labels={"name": n}) for n in "abc"))
    one(d.dequeue(fraction("ns/s1", 300, name="a")), GangPlaced)
    one(d.dequeue(fraction("ns/s2", 300, name="b")), GangPlaced)
    return [d.dequeue(fraction(f"ns/w{i}", share))[0] for i, share in enumerate((600, 300, 600, 600), 1)]


def test_fragmentation_keeps_room_for_the_pods_that_come_where_binpack_does_not():
    frag = sequence(Policy(placement="fragmentation"))
    assert [p.slots[0].node for p in frag] == ["a", "c", "b", "c"]
    assert frag[1].reason == "1/1 pods placed on 1 node(s) (fragmentation)"
    # binpack puts the second 0.3 on the fuller b; 0.4 is left on b and c each, and the last 0.6 fits nowhere.
    pack = sequence(Policy(placement="binpack"))
    assert [p.slots[0].node for p in pack[:3]] == ["a", "b", "c"]
    assert isinstance(pack[3], PlacementFailed)
    assert pack[3].reason.endswith("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")


def test_a_queue_can_ask_for_fragmentation_alone():
    per_queue = sequence(Policy(placement="binpack", queues={"default": QueuePolicy(placement="fragmentation")}))
    assert [p.slots[0].node for p in per_queue] == ["a", "c", "b", "c"]


def test_a_fraction_goes_where_it_strands_nothing_not_to_the_fullest_device():
    # Device 0 has 0.3 left. A 0.2 pod there (KAI's gpupack: the fullest device) would strand 0.1
    # that no 0.3 or 0.2 pod can use; on device 1 it strands nothing.
    d = PlacementDriver(Policy(placement="fragmentation"), node("n", cpu="8", gpu="2"))
    d.pod(pod("other", node_name="n", annotations={"gpu-fraction": "0.7"}))
    assert one(d.dequeue(fraction("ns/fills", 300)), GangPlaced).slots[0].gpu.devices == (0,)  # exact fit
    d.withdraw("ns/fills")                                  # gone; the mix remembers a 0.3 pod
    assert one(d.dequeue(fraction("ns/small", 200)), GangPlaced).slots[0].gpu.devices == (1,)
    pack = PlacementDriver(Policy(placement="binpack"), node("n", cpu="8", gpu="2"))
    pack.pod(pod("other", node_name="n", annotations={"gpu-fraction": "0.7"}))
    assert one(pack.dequeue(fraction("ns/small", 200)), GangPlaced).slots[0].gpu.devices == (0,)


def test_an_empty_mix_ranks_like_binpack():
    d = PlacementDriver(Policy(placement="fragmentation"), node("a", cpu="8"), node("b", cpu="8"))
    d.dequeue(workload("ns/first", gang_=gang(pod_set("p", 1, cpu="2"))))
    placed = one(d.dequeue(workload("ns/second", gang_=gang(pod_set("p", 2, cpu="2")))), GangPlaced)
    assert [s.node for s in placed.slots] == ["a", "a"]
