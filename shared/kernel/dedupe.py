"""Which envelope ids a service still remembers, and for how long (memory bounded by what is live,
not by history).

A copy reaches an inbox in one way only: a producer restarted and handled again what it had handled
after its last committed offset, sending the same outputs with the same ids. So copies trail their
originals by at most what that producer sends in about one commit interval (plus the batch in hand
and a commit lost to a rebalance: ``SPAN`` intervals), *counted in that producer's own records*: a
producer that is down sends nothing meanwhile, however long the others keep writing. Hence one
window per source, sized from the commit interval and the fastest a producer can write into one
inbox, instead of one ever-growing set or a flat million shared by every source.

Inboxes are ordered, so a service never needs ids for what it re-reads of its own inbox: a restart
resumes at an offset (``shared.runtime.bus.snapshot``), and what lies below it is never handed over again.

The window is kept once, by ``shared.runtime.service.Service``, which every runtime puts in front of
every core (embedded, the Kafka worker, the audit's replay): a core keeps no window of its own, since
one could only hold ids the service's larger window of the same stream already holds.

What a service remembers for a time rather than by count (a deleted object's tombstone, a recent
write) is kept oldest first and let go by ``forget_before``; a core's tombstones by ``Tombstones``.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from operator import itemgetter
from typing import Any, Callable, Generic, Iterator, TypeVar

K = TypeVar("K")
V = TypeVar("V")

PEAK_RATE = 10_000
"""Envelopes per second one producer can write into one inbox: a generous ceiling, well above what
a service writes into one inbox at ``make bench``'s end-to-end pace (docs/benchmarks.md), not a
measured rate."""

SPAN = 2.0
"""Commit intervals a copy can trail its original by, in the producer's own records."""

DEFAULT_COMMIT_INTERVAL = 1.0
"""The commit interval a window is sized for when the runtime names none (``shared.runtime.bus.app``'s)."""


def dedupe_window(commit_interval: float = DEFAULT_COMMIT_INTERVAL, peak_rate: float = PEAK_RATE) -> int:
    """Ids to remember per source: what it can send in ``SPAN`` commit intervals at ``peak_rate``."""
    if commit_interval <= 0 or peak_rate <= 0:
        raise ValueError("a dedupe window needs a positive commit interval and rate")
    return max(1, math.ceil(commit_interval * SPAN * peak_rate))


DEDUPE_WINDOW = dedupe_window()


class Seen:
    """The most recent ``capacity`` ids of each source, oldest forgotten first.

    One dict of every remembered id answers "seen?" in one lookup (every envelope of every service
    asks); each source's ids, oldest first, sit in a deque that says which to forget. An id is held
    once, by the source that sent it first: a copy is refused before it is queued twice."""

    __slots__ = ("capacity", "_ids", "_by_source")

    def __init__(self, capacity: int = DEDUPE_WINDOW) -> None:
        if capacity < 1:
            raise ValueError("a dedupe window must hold at least one id")
        self.capacity = capacity
        self._ids: dict[str, None] = {}
        self._by_source: dict[str, deque[str]] = {}

    def add(self, event_id: str, source: str = "") -> bool:
        """Remember ``event_id`` (sent by ``source``); False if it was remembered already (a duplicate)."""
        ids = self._ids
        if event_id in ids:
            return False
        ids[event_id] = None
        order = self._by_source.get(source)
        if order is None:
            order = self._by_source[source] = deque()
        order.append(event_id)
        if len(order) > self.capacity:
            del ids[order.popleft()]
        return True

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)


def forget_before(entries: OrderedDict[K, Any], horizon: float, when: Callable[[Any], float] = float) -> None:
    """Drop the entries noted before ``horizon``: ``entries`` is oldest first (a key noted again is
    moved to the end), ``when`` reads an entry's time (the value itself by default). So a memory of
    the last N seconds (tombstones of deleted objects, recent writes) costs what came in those
    seconds, not the history; one step per entry dropped, plus one."""
    while entries:
        key, value = next(iter(entries.items()))
        if when(value) >= horizon:
            return
        del entries[key]


_BURIED_AT = itemgetter(1)
"""When a tombstone's object was deleted: its (value, deleted at)'s second (``forget_before``)."""


class Tombstones(Generic[K, V]):
    """Deleted objects a core remembers for ``seconds`` of event time, each with what it must know of
    the one that went (admission: its uid; the reconciler: nothing), oldest first.

    Something can still speak of an object after its deletion — a watch's late event, a decision
    another service took before it heard — and a tombstone lets the core drop that instead of
    bringing the object back. Let go of after ``seconds`` (``expire``, through ``forget_before``), they
    cost the deletions of that span, not every deletion ever: state follows live objects."""

    __slots__ = ("seconds", "_entries")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._entries: OrderedDict[K, tuple[V, float]] = OrderedDict()

    def bury(self, key: K, value: V, at: float) -> None:
        """``key``'s object was deleted at ``at``: remember it with ``value`` as the newest (buried again,
        it moves to the end, so the oldest stays first)."""
        entries = self._entries
        entries.pop(key, None)
        entries[key] = (value, at)

    def expire(self, now: float) -> None:
        """Forget the objects deleted more than ``seconds`` before ``now``."""
        forget_before(self._entries, now - self.seconds, _BURIED_AT)

    def get(self, key: K) -> V | None:
        """What was kept of ``key``'s object (None: no tombstone)."""
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    def lift(self, key: K) -> None:
        """Forget ``key``'s tombstone: an object of that name is made again."""
        self._entries.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[K]:
        """The keys, oldest deletion first."""
        return iter(self._entries)
