"""Usage, free capacity and fair shares as one cycle sees them; reservations update it in place.

Kueue's "snapshot" step: built once per cycle from the ledger's per-queue aggregates, so every
decision in the cycle sees the reservations made before it in the same cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from services.queue.fairshare import deserved, dominant_share
from services.queue.ledger import Ledger
from services.queue.reclaim import Running
from services.queue.tree import QueueTree
from services.queue.workload import Tracked
from shared.kernel import quantity as q

Resources = dict[str, int]
Freed = tuple[str, Mapping[str, int]]
"""What a promised victim gives back once placement evicts it: (its leaf queue, the demand) — a whole
workload's demand, or that of the elastic pods of it that were named."""


@dataclass
class Snapshot:
    usage: dict[str, Resources]
    """Quota held per queue, rolled up to every ancestor."""
    protected: dict[str, Resources]
    """The same for non-preemptible workloads only (they must stay within guarantee)."""
    free: Resources
    """Cluster capacity minus everything any queue holds."""
    shares: dict[str, Resources]
    """Deserved (fair) share per queue."""
    capacity: Resources = field(default_factory=dict)
    """The cluster's schedulable totals (``CapacityChanged.total``): the room guarantees are reserved in
    (``tree.reserved_block``); empty in a quota-only snapshot, which reserves nothing."""

    candidates: dict[str, list[Running]] | None = None
    """Per queue, its running workloads as reclaim sees them; each queue's built on first need (only for
    queues that may give), all dropped after a reclaim."""
    candidate_queues: list[str] | None = None
    """The queues of ``candidates`` (built with the first reclaim that needs them; only which, not their
    order, is read)."""
    holders: dict[str, list[Tracked]] | None = None
    """Admitted and running workloads per leaf queue (quota preemption); built on first need."""
    reclaims: list[tuple[Tracked, Sequence[Freed]]] = field(default_factory=list)
    """The reservations with victims still holding quota that ``take`` credited."""

    @classmethod
    def take(cls, tree: QueueTree, ledger: Ledger, capacity: Mapping[str, int],
             reclaims: Iterable[tuple[Tracked, Sequence[Freed]]] = ()) -> "Snapshot":
        """``reclaims``: reservations whose victims still hold quota (placement has not answered yet),
        with what those victims free; their parents count them as ``charge`` did in the cycle that made them."""
        wanted: dict[str, Resources] = {}
        for name, amounts in ledger.demand.items():
            # a queue that takes no workloads asks for no share on behalf of its waiting ones
            wanted[name] = amounts if tree.wait_reason(name) is None else ledger.held.get(name, {})
        snap = cls.quota(tree, ledger, reclaims)
        snap.capacity = dict(capacity)
        snap.free = q.sub(dict(capacity), ledger.in_use)
        snap.shares = deserved(tree, capacity, wanted)
        for _, freed in snap.reclaims:
            for _, demand in freed:
                snap.free_capacity_of(demand)
        return snap

    @classmethod
    def quota(cls, tree: QueueTree, ledger: Ledger,
              reclaims: Iterable[tuple[Tracked, Sequence[Freed]]] = ()) -> "Snapshot":
        """Usage and protected usage alone, reclaims credited (no free capacity, no shares): what a
        release of quota judges its waiters against (``QueueCore._wake_quota``)."""
        snap = cls(usage=tree.roll_up(ledger.held), protected=tree.roll_up(ledger.protected), free={}, shares={})
        snap.reclaims = list(reclaims)
        for w, freed in snap.reclaims:
            snap.credit(tree, w, freed)
        return snap

    def charge(self, tree: QueueTree, w: Tracked, freed: Sequence[Freed] = ()) -> None:
        """Reserve ``w``'s demand at its leaf and every ancestor, and take it from the free pool; a level
        that also holds what ``w``'s victims free counts the larger of the two, not both (``credit``)."""
        self.charge_amount(tree, w.queue, w.demand, w.spec.preemptible)
        self.credit(tree, w, freed)

    def charge_amount(self, tree: QueueTree, queue: str, demand: Mapping[str, int], preemptible: bool) -> None:
        """Reserve ``demand`` (a workload's, or one elastic pod's) at ``queue`` and every ancestor."""
        for name in [spec.name for spec in tree.ancestry(queue)] or [queue]:
            self.usage[name] = q.add(self.usage.get(name, {}), demand, 1)
            if not preemptible:
                self.protected[name] = q.add(self.protected.get(name, {}), demand, 1)
        self.free = q.add(self.free, demand, -1)

    def credit(self, tree: QueueTree, w: Tracked, freed: Sequence[Freed]) -> None:
        """A level holding both ``w`` and some of what its victims free (their common ancestors; the leaf
        itself for in-queue preemption) counts max(w, victims) per resource instead of w + victims: once
        placement places ``w`` the victims are gone, and if it fails ``w`` gives its reservation back, so
        the level never holds both. Without this, a second preemption or reclaim under the same parent in
        the same instant would evict again what the first one's victims free anyway."""
        if not freed:
            return
        chains = [{spec.name for spec in tree.ancestry(queue)} or {queue} for queue, _ in freed]
        for name in [spec.name for spec in tree.ancestry(w.queue)] or [w.queue]:
            given: Resources = {}
            for (_, demand), chain in zip(freed, chains):
                if name in chain:
                    given = q.add(given, demand)
            credit = {r: min(w.demand.get(r, 0), v) for r, v in given.items() if min(w.demand.get(r, 0), v) > 0}
            if credit:
                self.usage[name] = q.sub(self.usage.get(name, {}), credit)

    def free_capacity_of(self, demand: Mapping[str, int]) -> None:
        """What a promised victim frees: its nodes count as free for the rest of the cycle; its quota does
        not (only placement's eviction gives that back)."""
        self.free = q.add(self.free, demand, 1)

    def dominant(self, queue: str) -> float:
        return dominant_share(self.usage.get(queue, {}), self.shares.get(queue, {}))
