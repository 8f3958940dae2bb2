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
- order: lowest priority first, then who loses the least work (not started yet, then latest start,
  then admitted last): ``shared.kernel.victims.victim_rank``, the order placement evicts in too;
- greedy: add candidates in that order until the requester passes the quota check with their
  quota given back (``fits``, the leaf and every ancestor); None when even all of them do not;
- then drop every victim the others already cover for, the last taken first.

Placement then places the requester over exactly these victims (``ReclaimRequested``); since the
victims share the requester's queue it treats that as in-queue preemption (``reclaim=False``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from shared.kernel import victims as kernel_victims

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


def victim_order(holders: Iterable[Holder]) -> list[Holder]:
    """The in-queue victim order every evicting service shares (``shared.kernel.victims.victim_rank``),
    read from the holders: the queue's own admission order (``admitted_seq``) and start."""
    return kernel_victims.victim_order(holders, priority=lambda h: h.priority, started_at=lambda h: h.started_at,
                                       admitted=lambda h: h.admitted_seq, key=lambda h: h.key)
