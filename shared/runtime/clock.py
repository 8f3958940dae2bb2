"""The clock rule, once: what every clock of muster arms, and when it fires.

A clock arms one timer per service, key and instant, the instant being the ``TimerSet``'s ``at``
or the time it was set if later (``instant``). A second ``TimerSet`` for a pending timer's instant
arms nothing: it is answered by the one ``TimerFired`` (whose ``at`` is the instant,
``shared.kernel.events.TimerFired``). Three places follow the rule and take it from here:

- the embedded runtime (``shared.runtime.embedded``), whose clock is virtual: a timer is set at
  the runtime's now;
- the Kafka worker's ``Clock`` (``shared.runtime.bus.worker``), one per service, whose timers are
  set at their ``TimerSet``'s ``occurred_at`` (``instant_of``);
- the replay's ``Router`` (``shared.audit.replay``), which reads the log's ``TimerSet``s as a clock
  armed them (``armed_as``) to know which service a ``TimerFired`` answers.

``Timers`` is the bookkeeping the two runtimes share: the armed set and the heap of pending timers,
earliest first (then by ``phase``, then in arming order). Pure: no wall clock, no I/O; the caller
says what now is.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from shared.kernel.events import Envelope

Instant = tuple[str, str, float]
"""(target, key, when it fires): a clock arms one timer per instant. The target is the service that
set it (``cluster`` for the simulated cluster's own in the embedded runtime)."""


def instant(at: float, now: float) -> float:
    """When a timer asked for at ``at`` and set at ``now`` fires: never before it was set."""
    return max(at, now)


def instant_of(timer_set: Envelope) -> float:
    """When the timer of ``timer_set`` (a ``TimerSet`` envelope) fires: set at its ``occurred_at``."""
    return instant(timer_set.payload.at, timer_set.occurred_at)


def armed_as(timer_set: Envelope) -> Instant:
    """The instant a clock arms for ``timer_set``: its source's, its key, ``instant_of`` it."""
    return (timer_set.source, timer_set.payload.key, instant_of(timer_set))


@dataclass(order=True)
class Timer:
    """One armed timer: ordered by when it fires, then ``phase``, then arming order (``seq``)."""

    at: float
    phase: int
    seq: int
    target: str = field(compare=False)
    key: str = field(compare=False)
    cause: Any = field(compare=False, default=None)
    """What set it (the ``TimerSet`` envelope; None for a timer no event set)."""


class Timers:
    """Armed timers: one per ``Instant``, earliest first."""

    def __init__(self) -> None:
        self._heap: list[Timer] = []
        self._armed: set[Instant] = set()
        self._seq = 0

    def arm(self, target: str, key: str, at: float, now: float, *, cause: Any = None, phase: int = 0) -> bool:
        """Arm ``target``'s timer ``key`` asked for at ``at`` and set at ``now``: False (nothing armed)
        when one is armed for that instant already."""
        marker = (target, key, instant(at, now))
        if marker in self._armed:
            return False
        self._armed.add(marker)
        self._seq += 1
        heapq.heappush(self._heap, Timer(marker[2], phase, self._seq, target, key, cause))
        return True

    def disarm(self, target: str, key: str, at: float) -> bool:
        """The timer of that instant fired elsewhere (a restart reads its ``TimerFired`` back): it
        does not fire here. Whether it was armed."""
        marker = (target, key, at)
        if marker in self._armed:
            self._armed.discard(marker)
            return True
        return False

    def next_at(self) -> float | None:
        """When the earliest timer still in the heap fires (a disarmed one included: it is skipped
        when due); None when none is."""
        return self._heap[0].at if self._heap else None

    def pop(self, now: float) -> Timer | None:
        """The earliest armed timer due at ``now``, fired (no longer armed); None when none is due."""
        heap, armed = self._heap, self._armed
        while heap and heap[0].at <= now:
            timer = heapq.heappop(heap)
            marker = (timer.target, timer.key, timer.at)
            if marker in armed:
                armed.discard(marker)
                return timer
        return None

    def pending(self) -> list[Timer]:
        """The timers armed and not fired, in arming order."""
        armed = self._armed
        return sorted((t for t in self._heap if (t.target, t.key, t.at) in armed), key=lambda t: t.seq)

    def __len__(self) -> int:
        """Timers in the heap (a disarmed one until it would have fired)."""
        return len(self._heap)
