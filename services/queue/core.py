"""The queue core: decides *when* a workload may take quota.

``QueueCore`` owns the books (workloads, ledger, tree, waits) and folds each inbox event in its
handlers (``_on_<PayloadType>``, its table ``shared.kernel.fold``); every decision beyond one event's bookkeeping is made by a
named collaborator it owns. Where each decision is made:

- ``core.py`` (this file): the handlers, state changes of workloads and queues, capacity,
  the fired timer, what a waiting workload is told (``tell_where``), backing off;
- ``status.py``: the read-only per-queue view ``status()`` returns;
- ``answers.py`` (``PlacementAnswers``, ``core.answers``): placement's answers (placed, running,
  failed, preempted, elastic pods released) and whom each wakes (the core's ``_on_*`` handlers
  hand these on);
- ``cycle.py`` (``AdmissionCycle``, ``core.cycle``): the per-instant admission cycle: hold, heads,
  snapshot, serve order, quota check, Dequeued vs ReclaimRequested vs BackedOff;
- ``victims.py`` (``Victims``, ``core.victims``): whom a head that does not fit takes quota back
  from: reclaim across queues (rules in ``reclaim.py``), in-queue preemption (rules in
  ``preemption.py``), and the minimum-runtime wake-up when only the victims' age stands in the way;
- ``promises.py`` (``Promises``, ``core.promises``): which victims are promised to which
  reservation until placement answers, and what they still hold (``Snapshot.credit``);
- ``grants.py`` (``ElasticGrants``, ``core.grants``): who wants elastic pods, the cycle's grant step;
- ``wakeups.py`` (``Wakeups``, ``core.wake``): whom released quota or capacity wakes;
- ``timers.py`` (``Timers``, ``core.timers``): the ``cycle`` timer, cycle and ripening arming;
- ``room.py``: who waits for room (``RoomWaits``) or quota (``QuotaWaits``) and under what;
- ``tree.py``: which queues exist, roll-up, limit/guarantee checks and the quota reason line;
- ``ordering.py``: pending order in a queue, queue serving order, StrictFIFO vs BestEffortFIFO;
- ``backoff.py``: requeue_at as data; ``fairshare.py``: deserved shares and dominant share;
- ``reclaim.py``: whether and from whom to reclaim; ``snapshot.py``: what one cycle sees;
- ``preemption.py``: which lower priorities of the same queue give quota back when its limit blocks;
- ``elastic.py``: who may grow by elastic pods, and which elastic pods go first as victims;
- ``workload.py``: one workload's record here, what it charges (a ``gpu-memory`` pod: its share of the
  smallest GPU a node states while it waits, of the device it got once placed), and ``shrunk`` (what
  an edit leaves of an admission);
- ``ledger.py``: per-queue pending index and usage totals, updated on every state change.

The collaborators are plain classes holding the core (statecodec encodes the graph, cycles and
all); they read its books and share its timers. The runtime fires timers only when every inbox is
drained, so one cycle sees everything that arrived at its instant (``timers.py``).
"""

from __future__ import annotations

from typing import Union

from services.queue import backoff
from services.queue.answers import PlacementAnswers
from services.queue.cycle import AdmissionCycle
from services.queue.grants import ElasticGrants
from services.queue.ledger import Ledger
from services.queue.promises import Promises
from services.queue.reasons import waiting
from services.queue.room import QuotaWaits, RoomWaits
from services.queue.status import BackoffEntry, PendingEntry, QueueStatus, status
from services.queue.timers import CYCLE, Timers
from services.queue.tree import QueueTree
from services.queue.victims import Victims
from services.queue.wakeups import Wakeups
from services.queue.workload import Tracked
from shared.kernel.fold import Folds
from shared.kernel.model import shrunk
from shared.kernel.events import (
    BackedOff, CapacityChanged, Dequeued, ElasticGranted, ElasticReleased, ElasticWaiting, Envelope, Enqueued,
    GangEvicted, GangPlaced, GangRunning, PlacementFailed, PreemptionRequested, QueueDefined, QueueRejected, QueueRemoved,
    ReclaimRequested, TimerFired, TimerSet, WorkloadDeleted, WorkloadFinished, WorkloadRejected, WorkloadSubmitted,
    WorkloadUpdated, WorkloadWithdrawn,
)
from shared.kernel.model import WorkloadSpec
from shared.kernel.policy import Policy

Output = Union[Enqueued, BackedOff, Dequeued, ReclaimRequested, WorkloadWithdrawn, ElasticGranted, ElasticWaiting,
               TimerSet, QueueRejected]
"""What the queue emits (``shared.kernel.topology`` routes each)."""
Out = list[Output]


class QueueCore(Folds):
    """Pure fold over the queue inbox; ``status()`` is a read-only view for the projection."""

    service = "queue"

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.tree = QueueTree(policy.default_queue)
        self._workloads: dict[str, Tracked] = {}
        self._ledger = Ledger()
        self._capacity: dict[str, int] = {}
        self.gpu_memory = 0
        """MiB per GPU device a waiting workload's ``gpu-memory`` pods are charged at: the least any
        schedulable node states (``CapacityChanged.gpu_memory``); 0 while none does."""
        self._room = RoomWaits(self._ledger)
        """Pending gangs placement found no room and no victim for: they wait for a release that holds them."""
        self._quota = QuotaWaits(self._ledger)
        """Pending workloads over a limit with nothing to reclaim: they wait for usage under it to drop."""
        self._seq = 0
        self._now = 0.0
        self.timers = Timers()
        self.promises = Promises(self._workloads)
        self.grants = ElasticGrants(self)
        self.wake = Wakeups(self)
        self.victims = Victims(self)
        self.cycle = AdmissionCycle(self)
        self.answers = PlacementAnswers(self)

    def handle(self, env: Envelope) -> list[Output]:
        """Fold one inbox event; anything not addressed to the queue is ignored quietly."""
        handler = self.folds.get(env.type)
        if handler is None:
            return []
        now = env.occurred_at
        self._now = max(self._now, now)
        out: Out = []
        handler(self, env.payload, now, out)
        return out

    # ------------------------------------------------------------------ queues
    def _on_QueueDefined(self, p: QueueDefined, now: float, out: Out) -> None:
        problem = self.tree.define(p.queue)
        if problem is not None:
            out.append(QueueRejected(name=p.queue.name, kind=p.queue.kind, reason=problem))
            return
        self.wake.quota_all(now)  # a limit, parent or state changed: every quota wait is judged again
        self.timers.request_cycle(now, out)  # limits, state or shape changed: the cycle re-tells waits

    def _on_QueueRemoved(self, p: QueueRemoved, now: float, out: Out) -> None:
        if self.tree.remove(p.name):
            self._ledger.forget(p.name)
            self.wake.quota_all(now)
            self.timers.request_cycle(now, out)  # its pending workloads hear "does not exist" in the cycle

    def _left(self, queue: str) -> None:
        """A workload left ``queue``: the ledger forgets a queue that does not exist once nobody books there."""
        if not self.tree.exists(queue):
            self._ledger.forget(queue)

    # ------------------------------------------------------------------ workloads from admission
    def _on_WorkloadSubmitted(self, p: WorkloadSubmitted, now: float, out: Out) -> None:
        if p.workload.key in self._workloads:
            self._update(p.workload, now, out)  # a resubmission only matters while it waits
            return
        w = self._workloads[p.workload.key] = Tracked.of(p.workload, self.gpu_memory)
        self._ledger.book(w)
        self.tell_where(w, self.tree.wait_reason(w.queue), out)
        self.timers.request_cycle(now, out)

    def _on_WorkloadUpdated(self, p: WorkloadUpdated, now: float, out: Out) -> None:
        if p.workload.key not in self._workloads:
            self._on_WorkloadSubmitted(WorkloadSubmitted(workload=p.workload), now, out)
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
            self.tell_where(w, self.tree.wait_reason(w.queue), out, moved=True)
        self.timers.request_cycle(now, out)

    def _edit_holder(self, w: Tracked, spec: WorkloadSpec, now: float, out: Out) -> None:
        """Quota follows what was admitted. An edit that asks for fewer pods gives back what it no
        longer asks for at once (placement drops the same surplus slots, ``shrunk``); anything more
        (more pods, a new shape, queue or priority) waits for the workload's next admission, kept in
        ``latest``: the pods beyond the admitted ones stay Pending and use no quota. Nothing to tell."""
        smaller = shrunk(w.spec.gang, spec.gang)
        if smaller is not None:
            with self._ledger.moving(w):
                w.respec(w.spec.model_copy(update={"gang": smaller}))
            self.wake.all(now)  # quota came back: whatever waits for it may try at once
            self.wake.quota_freed(w.queue, now)
            self.timers.request_cycle(now, out)
        w.latest = None if spec == w.spec else spec
        if self.grants.set_goal(w):
            self.timers.request_cycle(now, out)  # the owner wants more elastic pods: the cycle may grant them

    def _gone(self, p: WorkloadFinished | WorkloadDeleted | WorkloadRejected, now: float, out: Out) -> None:
        """The workload left: finished, deleted, or (waiting) made invalid by an edit."""
        w = self._workloads.pop(p.key, None)
        if w is None:
            return
        self._room.unpark(w)
        self._quota.unpark(w)
        self._ledger.unbook(w)
        self._left(w.queue)
        self.grants.growing.pop(w.key, None)
        self.promises.gone(w)
        reason = p.reason or (p.outcome if isinstance(p, WorkloadFinished) else "deleted")
        out.append(WorkloadWithdrawn(key=w.key, reason=reason))
        if w.holds_quota:
            self.wake.all(now)
            self.wake.quota_freed(w.queue, now)
        self.timers.request_cycle(now, out)

    _on_WorkloadFinished = _on_WorkloadDeleted = _gone

    def _on_WorkloadRejected(self, p: WorkloadRejected, now: float, out: Out) -> None:
        """A waiting workload whose update made it invalid leaves its queue until it is fixed.

        One that already holds quota keeps running on its last valid spec, as a refused edit would.
        """
        w = self._workloads.get(p.key)
        if w is not None and not w.holds_quota and w.spec.kind == p.kind:  # another kind's claim is not this one
            self._gone(p, now, out)

    # ------------------------------------------------------------------ placement's answers (answers.py)
    def _on_GangPlaced(self, p: GangPlaced, now: float, out: Out) -> None:
        self.answers.placed(p, now, out)

    def _on_GangRunning(self, p: GangRunning, now: float, out: Out) -> None:
        self.answers.running(p, now, out)

    def _on_PlacementFailed(self, p: PlacementFailed, now: float, out: Out) -> None:
        self.answers.placement_failed(p, now, out)

    def _on_PreemptionRequested(self, p: PreemptionRequested, now: float, out: Out) -> None:
        self.answers.preempted(p, now, out)

    def _on_GangEvicted(self, p: GangEvicted, now: float, out: Out) -> None:
        self.answers.evicted(p, now, out)

    def _on_ElasticReleased(self, p: ElasticReleased, now: float, out: Out) -> None:
        self.answers.elastic_released(p, now, out)

    # ------------------------------------------------------------------ capacity and the timer
    def _on_CapacityChanged(self, p: CapacityChanged, now: float, out: Out) -> None:
        self._capacity = dict(p.total)
        if p.gpu_memory != self.gpu_memory:
            self._charge_gpu_memory_at(p.gpu_memory, now)
        if p.released:
            self.wake.released(p.room, now)
        self.timers.request_cycle(now, out)

    def _charge_gpu_memory_at(self, gpu_memory: int, now: float) -> None:
        """The least memory per GPU device the nodes state changed (a node came, left or was relabelled):
        every waiting workload asking for GPU memory is charged at it from now; a holder keeps what it
        was reserved at. A smaller charge may let a quota wait through, so those are judged again."""
        self.gpu_memory = gpu_memory
        changed = False
        for w in self._workloads.values():
            if not w.holds_quota and w.spec.gang.asks_gpu_memory:
                with self._ledger.moving(w):
                    w.charge_at(gpu_memory)
                changed = True
        if changed:
            self.wake.quota_all(now)

    def _on_TimerFired(self, p: TimerFired, now: float, out: Out) -> None:
        if p.key != CYCLE:
            return
        due = p.due(now)  # the instant it was set for; ``now`` is when it is handled (never earlier)
        self._quota.cycled()
        if self.timers.fired(due):
            self.wake.ripened(now)  # victims a reclaim waited for have run their minimum runtime
        self.cycle.run(now, out)

    # ------------------------------------------------------------------ helpers
    def tell_where(self, w: Tracked, why: str | None, out: Out, moved: bool = False) -> None:
        """Tell a pending workload why its queue holds it (``why``), or that it waits its turn (once each)."""
        if why is not None:
            if w.held != why or moved:
                w.held = why
                self.tell(w, why, out)
        elif w.held or moved or not w.last_reason:
            w.held = ""
            self.tell(w, waiting(w.queue), out)

    def tell(self, w: Tracked, text: str, out: Out) -> None:
        """Enqueued with ``text``, unless that is what the workload was last told."""
        reason = w.reason(text)
        if reason != w.last_reason:
            w.last_reason = reason
            out.append(Enqueued(key=w.key, queue=w.queue, reason=reason))

    def back_off(self, w: Tracked, now: float, reason: str, out: Out, arm: bool = True) -> None:
        """``arm`` False: it waits for room (``RoomWaits``), not for a time: ``requeue_at`` is now, no timer
        (the projection and the status then show it waiting in line, not backing off)."""
        w.attempts += 1
        w.requeue_at = backoff.requeue_at(self.policy, now, w.attempts) if arm else now
        w.last_reason = reason
        out.append(BackedOff(key=w.key, queue=w.queue, requeue_at=w.requeue_at, attempts=w.attempts, reason=reason))
        if arm:
            self.timers.arm(w.requeue_at, now, out)

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # ------------------------------------------------------------------ read-only view
    def status(self) -> dict[str, QueueStatus]:
        """Per queue: usage (rolled up), guarantee, limit, fair share, active, pending, backoff (status.py)."""
        return status(self.tree, self._ledger, self._capacity, self._workloads, self._now)


__all__ = ["BackoffEntry", "Out", "Output", "PendingEntry", "QueueCore", "QueueStatus"]
