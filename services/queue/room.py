"""Pending workloads that wait for an event, not a timer: room on nodes, or quota in their tree path.

**Room** (issue 16): placement found neither nodes nor a victim for a gang. It is no head of any
cycle until placement reports room for its shape (its room key, one per distinct gang and
strategy): a ``CapacityChanged`` release names, per room key, how many gangs of that shape the free
nodes now hold, and that many of them wake, in queue order (priority desc, submitted_at, key). A
release that names no room for a shape wakes none of its gangs, so a release costs an attempt only
where one can succeed. Nodes joining or changing, or victims reaching their minimum runtime, wake
every waiting gang (``room`` None). A lower-priority preemptible workload admitted to a waiting
gang's queue wakes the gangs above it there (it may be their victim).

**Quota**: the cycle found the workload over a limit (or a guarantee cap) of its leaf or an
ancestor, with nothing to reclaim or preempt. It waits, keyed by the level that blocked it, until
usage under that level drops (a holder of a queue below it finishes, is deleted, preempted, shrunk,
gives back elastic pods or a reservation), a queue is defined or removed, reclaim victims ripen, or a
lower-priority workload is admitted to its own queue (a victim of in-queue preemption): Kueue's
inadmissible workloads (pkg/queue/cluster_queue.go ``QueueInadmissibleWorkloads``, requeued by
``Manager.requeueWorkloadsCQ`` / ``requeueWorkloadsCohort`` in pkg/queue/manager.go on those same
events), not a backoff timer re-checked on every release anywhere.

A waiting workload is out of its queue's pending index (``Ledger.parked``), so a cycle never walks it.
"""

from __future__ import annotations

import heapq
from typing import Iterable

from services.queue.ledger import Ledger
from services.queue.workload import Tracked


class RoomWaits:
    """Workloads parked under a key (``attr`` names the ``Tracked`` field that holds it)."""

    def __init__(self, ledger: Ledger, attr: str = "room_key") -> None:
        self._ledger = ledger
        self._attr = attr
        self._heaps: dict[str, list[tuple[tuple[int, float, str], int, str]]] = {}
        """Key -> heap of (order, park number, workload key); stale entries are skipped."""
        self._parked: dict[str, tuple[str, int]] = {}
        """Workload key -> (key, park number) while it waits."""
        self._by_queue: dict[str, dict[int, dict[str, None]]] = {}
        """Queue -> priority -> waiting workload keys (who a newly admitted lower priority may serve)."""
        self._seq = 0

    def __len__(self) -> int:
        return len(self._parked)

    def park(self, w: Tracked, key: str) -> None:
        self.unpark(w)
        self._seq += 1
        self._parked[w.key] = (key, self._seq)
        heapq.heappush(self._heaps.setdefault(key, []), (w.order, self._seq, w.key))
        self._by_queue.setdefault(w.queue, {}).setdefault(w.spec.priority, {})[w.key] = None
        with self._ledger.moving(w):
            setattr(w, self._attr, key)

    def unpark(self, w: Tracked) -> None:
        """``w`` no longer waits (woken, edited, moved, admitted or gone)."""
        if self._parked.pop(w.key, None) is None:
            return
        with self._ledger.moving(w):
            setattr(w, self._attr, "")
        by_priority = self._by_queue.get(w.queue, {})
        members = by_priority.get(w.spec.priority, {})
        members.pop(w.key, None)
        if not members:
            by_priority.pop(w.spec.priority, None)
            if not by_priority:
                self._by_queue.pop(w.queue, None)

    def wake(self, room: dict[str, int], workloads: dict[str, Tracked]) -> list[Tracked]:
        """The first ``count`` waiting workloads of each key, in queue order; they wait no more."""
        woken: list[Tracked] = []
        for key, count in room.items():
            heap = self._heaps.get(key)
            while heap and count > 0:
                _, seq, name = heapq.heappop(heap)
                if self._parked.get(name) != (key, seq):
                    continue  # stale: woken or parked again since
                count -= 1
                woken.append(workloads[name])
            if heap is not None and not heap:
                del self._heaps[key]
        for w in woken:
            self.unpark(w)
        return woken

    def wake_keys(self, keys: Iterable[str], workloads: dict[str, Tracked]) -> list[Tracked]:
        """Every workload waiting under any of ``keys``, in queue order per key."""
        return self.wake({key: len(self._parked) for key in keys if key in self._heaps}, workloads)

    def wake_all(self, workloads: dict[str, Tracked]) -> list[Tracked]:
        woken = [workloads[key] for key in self._parked]
        for w in woken:
            self.unpark(w)
        self._heaps.clear()
        return woken

    def above(self, queue: str, priority: int, workloads: dict[str, Tracked]) -> list[Tracked]:
        """Waiting workloads of ``queue`` with a priority above ``priority`` that may preempt."""
        return [workloads[key] for p, members in self._by_queue.get(queue, {}).items() if p > priority
                for key in members if workloads[key].spec.preempts]
