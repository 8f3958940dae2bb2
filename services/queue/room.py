"""Pending workloads that wait for an event, not a timer: room on nodes, or quota in their tree path.

**Room**: placement found neither nodes nor a victim for a gang. It is no head of any
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
from typing import Callable, Hashable, Iterable, TypeVar

from services.queue.ledger import Ledger
from services.queue.workload import Tracked


Order = tuple[int, float, str]
"""``Tracked.order``: the queue order of a waiting workload."""
Entry = tuple[Order, int, str]
"""A heap entry: (order, park number, workload key)."""
_At = TypeVar("_At", bound=Hashable)
Shape = tuple[bool, tuple[tuple[str, int], ...]]
"""(preemptible, sorted demand): waiters of one shape are interchangeable for a release."""


class RoomWaits:
    """Workloads parked under a key (``attr`` names the ``Tracked`` field that holds it)."""

    def __init__(self, ledger: Ledger, attr: str = "room_key") -> None:
        self._ledger = ledger
        self._attr = attr
        self._heaps: dict[str, list[Entry]] = {}
        """Key -> heap of (order, park number, workload key); stale entries are skipped."""
        self._parked: dict[str, tuple[str, int]] = {}
        """Workload key -> (key, park number) while it waits."""
        self._by_queue: dict[str, dict[int, dict[str, None]]] = {}
        """Queue -> priority -> waiting workload keys (who a newly admitted lower priority may serve)."""
        self._under: dict[str, int] = {}
        """Key -> how many wait under it (its heap's live entries): a heap of stale entries only goes."""
        self._seq = 0

    def __len__(self) -> int:
        return len(self._parked)

    def park(self, w: Tracked, key: str) -> None:
        self.unpark(w)
        self._seq += 1
        self._parked[w.key] = (key, self._seq)
        self._push(w, key, (w.order, self._seq, w.key))
        self._by_queue.setdefault(w.queue, {}).setdefault(w.spec.priority, {})[w.key] = None
        with self._ledger.moving(w):
            setattr(w, self._attr, key)

    def _push(self, w: Tracked, key: str, entry: Entry) -> None:
        """Index a workload just parked under ``key``: (its order, park number, key) in the key's heap."""
        heapq.heappush(self._heaps.setdefault(key, []), entry)
        self._under[key] = self._under.get(key, 0) + 1

    def unpark(self, w: Tracked) -> None:
        """``w`` no longer waits (woken, edited, moved, admitted or gone)."""
        parked = self._parked.pop(w.key, None)
        if parked is None:
            return
        if parked[0] in self._under:
            self._unpushed(parked[0])
        with self._ledger.moving(w):
            setattr(w, self._attr, "")
        by_priority = self._by_queue.get(w.queue, {})
        members = by_priority.get(w.spec.priority, {})
        members.pop(w.key, None)
        if not members:
            by_priority.pop(w.spec.priority, None)
            if not by_priority:
                self._by_queue.pop(w.queue, None)

    def _unpushed(self, key: str) -> None:
        """One waiting under ``key`` waits no more (``_stale``)."""
        if not self._stale(self._under, key, key, self._heaps.get(key)):
            self._heaps.pop(key, None)

    def _stale(self, live: dict[_At, int], at: _At, key: str, heap: list[Entry] | None) -> bool:
        """One entry of ``heap`` (parked under ``key``, its live entries counted in ``live[at]``) went
        stale; False when none is live any more, for the caller to drop the heap: a heap nobody waits in
        goes (a shape no release names again would keep its entries for months), and one mostly of stale
        entries keeps only the live ones. Live entries pop as before."""
        left = live.get(at, 0) - 1
        if left <= 0:
            live.pop(at, None)
            return False
        live[at] = left
        if heap is not None and len(heap) > 2 * left + 16:
            heap[:] = [e for e in heap if self._parked.get(e[2]) == (key, e[1])]
            heapq.heapify(heap)
        return True

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
        """Every waiting workload; ``unpark`` leaves no heap or count behind once none waits."""
        woken = [workloads[key] for key in self._parked]
        for w in woken:
            self.unpark(w)
        return woken

    def above(self, queue: str, priority: int, workloads: dict[str, Tracked]) -> list[Tracked]:
        """Waiting workloads of ``queue`` with a priority above ``priority`` that may preempt."""
        return [workloads[key] for p, members in self._by_queue.get(queue, {}).items() if p > priority
                for key in members if workloads[key].spec.preempts]


AS_IT_IS = " as it is"


def as_it_is(level: str) -> str:
    """The key a workload waits for quota under when no release can let it in, only a change of the queue
    ``level`` (``tree.never_fits``): no release names it (a queue's name has no space), no victim makes
    room for it (``QuotaWaits.above`` leaves it out), so only a queue defined or removed
    (``QuotaWaits.wake_all``) or an edit of the workload wakes it."""
    return f"{level}{AS_IT_IS}"


_Fits = Callable[[Tracked, dict[str, int]], bool]
"""Whether a waiter passes the blocking level's check with ``consumed`` already taken from it this wake."""


class QuotaWaits(RoomWaits):
    """Workloads waiting for quota, per blocking level, per leaf queue, per demand (its shape).

    A release under a level wakes, per leaf queue, the waiters whose demand the level's free quota
    holds, in queue order, each one's demand counted against what is left for that leaf's next
    (``wake_fitting``): no more than could pass the level, each leaf judged alone because the cycle
    serves leaves by fair share, not in one order. ``head`` adds the leaf's first waiter even when it
    does not fit (it may reclaim or preempt instead). A leaf's waiters are kept in one heap per demand,
    so a wake costs per workload woken, not per workload waiting."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger, "quota_key")
        self._shapes: dict[str, dict[str, dict[Shape, list[Entry]]]] = {}
        """Level -> leaf queue -> (preemptible, demand) -> heap of (order, park number, workload key)."""
        self._live: dict[tuple[str, str, Shape], int] = {}
        """Live (not stale) entries per heap, so a heap of mostly stale entries is rebuilt."""
        self._where: dict[str, tuple[str, Shape]] = {}
        """Workload key -> (leaf queue, shape) it was parked with."""
        self._woken: dict[tuple[str, str], dict[str, int]] = {}
        """(level, leaf queue) -> what the waiters woken there since the last cycle ask: the next release
        before that cycle counts them as taken (several releases in one instant wake no more than fits)."""

    @staticmethod
    def _shape(w: Tracked) -> Shape:
        return (w.spec.preemptible, tuple(sorted(w.demand.items())))

    def above(self, queue: str, priority: int, workloads: dict[str, Tracked]) -> list[Tracked]:
        """As ``RoomWaits.above``, but for those waiting for their queue to change (``as_it_is``): a lower
        priority to preempt gives them nothing."""
        return [w for w in super().above(queue, priority, workloads) if not w.quota_key.endswith(AS_IT_IS)]

    def _push(self, w: Tracked, key: str, entry: Entry) -> None:
        shape = self._shape(w)
        heapq.heappush(self._shapes.setdefault(key, {}).setdefault(w.queue, {}).setdefault(shape, []), entry)
        self._live[(key, w.queue, shape)] = self._live.get((key, w.queue, shape), 0) + 1
        self._where[w.key] = (w.queue, shape)

    def unpark(self, w: Tracked) -> None:
        parked = self._parked.get(w.key)
        if parked is None:
            return
        key = parked[0]
        queue, shape = self._where.pop(w.key)
        super().unpark(w)
        leaves = self._shapes.get(key, {})
        heaps = leaves.get(queue, {})
        if not self._stale(self._live, (key, queue, shape), key, heaps.get(shape)):
            heaps.pop(shape, None)  # nobody of this shape waits here any more
            if not heaps:
                leaves.pop(queue, None)
                if not leaves:
                    self._shapes.pop(key, None)

    def _first(self, key: str, heap: list[Entry]) -> Entry | None:
        while heap and self._parked.get(heap[0][2]) != (key, heap[0][1]):
            heapq.heappop(heap)
        return heap[0] if heap else None

    def wake_fitting(self, key: str, fits: _Fits, workloads: dict[str, Tracked],
                     head: Callable[[str], bool]) -> list[Tracked]:
        """Per leaf queue waiting under ``key``: its waiters that ``fits`` in queue order, each woken one's
        demand counted against the next; for leaves ``head`` names, its first waiter in any case."""
        woken: list[Tracked] = []
        for queue in sorted(self._shapes.get(key, {})):
            heaps = self._shapes[key][queue]
            consumed = self._woken.get((key, queue))
            first = consumed is None and head(queue)  # one head per leaf and cycle
            consumed = self._woken[(key, queue)] = consumed or {}
            while True:
                best = None
                for heap in heaps.values():
                    top = self._first(key, heap)
                    if top is None or (best is not None and top >= best[0]):
                        continue
                    if first or fits(workloads[top[2]], consumed):
                        best = (top, heap)
                if best is None:
                    break
                w = workloads[best[0][2]]
                if not first or fits(w, consumed):  # a head that does not fit wakes to reclaim or preempt:
                    for r, v in w.demand.items():    # it takes nothing from the others
                        consumed[r] = consumed.get(r, 0) + v
                first = False
                woken.append(w)
                self.unpark(w)
                if queue not in self._shapes.get(key, {}):
                    break
        return woken

    def cycled(self) -> None:
        """A cycle has judged everyone woken before it: the next release starts from the ledger again."""
        self._woken.clear()

    def wake(self, room: dict[str, int], workloads: dict[str, Tracked]) -> list[Tracked]:
        """The first ``count`` waiters of each key in queue order, across its leaves."""
        woken: list[Tracked] = []
        for key, count in room.items():
            while count > 0:
                best = None
                for heaps in self._shapes.get(key, {}).values():
                    for heap in heaps.values():
                        top = self._first(key, heap)
                        if top is not None and (best is None or top < best):
                            best = top
                if best is None:
                    break
                count -= 1
                w = workloads[best[2]]
                woken.append(w)
                self.unpark(w)
        return woken

    def wake_keys(self, keys: Iterable[str], workloads: dict[str, Tracked]) -> list[Tracked]:
        return self.wake({key: len(self._parked) for key in keys if key in self._shapes}, workloads)
