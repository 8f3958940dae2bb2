"""Deserved (fair) share per queue and resource, and the dominant share that orders queues.

Top down from the top level, whose total is the cluster capacity (``CapacityChanged.total``):
1. every child gets min(entitlement, demand) (its guarantee, or Volcano's ``deserved`` where it is
   higher: ``QueueSpec.entitled_of``), where demand = usage + pending demand of its subtree,
   capped by its limit (so a queue never deserves more than it may use);
2. the remainder goes to the highest queue-priority level first, split by weight among the
   children still short of their demand (water-filling), then to the next level. Weights are
   ``QueueSpec.weight``, integers in thousandths (KAI's ``overQuotaWeight: 0.4`` is 400); only their
   ratios matter and the split is integer arithmetic, so whole weights (×1000) split exactly as before;
3. each child's share is split among its own children the same way.
If guarantees alone exceed what the level has (cluster smaller than promised), the level is
water-filled with equal weights up to each child's guaranteed amount instead.
"""

from __future__ import annotations

import math
from typing import Mapping

from services.queue.tree import QueueTree
from shared.kernel import quantity as q
from shared.kernel.model import QueueSpec

Resources = dict[str, int]

DRF_RESOURCES = (q.CPU, q.MEMORY, q.GPU)
"""Resources the dominant share is taken over (DRF)."""


def waterfill(amount: int, caps: Mapping[str, int], weights: Mapping[str, int]) -> dict[str, int]:
    """Split ``amount`` by weight without exceeding any cap; capped members' excess goes to the rest.

    Integer milli-units: the last few units of a proportional split go one each to members in
    ``caps`` order, so the result is exact and deterministic. Weight 0 gets nothing.
    """
    given = {name: 0 for name in caps}
    active = [n for n in caps if caps[n] > 0 and weights.get(n, 0) > 0]
    while amount > 0 and active:
        total_weight = sum(weights[n] for n in active)
        capped = [n for n in active if (caps[n] - given[n]) * total_weight <= amount * weights[n]]
        if capped:
            for n in capped:
                amount -= caps[n] - given[n]
                given[n] = caps[n]
            active = [n for n in active if n not in capped]
            continue
        parts = {n: amount * weights[n] // total_weight for n in active}
        rest = amount - sum(parts.values())
        for n in active:
            given[n] += parts[n]
        for n in active:
            if rest <= 0:
                break
            given[n] += 1
            rest -= 1
        amount = 0
    return given


def split_level(available: int, children: list[QueueSpec], demand: Mapping[str, int], resource: str) -> dict[str, int]:
    """One level of the tree for one resource: entitlements first, then priority levels by weight."""
    floor: dict[str, int] = {}
    for spec in children:
        entitled = spec.entitled_of(resource)
        floor[spec.name] = demand[spec.name] if entitled is None else min(entitled, demand[spec.name])
    if sum(floor.values()) > available:
        return waterfill(available, floor, {name: 1 for name in floor})
    given = dict(floor)
    left = available - sum(floor.values())
    for level in sorted(dict.fromkeys(spec.priority for spec in children), reverse=True):
        members = [spec for spec in children if spec.priority == level]
        room = {spec.name: demand[spec.name] - given[spec.name] for spec in members}
        extra = waterfill(left, room, {spec.name: spec.weight for spec in members})
        for name, amount in extra.items():
            given[name] += amount
            left -= amount
    return given


def capped_demand(tree: QueueTree, direct: Mapping[str, Mapping[str, int]], resources: list[str]) -> dict[str, Resources]:
    """Per queue: its own plus its subtree's demand, each level capped by its limit."""
    out: dict[str, Resources] = {}
    for top in tree.children(None):
        _capped(tree, direct, resources, top, out)
    return out


def _capped(tree: QueueTree, direct: Mapping[str, Mapping[str, int]], resources: list[str], name: str,
            out: dict[str, Resources]) -> Resources:
    """``capped_demand`` of ``name``'s subtree. A module function, not a closure: a recursive closure
    is a reference cycle, garbage only the cyclic collector frees (the queue asks every cycle)."""
    total = {r: direct.get(name, {}).get(r, 0) for r in resources}
    for child in tree.children(name):
        total = q.add(total, _capped(tree, direct, resources, child, out))
    spec = tree.get(name)
    for r in resources:
        limit = spec.limit_of(r) if spec else None
        if limit is not None:
            total[r] = min(total[r], limit)
    out[name] = total
    return total


def deserved(tree: QueueTree, capacity: Mapping[str, int], direct: Mapping[str, Mapping[str, int]]) -> dict[str, Resources]:
    """Fair share of every queue for every resource the cluster has.

    ``direct``: per queue, usage + pending demand of the workloads it holds itself.
    """
    resources = sorted(r for r in capacity if capacity[r] > 0)
    demand = capped_demand(tree, direct, resources)
    shares: dict[str, Resources] = {name: {} for name in tree.names()}
    _share_out(tree, resources, demand, shares, None, capacity)
    return shares


def _share_out(tree: QueueTree, resources: list[str], demand: Mapping[str, Resources], shares: dict[str, Resources],
               parent: str | None, available: Mapping[str, int]) -> None:
    """Split ``available`` among ``parent``'s children, then each child's share among its own (a
    module function for the reason ``_capped`` is)."""
    kids = tree.children(parent)
    if not kids:
        return
    specs = [spec for spec in (tree.get(k) for k in kids) if spec is not None]
    for r in resources:
        level = split_level(available.get(r, 0), specs, {s.name: demand[s.name][r] for s in specs}, r)
        for name, amount in level.items():
            shares[name][r] = amount
    for spec in specs:
        _share_out(tree, resources, demand, shares, spec.name, shares[spec.name])


def dominant_share(usage: Mapping[str, int], share: Mapping[str, int]) -> float:
    """max over cpu/memory/GPU of usage / fair share (0 when both are 0, inf when only share is)."""
    best = 0.0
    for r in DRF_RESOURCES:
        used = usage.get(r, 0)
        if used <= 0:
            continue
        deserved_amount = share.get(r, 0)
        if deserved_amount <= 0:
            return math.inf
        best = max(best, used / deserved_amount)
    return best
