"""Gangs waiting for room: placement found neither nodes nor a victim for them (issue 16).

Such a gang is no head of any cycle until placement reports room for its shape (its room key, one
per distinct gang and strategy): a ``CapacityChanged`` release names, per room key, how many gangs
of that shape the free nodes now hold, and that many of them wake, in queue order (priority desc,
submitted_at, key). A release that names no room for a shape wakes none of its gangs, so a release
costs an attempt only where one can succeed. Nodes joining or changing, or victims reaching their
minimum runtime, wake every waiting gang (``room`` None). A lower-priority preemptible workload
admitted to a waiting gang's queue wakes the gangs above it there (it may be their victim).
"""

from __future__ import annotations

import heapq

from services.queue.workload import Tracked


class RoomWaits:
    def __init__(self) -> None:
        self._heaps: dict[str, list[tuple[tuple[int, float, str], int, str]]] = {}
        """Room key -> heap of (order, park number, workload key); stale entries are skipped."""
        self._parked: dict[str, tuple[str, int]] = {}
        """Workload key -> (room key, park number) while it waits."""
        self._by_queue: dict[str, dict[int, dict[str, None]]] = {}
        """Queue -> priority -> waiting workload keys (who a newly admitted lower priority may serve)."""
        self._seq = 0

    def __len__(self) -> int:
        return len(self._parked)

    def park(self, w: Tracked, room_key: str) -> None:
        self.unpark(w)
        self._seq += 1
        self._parked[w.key] = (room_key, self._seq)
        heapq.heappush(self._heaps.setdefault(room_key, []), (w.order, self._seq, w.key))
        self._by_queue.setdefault(w.queue, {}).setdefault(w.spec.priority, {})[w.key] = None
        w.room_key = room_key

    def unpark(self, w: Tracked) -> None:
        """``w`` no longer waits for room (woken, edited, moved, admitted or gone)."""
        if self._parked.pop(w.key, None) is None:
            return
        w.room_key = ""
        by_priority = self._by_queue.get(w.queue, {})
        members = by_priority.get(w.spec.priority, {})
        members.pop(w.key, None)
        if not members:
            by_priority.pop(w.spec.priority, None)
            if not by_priority:
                self._by_queue.pop(w.queue, None)

    def wake(self, room: dict[str, int], workloads: dict[str, Tracked]) -> list[Tracked]:
        """The first ``count`` waiting gangs of each room key, in queue order; they wait no more."""
        woken: list[Tracked] = []
        for room_key, count in room.items():
            heap = self._heaps.get(room_key)
            while heap and count > 0:
                _, seq, key = heapq.heappop(heap)
                if self._parked.get(key) != (room_key, seq):
                    continue  # stale: woken or parked again since
                count -= 1
                woken.append(workloads[key])
            if heap is not None and not heap:
                del self._heaps[room_key]
        for w in woken:
            self.unpark(w)
        return woken

    def wake_all(self, workloads: dict[str, Tracked]) -> list[Tracked]:
        woken = [workloads[key] for key in self._parked]
        for w in woken:
            self.unpark(w)
        self._heaps.clear()
        return woken

    def above(self, queue: str, priority: int, workloads: dict[str, Tracked]) -> list[Tracked]:
        """Waiting gangs of ``queue`` with a priority above ``priority`` that may preempt."""
        return [workloads[key] for p, members in self._by_queue.get(queue, {}).items() if p > priority
                for key in members if workloads[key].spec.preempts]
