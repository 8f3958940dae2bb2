"""The queue core: decides *when* a workload may take quota.

Where each decision is made:
- event handlers (this file, ``_on_*``): state changes of workloads and queues, backoff, wake-ups;
- the scheduling cycle (this file, ``_cycle``): who goes, in what order, Dequeued vs ReclaimRequested;
- ``tree.py``: which queues exist, roll-up, limit/guarantee checks and the quota reason line;
- ``ordering.py``: pending order in a queue, queue serving order, StrictFIFO vs BestEffortFIFO;
- ``backoff.py``: requeue_at as data; ``fairshare.py``: deserved shares and dominant share;
- ``reclaim.py``: whether and from whom to reclaim; ``snapshot.py``: what one cycle sees;
- ``preemption.py``: which lower priorities of the same queue give quota back when its limit blocks;
- ``elastic.py``: who may grow by elastic pods, and which elastic pods go first as victims;
- ``workload.py``: one workload's record here, and ``shrunk`` (what an edit leaves of an admission);
- ``ledger.py``: per-queue pending index and usage totals, updated on every state change.

Every timer is the key ``"cycle"``: set for now whenever something changed that could let a
workload go, and for ``requeue_at`` when a workload backs off. The runtime fires timers only when
every inbox is drained, so one cycle sees everything that arrived at its instant.
"""

from __future__ import annotations

import heapq
import math
from operator import attrgetter
from typing import Any, Callable, Sequence, TypedDict, Union

from services.queue import backoff, elastic, preemption
from services.queue.ledger import Ledger
from services.queue.ordering import blocks, serve_key
from services.queue.reasons import preempted_by, waiting
from services.queue.room import QuotaWaits, RoomWaits
from shared.kernel.reasons import amounts, gang_line
from services.queue.reclaim import (CLUSTER, Choice, Running, above_guarantee, choose_victims, shortage,
                                    within_guarantee, within_share)
from services.queue.snapshot import Freed, Snapshot
from services.queue.tree import QueueTree, cap_failure, level_failure, over_limits, quota_block, quota_failure
from services.queue.workload import Tracked
from shared.kernel import quantity as q
from shared.kernel.model import shrunk
from shared.kernel.victims import minimal_victims
from shared.kernel.events import (
    BackedOff, CapacityChanged, Dequeued, ElasticGranted, ElasticReleased, ElasticWaiting, Envelope, Enqueued,
    GangPlaced, GangRunning, PlacementFailed, PreemptionRequested, QueueDefined, QueueRejected, QueueRemoved,
    ReclaimRequested, TimerFired, TimerSet, WorkloadDeleted, WorkloadFinished, WorkloadRejected, WorkloadSubmitted,
    WorkloadUpdated, WorkloadWithdrawn,
)
from shared.kernel.model import QueueSpec, WorkloadSpec
from shared.kernel.policy import Policy

CYCLE = "cycle"
_ORDER = attrgetter("order")

Output = Union[Enqueued, BackedOff, Dequeued, ReclaimRequested, WorkloadWithdrawn, ElasticGranted, ElasticWaiting,
               TimerSet, QueueRejected]
"""What the queue emits (``shared.kernel.topology`` routes each)."""
Out = list[Output]


class QueueCore:
    """Pure fold over the queue inbox; ``status()`` is a read-only view for the projection."""

    service = "queue"

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.tree = QueueTree(policy.default_queue)
        self._workloads: dict[str, Tracked] = {}
        self._ledger = Ledger()
        self._capacity: dict[str, int] = {}
        self._armed: dict[float, None] = {}
        self._ripening: dict[float, None] = {}
        """Times at which a blocked reclaim's victims reach their minimum runtime: wake-ups, not just cycles."""
        self._growing: dict[str, None] = {}
        """Keys of quota holders whose owners want elastic pods (the cycle's grant step reads only these)."""
        self._room = RoomWaits(self._ledger)
        """Pending gangs placement found no room and no victim for: they wait for a release that holds them."""
        self._quota = QuotaWaits(self._ledger)
        """Pending workloads over a limit with nothing to reclaim: they wait for usage under it to drop."""
        self._reclaiming: dict[str, None] = {}
        """Reserved workloads whose named victims may still hold quota (until placement answers)."""
        self._seq = 0
        self._now = 0.0
        self._handlers: dict[str, Callable[[Any, float, Out], None]] = {
            "QueueDefined": self._on_queue_defined,
            "QueueRemoved": self._on_queue_removed,
            "WorkloadSubmitted": self._on_submitted,
            "WorkloadUpdated": self._on_updated,
            "WorkloadFinished": self._on_gone,
            "WorkloadDeleted": self._on_gone,
            "WorkloadRejected": self._on_rejected,
            "GangPlaced": self._on_placed,
            "PlacementFailed": self._on_placement_failed,
            "GangRunning": self._on_running,
            "PreemptionRequested": self._on_preempted,
            "CapacityChanged": self._on_capacity,
            "ElasticReleased": self._on_elastic_released,
            "TimerFired": self._on_timer,
        }

    def handle(self, env: Envelope) -> list[Output]:
        """Fold one inbox event; anything not addressed to the queue is ignored quietly."""
        handler = self._handlers.get(env.type)
        if handler is None:
            return []
        now = env.occurred_at
        self._now = max(self._now, now)
        out: Out = []
        handler(env.payload, now, out)
        return out

    # ------------------------------------------------------------------ queues
    def _on_queue_defined(self, p: QueueDefined, now: float, out: Out) -> None:
        problem = self.tree.define(p.queue)
        if problem is not None:
            out.append(QueueRejected(name=p.queue.name, kind=p.queue.kind, reason=problem))
            return
        self._wake_quota_all(now)  # a limit, parent or state changed: every quota wait is judged again
        self._request_cycle(now, out)  # limits, state or shape changed: the cycle re-tells waits

    def _on_queue_removed(self, p: QueueRemoved, now: float, out: Out) -> None:
        if self.tree.remove(p.name):
            self._ledger.forget(p.name)
            self._wake_quota_all(now)
            self._request_cycle(now, out)  # its pending workloads hear "does not exist" in the cycle

    def _left(self, queue: str) -> None:
        """A workload left ``queue``: the ledger forgets a queue that does not exist once nobody books there."""
        if not self.tree.exists(queue):
            self._ledger.forget(queue)

    # ------------------------------------------------------------------ workloads from admission
    def _on_submitted(self, p: WorkloadSubmitted, now: float, out: Out) -> None:
        if p.workload.key in self._workloads:
            self._update(p.workload, now, out)  # a resubmission only matters while it waits
            return
        w = self._workloads[p.workload.key] = Tracked.of(p.workload)
        self._ledger.book(w)
        self._tell_where(w, self.tree.wait_reason(w.queue), out)
        self._request_cycle(now, out)

    def _on_updated(self, p: WorkloadUpdated, now: float, out: Out) -> None:
        if p.workload.key not in self._workloads:
            self._on_submitted(WorkloadSubmitted(workload=p.workload), now, out)
            return
        self._update(p.workload, now, out)

    def _update(self, spec: WorkloadSpec, now: float, out: Out) -> None:
        """Replace the spec of a waiting workload (a holder keeps what it was admitted with)."""
        w = self._workloads[spec.key]
        if w.holds_quota:
            self._edit_holder(w, spec, now, out)
            return
        if spec == w.spec:
            return
        moved, was = spec.queue != w.queue, w.queue
        self._room.unpark(w)  # a new shape or queue: placement has not judged it yet
        self._quota.unpark(w)  # nor the quota check
        with self._ledger.moving(w):
            w.respec(spec)
        if moved:
            self._left(was)
        w.attempts, w.requeue_at = 0, None  # a changed spec is a new attempt: why it backed off may be gone
        if moved:
            self._tell_where(w, self.tree.wait_reason(w.queue), out, moved=True)
        self._request_cycle(now, out)

    def _edit_holder(self, w: Tracked, spec: WorkloadSpec, now: float, out: Out) -> None:
        """Quota follows what was admitted. An edit that asks for fewer pods gives back what it no
        longer asks for at once (placement drops the same surplus slots, ``shrunk``); anything more
        (more pods, a new shape, queue or priority) waits for the workload's next admission, kept in
        ``latest``: the pods beyond the admitted ones stay Pending and use no quota. Nothing to tell."""
        smaller = shrunk(w.spec.gang, spec.gang)
        if smaller is not None:
            with self._ledger.moving(w):
                w.respec(w.spec.model_copy(update={"gang": smaller}))
            self._wake_all(now)  # quota came back: whatever waits for it may try at once
            self._quota_freed(w.queue, now)
            self._request_cycle(now, out)
        w.latest = None if spec == w.spec else spec
        if self._set_goal(w):
            self._request_cycle(now, out)  # the owner wants more elastic pods: the cycle may grant them

    def _on_gone(self, p: WorkloadFinished | WorkloadDeleted | WorkloadRejected, now: float, out: Out) -> None:
        w = self._workloads.pop(p.key, None)
        if w is None:
            return
        self._room.unpark(w)
        self._quota.unpark(w)
        self._ledger.unbook(w)
        self._left(w.queue)
        self._growing.pop(w.key, None)
        reclaimer = self._workloads.get(w.promised_to) if w.promised_to else None
        if reclaimer is not None:
            reclaimer.victims = tuple(v for v in reclaimer.victims if v != w.key)
            reclaimer.elastic_victims = tuple(v for v in reclaimer.elastic_victims if v.key != w.key)
        self._unpromise(w)
        reason = p.reason or (p.outcome if isinstance(p, WorkloadFinished) else "deleted")
        out.append(WorkloadWithdrawn(key=w.key, reason=reason))
        if w.holds_quota:
            self._wake_all(now)
            self._quota_freed(w.queue, now)
        self._request_cycle(now, out)

    def _on_rejected(self, p: WorkloadRejected, now: float, out: Out) -> None:
        """A waiting workload whose update made it invalid leaves its queue until it is fixed.

        One that already holds quota keeps running on its last valid spec, as a refused edit would.
        """
        w = self._workloads.get(p.key)
        if w is not None and not w.holds_quota and w.spec.kind == p.kind:  # another kind's claim is not this one
            self._on_gone(p, now, out)

    # ------------------------------------------------------------------ placement's answers
    def _on_placed(self, p: GangPlaced, now: float, out: Out) -> None:
        w = self._workloads.get(p.key)
        if w is None or w.state in ("admitted", "running"):
            return
        if w.state == "pending":  # placement placed it after all: reality wins, it holds quota
            w.reserved_seq = self._next_seq()
            self._room.unpark(w)
            self._quota.unpark(w)
        with self._ledger.moving(w):
            w.state = "admitted"
        w.attempts, w.requeue_at, w.preempted_by, w.held, w.reclaim_note = 0, None, "", "", ""
        self._unpromise(w)
        if w.spec.preemptible and len(self._room):
            woken = self._room.above(w.queue, w.spec.priority, self._workloads)
            for x in woken:  # a lower priority now holds nodes in their queue: they may preempt it
                self._room.unpark(x)
                x.requeue_at = now
            if woken:
                self._request_cycle(now, out)
        if w.spec.preemptible and len(self._quota):
            woken = self._quota.above(w.queue, w.spec.priority, self._workloads)
            for x in woken:  # a lower priority now holds quota in their queue: they may preempt it for quota
                self._quota.unpark(x)
            if woken:
                self._request_cycle(now, out)
        if self._set_goal(w):
            self._request_cycle(now, out)  # placement holds its slots now: elastic pods may follow

    def _on_running(self, p: GangRunning, now: float, out: Out) -> None:
        w = self._workloads.get(p.key)
        if w is None or w.state not in ("reserved", "admitted"):
            return
        with self._ledger.moving(w):
            w.state = "running"
        if w.started_at is None:
            w.started_at = now
        if w.spec.preemptible and len(self._quota) and self._above_guarantee(w.queue):
            self._reclaimable(w.queue, now, out)
        if self._set_goal(w):
            self._request_cycle(now, out)

    def _on_placement_failed(self, p: PlacementFailed, now: float, out: Out) -> None:
        w = self._workloads.get(p.key)
        if w is None or w.state != "reserved":
            return
        with self._ledger.moving(w):
            w.state = "pending"
            w.drop_elastic()
            if w.latest is not None:  # edited beyond what was reserved: it waits as the user has it now
                w.respec(w.latest)
        self._set_goal(w)
        self._unpromise(w)
        reason = f"{p.reason} {w.reclaim_note}" if w.reclaim_note else p.reason
        parks = bool(p.room_key)  # a reclaim waiting for its victims' minimum runtime wakes it then (_on_timer)
        if parks:  # no node and no victim: it waits for a release that holds it, not for a timer
            self._room.park(w, p.room_key)
        self._back_off(w, now, w.reason(reason), out, arm=not parks)
        self._quota_freed(w.queue, now)
        self._request_cycle(now, out)  # its reservation went back to the queue

    def _on_preempted(self, p: PreemptionRequested, now: float, out: Out) -> None:
        w = self._workloads.get(p.key)
        if w is None or not w.holds_quota:
            return
        self._unpromise(w)
        with self._ledger.moving(w):
            w.state = "pending"
            w.drop_elastic()
            if w.latest is not None:  # edited beyond what was admitted: it comes back as the user has it now
                w.respec(w.latest)
        self._set_goal(w)
        w.started_at, w.attempts, w.requeue_at, w.held = None, 0, None, ""
        w.preempted_by = preempted_by(p.preemptor, p.preemptor_priority, 
                                    reclaimed_for=self._queue_of(p.preemptor) if p.reclaim else None)
        w.last_reason = f"{w.preempted_by}; {waiting(w.queue)}"
        out.append(Enqueued(key=w.key, queue=w.queue, reason=w.last_reason))
        self._wake_all(now)
        self._quota_freed(w.queue, now)
        self._request_cycle(now, out)

    def _queue_of(self, key: str) -> str:
        w = self._workloads.get(key)
        return w.queue if w is not None else "?"

    def _on_elastic_released(self, p: ElasticReleased, now: float, out: Out) -> None:
        """Placement gave back elastic pods' quota (no node for them, gone, unwanted, evicted). A release
        of an earlier admission's pods is stale: the grants it answers were dropped with that admission."""
        w = self._workloads.get(p.key)
        if w is None or not w.holds_quota or w.reserved_seq != p.admission:
            return
        with self._ledger.moving(w):
            w.set_elastic(p.pod_set, w.elastic.get(p.pod_set, 0) - p.count)
        self._quota_freed(w.queue, now)
        if p.refused:
            w.elastic_waits = True  # no node for it now: it asks again when capacity is released
            self._tell_elastic_wait(w, p.pod_set, p.count, f"{p.reason}; asked again when capacity is released", out)
        else:
            self._wake_all(now)
        self._request_cycle(now, out)

    def _set_goal(self, w: Tracked) -> bool:
        """Recompute what elastic pods ``w``'s owner wants; True when it wants some it was not granted."""
        w.elastic_goal = elastic.goal(w)
        if w.elastic_goal:
            self._growing[w.key] = None
        else:
            self._growing.pop(w.key, None)
        return bool(elastic.still_wanted(w)) and not w.elastic_waits

    def _on_capacity(self, p: CapacityChanged, now: float, out: Out) -> None:
        self._capacity = dict(p.total)
        if p.released:
            self._wake_all(now)
            if len(self._room):
                woken = (self._room.wake_all(self._workloads) if p.room is None
                         else self._room.wake(p.room, self._workloads))
                for w in woken:
                    w.requeue_at = now
        self._request_cycle(now, out)

    def _on_timer(self, p: TimerFired, now: float, out: Out) -> None:
        if p.key != CYCLE:
            return
        due = p.due(now)  # the instant it was set for; ``now`` is when it is handled (never earlier)
        self._armed.pop(due, None)
        self._quota.cycled()
        if due in self._ripening:
            del self._ripening[due]
            self._wake_all(now)  # victims a reclaim waited for have run their minimum runtime
            for w in self._room.wake_all(self._workloads):
                w.requeue_at = now
            self._wake_quota_all(now)
        self._cycle(now, out)

    # ------------------------------------------------------------------ the cycle
    def _cycle(self, now: float, out: Out) -> None:
        """One scheduling cycle per instant, after every inbox is drained (Kueue's model):

        1. hold: pending workloads of queues that take none (missing, Closed/Closing, not a
           leaf) are told why and skip the cycle; those whose queue takes them again are told so;
        2. heads: per leaf queue, its pending workloads in order (priority desc, submitted_at,
           key); backing-off ones are skipped (BestEffortFIFO) or stop the queue (StrictFIFO);
        3. snapshot: usage rolled up the tree, non-preemptible usage, cluster free, fair shares;
        4. iterate: serve queues by (queue priority desc, dominant share asc, name), one head at
           a time, re-ranking the served queue after each decision;
        5. quota: leaf and every ancestor within limit (and guarantee if non-preemptible where the
           dialect caps them); else, when an ancestor's limit blocks, queues above their share or
           guarantee under it give back (reclaim across the tree, reclaim.py); else lower-priority
           preemptible holders of the same leaf queue that would make it fit are named in
           ReclaimRequested (in-queue preemption, preemption.py); else BackedOff with the gang line;
           StrictFIFO stops that queue, BestEffortFIFO moves on;
        6. admit: Dequeued when free capacity covers the demand or no reclaim is possible, else
           ReclaimRequested(victims); both reserve quota in the snapshot for the next heads. Every
           reclaim and preemption names elastic pods alone first (elastic.py), whole gangs only when
           those do not cover;
        7. elastic pods of holders, one at a time (``_grant_elastic``).
        """
        heads = self._heads(now, out)
        if not heads and not self._growing:
            return
        snap = self._snapshot()
        ranking = [(self._rank(name, snap), name) for name in heads]
        heapq.heapify(ranking)
        cursor = {name: 0 for name in heads}
        while ranking:
            _, name = heapq.heappop(ranking)
            w = heads[name][cursor[name]]
            cursor[name] += 1
            went = self._try(w, snap, now, out)
            if not went and blocks(self.policy.queueing_for(name)):
                continue
            if cursor[name] < len(heads[name]):
                heapq.heappush(ranking, (self._rank(name, snap), name))
        self._grant_elastic(snap, out)

    def _grant_elastic(self, snap: Snapshot, out: Out) -> None:
        """7. elastic pods, after every gang of the cycle (elastic.py): one pod at a time, queues served
        as for gangs, holders of a queue round robin; each pod within quota and the free capacity."""
        members: dict[str, list[Tracked]] = {}
        for key in self._growing:
            w = self._workloads[key]
            if w.holds_quota and not w.elastic_waits and not w.promised_to and elastic.still_wanted(w):
                members.setdefault(w.queue, []).append(w)
        if not members:
            return
        turns = {name: sorted(ws, key=_ORDER) for name, ws in members.items()}
        ranking = [(self._rank(name, snap), name) for name in sorted(turns)]
        heapq.heapify(ranking)
        granted: dict[tuple[str, str], int] = {}
        while ranking:
            _, name = heapq.heappop(ranking)
            queue = turns[name]
            w = queue.pop(0)
            if self._grant_one(w, snap, granted):
                queue.append(w)  # round robin: it may take another once the others had their turn
            if queue:
                heapq.heappush(ranking, (self._rank(name, snap), name))
        for (key, pod_set), count in granted.items():
            w = self._workloads[key]
            w.elastic_told = ""
            reason = (f"quota reserved in queue {w.queue} for {count} elastic pod(s) of {pod_set} "
                      f"({amounts(w.demand)} held in all)")
            out.append(ElasticGranted(key=key, queue=w.queue, pod_set=pod_set, count=count, admission=w.reserved_seq,
                                      reason=reason))
        for ws in members.values():
            for w in ws:
                self._elastic_wait(w, snap, out)

    def _elastic_wait(self, w: Tracked, snap: Snapshot, out: Out) -> None:
        """After the grants: why ``w``'s first pod set that still wants elastic pods got none (its queue
        chain's quota, else the cluster's free capacity), told when that changes."""
        for pod_set, missing in elastic.still_wanted(w):
            demand = next(p for p in w.spec.gang.pod_sets if p.name == pod_set).pod_demand
            why = quota_failure(self.tree, w.queue, demand, snap.usage, snap.protected, w.spec.preemptible)
            if why is None:
                short = shortage(demand, snap.free)
                why = f"the cluster's free capacity lacks {amounts(short)} for one" if short else None
            if why is not None:
                self._tell_elastic_wait(w, pod_set, missing, f"{missing} elastic pod(s) of {pod_set} wait: {why}", out)
            return

    def _tell_elastic_wait(self, w: Tracked, pod_set: str, count: int, reason: str, out: Out) -> None:
        if reason != w.elastic_told:
            w.elastic_told = reason
            out.append(ElasticWaiting(key=w.key, queue=w.queue, pod_set=pod_set, count=count, reason=reason))

    def _grant_one(self, w: Tracked, snap: Snapshot, granted: dict[tuple[str, str], int]) -> bool:
        """Grant ``w`` one more elastic pod of the first pod set that still wants one and fits; False
        when none does (it gets no more turns this cycle)."""
        for pod_set, _ in elastic.still_wanted(w):
            ps = next(p for p in w.spec.gang.pod_sets if p.name == pod_set)
            demand = ps.pod_demand
            if quota_failure(self.tree, w.queue, demand, snap.usage, snap.protected, w.spec.preemptible) is not None:
                continue
            if shortage(demand, snap.free):
                continue
            snap.charge_amount(self.tree, w.queue, demand, w.spec.preemptible)
            with self._ledger.moving(w):
                w.set_elastic(pod_set, w.elastic.get(pod_set, 0) + 1)
            granted[(w.key, pod_set)] = granted.get((w.key, pod_set), 0) + 1
            return True
        return False

    def _heads(self, now: float, out: Out) -> dict[str, list[Tracked]]:
        """Steps 1-2: per leaf queue that takes workloads, the ordered candidates of this cycle."""
        heads: dict[str, list[Tracked]] = {}
        for name in sorted(self._ledger.pending):
            members = self._ledger.pending[name].values()
            why = self.tree.wait_reason(name)
            for w in sorted((w for w in members if why is not None or w.held or not w.last_reason), key=_ORDER):
                self._tell_where(w, why, out)
            if why is not None:
                continue
            ready = [w for w in members if not _resting(w, now)]
            if blocks(self.policy.queueing_for(name)):
                resting = [w.order for w in members if _resting(w, now)]
                resting += [w.order for w in self._ledger.parked.get(name, {}).values()]
                if resting:  # StrictFIFO: nothing passes a head that is backing off
                    first = min(resting)
                    ready = [w for w in ready if w.order < first]
            if ready:
                heads[name] = sorted(ready, key=_ORDER)
        return heads

    def _rank(self, name: str, snap: Snapshot) -> tuple[int, float, str]:
        spec = self.tree.get(name)
        return serve_key(spec.priority if spec else 0, snap.dominant(name), name)

    def _snapshot(self) -> Snapshot:
        return Snapshot.take(self.tree, self._ledger, self._capacity, self._reclaims())

    def _reclaims(self) -> list[tuple[Tracked, list[Freed]]]:
        """Reservations whose victims may still hold quota, with what those give back (``Snapshot.credit``)."""
        return [(w, self._freed_by(w)) for w in (self._workloads[k] for k in self._reclaiming)]

    def _freed_by(self, w: Tracked) -> list[Freed]:
        """What ``w``'s victims that still hold quota and are still promised to it give back once placement
        evicts them: a whole victim's demand, or the named elastic pods it still holds."""
        out: list[Freed] = []
        for key in w.victims:
            v = self._workloads.get(key)
            if v is not None and v.holds_quota and v.promised_to == w.key:
                out.append((v.queue, v.demand))
        for unit in w.elastic_victims:
            v = self._workloads.get(unit.key)
            if v is not None and v.holds_quota and v.promised_to == w.key:
                demand = v.elastic_demand(unit.pod_set, unit.count)
                if demand:
                    out.append((v.queue, demand))
        return out

    def _try(self, w: Tracked, snap: Snapshot, now: float, out: Out) -> bool:
        """Steps 5-6 for one head; True when it took quota."""
        block = quota_block(self.tree, w.queue, w.demand, snap.usage, snap.protected, w.spec.preemptible)
        short = shortage(w.demand, snap.free)
        if block is not None:
            return self._over_quota(w, block, short, snap, now, out)
        choice, pods = self._reclaim(w, {CLUSTER: short}, snap, now) if short else (Choice(None), [])
        if short and choice.victims is None:
            w.reclaim_note = self._ripening_reclaim(w, {CLUSTER: short}, snap, now, out) or _refused(choice.refusal)
        else:
            w.reclaim_note = ""
        self._reserve(w, choice.victims or (), snap, pods)
        if choice.victims is not None:
            self._ask_reclaim(w, choice, pods, "", out)
        else:
            w.last_reason = w.reason(f"quota reserved in queue {w.queue} ({amounts(w.demand)})")
            out.append(Dequeued(key=w.key, queue=w.queue, workload=w.spec, reason=w.last_reason))
        return True

    def _over_quota(self, w: Tracked, block: tuple[str, str], short: dict[str, int], snap: Snapshot, now: float,
                    out: Out) -> bool:
        """Step 5 failed on a limit. When that limit is an ancestor's (shared with other queues), queues
        using more than their share under it give the quota back first (reclaim across the tree, what
        the ACK doc calls reclaiming a quota's minimum from quotas above theirs; their elastic pods before
        any whole gang); else lower priorities of ``w``'s own queue (in-queue preemption for quota); else
        ``BackedOff`` saying why."""
        level, failure = block
        needs = over_limits(self.tree, w.queue, w.demand, snap.usage)
        note = ""
        if needs and w.queue not in needs and cap_failure(self.tree, w.queue, w.demand, snap.protected,
                                                          w.spec.preemptible) is None:
            if short:
                needs[CLUSTER] = short
            choice, pods = self._reclaim(w, needs, snap, now)
            if choice.victims is not None:
                w.reclaim_note = ""
                self._reserve(w, choice.victims, snap, pods)
                self._ask_reclaim(w, choice, pods, f" to stay within {failure}", out)
                return True
            note = self._ripening_reclaim(w, needs, snap, now, out) or _refused(choice.refusal)
        return self._preempt_for_quota(w, failure, snap, now, out, note, level)

    def _ask_reclaim(self, w: Tracked, choice: Choice, pods: list[elastic.ElasticPod], within: str, out: Out) -> None:
        """``ReclaimRequested`` for a reservation that takes back what other queues hold."""
        named = _elastic_text(pods) if pods else ", ".join(choice.victims or ())
        w.last_reason = w.reason(f"quota reserved in queue {w.queue} ({amounts(w.demand)}); "
                                 f"reclaiming {named} from {_givers(choice)}{within}")
        out.append(ReclaimRequested(key=w.key, queue=w.queue, workload=w.spec, victims=w.victims,
                                    elastic_victims=w.elastic_victims, reason=w.last_reason))

    def _reserve(self, w: Tracked, victims: tuple[str, ...], snap: Snapshot,
                 pods: Sequence[elastic.ElasticPod] = ()) -> None:
        """``w`` takes its quota (ledger and snapshot). What its victims free (whole workloads, or elastic
        pods) counts as free nodes for the rest of the cycle (placement is the judge of capacity), but
        their quota stays held until placement evicts them: if placement fails nothing was given back, so
        no later head of the cycle may be admitted against quota a victim still holds. Only where ``w``
        and a victim share a level (a common parent) does that level count the larger of the two
        (``Snapshot.credit``)."""
        with self._ledger.moving(w):
            w.state = "reserved"
        w.requeue_at, w.held = None, ""
        w.reserved_seq = self._next_seq()
        w.victims, w.elastic_victims = victims, elastic.as_victims(pods)
        for key in dict.fromkeys([*victims, *(unit.key for unit in w.elastic_victims)]):
            self._workloads[key].promised_to = w.key  # no one else may count on evicting it, nor may it grow
        freed = self._freed_by(w)
        snap.charge(self.tree, w, freed)
        if victims or pods:
            self._reclaiming[w.key] = None
            for _, demand in freed:
                snap.free_capacity_of(demand)
            snap.candidates, snap.candidate_queues = None, None  # promises changed

    def _preempt_for_quota(self, w: Tracked, failure: str, snap: Snapshot, now: float, out: Out,
                           refused: str = "", level: str = "") -> bool:
        """Lower priorities of ``w``'s own leaf queue may give their quota back (preemption.py), their
        elastic pods before any whole gang (elastic.py). Then ``ReclaimRequested`` naming them (placement
        places ``w`` over them and evicts them as in-queue preemption), else ``BackedOff`` with the quota
        reason (and ``refused``: why no reclaim): waiting for quota under ``level`` (``room.py``), or, when
        only victims' minimum runtime stands in the way, for a time."""
        pods = self._elastic_quota_victims(w, snap, now)
        if pods is not None:
            w.reclaim_note = ""
            self._reserve(w, (), snap, pods)
            w.last_reason = w.reason(f"quota reserved in queue {w.queue} ({amounts(w.demand)}); "
                                     f"preempting {_elastic_text(pods)} to stay within {failure}")
            out.append(ReclaimRequested(key=w.key, queue=w.queue, workload=w.spec, victims=(),
                                        elastic_victims=w.elastic_victims, reason=w.last_reason))
            return True
        victims, note = self._quota_victims(w, snap, now, out)
        if victims is None:
            tail = " ".join(part for part in (note, refused) if part)
            parks = bool(level) and not note
            if parks:
                self._quota.park(w, level)
            self._back_off(w, now, w.reason(gang_line(w.spec.gang) + failure + (f". {tail}" if tail else "")), out,
                           arm=not parks)
            return False
        keys = tuple(h.key for h in victims)
        w.reclaim_note = ""
        self._reserve(w, keys, snap)
        named = ", ".join(f"{h.key} (priority {h.priority})" for h in victims)
        w.last_reason = w.reason(f"quota reserved in queue {w.queue} ({amounts(w.demand)}); "
                                 f"preempting {named} to stay within {failure}")
        out.append(ReclaimRequested(key=w.key, queue=w.queue, workload=w.spec, victims=keys, reason=w.last_reason))
        return True

    def _quota_victims(self, w: Tracked, snap: Snapshot, now: float,
                       out: Out) -> tuple[list[preemption.Holder] | None, str]:
        """The fewest lower-priority holders of ``w``'s leaf queue whose quota lets ``w`` pass the quota
        check; else None, with a note (and a wake-up) when only their minimum runtime stands in the way."""
        holders = self._quota_holders(w, snap) if w.spec.preempts else []
        if not holders:
            return None, ""
        min_runtime = self._min_runtime(w.queue)

        def fits(victims: list[preemption.Holder]) -> bool:
            freed: dict[str, int] = {}
            for h in victims:
                freed = q.add(freed, h.demand)
            return self._fits_quota_without(w, snap, freed)

        ready = [h for h in holders if preemption.eligible(h, w.spec.priority, now, min_runtime)]
        victims = minimal_victims(preemption.victim_order(ready), fits)
        if victims is not None:
            return victims, ""
        aged = [h for h in holders if preemption.eligible(h, w.spec.priority, math.inf, min_runtime)]
        later = minimal_victims(preemption.victim_order(aged), fits) if len(aged) > len(ready) else None
        if not later:
            return None, ""
        ripe = max((h.started_at + min_runtime for h in later if h.started_at is not None), default=now)
        if ripe <= now:
            return None, ""
        if ripe not in self._ripening:
            self._ripening[ripe] = None
            self._arm(ripe, now, out)
        return None, (f"Preempting {', '.join(h.key for h in later)} waits for the minimum runtime of queue "
                      f"{w.queue} (until {ripe:g}s).")

    def _fits_quota_without(self, w: Tracked, snap: Snapshot, freed: dict[str, int]) -> bool:
        """Would ``w`` pass the quota check of its queue and every ancestor with ``freed`` given back?"""
        chain = [spec.name for spec in self.tree.ancestry(w.queue)]
        usage = {name: q.sub(snap.usage.get(name, {}), freed) for name in chain}
        return quota_failure(self.tree, w.queue, w.demand, usage, snap.protected, w.spec.preemptible) is None

    def _elastic_quota_victims(self, w: Tracked, snap: Snapshot, now: float) -> list[elastic.ElasticPod] | None:
        """The fewest elastic pods of lower-priority holders of ``w``'s leaf queue whose quota lets ``w``
        pass (elastic pods go before any whole gang); None when they do not suffice or ``w`` may not preempt."""
        if not w.spec.preempts:
            return None
        self._quota_holders(w, snap)
        assert snap.holders is not None
        min_runtime = self._min_runtime(w.queue)
        pods = [pod for pod in elastic.elastic_pods(x for x in snap.holders.get(w.queue, []) if x.key != w.key)
                if preemption.eligible(pod.holder, w.spec.priority, now, min_runtime)]
        if not pods:
            return None

        def fits(chosen: list[elastic.ElasticPod]) -> bool:
            freed: dict[str, int] = {}
            for pod in chosen:
                freed = q.add(freed, pod.demand)
            return self._fits_quota_without(w, snap, freed)

        return minimal_victims(pods, fits)

    def _quota_holders(self, w: Tracked, snap: Snapshot) -> list[preemption.Holder]:
        """Admitted and running workloads of ``w``'s leaf queue, as quota preemption sees them."""
        if snap.holders is None:
            snap.holders = {}
            for x in self._workloads.values():
                if x.state in ("admitted", "running"):
                    snap.holders.setdefault(x.queue, []).append(x)
        return [preemption.Holder(key=x.key, priority=x.spec.priority, preemptible=x.spec.preemptible,
                                  started_at=x.started_at, admitted_seq=x.reserved_seq, demand=x.demand,
                                  promised=bool(x.promised_to))
                for x in snap.holders.get(w.queue, []) if x.key != w.key]

    def _reclaim(self, w: Tracked, needs: dict[str, dict[str, int]], snap: Snapshot,
                 now: float) -> tuple[Choice, list[elastic.ElasticPod]]:
        """Reclaim for ``w`` (see reclaim.py): what covers ``needs``, or why nothing does. Elastic pods of
        other queues first, each a victim of its own under the same rules (elastic.py); only when they
        do not cover, whole workloads (``Choice.victims`` then names them, and no pods)."""
        usage, share = snap.usage.get(w.queue, {}), snap.shares.get(w.queue, {})
        if not within_share(usage, w.demand, share):  # what _choose answers first, without a view of every running one
            return Choice(None, self._beyond_share(w, usage, share, list(self._ledger.running_of), snap)), []
        units = elastic.as_running(
            elastic.elastic_pods(x for x in self._ledger.running_elastic.values() if x.queue != w.queue),
            self._min_runtime)
        if units:
            choice = self._choose(w, needs, snap, now, [r for r, _ in units.values()])
            if choice.victims:
                return Choice((), by_guarantee=choice.by_guarantee), [units[key][1] for key in choice.victims]
        return self._choose(w, needs, snap, now), []

    def _candidates(self, snap: Snapshot, names: list[str]) -> list[Running]:
        """The running workloads of queues ``names`` as reclaim sees them, whole: each queue's built once per
        cycle (again after a reclaim), and only when a reclaim may take from that queue (``_giving_queues``)."""
        if snap.candidates is None:
            snap.candidates = {}
        out: list[Running] = []
        for name in names:
            views = snap.candidates.get(name)
            if views is None:
                min_runtime = self._min_runtime(name)
                views = snap.candidates[name] = [
                    Running(spec.key, spec.queue, spec.priority, spec.preemptible, x.started_at or 0.0,
                            min_runtime, x.demand, x.reserved_seq, bool(x.promised_to))
                    for x in self._ledger.running_of[name].values() for spec in (x.spec,)
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
        return [name for name in names if name != requester and (
            snap.dominant(name) > 1
            or (starved and above_guarantee(snap.usage.get(name, {}), self.tree.get(name), contested)))]

    def _choose(self, w: Tracked, needs: dict[str, dict[str, int]], snap: Snapshot, now: float,
                candidates: list[Running] | None = None) -> Choice:
        """Victims among ``candidates`` (by default the running workloads of the queues that may give)
        covering ``needs``, or why there are none.

        ``w``'s queue must stay within its fair share; staying within its guarantee too, it is starved, and
        queues above their guarantee give as well."""
        usage = snap.usage.get(w.queue, {})
        if candidates is None:
            if snap.candidate_queues is None:  # the queues of every running workload, which the ledger keeps
                snap.candidate_queues = list(self._ledger.running_of)
            names = snap.candidate_queues
        else:
            names = list(dict.fromkeys(x.queue for x in candidates))
        queues = {name: self.tree.get(name) for name in names}
        share = snap.shares.get(w.queue, {})
        if not within_share(usage, w.demand, share):
            return Choice(None, self._beyond_share(w, usage, share, names, snap))
        scopes = {name: frozenset(spec.name for spec in self.tree.ancestry(name)) for name in names}
        contested = {r for amounts in needs.values() for r in amounts}
        starved = within_guarantee(usage, w.demand, self.tree.get(w.queue), contested)
        if candidates is None:
            candidates = self._candidates(snap, self._giving_queues(w.queue, names, snap, contested, starved))
        return choose_victims(needs, candidates, queues, snap.usage, snap.shares, w.queue, now, scopes=scopes,
                              starved=starved)

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

    def _ripening_reclaim(self, w: Tracked, needs: dict[str, dict[str, int]], snap: Snapshot, now: float,
                          out: Out) -> str:
        """No reclaim now: would there be one once the victims have run their minimum runtime (KAI's
        preemptMinRuntime / reclaimMinRuntime)? Then wake everyone up at that time, not only when a
        backoff expires, and say so in the reason ("" when age is not what blocks it)."""
        if not within_share(snap.usage.get(w.queue, {}), w.demand, snap.shares.get(w.queue, {})):
            return ""  # _choose's first answer, at any age of the victims
        later = self._choose(w, needs, snap, math.inf).victims
        if not later or snap.candidates is None:
            return ""
        ripe = max(c.started_at + c.min_runtime for views in snap.candidates.values() for c in views if c.key in later)
        if ripe <= now:
            return ""
        if ripe not in self._ripening:
            self._ripening[ripe] = None
            self._arm(ripe, now, out)
        queues = dict.fromkeys(x.queue for key, x in self._ledger.running.items() if key in later)  # in running order
        return (f"Reclaiming {', '.join(later)} waits for the minimum runtime of queue "
                f"{', '.join(queues)} (until {ripe:g}s).")

    def _min_runtime(self, queue: str) -> float:
        spec = self.tree.get(queue)
        if spec is not None and spec.min_runtime is not None:
            return spec.min_runtime
        return self.policy.min_runtime_for(queue)

    # ------------------------------------------------------------------ helpers
    def _tell_where(self, w: Tracked, why: str | None, out: Out, moved: bool = False) -> None:
        """Tell a pending workload why its queue holds it (``why``), or that it waits its turn (once each)."""
        if why is not None:
            if w.held != why or moved:
                w.held = why
                self._tell(w, why, out)
        elif w.held or moved or not w.last_reason:
            w.held = ""
            self._tell(w, waiting(w.queue), out)

    def _tell(self, w: Tracked, text: str, out: Out) -> None:
        """Enqueued with ``text``, unless that is what the workload was last told."""
        reason = w.reason(text)
        if reason != w.last_reason:
            w.last_reason = reason
            out.append(Enqueued(key=w.key, queue=w.queue, reason=reason))

    def _back_off(self, w: Tracked, now: float, reason: str, out: Out, arm: bool = True) -> None:
        """``arm`` False: it waits for room (``RoomWaits``), not for a time: ``requeue_at`` is now, no timer
        (the projection and the status then show it waiting in line, not backing off)."""
        w.attempts += 1
        w.requeue_at = backoff.requeue_at(self.policy, now, w.attempts) if arm else now
        w.last_reason = reason
        out.append(BackedOff(key=w.key, queue=w.queue, requeue_at=w.requeue_at, attempts=w.attempts, reason=reason))
        if arm:
            self._arm(w.requeue_at, now, out)

    def _wake_all(self, now: float) -> None:
        """Capacity or quota came back: every backing-off workload may try again in this instant, and
        holders whose elastic pods found no node may ask again."""
        for members in self._ledger.pending.values():
            for w in members.values():
                if backoff.backing_off(w.requeue_at, now):
                    w.requeue_at = now
        for key in self._growing:
            self._workloads[key].elastic_waits = False

    def _quota_freed(self, queue: str, now: float) -> None:
        """Usage of ``queue`` and its ancestors dropped: who waits for quota at one of them and now fits
        tries again (``QuotaWaits.wake_fitting``), and the first waiter of each leaf under them, which may
        reclaim or preempt instead (shares and usage moved): Kueue's one head per ClusterQueue."""
        if len(self._quota):
            levels = [spec.name for spec in self.tree.ancestry(queue)] or [queue]
            for w in self._wake_quota(levels, lambda leaf: True):
                w.requeue_at = now

    def _wake_quota(self, levels: list[str], head: Callable[[str], bool]) -> list[Tracked]:
        """Waiters for quota at ``levels`` that the levels' free quota now holds, per leaf queue in queue
        order (what each one woken takes counted against the leaf's next), and the first waiter of every
        leaf ``head`` names whether it fits or not (it may reclaim or preempt instead)."""
        snap = Snapshot.quota(self.tree, self._ledger, self._reclaims())
        usage, protected = snap.usage, snap.protected
        woken: list[Tracked] = []
        for level in levels:
            spec = self.tree.get(level)
            if spec is None:
                woken += self._quota.wake_keys([level], self._workloads)
                continue
            used = usage.get(level, {})

            def fits(w: Tracked, consumed: dict[str, int], spec: QueueSpec = spec, used: dict[str, int] = used) -> bool:
                wanted = sorted(r for r, v in w.demand.items() if v > 0)
                if consumed:
                    used = q.add(used, consumed)
                if w.spec.preempts:  # lower priorities of its own queue may give their quota back to it
                    for priority, amounts in self._ledger.yielding.get(w.queue, {}).items():
                        if priority < w.spec.priority:
                            used = q.sub(used, amounts)
                return level_failure(spec, wanted, w.demand, used, protected, w.spec.preemptible) is None

            woken += self._quota.wake_fitting(level, fits, self._workloads, head)
        return woken

    def _above_guarantee(self, queue: str) -> bool:
        """Whether ``queue`` holds more than it is entitled to of some resource (what reclaim may take back)."""
        held = self._ledger.held.get(queue, {})
        return above_guarantee(held, self.tree.get(queue), held)

    def _reclaimable(self, queue: str, now: float, out: Out) -> None:
        """A preemptible workload of ``queue`` runs above its guarantee: reclaim may take it for workloads
        of other queues waiting for quota at one of its ancestors (the leaf's own wait for it to drop)."""
        levels = [spec.name for spec in self.tree.ancestry(queue)][1:]
        woken = self._wake_quota(levels, lambda leaf: leaf != queue)  # each other leaf's head may reclaim it
        for w in woken:
            w.requeue_at = now
        if woken:
            self._request_cycle(now, out)

    def _wake_quota_all(self, now: float) -> None:
        for w in self._quota.wake_all(self._workloads):
            w.requeue_at = now

    def _unpromise(self, w: Tracked) -> None:
        """Placement answered ``w``'s reclaim (or ``w`` left): its victims are free to be chosen again."""
        for key in [*w.victims, *(unit.key for unit in w.elastic_victims)]:
            victim = self._workloads.get(key)
            if victim is not None and victim.promised_to == w.key:
                victim.promised_to = ""
        w.victims, w.elastic_victims = (), ()
        w.promised_to = ""
        self._reclaiming.pop(w.key, None)

    def _request_cycle(self, now: float, out: Out) -> None:
        self._arm(now, now, out)

    def _arm(self, at: float, now: float, out: Out) -> None:
        """One ``cycle`` timer per instant: never set the same key/at twice."""
        for stale in [t for t in self._armed if t < now]:
            del self._armed[stale]
        if at in self._armed:
            return
        self._armed[at] = None
        out.append(TimerSet(key=CYCLE, at=at))

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # ------------------------------------------------------------------ read-only view
    def status(self) -> dict[str, QueueStatus]:
        """Per queue: usage (rolled up), guarantee, limit, fair share, active, pending, backoff."""
        snap = Snapshot.take(self.tree, self._ledger, self._capacity)  # what is held, credits aside
        members: dict[str, list[Tracked]] = {}
        for w in self._workloads.values():
            members.setdefault(w.queue, []).append(w)
        names = sorted(dict.fromkeys([*self.tree.names(), *members, *snap.usage]))
        view: dict[str, QueueStatus] = {}
        for name in names:
            spec = self.tree.get(name)
            mine = members.get(name, [])
            active = sorted((w for w in mine if w.holds_quota), key=lambda w: w.reserved_seq)
            queued = sorted((w for w in mine if w.state == "pending"), key=_ORDER)
            resting = [w for w in queued if backoff.backing_off(w.requeue_at, self._now)]
            ready = [w for w in queued if not backoff.backing_off(w.requeue_at, self._now)]  # waiting for room too
            view[name] = {
                "exists": spec is not None,
                "parent": self.tree.parent_of(name) if spec else None,
                "state": spec.state if spec else None,
                "usage": {r: v for r, v in sorted(snap.usage.get(name, {}).items()) if v},
                "guarantee": dict(spec.guarantee) if spec else {},
                "limit": dict(spec.limit) if spec else {},
                "fair_share": dict(snap.shares.get(name, {})),
                "active": [w.key for w in active],
                "pending": [{"workload": w.key, "position": i + 1} for i, w in enumerate(ready)],
                "backoff": [{"workload": w.key, "requeue_at": w.requeue_at} for w in resting],
            }
        return view


class PendingEntry(TypedDict):
    workload: str
    position: int
    """1 for the queue's head."""


class BackoffEntry(TypedDict):
    workload: str
    requeue_at: float | None


class QueueStatus(TypedDict):
    """One queue of ``QueueCore.status``: read by ``muster explain`` and the scheduling metrics."""

    exists: bool
    parent: str | None
    state: str | None
    usage: dict[str, int]
    guarantee: dict[str, int]
    limit: dict[str, int]
    fair_share: dict[str, int]
    active: list[str]
    pending: list[PendingEntry]
    backoff: list[BackoffEntry]


def _resting(w: Tracked, now: float) -> bool:
    """Not a head now: backing off, or waiting for room a release has not named yet."""
    return bool(w.room_key or w.quota_key) or backoff.backing_off(w.requeue_at, now)


def _elastic_text(pods: Sequence[elastic.ElasticPod]) -> str:
    """``2 elastic pod(s) of ns/a (worker), 1 elastic pod(s) of ns/b (small)`` for a reason."""
    return ", ".join(f"{v.count} elastic pod(s) of {v.key} ({v.pod_set})" for v in elastic.as_victims(pods))


def _refused(refusal: str) -> str:
    return f"Reclaim refused: {refusal}." if refusal else ""


def _givers(choice: Choice) -> str:
    return "queues over their guarantee" if choice.by_guarantee else "queues over their fair share"
