"""Elastic pods of quota holders: who wants more, step 7 of the cycle, and why a pod waits.

``growing`` keys the holders whose owners want elastic pods (``set_goal`` keeps it); the cycle's
grant step reads only those. One pod at a time, queues served as for gangs, holders of a queue
round robin; each pod within quota and the free capacity (elastic.py's rules).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from services.queue import elastic
from services.queue.ordering import ORDER
from services.queue.reclaim import shortage
from services.queue.snapshot import Snapshot
from services.queue.tree import quota_failure, reserved_block
from services.queue.workload import Tracked
from shared.kernel.events import ElasticGranted, ElasticWaiting
from shared.kernel.reasons import amounts

if TYPE_CHECKING:
    from services.queue.core import Out, QueueCore


class ElasticGrants:
    """One core's elastic grants (``core`` owns the books)."""

    def __init__(self, core: QueueCore) -> None:
        self.core = core
        self.growing: dict[str, None] = {}
        """Keys of quota holders whose owners want elastic pods (the cycle's grant step reads only these)."""

    def set_goal(self, w: Tracked) -> bool:
        """Recompute what elastic pods ``w``'s owner wants; True when it wants some it was not granted."""
        w.elastic_goal = elastic.goal(w)
        if w.elastic_goal:
            self.growing[w.key] = None
        else:
            self.growing.pop(w.key, None)
        return bool(elastic.still_wanted(w)) and not w.elastic_waits

    def grant(self, snap: Snapshot, out: Out) -> None:
        """7. elastic pods, after every gang of the cycle (elastic.py): one pod at a time, queues served
        as for gangs, holders of a queue round robin; each pod within quota and the free capacity."""
        workloads, rank = self.core._workloads, self.core.cycle.rank
        members: dict[str, list[Tracked]] = {}
        for key in self.growing:
            w = workloads[key]
            if w.holds_quota and not w.elastic_waits and not w.promised_to and elastic.still_wanted(w):
                members.setdefault(w.queue, []).append(w)
        if not members:
            return
        turns = {name: sorted(ws, key=ORDER) for name, ws in members.items()}
        ranking = [(rank(name, snap), name) for name in sorted(turns)]
        heapq.heapify(ranking)
        granted: dict[tuple[str, str], int] = {}
        while ranking:
            _, name = heapq.heappop(ranking)
            queue = turns[name]
            w = queue.pop(0)
            if self._grant_one(w, snap, granted):
                queue.append(w)  # round robin: it may take another once the others had their turn
            if queue:
                heapq.heappush(ranking, (rank(name, snap), name))
        for (key, pod_set), count in granted.items():
            w = workloads[key]
            w.elastic_told = ""
            reason = (f"quota reserved in queue {w.queue} for {count} elastic pod(s) of {pod_set} "
                      f"({amounts(w.demand)} held in all)")
            out.append(ElasticGranted(key=key, queue=w.queue, pod_set=pod_set, count=count, admission=w.reserved_seq,
                                      reason=reason))
        for ws in members.values():
            for w in ws:
                self._wait(w, snap, out)

    def _wait(self, w: Tracked, snap: Snapshot, out: Out) -> None:
        """After the grants: why ``w``'s first pod set that still wants elastic pods got none (its queue
        chain's quota, else the cluster's free capacity), told when that changes."""
        for pod_set, missing in elastic.still_wanted(w):
            demand = w.pod_demand(next(p for p in w.spec.gang.pod_sets if p.name == pod_set))
            why = self._quota_failure(w, demand, snap)
            if why is None:
                short = shortage(demand, snap.free)
                why = f"the cluster's free capacity lacks {amounts(short)} for one" if short else None
            if why is not None:
                self.tell_wait(w, pod_set, missing, f"{missing} elastic pod(s) of {pod_set} wait: {why}", out)
            return

    def _quota_failure(self, w: Tracked, demand: dict[str, int], snap: Snapshot) -> str | None:
        """What keeps one elastic pod of ``w`` out of its queue chain: a limit, or room a sibling's guarantee
        holds (each task is judged against Volcano's ``realCapability``, ``queueAllocatable``)."""
        tree = self.core.tree
        why = quota_failure(tree, w.queue, demand, snap.usage, snap.protected, w.spec.preemptible)
        if why is None:
            reserved = reserved_block(tree, w.queue, demand, snap.usage, snap.capacity)
            why = reserved[1] if reserved is not None else None
        return why

    def tell_wait(self, w: Tracked, pod_set: str, count: int, reason: str, out: Out) -> None:
        if reason != w.elastic_told:
            w.elastic_told = reason
            out.append(ElasticWaiting(key=w.key, queue=w.queue, pod_set=pod_set, count=count, reason=reason))

    def _grant_one(self, w: Tracked, snap: Snapshot, granted: dict[tuple[str, str], int]) -> bool:
        """Grant ``w`` one more elastic pod of the first pod set that still wants one and fits; False
        when none does (it gets no more turns this cycle)."""
        tree = self.core.tree
        for pod_set, _ in elastic.still_wanted(w):
            ps = next(p for p in w.spec.gang.pod_sets if p.name == pod_set)
            demand = w.pod_demand(ps)
            if self._quota_failure(w, demand, snap) is not None:
                continue
            if shortage(demand, snap.free):
                continue
            snap.charge_amount(tree, w.queue, demand, w.spec.preemptible)
            with self.core._ledger.moving(w):
                w.set_elastic(pod_set, w.elastic.get(pod_set, 0) + 1)
            granted[(w.key, pod_set)] = granted.get((w.key, pod_set), 0) + 1
            return True
        return False
