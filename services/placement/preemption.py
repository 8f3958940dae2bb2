"""In-queue priority preemption: which admitted workloads may make room, and the fewest of them.

Who may be a victim (all must hold): the preemptor may preempt (``WorkloadSpec.preempts``: not a
suspended workload of a kube-queue or default queue), same queue as the preemptor, lower priority,
preemptible (``volcano.sh/preemptable: "false"`` and KAI's non-preemptible never are), admitted here,
and ran at least its min runtime (time since GangRunning; with a min runtime of 0
an admitted workload that is not Running yet qualifies too).

Which victims: candidates ordered by priority ascending, newest first; add them one by one until
the gang fits, then drop every victim the gang does not need (trying the last added, i.e. the
highest priority / oldest, first). ``fits`` is a trial placement the caller rolls back.
"""

from __future__ import annotations

from typing import Sequence

from services.placement.elastic import Victim
from services.placement.gang import GangAttempt, place_gang
from services.placement.ledger import PodLedger
from services.placement.nodes import NodeTable
from services.placement.statement import Statement
from services.placement.workloads import WorkloadRecord
from shared.kernel.model import Gang



def eligible(victim: WorkloadRecord, preemptor: WorkloadRecord, now: float, min_runtime: float) -> bool:
    spec = victim.spec
    if victim is preemptor or not victim.admitted or victim.queue != preemptor.queue or not preemptor.spec.preempts:
        return False
    if not spec.preemptible or spec.priority >= preemptor.spec.priority:
        return False
    if victim.started_at is None:
        return min_runtime <= 0
    return now - victim.started_at >= min_runtime


def victim_order(candidates: Sequence[WorkloadRecord]) -> list[WorkloadRecord]:
    """Lowest priority first; within a priority the newest (latest start, else latest admission)."""
    def key(w: WorkloadRecord) -> tuple[int, float, int, str]:
        since = w.started_at if w.started_at is not None else w.admitted_at
        return (w.spec.priority, -since, -w.admitted_seq, w.spec.key)
    return sorted(candidates, key=key)


def trial(nodes: NodeTable, ledger: PodLedger, gang: Gang, strategy: str, victims: Sequence[WorkloadRecord],
          pods: Sequence[Victim], *, explain: bool) -> tuple[Statement, GangAttempt]:
    """The one trial placement (KAI's statement): open a statement, release the victims' holdings into
    it (whole workloads, then elastic pods), place the gang. The caller commits or rolls back."""
    stmt = Statement(nodes)
    for victim in victims:
        ledger.release_into(stmt, victim)
    ledger.release_slots_into(stmt, pods)
    return stmt, place_gang(nodes, stmt, gang, strategy, explain=explain)


def fits_without(nodes: NodeTable, ledger: PodLedger, gang: Gang, strategy: str, victims: Sequence[WorkloadRecord],
                 pods: Sequence[Victim] = ()) -> bool:
    """Would the gang fit with these victims (whole workloads, elastic pods) gone? Always rolled back."""
    stmt, attempt = trial(nodes, ledger, gang, strategy, victims, pods, explain=False)
    stmt.rollback()
    return attempt.ok
