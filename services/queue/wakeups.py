"""Wake-ups: who waits no longer when quota or capacity comes back.

A waiter is a pending workload backing off (``requeue_at`` in the future), parked for room
(``RoomWaits``) or parked for quota (``QuotaWaits``), or a holder whose elastic pods found no node.
Waking it sets ``requeue_at`` to now (or clears ``elastic_waits``): the next cycle tries it again.
``room.py`` keeps who waits for what; this module decides whom a change wakes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from services.queue import backoff
from services.queue.reclaim import above_guarantee
from services.queue.snapshot import Snapshot
from services.queue.tree import level_failure
from services.queue.workload import Tracked
from shared.kernel import quantity as q
from shared.kernel.model import QueueSpec

if TYPE_CHECKING:
    from services.queue.core import Out, QueueCore


class Wakeups:
    """One core's wake-ups (``core`` owns the books and the waits)."""

    def __init__(self, core: QueueCore) -> None:
        self.core = core

    def all(self, now: float) -> None:
        """Capacity or quota came back: every backing-off workload may try again in this instant, and
        holders whose elastic pods found no node may ask again."""
        core = self.core
        for members in core._ledger.pending.values():
            for w in members.values():
                if backoff.backing_off(w.requeue_at, now):
                    w.requeue_at = now
        for key in core.grants.growing:
            core._workloads[key].elastic_waits = False

    def ripened(self, now: float) -> None:
        """Victims a reclaim or preemption waited for have run their minimum runtime: every waiter, for
        time, room or quota, tries again."""
        core = self.core
        self.all(now)
        for w in core._room.wake_all(core._workloads):
            w.requeue_at = now
        self.quota_all(now)

    def released(self, room: dict[str, int] | None, now: float) -> None:
        """Placement released capacity: backing-off workloads try again, and the gangs waiting for room
        that ``room`` says the free nodes now hold (per room key; None: every waiting gang)."""
        core = self.core
        self.all(now)
        if len(core._room):
            woken = core._room.wake_all(core._workloads) if room is None else core._room.wake(room, core._workloads)
            for w in woken:
                w.requeue_at = now

    def below(self, w: Tracked, now: float) -> bool:
        """Preemptible ``w`` now holds nodes and quota in its queue: waiters of higher priority there, for
        room or for quota, may preempt it. True when any woke."""
        core = self.core
        any_woken = False
        if len(core._room):
            woken = core._room.above(w.queue, w.spec.priority, core._workloads)
            for x in woken:  # a lower priority now holds nodes in their queue: they may preempt it
                core._room.unpark(x)
                x.requeue_at = now
            any_woken = bool(woken)
        if len(core._quota):
            woken = core._quota.above(w.queue, w.spec.priority, core._workloads)
            for x in woken:  # a lower priority now holds quota in their queue: they may preempt it for quota
                core._quota.unpark(x)
            any_woken = any_woken or bool(woken)
        return any_woken

    def quota_freed(self, queue: str, now: float) -> None:
        """Usage of ``queue`` and its ancestors dropped: who waits for quota at one of them and now fits
        tries again (``QuotaWaits.wake_fitting``), and the first waiter of each leaf under them, which may
        reclaim or preempt instead (shares and usage moved): Kueue's one head per ClusterQueue."""
        if len(self.core._quota):
            levels = [spec.name for spec in self.core.tree.ancestry(queue)] or [queue]
            for w in self._wake_quota(levels, lambda leaf: True):
                w.requeue_at = now

    def _wake_quota(self, levels: list[str], head: Callable[[str], bool]) -> list[Tracked]:
        """Waiters for quota at ``levels`` that the levels' free quota now holds, per leaf queue in queue
        order (what each one woken takes counted against the leaf's next), and the first waiter of every
        leaf ``head`` names whether it fits or not (it may reclaim or preempt instead)."""
        core = self.core
        snap = Snapshot.quota(core.tree, core._ledger, core.promises.reclaims())
        usage, protected = snap.usage, snap.protected
        woken: list[Tracked] = []
        for level in levels:
            spec = core.tree.get(level)
            if spec is None:
                woken += core._quota.wake_keys([level], core._workloads)
                continue
            used = usage.get(level, {})

            def fits(w: Tracked, consumed: dict[str, int], spec: QueueSpec = spec, used: dict[str, int] = used) -> bool:
                wanted = sorted(r for r, v in w.demand.items() if v > 0)
                if consumed:
                    used = q.add(used, consumed)
                if w.spec.preempts:  # lower priorities of its own queue may give their quota back to it
                    for priority, amounts in core._ledger.yielding.get(w.queue, {}).items():
                        if priority < w.spec.priority:
                            used = q.sub(used, amounts)
                return level_failure(spec, wanted, w.demand, used, protected, w.spec.preemptible) is None

            woken += core._quota.wake_fitting(level, fits, core._workloads, head)
        return woken

    def above_guarantee(self, queue: str) -> bool:
        """Whether ``queue`` holds more than it is entitled to of some resource (what reclaim may take back)."""
        held = self.core._ledger.held.get(queue, {})
        return above_guarantee(held, self.core.tree.get(queue), held)

    def reclaimable(self, queue: str, now: float, out: Out) -> None:
        """A preemptible workload of ``queue`` runs above its guarantee: reclaim may take it for workloads
        of other queues waiting for quota at one of its ancestors (the leaf's own wait for it to drop)."""
        levels = [spec.name for spec in self.core.tree.ancestry(queue)][1:]
        woken = self._wake_quota(levels, lambda leaf: leaf != queue)  # each other leaf's head may reclaim it
        for w in woken:
            w.requeue_at = now
        if woken:
            self.core.timers.request_cycle(now, out)

    def quota_all(self, now: float) -> None:
        for w in self.core._quota.wake_all(self.core._workloads):
            w.requeue_at = now
