"""In-queue priority preemption for quota: when a queue's own limit (or an ancestor's) blocks a
workload, lower-priority holders of the SAME leaf queue give their quota back (Volcano's and KAI's
in-queue preemption when the queue is full).

Rules, in the order they are applied:
- the requester may preempt (``WorkloadSpec.preempts``: a suspended workload of a kube-queue or
  default queue only overtakes, the core asks nobody for it);
- candidates hold quota as admitted or running (a mere reservation is not evicted), are
  preemptible, have a lower priority than the requester, are not already promised to another
  reclaim or preemption, and have run the queue's minimum runtime (one admitted but not Running
  yet qualifies only when that minimum is 0);
- order: lowest priority first, then newest (not started yet, then latest start, then admitted
  last);
- greedy: add candidates in that order until the requester passes the quota check with their
  quota given back (``fits``, the leaf and every ancestor); None when even all of them do not;
- then drop every victim the others already cover for, the last taken first.

Placement then places the requester over exactly these victims (``ReclaimRequested``); since the
victims share the requester's queue it treats that as in-queue preemption (``reclaim=False``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

Resources = dict[str, int]


@dataclass(frozen=True)
class Holder:
    """What quota preemption needs to know about one workload holding quota in the queue."""

    key: str
    priority: int
    preemptible: bool
    started_at: float | None
    """When its gang was Running (None: admitted, not Running yet)."""
    admitted_seq: int
    demand: Resources
    promised: bool = False


def eligible(h: Holder, priority: int, now: float, min_runtime: float) -> bool:
    if h.promised or not h.preemptible or h.priority >= priority:
        return False
    if h.started_at is None:
        return min_runtime <= 0
    return now - h.started_at >= min_runtime


def victim_order(holders: Sequence[Holder]) -> list[Holder]:
    """Lowest priority first; within it the newest: not started yet, latest start, admitted last."""
    return sorted(holders, key=lambda h: (h.priority, h.started_at is not None, -(h.started_at or 0.0),
                                          -h.admitted_seq, h.key))
