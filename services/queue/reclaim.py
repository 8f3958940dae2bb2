"""Reclaim: taking back over-share resources from other queues for a queue still within its share.

Rules, in the order they are applied:
- never when the cluster's free capacity already covers the demand (the caller checks that);
- the requesting queue must stay within its fair share: usage + demand <= share, every resource;
- victims are running, preemptible workloads of *other* leaf queues that are ``reclaimable`` and
  whose dominant share is above 1 (re-evaluated after every victim taken);
- the queue furthest above its share gives first; within it lowest priority, then newest
  (started_at desc, then admitted last);
- never a workload younger than its min runtime, never one whose removal would bring its queue
  below its guarantee on a resource being reclaimed (an UNLIMITED guarantee protects it fully),
  never one already promised to another reclaim, never one that frees nothing the cluster is
  short of;
- victims are added until free + reclaimed covers the demand; if that cannot be reached, none;
- then victims the others already cover for are dropped again (the last taken first), so no
  workload is evicted only to be admitted again in the same cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from services.queue.fairshare import dominant_share
from shared import quantity as q
from shared.model import QueueSpec

Resources = dict[str, int]


@dataclass(frozen=True)
class Running:
    """What reclaim needs to know about one running workload."""

    key: str
    queue: str
    priority: int
    preemptible: bool
    started_at: float
    min_runtime: float
    demand: Resources
    admitted_seq: int = 0
    """Admission order: breaks started_at ties (newest admitted goes first)."""
    promised: bool = False
    """Already named as a victim of a reclaim that placement has not answered yet."""


def within_share(usage: Mapping[str, int], demand: Mapping[str, int], share: Mapping[str, int]) -> bool:
    """A queue may reclaim only for a workload that keeps it within its fair share."""
    return all(usage.get(r, 0) + v <= share.get(r, 0) for r, v in demand.items() if v > 0)


def shortage(demand: Mapping[str, int], free: Mapping[str, int]) -> Resources:
    """What the cluster lacks for ``demand`` (positive amounts only)."""
    return {r: v - free.get(r, 0) for r, v in sorted(demand.items()) if v > 0 and v > free.get(r, 0)}


def _eligible(w: Running, requester: str, queue: QueueSpec | None, now: float) -> bool:
    if w.queue == requester or w.promised or not w.preemptible:
        return False
    if queue is not None and not queue.reclaimable:
        return False
    return now - w.started_at >= w.min_runtime


def _keeps_guarantee(usage: Mapping[str, int], demand: Mapping[str, int], queue: QueueSpec | None,
                     need: Mapping[str, int]) -> bool:
    """Taking ``demand`` away must leave the queue at or above its guarantee on what is reclaimed.

    Only the resources the reclaimer is short of count: what the victim frees besides them is
    not contested, so its owner can have it back at once.
    """
    if queue is None:
        return True
    for r, v in demand.items():
        if v <= 0 or r not in need:
            continue
        guarantee = queue.guarantee_of(r)
        if guarantee is None or usage.get(r, 0) - v < guarantee:
            return False
    return True


def choose_victims(short: Mapping[str, int], running: list[Running], queues: Mapping[str, QueueSpec | None],
                   usage: Mapping[str, Mapping[str, int]], shares: Mapping[str, Mapping[str, int]],
                   requester: str, now: float) -> tuple[str, ...] | None:
    """Victims whose release covers ``short``, furthest-above-share queue first; None if impossible."""
    need = {r: v for r, v in short.items() if v > 0}
    pool: dict[str, list[Running]] = {}
    for w in sorted(running, key=lambda w: (w.priority, -w.started_at, -w.admitted_seq, w.key)):
        if _eligible(w, requester, queues.get(w.queue), now):
            pool.setdefault(w.queue, []).append(w)
    left = {name: dict(usage.get(name, {})) for name in pool}
    short_of = {r: v for r, v in short.items() if v > 0}
    taken: list[Running] = []
    while need:
        best: tuple[float, str, Running] | None = None
        for name in sorted(pool):
            share = dominant_share(left[name], shares.get(name, {}))
            if share <= 1 or (best is not None and share <= best[0]):
                continue
            victim = next((w for w in pool[name]
                           if any(w.demand.get(r, 0) > 0 for r in need)
                           and _keeps_guarantee(left[name], w.demand, queues.get(name), need)), None)
            if victim is not None:
                best = (share, name, victim)
        if best is None:
            return None
        _, name, victim = best
        pool[name].remove(victim)
        left[name] = q.sub(left[name], victim.demand)
        need = {r: v - victim.demand.get(r, 0) for r, v in need.items() if v - victim.demand.get(r, 0) > 0}
        taken.append(victim)
    return tuple(w.key for w in _without_needless(taken, short_of))


def _without_needless(taken: list[Running], short: Mapping[str, int]) -> list[Running]:
    """Drop every victim the others already cover for, the last taken first.

    Greedy order may take a small victim from the queue furthest above its share before a larger
    one that alone covers the shortage; evicting the small one would only see it admitted again
    in the same cycle (its room is not needed), so it stays.
    """
    def covers(victims: list[Running]) -> bool:
        return all(sum(w.demand.get(r, 0) for w in victims) >= v for r, v in short.items())

    chosen = list(taken)
    for victim in reversed(taken):
        rest = [w for w in chosen if w is not victim]
        if covers(rest):
            chosen = rest
    return chosen
