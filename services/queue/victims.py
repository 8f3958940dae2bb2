"""Who gives quota back to a head that does not fit: the queue's side of reclaim and preemption.

- across queues (``reclaim``): running workloads of queues above their fair share (or guarantee,
  for a starved requester), elastic pods alone first; the rules are ``reclaim.py``'s;
- within a leaf queue (``quota_victims``): lower priorities whose quota (their elastic pods first)
  lets the head pass its limits (``preemption.py``'s rules);
- when only the victims' minimum runtime stands in the way, a wake-up for then (``Timers.ripen``).

``Victims`` reads the core's books (tree, ledger, workloads) and changes nothing but the cycle's
``Snapshot`` caches and the ripening timers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from services.queue import elastic, preemption
from services.queue.reclaim import MAX_OFFERED, Choice, Running, above_guarantee, choose_victims, within_guarantee, within_share
from services.queue.snapshot import Snapshot
from services.queue.tree import over_limits, quota_failure, reserved_block
from services.queue.workload import Tracked
from shared.kernel import quantity as q
from shared.kernel.events import GivingQueue, LevelNeed, OfferedVictim, ReclaimOffer
from shared.kernel.victims import minimal_victims, parts_then_wholes

if TYPE_CHECKING:
    from services.queue.core import Out, QueueCore


class Victims:
    """The victim choices of one core (``core`` owns the books they read)."""

    def __init__(self, core: QueueCore) -> None:
        self.core = core

    def min_runtime(self, queue: str) -> float:
        spec = self.core.tree.get(queue)
        if spec is not None and spec.min_runtime is not None:
            return spec.min_runtime
        return self.core.policy.min_runtime_for(queue)

    # ------------------------------------------------------------------ across queues
    def reclaim(self, w: Tracked, needs: dict[str, dict[str, int]], snap: Snapshot,
                now: float) -> tuple[Choice, list[elastic.ElasticPod]]:
        """Reclaim for ``w`` (see reclaim.py): what covers ``needs``, or why nothing does. Elastic pods of
        other queues first, each a victim of its own under the same rules (elastic.py); only when they
        do not cover, whole workloads (``Choice.victims`` then names them, and no pods)."""
        ledger = self.core._ledger
        usage, share = snap.usage.get(w.queue, {}), snap.shares.get(w.queue, {})
        if not within_share(usage, w.demand, share):  # what choose answers first, without a view of every running one
            return Choice(None, self._beyond_share(w, usage, share, list(ledger.running_of), snap)), []
        units = elastic.as_running(
            elastic.elastic_pods(x for x in ledger.running_elastic.values() if x.queue != w.queue),
            self.min_runtime)
        if units:
            choice = self.choose(w, needs, snap, now, [r for r, _ in units.values()])
            if choice.victims:
                return Choice((), by_guarantee=choice.by_guarantee), [units[key][1] for key in choice.victims]
        return self.choose(w, needs, snap, now), []

    def _candidates(self, snap: Snapshot, names: list[str]) -> list[Running]:
        """The running workloads of queues ``names`` as reclaim sees them, whole: each queue's built once per
        cycle (again after a reclaim), and only when a reclaim may take from that queue (``_giving_queues``)."""
        if snap.candidates is None:
            snap.candidates = {}
        out: list[Running] = []
        for name in names:
            views = snap.candidates.get(name)
            if views is None:
                min_runtime = self.min_runtime(name)
                views = snap.candidates[name] = [
                    Running(spec.key, spec.queue, spec.priority, spec.preemptible, x.started_at or 0.0,
                            min_runtime, x.demand, x.reserved_seq, bool(x.promised_to))
                    for x in self.core._ledger.running_of[name].values() for spec in (x.spec,)
                ]
            out += views
        return out

    def _giving_queues(self, requester: str, names: list[str], snap: Snapshot, contested: set[str],
                       starved: bool) -> list[str]:
        """The queues of ``names`` a reclaim for ``requester`` could take from or must name in a refusal:
        those above their fair share, and, for a starved requester, those above their guarantee on a
        contested resource. Taking victims only lowers a queue's usage, so a queue that is neither now
        never becomes one during the choice (``choose_victims`` skips it), and its running workloads
        need no view."""
        tree = self.core.tree
        return [name for name in names if name != requester and (
            snap.dominant(name) > 1
            or (starved and above_guarantee(snap.usage.get(name, {}), tree.get(name), contested)))]

    def choose(self, w: Tracked, needs: dict[str, dict[str, int]], snap: Snapshot, now: float,
               candidates: list[Running] | None = None) -> Choice:
        """Victims among ``candidates`` (by default the running workloads of the queues that may give)
        covering ``needs``, or why there are none.

        ``w``'s queue must stay within its fair share; staying within its guarantee too, it is starved, and
        queues above their guarantee give as well."""
        tree = self.core.tree
        usage = snap.usage.get(w.queue, {})
        if candidates is None:
            if snap.candidate_queues is None:  # the queues of every running workload, which the ledger keeps
                snap.candidate_queues = list(self.core._ledger.running_of)
            names = snap.candidate_queues
        else:
            names = list(dict.fromkeys(x.queue for x in candidates))
        queues = {name: tree.get(name) for name in names}
        share = snap.shares.get(w.queue, {})
        if not within_share(usage, w.demand, share):
            return Choice(None, self._beyond_share(w, usage, share, names, snap))
        scopes = {name: frozenset(spec.name for spec in tree.ancestry(name)) for name in names}
        contested = {r for amounts in needs.values() for r in amounts}
        starved = within_guarantee(usage, w.demand, tree.get(w.queue), contested)
        if candidates is None:
            candidates = self._candidates(snap, self._giving_queues(w.queue, names, snap, contested, starved))
        mine = tree.get(w.queue)
        return choose_victims(needs, candidates, queues, snap.usage, snap.shares, w.queue, now, scopes=scopes,
                              starved=starved, by_queue_priority=mine is not None and mine.victim_queues_by_priority)

    def _beyond_share(self, w: Tracked, usage: dict[str, int], share: dict[str, int], names: list[str],
                      snap: Snapshot) -> str:
        """Why ``w``'s queue reclaims nothing although some other queue is above its share ("" if none is)."""
        if not any(name != w.queue and snap.dominant(name) > 1 for name in names):
            return ""
        for r, v in sorted(w.demand.items()):
            if v > 0 and usage.get(r, 0) + v > share.get(r, 0):
                return (f"queue {w.queue} would go over its fair share {r} {q.human(r, share.get(r, 0))} "
                        f"(used {q.human(r, usage.get(r, 0))}, requested {q.human(r, v)})")
        return ""

    def ripening_reclaim(self, w: Tracked, needs: dict[str, dict[str, int]], snap: Snapshot, now: float,
                         out: Out) -> str:
        """No reclaim now: would there be one once the victims have run their minimum runtime (KAI's
        preemptMinRuntime / reclaimMinRuntime)? Then wake everyone up at that time, not only when a
        backoff expires, and say so in the reason ("" when age is not what blocks it)."""
        if not within_share(snap.usage.get(w.queue, {}), w.demand, snap.shares.get(w.queue, {})):
            return ""  # choose's first answer, at any age of the victims
        later = self.choose(w, needs, snap, math.inf).victims
        if not later or snap.candidates is None:
            return ""
        ripe = max(c.started_at + c.min_runtime for views in snap.candidates.values() for c in views if c.key in later)
        if ripe <= now:
            return ""
        self.core.timers.ripen(ripe, now, out)
        running = self.core._ledger.running
        queues = dict.fromkeys(x.queue for key, x in running.items() if key in later)  # in running order
        return (f"Reclaiming {', '.join(later)} waits for the minimum runtime of queue "
                f"{', '.join(queues)} (until {ripe:g}s).")

    # ------------------------------------------------------------------ within a leaf queue
    def quota_victims(self, w: Tracked, snap: Snapshot, now: float, out: Out
                      ) -> tuple[tuple[list[elastic.ElasticPod], list[preemption.Holder]] | None, str]:
        """The fewest victims in ``w``'s leaf queue whose quota lets ``w`` pass the quota check: elastic
        pods of lower-priority holders before any whole holder, and both together where neither alone
        does (``parts_then_wholes``); else None, with a note (and a wake-up) when only the holders'
        minimum runtime stands in the way."""
        holders = self._quota_holders(w, snap) if w.spec.preempts else []
        if not holders:
            return None, ""
        min_runtime = self.min_runtime(w.queue)
        assert snap.holders is not None

        def fits(pods: list[elastic.ElasticPod], victims: list[preemption.Holder]) -> bool:
            freed: dict[str, int] = {}
            for demand in [*(pod.demand for pod in pods), *(h.demand for h in victims)]:
                freed = q.add(freed, demand)
            return self._fits_quota_without(w, snap, freed)

        ready = [h for h in holders if preemption.eligible(h, w.spec.priority, now, min_runtime)]
        pods = [pod for pod in elastic.elastic_pods(x for x in snap.holders.get(w.queue, []) if x.key != w.key)
                if preemption.eligible(pod.holder, w.spec.priority, now, min_runtime)]
        chosen = parts_then_wholes(pods, preemption.victim_order(ready), owner=lambda pod: pod.key,
                                   key=lambda h: h.key, fits=fits)
        if chosen is not None:
            return chosen, ""
        aged = [h for h in holders if preemption.eligible(h, w.spec.priority, math.inf, min_runtime)]
        later = (minimal_victims(preemption.victim_order(aged), lambda victims: fits([], victims))
                 if len(aged) > len(ready) else None)
        if not later:
            return None, ""
        ripe = max((h.started_at + min_runtime for h in later if h.started_at is not None), default=now)
        if ripe <= now:
            return None, ""
        self.core.timers.ripen(ripe, now, out)
        return None, (f"Preempting {', '.join(h.key for h in later)} waits for the minimum runtime of queue "
                      f"{w.queue} (until {ripe:g}s).")

    def quota_offer(self, w: Tracked, snap: Snapshot, now: float, chosen: list[preemption.Holder]) -> ReclaimOffer:
        """``chosen`` and the other lower priorities of ``w``'s queue that may go for its quota, with what
        any set of them must give back to each level whose limit blocks it: placement takes others where
        ``chosen`` free room on nodes the gang cannot use."""
        ready = [h for h in self._quota_holders(w, snap)
                 if preemption.eligible(h, w.spec.priority, now, self.min_runtime(w.queue))]
        keys = {h.key for h in chosen}
        ordered = [*chosen, *(h for h in preemption.victim_order(ready) if h.key not in keys)]
        chain = tuple(spec.name for spec in self.core.tree.ancestry(w.queue)) or (w.queue,)
        needs = over_limits(self.core.tree, w.queue, w.demand, snap.usage)
        return ReclaimOffer(
            victims=tuple(OfferedVictim(key=h.key, queue=w.queue, demand=dict(h.demand))
                          for h in ordered[:max(MAX_OFFERED, len(chosen))]),
            queues=(GivingQueue(name=w.queue, usage=dict(snap.usage.get(w.queue, {})), above=None, floor={},
                                levels=tuple(sorted(chain))),),
            needs=tuple(LevelNeed(level=level, resource=r, amount=v)
                        for level, amounts in sorted(needs.items()) for r, v in sorted(amounts.items())))

    def _fits_quota_without(self, w: Tracked, snap: Snapshot, freed: dict[str, int]) -> bool:
        """Would ``w`` pass the quota check of its queue and every ancestor with ``freed`` given back?"""
        tree = self.core.tree
        chain = [spec.name for spec in tree.ancestry(w.queue)]
        usage = {name: q.sub(snap.usage.get(name, {}), freed) for name in chain}
        return (quota_failure(tree, w.queue, w.demand, usage, snap.protected, w.spec.preemptible) is None
                and reserved_block(tree, w.queue, w.demand, usage, snap.capacity) is None)

    def _quota_holders(self, w: Tracked, snap: Snapshot) -> list[preemption.Holder]:
        """Admitted and running workloads of ``w``'s leaf queue, as quota preemption sees them."""
        if snap.holders is None:
            snap.holders = {}
            for x in self.core._workloads.values():
                if x.state in ("admitted", "running"):
                    snap.holders.setdefault(x.queue, []).append(x)
        return [preemption.Holder(key=x.key, priority=x.spec.priority, preemptible=x.spec.preemptible,
                                  started_at=x.started_at, admitted_seq=x.reserved_seq, demand=x.demand,
                                  promised=bool(x.promised_to))
                for x in snap.holders.get(w.queue, []) if x.key != w.key]
