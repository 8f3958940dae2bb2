"""Placement's answers about a reservation: placed, running, failed, preempted or evicted, elastic pods released.

Each answer moves one workload's state in the core's books (ledger, waits, promises, elastic goal)
and wakes whom it concerns; the decision what to admit next stays with the cycle (``cycle.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.queue.reasons import preempted_by, waiting
from shared.kernel.events import (
    ElasticReleased, Enqueued, GangEvicted, GangPlaced, GangRunning, PlacementFailed, PreemptionRequested,
)
from shared.kernel.model import as_placed

if TYPE_CHECKING:
    from services.queue.core import Out, QueueCore


class PlacementAnswers:
    """One core's handlers for placement's answers (``core`` owns the books)."""

    def __init__(self, core: QueueCore) -> None:
        self.core = core

    def placed(self, p: GangPlaced, now: float, out: Out) -> None:
        core = self.core
        w = core._workloads.get(p.key)
        if w is None or w.state in ("admitted", "running"):
            return
        if w.state == "pending":  # placement placed it after all: reality wins, it holds quota
            w.reserved_seq = core.next_seq()
            core._room.unpark(w)
            core._quota.unpark(w)
        before = w.demand
        with core._ledger.moving(w):
            w.state = "admitted"
            w.placed_as(as_placed(w.spec.gang, (s.pod_set for s in p.slots)))
            held = p.gpu_memory_held
            if held:
                w.hold_gpu(held)
        if w.demand != before:  # its gpu-memory pods hold less than the estimate reserved: quota came back
            core.wake.quota_freed(w.queue, now)
            core.timers.request_cycle(now, out)
        w.attempts, w.requeue_at, w.preempted_by, w.held, w.reclaim_note = 0, None, "", "", ""
        core.promises.release(w)
        if w.spec.preemptible and core.wake.below(w, now):
            core.timers.request_cycle(now, out)
        if core.grants.set_goal(w):
            core.timers.request_cycle(now, out)  # placement holds its slots now: elastic pods may follow

    def running(self, p: GangRunning, now: float, out: Out) -> None:
        core = self.core
        w = core._workloads.get(p.key)
        if w is None or w.state not in ("reserved", "admitted"):
            return
        with core._ledger.moving(w):
            w.state = "running"
        if w.started_at is None:
            w.started_at = now
        if w.spec.preemptible and len(core._quota) and core.wake.above_guarantee(w.queue):
            core.wake.reclaimable(w.queue, now, out)
        if core.grants.set_goal(w):
            core.timers.request_cycle(now, out)

    def placement_failed(self, p: PlacementFailed, now: float, out: Out) -> None:
        core = self.core
        w = core._workloads.get(p.key)
        if w is None or w.state != "reserved":
            return
        with core._ledger.moving(w):
            w.state = "pending"
            w.drop_elastic(core.gpu_memory)
            if w.latest is not None:  # edited beyond what was reserved: it waits as the user has it now
                w.respec(w.latest)
        core.grants.set_goal(w)
        core.promises.release(w)
        reason = f"{p.reason} {w.reclaim_note}" if w.reclaim_note else p.reason
        parks = bool(p.room_key)  # a reclaim waiting for its victims' minimum runtime wakes it then (_on_TimerFired)
        if parks:  # no node and no victim: it waits for a release that holds it, not for a timer
            core._room.park(w, p.room_key)
        core.back_off(w, now, w.reason(reason), out, arm=not parks)
        core.wake.quota_freed(w.queue, now)
        core.timers.request_cycle(now, out)  # its reservation went back to the queue

    def preempted(self, p: PreemptionRequested, now: float, out: Out) -> None:
        self._requeue(p.key, preempted_by(p.preemptor, p.preemptor_priority,
                                           reclaimed_for=self._queue_of(p.preemptor) if p.reclaim else None), now, out)

    def evicted(self, p: GangEvicted, now: float, out: Out) -> None:
        """A stale gang was evicted (its queue's staleness grace period passed while it was below its
        minimum): it waits in its queue again, the reason saying why, as a preempted one does."""
        self._requeue(p.key, p.reason, now, out)

    def _requeue(self, key: str, why: str, now: float, out: Out) -> None:
        """A holder lost its admission to an eviction: back to pending with ``why`` before every reason
        until it is admitted again; its quota goes back and whoever waits for it is woken."""
        core = self.core
        w = core._workloads.get(key)
        if w is None or not w.holds_quota:
            return
        core.promises.release(w)
        with core._ledger.moving(w):
            w.state = "pending"
            w.drop_elastic(core.gpu_memory)
            if w.latest is not None:  # edited beyond what was admitted: it comes back as the user has it now
                w.respec(w.latest)
        core.grants.set_goal(w)
        w.started_at, w.attempts, w.requeue_at, w.held = None, 0, None, ""
        w.preempted_by = why
        w.last_reason = f"{w.preempted_by}; {waiting(w.queue)}"
        out.append(Enqueued(key=w.key, queue=w.queue, reason=w.last_reason))
        core.wake.all(now)
        core.wake.quota_freed(w.queue, now)
        core.timers.request_cycle(now, out)

    def _queue_of(self, key: str) -> str:
        w = self.core._workloads.get(key)
        return w.queue if w is not None else "?"

    def elastic_released(self, p: ElasticReleased, now: float, out: Out) -> None:
        """Placement gave back elastic pods' quota (no node for them, gone, unwanted, evicted). A release
        of an earlier admission's pods is stale: the grants it answers were dropped with that admission."""
        core = self.core
        w = core._workloads.get(p.key)
        if w is None or not w.holds_quota or w.reserved_seq != p.admission:
            return
        with core._ledger.moving(w):
            w.set_elastic(p.pod_set, w.elastic.get(p.pod_set, 0) - p.count)
        core.wake.quota_freed(w.queue, now)
        if p.refused:
            w.elastic_waits = True  # no node for it now: it asks again when capacity is released
            core.grants.tell_wait(w, p.pod_set, p.count, f"{p.reason}; asked again when capacity is released", out)
        else:
            core.wake.all(now)
        core.timers.request_cycle(now, out)
