"""What placement tells the queue about capacity: CapacityChanged, the timers that time it
(``capacity``, ``ripen``), and the gangs waiting for room (the ``room`` a release names per shape).

A signal is asked for with ``request`` during an instant and sent once, when its ``capacity`` timer
fires at the instant's quiescence; a node's change is said at once (``changed``). A ``ripen`` timer
fires when would-be preemption victims reach their minimum runtime: a release, so the queue retries.
"""

from __future__ import annotations

import hashlib

from services.placement.gang import place_gang
from services.placement.ledger import PodLedger
from services.placement.nodes import NodeTable
from services.placement.statement import Statement
from services.placement.workloads import WorkloadRecord
from shared.kernel.events import CapacityChanged, TimerSet
from shared.kernel.model import Gang

CAPACITY_TIMER = "capacity"
"""Fires at quiescence of an instant in which pods went away (or foreign pods came): one signal."""
RIPEN_TIMER = "ripen"
"""Fires when would-be preemption victims reach their minimum runtime: a release, so the queue retries."""


class CapacitySignals:
    def __init__(self, nodes: NodeTable, ledger: PodLedger) -> None:
        self.nodes = nodes
        self.ledger = ledger
        self.timer_at: float | None = None
        self.timer_fired_at: float | None = None
        self.release_pending = False
        self.last_total: dict[str, int] | None = None
        self.ripen_at: dict[float, None] = {}
        """Times a ``ripen`` timer is set for (one per time)."""
        self.waiting: dict[str, str] = {}
        """Gangs that found no room and no victim (workload key -> room key): they wait for a release."""
        self.shapes: dict[str, tuple[Gang, str, dict[str, None]]] = {}
        """Room key -> (gang, strategy, keys of the waiting gangs of that shape)."""

    def changed(self, released: bool, everyone: bool = False) -> CapacityChanged:
        """``everyone``: nodes came, changed or victims ripened; every waiting gang may try. Otherwise a
        release names the room it made per waiting shape (``room``)."""
        total = self.nodes.totals()
        for name, used in self.ledger.foreign.items():
            if name in total:
                total[name] = max(0, total[name] - used)
        self.last_total = total
        room = None if everyone or not released or not self.shapes else self.room()
        return CapacityChanged(total=total, nodes=self.nodes.schedulable_count(), released=released, room=room,
                               gpu_memory=self.nodes.least_gpu_memory())

    def request(self, now: float, released: bool) -> list[TimerSet]:
        """Ask for one CapacityChanged at the end of this instant (a timer at ``now``, set once)."""
        self.release_pending = self.release_pending or released
        if self.timer_at == now or self.timer_fired_at == now:
            return []
        self.timer_at = now
        return [TimerSet(key=CAPACITY_TIMER, at=now)]

    def take_pending(self) -> bool:
        """Whether a release was asked for and not said yet; it is said now."""
        released, self.release_pending = self.release_pending, False
        return released

    def fired(self, due: float) -> tuple[list[CapacityChanged], bool]:
        """The ``capacity`` timer set for ``due`` fired: the signal (none when nothing was released and
        the total is unchanged), and whether it is a release."""
        if self.timer_at == due:
            self.timer_at = None
        self.timer_fired_at = due
        released = self.take_pending()
        before = self.last_total
        event = self.changed(released)
        return ([event] if released or event.total != before else []), released

    def ripened(self, due: float) -> CapacityChanged:
        self.ripen_at.pop(due, None)
        return self.changed(released=True, everyone=True)

    def ripen(self, at: float) -> list[TimerSet]:
        """A ``ripen`` timer at ``at``, once per time."""
        if at in self.ripen_at:
            return []
        self.ripen_at[at] = None
        return [TimerSet(key=RIPEN_TIMER, at=at)]

    # ------------------------------------------------------------------ gangs waiting for room
    def wait_for_room(self, rec: WorkloadRecord, strategy: str) -> str:
        """``rec`` found neither room nor a victim: it waits until a release could hold its gang. The
        room key names its shape (gang and strategy); identical gangs share one, so a release is tried
        once per shape (``room``), not once per waiting gang."""
        text = f"{strategy}|{rec.spec.gang.model_dump_json()}"
        key = hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
        self.waiting[rec.key] = key
        shape = self.shapes.get(key)
        if shape is None:
            shape = self.shapes[key] = (rec.spec.gang, strategy, {})
        shape[2][rec.key] = None
        return key

    def stop_waiting(self, key: str) -> None:
        room_key = self.waiting.pop(key, None)
        if room_key is None:
            return
        members = self.shapes[room_key][2]
        members.pop(key, None)
        if not members:
            del self.shapes[room_key]

    def room(self) -> dict[str, int]:
        """Per shape of the waiting gangs: how many of them the free nodes hold now, placed one after
        another in a trial that is rolled back (at most as many as wait). The queue wakes that many of
        each, in its own order; a shape missing here gets no attempt."""
        room: dict[str, int] = {}
        for key, (gang, strategy, members) in self.shapes.items():
            stmt = Statement(self.nodes)
            fits = 0
            while fits < len(members) and place_gang(self.nodes, stmt, gang, strategy, explain=False).ok:
                fits += 1
            stmt.rollback()
            if fits:
                room[key] = fits
        return room
