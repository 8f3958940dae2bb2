"""GPU devices: each node's devices carry a used share in thousandths (1000 = a whole device).

Decisions made here:
- a fractional pod (``PodSet.gpu_share``) goes to the *fullest* device it still fits on
  (KAI's gpupack), ties to the lowest device index, and never pushes a device above 1000; a
  ``gpu-memory`` pod (``PodSet.gpu_memory``) is a fractional pod whose share is its memory's share of
  the node's devices (``NodeTable.share_on``), placed the same way;
- a whole-GPU pod takes fully free devices, lowest indices first;
- pods of one gang sharing one device share a group id ``derive_id(workload, node, device)``.

A node's row in the device matrix holds ``SENTINEL + used`` for device slots beyond its device
count, so such slots never look free or roomy, and charges stay reversible if the count changes.
"""

from __future__ import annotations

from typing import Sequence

from shared.kernel.events import GpuAssignment, derive_id

FULL = 1000
SENTINEL = 1 << 40

GpuCharge = tuple[tuple[int, int], ...]
"""(device index, share in thousandths) per device a pod or slot holds."""


def room(row: Sequence[int]) -> int:
    """The largest share one more pod could get on a single device of this node (-1: no device)."""
    live = [v for v in row if v < SENTINEL]
    return FULL - min(live) if live else -1


def free_devices(row: Sequence[int]) -> int:
    return sum(1 for v in row if v == 0)


def load(row: Sequence[int]) -> int:
    """Σ used shares over the node's devices (for scoring: how full the node's GPUs are)."""
    return sum(v for v in row if v < SENTINEL)


def best_fraction_device(row: Sequence[int], share: int) -> int | None:
    """Fullest device with ``used + share <= 1000``; lowest index on ties; None if none fits."""
    best, best_used = None, -1
    for device, used in enumerate(row):
        if used < SENTINEL and used + share <= FULL and used > best_used:
            best, best_used = device, used
    return best


def whole_devices(row: Sequence[int], count: int) -> tuple[int, ...] | None:
    """The first ``count`` fully free devices, or None when there are not enough."""
    free = [device for device, used in enumerate(row) if used == 0]
    return tuple(free[:count]) if len(free) >= count else None


def least_used_devices(row: Sequence[int], count: int) -> tuple[int, ...]:
    """For pods bound by someone else: the devices they most likely got (may overcommit)."""
    live = sorted((used, device) for device, used in enumerate(row) if used < SENTINEL)
    return tuple(device for _, device in live[:count])


def charge_for(row: Sequence[int], whole: int, share: int) -> GpuCharge | None:
    """Devices for a pod we place: None when this node cannot host it (the caller filtered already)."""
    if share:
        device = best_fraction_device(row, share)
        return None if device is None else ((device, share),)
    if whole:
        devices = whole_devices(row, whole)
        return None if devices is None else tuple((d, FULL) for d in devices)
    return ()


def observed_charge(row: Sequence[int], whole: int, share: int, devices: tuple[int, ...] | None) -> GpuCharge:
    """Devices a bound pod holds: as annotated when known, else the best guess (never refuses)."""
    if devices:
        per_device = share or FULL
        return tuple((d, per_device) for d in devices if 0 <= d < len(row) and row[d] < SENTINEL)
    if share:
        device = best_fraction_device(row, share)
        if device is None:
            guess = least_used_devices(row, 1)
            return ((guess[0], share),) if guess else ()
        return ((device, share),)
    if whole:
        picked = whole_devices(row, whole) or least_used_devices(row, whole)
        return tuple((d, FULL) for d in picked)
    return ()


def group_id(workload: str, node: str, device: int) -> str:
    return derive_id(workload, node, device)


def assignment(workload: str, node: str, charge: GpuCharge, memory: int = 0) -> GpuAssignment | None:
    """What the binder is told: fraction per device; a group id only for shared (fractional) devices;
    ``memory``: the MiB a ``gpu-memory`` pod asked for, whose share of the device the fraction is."""
    if not charge:
        return None
    devices = tuple(d for d, _ in charge)
    share = charge[0][1]
    if memory:
        return GpuAssignment(devices=devices, fraction=share / FULL, group=group_id(workload, node, devices[0]),
                             memory=memory)
    if share >= FULL:
        return GpuAssignment(devices=devices, fraction=1.0)
    return GpuAssignment(devices=devices, fraction=share / FULL, group=group_id(workload, node, devices[0]))
