"""Who holds what, kept in step with every state change so a cycle never re-walks every workload.

Per queue: the pending workloads (by key, inbox order), the quota held (reserved + admitted +
running), the part of it held by non-preemptible workloads, and the total demand (held + pending)
that fair share is computed from. The core un-books a workload before changing its state, queue or
spec and books it again afterwards (``Ledger.moving``).
"""

from __future__ import annotations

from typing import Mapping, TypeVar

from services.queue.workload import Tracked

Resources = dict[str, int]


_K = TypeVar("_K", str, int)


def _shift(target: dict[_K, Resources], key: _K, amounts: Mapping[str, int], sign: int) -> None:
    """Add ``sign`` x ``amounts`` to ``target``'s bucket of ``key`` (a queue, or a priority within one)."""
    bucket = target.setdefault(key, {})
    for name, value in amounts.items():
        bucket[name] = bucket.get(name, 0) + sign * value


class Ledger:
    def __init__(self) -> None:
        self.pending: dict[str, dict[str, Tracked]] = {}
        """Pending workloads a cycle considers (not waiting for room or quota), per queue."""
        self.parked: dict[str, dict[str, Tracked]] = {}
        """Pending workloads waiting for room or quota (``room.RoomWaits``): no cycle walks them."""
        self.running: dict[str, Tracked] = {}
        self.running_elastic: dict[str, Tracked] = {}
        """Running holders with granted elastic pods: reclaim's first victims, without a walk of every holder."""
        self.held: dict[str, Resources] = {}
        self.protected: dict[str, Resources] = {}
        self.demand: dict[str, Resources] = {}
        self.yielding: dict[str, dict[int, Resources]] = {}
        """Quota held by preemptible workloads, per queue and priority: what in-queue preemption could give
        back to a higher priority there (a release judges quota waiters with it, ``QueueCore._wake_quota``)."""
        self.in_use: Resources = {}
        self.running_of: dict[str, dict[str, Tracked]] = {}
        """The running workloads per queue (only queues with some): whom reclaim could take from, without a
        walk of every running workload (``QueueCore._reclaim``), and only of the queues that may give."""

    def book(self, w: Tracked) -> None:
        self._apply(w, 1)

    def unbook(self, w: Tracked) -> None:
        self._apply(w, -1)

    def forget(self, queue: str) -> None:
        """``queue`` is gone: if no workload books there any more (its totals are all zero), drop them,
        so the ledger keeps the queues in use, not every name a workload ever named."""
        if any(self.demand.get(queue, {}).values()):  # held, protected, yielding are parts of demand
            return
        for table in (self.held, self.protected, self.demand, self.yielding):
            table.pop(queue, None)

    def moving(self, w: Tracked) -> "_Moving":
        """``with ledger.moving(w): w.state = ...`` keeps every aggregate exact (``w`` is taken out of
        them on entering, put back on leaving, also when the body raises)."""
        return _Moving(self, w)

    def _apply(self, w: Tracked, sign: int) -> None:
        _shift(self.demand, w.queue, w.demand, sign)
        if w.holds_quota:
            _shift(self.held, w.queue, w.demand, sign)
            for name, value in w.demand.items():
                self.in_use[name] = self.in_use.get(name, 0) + sign * value
            if not w.spec.preemptible:
                _shift(self.protected, w.queue, w.demand, sign)
            else:
                _shift(self.yielding.setdefault(w.queue, {}), w.spec.priority, w.demand, sign)
        if w.state == "running":
            if sign > 0:
                self.running[w.key] = w
                self.running_of.setdefault(w.queue, {})[w.key] = w
                if w.elastic:
                    self.running_elastic[w.key] = w
            else:
                if self.running.pop(w.key, None) is not None:
                    members = self.running_of[w.queue]
                    del members[w.key]
                    if not members:
                        del self.running_of[w.queue]
                self.running_elastic.pop(w.key, None)
        if w.state == "pending":
            index = self.parked if w.room_key or w.quota_key else self.pending
            if sign > 0:
                index.setdefault(w.queue, {})[w.key] = w
            else:
                members = index.get(w.queue, {})
                members.pop(w.key, None)
                if not members:
                    index.pop(w.queue, None)


class _Moving:
    """``Ledger.moving``: a plain context manager, not ``contextlib``'s (a generator and two resumptions
    each time; the queue moves a workload on most events it reads)."""

    __slots__ = ("ledger", "w")

    def __init__(self, ledger: Ledger, w: Tracked) -> None:
        self.ledger, self.w = ledger, w

    def __enter__(self) -> Tracked:
        self.ledger.unbook(self.w)
        return self.w

    def __exit__(self, *exc: object) -> None:
        self.ledger.book(self.w)
