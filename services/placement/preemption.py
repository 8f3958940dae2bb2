"""In-queue priority preemption: which admitted workloads may make room, and the fewest of them.

Who may be a victim (all must hold): the preemptor may preempt (``WorkloadSpec.preempts``: not a
suspended workload of a kube-queue or default queue), same queue as the preemptor, lower priority,
preemptible (``volcano.sh/preemptable: "false"`` and KAI's non-preemptible never are; a Volcano workload
pinned only in some pod sets gives the other pod sets' elastic pods, never its gang), admitted here,
and ran at least its min runtime (time since GangRunning; with a min runtime of 0
an admitted workload that is not Running yet qualifies too).

Which victims: candidates in the in-queue victim order the queue uses too (``victim_order``: priority
ascending, then who loses the least work — not started yet, latest start, admitted last); add them
one by one until the gang fits, then drop every victim the gang does not need (trying the last added,
i.e. the highest priority / oldest, first). ``fits`` is a trial placement the caller rolls back.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

from services.placement import elastic
from services.placement.elastic import Victim
from services.placement.gang import GangAttempt, place_gang
from services.placement.ledger import PodLedger
from services.placement.nodes import NodeTable
from services.placement.statement import Statement
from services.placement.workloads import WorkloadRecord
from shared.kernel.events import ReclaimOffer, ReclaimRequested
from shared.kernel.model import Gang
from shared.kernel.policy import Policy
from shared.kernel import victims as kernel_victims
from shared.kernel.victims import minimal_victims, offer_allows, parts_then_wholes

MAX_TRIALS = 256
"""How many trial placements one reclaim's walk over the nodes may cost before it gives up."""


def eligible(victim: WorkloadRecord, preemptor: WorkloadRecord, now: float, min_runtime: float, *,
             part: bool = False) -> bool:
    """``part``: judged for its elastic pods alone, which a workload pinned only in some pod sets
    (``WorkloadSpec.pinned_pod_sets``) still gives."""
    spec = victim.spec
    if victim is preemptor or not victim.admitted or victim.queue != preemptor.queue or not preemptor.spec.preempts:
        return False
    if not (spec.preemptible or (part and spec.pinned_pod_sets)) or spec.priority >= preemptor.spec.priority:
        return False
    return ran(victim, now, min_runtime)


def ran(victim: WorkloadRecord, now: float, min_runtime: float) -> bool:
    """Has the workload run its minimum runtime (time since GangRunning)? One admitted but not Running
    yet has lost no work, so it qualifies only when there is no minimum."""
    if victim.started_at is None:
        return min_runtime <= 0
    return now - victim.started_at >= min_runtime


def victim_order(candidates: Iterable[WorkloadRecord]) -> list[WorkloadRecord]:
    """The in-queue victim order every evicting service shares (``shared.kernel.victims.victim_rank``),
    read from placement's records: its own admission order (``admitted_seq``) and start."""
    return kernel_victims.victim_order(candidates, priority=lambda w: w.spec.priority,
                                       started_at=lambda w: w.started_at, admitted=lambda w: w.admitted_seq,
                                       key=lambda w: w.spec.key)


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


def named_victims(p: ReclaimRequested, admitted: Callable[[str], WorkloadRecord | None]
                  ) -> tuple[list[WorkloadRecord], list[Victim], list[WorkloadRecord]]:
    """What a reclaim names, as placement holds it: the whole victims still admitted, the elastic pods
    named (the newest of each pod set), and the offered victims (none where elastic pods are named)."""
    named = dict.fromkeys(k for k in p.victims if k != p.key)
    victims = [w for k in named if (w := admitted(k)) is not None]
    pods: list[Victim] = []
    for unit in p.elastic_victims:
        owner = admitted(unit.key)
        if owner is not None and owner.key != p.key:
            pods += elastic.newest(owner, unit.pod_set, unit.count)
    offered = [w for v in (p.offer.victims if p.offer is not None and not pods else ())
               if v.key != p.key and (w := admitted(v.key)) is not None]
    return victims, pods, offered


def reclaim_words(rec: WorkloadRecord, victims: Sequence[WorkloadRecord], pods: Sequence[Victim]) -> tuple[str, str]:
    """(why the victims go, the verb of the placed reason): victims all of ``rec``'s own queue were named
    because its own limit blocked it (in-queue preemption for quota); else it is a reclaim."""
    queues = [v.queue for v in victims] + [w.queue for w, _ in pods]
    if queues and all(q_ == rec.queue for q_ in queues):
        return f"preempted by {rec.key} (priority {rec.spec.priority}) in queue {rec.queue}", "preempting"
    return f"reclaimed by {rec.key} for queue {rec.queue}", "reclaiming"


class Preemption:
    """Who makes room for a gang that does not fit: the admitted workloads per queue and priority
    (never a scan of every workload), the queues' minimum runtimes, the fewest victims, and why
    there are none."""

    def __init__(self, nodes: NodeTable, ledger: PodLedger) -> None:
        self.nodes = nodes
        self.ledger = ledger
        self.held: dict[str, dict[int, dict[str, WorkloadRecord]]] = {}
        """Admitted workloads per queue, per priority: where preemption looks for victims."""
        self.queue_min_runtime: dict[str, float] = {}
        """Queues whose definition sets a minimum runtime (KAI's preemptMinRuntime)."""

    def define_queue(self, name: str, min_runtime: float | None) -> None:
        if min_runtime is None:
            self.queue_min_runtime.pop(name, None)
        else:
            self.queue_min_runtime[name] = min_runtime

    def min_runtime(self, queue: str, policy: Policy) -> float:
        """A queue's minimum runtime: its definition's (KAI's preemptMinRuntime), else the policy's."""
        return self.queue_min_runtime.get(queue, policy.min_runtime_for(queue))

    def hold(self, rec: WorkloadRecord) -> None:
        self.held.setdefault(rec.queue, {}).setdefault(rec.spec.priority, {})[rec.key] = rec

    def unhold(self, rec: WorkloadRecord) -> None:
        by_priority = self.held.get(rec.queue)
        if by_priority is None:
            return
        members = by_priority.get(rec.spec.priority)
        if members is None or members.get(rec.key) is not rec:
            return
        del members[rec.key]
        if not members:
            del by_priority[rec.spec.priority]
            if not by_priority:
                del self.held[rec.queue]

    def lower(self, rec: WorkloadRecord) -> Iterable[WorkloadRecord]:
        """Admitted workloads of ``rec``'s queue with a lower priority: the only ones preemption may
        name (``eligible`` then checks the rest), found through the per-queue, per-priority index."""
        for priority, members in self.held.get(rec.queue, {}).items():
            if priority < rec.spec.priority:
                yield from (w for w in members.values() if w is not rec)

    def fits_without(self, rec: WorkloadRecord, strategy: str, victims: Sequence[WorkloadRecord],
                     pods: Sequence[Victim] = ()) -> bool:
        return fits_without(self.nodes, self.ledger, rec.spec.gang, strategy, victims, pods)

    def candidates(self, rec: WorkloadRecord, now: float, min_runtime: float) -> list[WorkloadRecord]:
        """Who may be a victim of ``rec`` now, in victim order."""
        return victim_order([w for w in self.lower(rec) if eligible(w, rec, now, min_runtime)])

    def partly_pinned(self, rec: WorkloadRecord, now: float, min_runtime: float) -> list[WorkloadRecord]:
        """Lower priorities whose gang is pinned by some of its pod sets but whose other elastic pods may
        go (Volcano's per-pod opt-out): victims of their elastic pods only."""
        return [w for w in self.lower(rec) if not w.spec.preemptible and w.spec.pinned_pod_sets
                and eligible(w, rec, now, min_runtime, part=True)]

    def choose(self, rec: WorkloadRecord, candidates: list[WorkloadRecord], strategy: str,
               partly: Sequence[WorkloadRecord] = ()) -> tuple[list[Victim], list[WorkloadRecord] | None]:
        """The fewest victims that make room, elastic pods before any whole gang, and both together
        where neither alone does (``parts_then_wholes``); None for the workloads when no preemption
        makes room. ``partly``: workloads that give elastic pods only (``partly_pinned``)."""
        owners = victim_order([*candidates, *partly]) if partly else candidates
        chosen = parts_then_wholes(elastic.victim_slots(owners), candidates, owner=lambda v: v[0].key,
                                   key=lambda w: w.key, fits=lambda ss, vs: self.fits_without(rec, strategy, vs, ss))
        return chosen if chosen is not None else ([], None)

    def on_nodes(self, rec: WorkloadRecord, offered: list[WorkloadRecord], offer: ReclaimOffer,
                 strategy: str) -> list[WorkloadRecord] | None:
        """The fewest of ``offered`` (the victims a reclaim's quota rules allow, in the queue's order)
        whose going makes the gang fit on the nodes, keeping those rules (``offer_allows``): freeing the
        same total on nodes the gang cannot use is no victim set. Node by node, as Volcano's reclaim
        walks them: the victims on one node first, then the others in order, each added while the
        rules allow, until the gang fits; then every victim it does not need is dropped. None when
        no node's walk makes it fit (or the walks cost more than ``MAX_TRIALS`` trials)."""
        def allowed(victims: list[WorkloadRecord]) -> bool:
            return offer_allows(offer, [w.key for w in victims])

        def enough(victims: list[WorkloadRecord]) -> bool:
            return allowed(victims) and self.fits_without(rec, strategy, victims)

        starts = list(dict.fromkeys(s.node for w in offered for s in w.slots))
        walked: set[tuple[str, ...]] = set()
        for node in starts:
            here: list[WorkloadRecord] = []
            elsewhere: list[WorkloadRecord] = []
            for w in offered:
                (here if any(s.node == node for s in w.slots) else elsewhere).append(w)
            chosen: list[WorkloadRecord] = []
            for w in here + elsewhere:
                if not allowed([*chosen, w]):
                    continue
                chosen.append(w)
                tried = tuple(v.key for v in chosen)
                if tried in walked:
                    continue  # an earlier node's walk tried this very set
                walked.add(tried)
                if len(walked) > MAX_TRIALS:
                    return None
                if self.fits_without(rec, strategy, chosen):
                    return minimal_victims(chosen, enough)
        return None

    def why_not(self, rec: WorkloadRecord, candidates: list[WorkloadRecord], strategy: str, now: float,
                min_runtime: float, reason: str) -> tuple[float | None, str]:
        """No preemption makes room now: when one would (victims ripen then: a ``ripen`` timer), and
        the failure ``reason`` told so."""
        ripe, note = self._ripening(rec, candidates, strategy, now, min_runtime)
        if note:
            return ripe, reason + note
        reason += self._pinned_note(rec, candidates, strategy)
        if candidates and not reason.endswith("not preemptible."):
            reason += (f" Preempting all {len(candidates)} lower-priority workload(s) of queue {rec.queue}"
                       f" would not make room.")
        return None, reason

    def _pinned_note(self, rec: WorkloadRecord, candidates: list[WorkloadRecord], strategy: str) -> str:
        """Lower priorities of the queue that would make room but are not preemptible (KAI's non-preemptible,
        ``volcano.sh/preemptable: "false"``): say so, since the wait then lasts as long as they run."""
        if not rec.spec.preempts:
            return ""
        pinned = [w for w in self.lower(rec) if not w.spec.preemptible]
        if not pinned or not self.fits_without(rec, strategy, candidates + pinned):
            return ""
        names = ", ".join(f"{w.key} (priority {w.spec.priority})" for w in pinned)
        verb = "is" if len(pinned) == 1 else "are"
        return f" Lower-priority {names} of queue {rec.queue} would make room but {verb} not preemptible."

    def _ripening(self, rec: WorkloadRecord, candidates: list[WorkloadRecord], strategy: str, now: float,
                  min_runtime: float) -> tuple[float | None, str]:
        """No preemption now: would there be one once younger victims have run their minimum runtime
        (KAI's preemptMinRuntime)? Then the time (a timer whose capacity release makes the queue try
        again then rather than when its backoff expires), and the reason's note."""
        young = [w for w in self.lower(rec)
                 if w.started_at is not None and eligible(w, rec, math.inf, min_runtime)
                 and not eligible(w, rec, now, min_runtime)]
        if not young:
            return None, ""
        later = minimal_victims(victim_order(candidates + young), lambda vs: self.fits_without(rec, strategy, vs))
        if later is None:
            return None, ""
        ripe = max((w.started_at or 0.0) + min_runtime for w in later if w in young)
        note = (f" Preempting {', '.join(w.key for w in later)} waits for the minimum runtime of queue {rec.queue}"
                f" (until {ripe:g}s).")
        return ripe, note
