"""GPU fragmentation with respect to the workload mix, and how much a placement adds to it (FGD).

The measure is FGD's (Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC '23; hkust-adsl/kubernetes-scheduler-simulator
``pkg/utils/frag.go``): for a node n and a pod shape m (cpu, memory, whole GPUs k or a share s of
one GPU), the fragment ``frag(n, m)`` is the free GPU capacity of n that a pod of shape m cannot use:

- m asks for no GPU: every free GPU share of n;
- m does not fit on n (cpu, memory, or fewer than k devices with room for its per-device need
  g = s, or 1000 for whole GPUs): every free GPU share of n;
- m fits: the free shares of the devices whose room is below g.

The node's fragmentation is the expectation over the mix, ``F(n) = Σ_m w_m · frag(n, m)`` with w_m
the number of recently arrived pods of shape m (``Mix``). A pod goes where ``F`` rises least (the
"fragmentation gradient"); a fractional pod also picks its device that way.

Arithmetic: free shares are integers in thousandths, weights are pod counts, so every F and every
difference is an integer far below 2**53; computed in float64 it stays exact, whatever the order
of summation.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable, TypeVar

import numpy as np

from services.placement import gpu

Shape = tuple[int, int, int, int]
"""(cpu milli, memory milli, whole GPUs, share of one GPU in thousandths) of one pod."""

MIX_WINDOW = 10_000
"""Pods the mix remembers: the shapes of the last this many pods that arrived (whole workloads)."""
MAX_SHAPES = 128
"""GPU shapes the measure keeps: the most frequent (ties by shape). FGD keeps the "typical" ones that
make up 95% of the pods; on the openb trace every shape helps (see bench/gpu_trace.md), so muster
keeps them all up to this bound on the cost of rebuilding the mix (openb's lists have at most 126;
docs/design/placement.md, "fragmentation", has the figures)."""


@dataclass
class MixArrays:
    """The kept shapes as arrays for the vectorised measure; every order in them is sorted, never arrival."""

    total: float
    """Σ of the kept shapes' weights (pods asking no GPU included: every free share is their fragment)."""
    cpu_levels: np.ndarray
    memory_levels: np.ndarray
    """(C,), (M,): the distinct cpu and memory asks of the GPU shapes, ascending."""
    fitting: np.ndarray
    """(Q, C + 1, M + 1): per GPU group (a per-device need and a device count), the weight of its
    shapes asking at most the i-th cpu level and the j-th memory level (index 0: below every level)."""
    group_need: np.ndarray
    """(Q,) index into ``needs`` of each group's per-device need."""
    group_devices: np.ndarray
    """(Q, 1) devices each group needs with that room."""
    needs: np.ndarray
    """(G, 1) distinct per-device needs in thousandths (1000 for whole GPUs)."""
    index: tuple[dict[tuple[int, int], int], dict[int, int], dict[int, int]]
    """Positions of each group, cpu level and memory level, to add a count in place."""

    def add(self, shape: Shape, count: int) -> bool:
        """Count ``count`` more (or fewer) pods of ``shape`` in place; False when its group or a level is
        new (then the arrays must be built again). A level left without shapes weighs nothing."""
        if not (shape[2] or shape[3]):
            self.total += count
            return True
        groups, cpu_levels, memory_levels = self.index
        q, i, j = groups.get(_group(shape)), cpu_levels.get(shape[0]), memory_levels.get(shape[1])
        if q is None or i is None or j is None:
            return False
        self.fitting[q, i + 1:, j + 1:] += count
        self.total += count
        return True


class Mix:
    """The shapes of recently arrived pods, counted once per workload, over a window of ``window`` pods;
    the measure keeps the ``limit`` most frequent GPU shapes."""

    def __init__(self, window: int = MIX_WINDOW, limit: int = MAX_SHAPES) -> None:
        self.window, self.limit = window, limit
        self._entries: deque[tuple[str, tuple[tuple[Shape, int], ...]]] = deque()
        self._keys: dict[str, None] = {}
        self.counts: dict[Shape, int] = {}
        self.pods = 0
        self._gpu_shapes = 0
        self._arrays: MixArrays | None = None

    def observe(self, key: str, pods: Iterable[tuple[Shape, int]]) -> None:
        """A workload arrived (its pods' shapes and counts); one already in the window is not counted again."""
        if key in self._keys:
            return
        entry = tuple((shape, count) for shape, count in pods if count > 0)
        self._entries.append((key, entry))
        self._keys[key] = None
        self._count(entry, +1)
        while self.pods > self.window and len(self._entries) > 1:
            old_key, old = self._entries.popleft()
            del self._keys[old_key]
            self._count(old, -1)

    def _count(self, entry: tuple[tuple[Shape, int], ...], sign: int) -> None:
        for shape, count in entry:
            left = self.counts.get(shape, 0) + sign * count
            if left:
                self.counts[shape] = left
            else:
                del self.counts[shape]
            self.pods += sign * count
            if shape[2] or shape[3]:
                self._gpu_shapes += (left > 0) - (left - sign * count > 0)
            # Counted in place while every GPU shape is kept, else built again. Arrays built with shapes
            # cut are never patched: the next change still finds more GPU shapes than the limit.
            if self._arrays is not None and (self._gpu_shapes > self.limit or not self._arrays.add(shape, sign * count)):
                self._arrays = None

    def arrays(self) -> MixArrays:
        if self._arrays is None:
            self._arrays = mix_arrays(self.counts, self.limit)
        return self._arrays


def kept(counts: dict[Shape, int], limit: int = MAX_SHAPES) -> dict[Shape, int]:
    """Every shape asking no GPU, and the ``limit`` most frequent GPU shapes (ties by shape)."""
    ranked = sorted(((s, w) for s, w in counts.items() if s[2] or s[3]), key=lambda item: (-item[1], item[0]))
    return {**{s: w for s, w in counts.items() if not (s[2] or s[3])}, **dict(ranked[:limit])}


def mix_arrays(counts: dict[Shape, int], limit: int = MAX_SHAPES) -> MixArrays:
    """The measure's view of shape counts, as arrays."""
    shapes = kept(counts, limit)
    gpu_shapes = sorted(s for s in shapes if s[2] or s[3])
    groups = _positions(_group(s) for s in gpu_shapes)
    needs = _positions(need for need, _ in groups)
    cpu_levels = _positions(s[0] for s in gpu_shapes)
    memory_levels = _positions(s[1] for s in gpu_shapes)
    fitting = np.zeros((len(groups), len(cpu_levels) + 1, len(memory_levels) + 1))
    np.add.at(fitting, ([groups[_group(s)] for s in gpu_shapes], [cpu_levels[s[0]] + 1 for s in gpu_shapes],
                        [memory_levels[s[1]] + 1 for s in gpu_shapes]), [shapes[s] for s in gpu_shapes])
    return MixArrays(
        total=float(sum(shapes.values())),
        cpu_levels=np.array(list(cpu_levels), np.int64),
        memory_levels=np.array(list(memory_levels), np.int64),
        fitting=fitting.cumsum(axis=1).cumsum(axis=2),
        group_need=np.array([needs[need] for need, _ in groups], np.intp),
        group_devices=np.array([devices for _, devices in groups], np.int64).reshape(-1, 1),
        needs=np.array(list(needs), np.int64).reshape(-1, 1),
        index=(groups, cpu_levels, memory_levels),
    )


_P = TypeVar("_P", int, tuple[int, int])


def _positions(values: Iterable[_P]) -> dict[_P, int]:
    """Distinct values in ascending order, each with its position."""
    return {v: i for i, v in enumerate(sorted(set(values)))}


def _group(shape: Shape) -> tuple[int, int]:
    """(per-device need, devices): a share needs one device with that room, k whole GPUs k free devices."""
    return (shape[3], 1) if shape[3] else (gpu.FULL, shape[2])


def free_shares(device_rows: np.ndarray) -> np.ndarray:
    """Room per device in thousandths from the table's used shares (absent device slots have none)."""
    room: np.ndarray = np.clip(gpu.FULL - device_rows, 0, None)
    return room


def fragmentation(free: np.ndarray, cpu_free: np.ndarray, memory_free: np.ndarray, mix: MixArrays) -> np.ndarray:
    """``F(n)`` for each row: ``free`` (N, D) room per device, ``cpu_free``/``memory_free`` (N,)."""
    below, fits = _device_terms(free, mix.needs)
    return _measure(mix, _fitting_weight(mix, cpu_free, memory_free), below, fits, free.sum(axis=1))


def increase(free: np.ndarray, cpu_free: np.ndarray, memory_free: np.ndarray, mix: MixArrays,
             cpu: int, memory: int, whole: int, share: int) -> tuple[np.ndarray, np.ndarray]:
    """How much ``F`` of each row rises when one pod (cpu, memory, whole GPUs or a share) lands there.

    Returns (increase (N,), device (N,)): for a fractional pod the device that rises least (ties:
    the fullest device, KAI's gpupack, then the lowest index), -1 where no device has room; whole-GPU
    pods take the lowest free devices (all free devices are alike to the measure), device -1.
    Rows must be able to host the pod (the caller filtered them).
    """
    n = free.shape[0]
    below, fits = _device_terms(free, mix.needs)
    total = free.sum(axis=1)
    before = _measure(mix, _fitting_weight(mix, cpu_free, memory_free), below, fits, total)
    weight_after = _fitting_weight(mix, cpu_free - cpu, memory_free - memory)
    if not share:
        # Whole devices come from fully free ones: room 1000 is never below a need, and 0 adds nothing.
        after = _measure(mix, weight_after, below, fits - whole, total - whole * gpu.FULL)
        return after - before, np.full(n, -1, np.intp)
    needs = mix.needs
    best = np.full(n, np.inf)
    best_key = np.full(n, np.iinfo(np.int64).max, np.int64)
    device = np.full(n, -1, np.intp)
    for d in range(free.shape[1]):
        room = free[:, d]
        # Devices with the room of an earlier device of the row give the same rise: only the first counts.
        rows = np.flatnonzero((room >= share) & (free[:, :d] != room[:, None]).all(axis=1))
        if not rows.size:
            continue
        was, left = room[rows], room[rows] - share
        below_d = below[:, rows] - np.where(was < needs, was, 0) + np.where(left < needs, left, 0)
        fits_d = fits[:, rows] - (was >= needs) + (left >= needs)
        rise = _measure(mix, weight_after[:, rows], below_d, fits_d, total[rows] - share) - before[rows]
        # One integer key orders (rise, fullest device): rises are exact integers, rooms ≤ 1000.
        key = rise.astype(np.int64) * (gpu.FULL + 1) + was
        better = key < best_key[rows]
        chosen = rows[better]
        best_key[chosen], best[chosen], device[chosen] = key[better], rise[better], d
    return best, device


def _device_terms(free: np.ndarray, needs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(G, N): per distinct need g, Σ of rooms below g, and the count of devices with room ≥ g.

    Rooms sorted per row: the k rooms below g are the first k, their sum a prefix sum.
    """
    n, width = free.shape
    rooms = np.sort(free, axis=1)
    prefix = np.zeros((n, width + 1), np.int64)
    np.cumsum(rooms, axis=1, out=prefix[:, 1:])
    under = np.zeros((needs.shape[0], n), np.intp)
    for d in range(width):
        under += rooms[:, d] < needs
    return prefix[np.arange(n), under], width - under


def _fitting_weight(mix: MixArrays, cpu_free: np.ndarray, memory_free: np.ndarray) -> np.ndarray:
    """(Q, N): per GPU group, the weight of its shapes whose cpu and memory fit on each row."""
    i = np.searchsorted(mix.cpu_levels, cpu_free, side="right")
    j = np.searchsorted(mix.memory_levels, memory_free, side="right")
    return mix.fitting[:, i, j]


def _measure(mix: MixArrays, weight: np.ndarray, below: np.ndarray, fits: np.ndarray, total: np.ndarray) -> np.ndarray:
    """``F = Σ_m w_m · total - Σ_(m fits) w_m · (total - below_g(m))``: a fitting shape strands only rooms below its need."""
    hosts = fits[mix.group_need] >= mix.group_devices
    usable = np.where(hosts, total - below[mix.group_need], 0)
    measure: np.ndarray = mix.total * total - (weight * usable).sum(axis=0)
    return measure
