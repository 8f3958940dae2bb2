"""The queue's one timer key, ``"cycle"``, and when it is armed.

Every timer is the key ``"cycle"``: set for now whenever something changed that could let a
workload go, for ``requeue_at`` when a workload backs off, and for the instant a blocked reclaim's
victims reach their minimum runtime (a *ripening*: a wake-up of every waiter, not just a cycle).
The runtime fires timers only when every inbox is drained, so one cycle sees everything that
arrived at its instant.
"""

from __future__ import annotations

from typing import Protocol

from shared.kernel.events import TimerSet

CYCLE = "cycle"


class TimerOut(Protocol):
    """Where a timer goes: a handler's list of outputs (any list a ``TimerSet`` may join)."""

    def append(self, timer: TimerSet, /) -> None: ...


class Timers:
    """The instants a ``cycle`` timer is set for, and which of them are ripenings."""

    def __init__(self) -> None:
        self.armed: dict[float, None] = {}
        self.ripening: dict[float, None] = {}
        """Times at which a blocked reclaim's victims reach their minimum runtime: wake-ups, not just cycles."""

    def request_cycle(self, now: float, out: TimerOut) -> None:
        self.arm(now, now, out)

    def arm(self, at: float, now: float, out: TimerOut) -> None:
        """One ``cycle`` timer per instant: never set the same key/at twice."""
        for stale in [t for t in self.armed if t < now]:
            del self.armed[stale]
        if at in self.armed:
            return
        self.armed[at] = None
        out.append(TimerSet(key=CYCLE, at=at))

    def ripen(self, at: float, now: float, out: TimerOut) -> None:
        """Wake everyone up at ``at``, when victims a reclaim or preemption waits for are old enough."""
        if at not in self.ripening:
            self.ripening[at] = None
            self.arm(at, now, out)

    def fired(self, due: float) -> bool:
        """The timer set for ``due`` fired: True when it was a ripening (every waiter tries again)."""
        self.armed.pop(due, None)
        if due in self.ripening:
            del self.ripening[due]
            return True
        return False
