"""Usage, free capacity and fair shares as one cycle sees them; reservations update it in place.

Kueue's "snapshot" step: built once per cycle from the ledger's per-queue aggregates, so every
decision in the cycle sees the reservations made before it in the same cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from services.queue.fairshare import deserved, dominant_share
from services.queue.ledger import Ledger
from services.queue.reclaim import Running
from services.queue.tree import QueueTree
from services.queue.workload import Tracked
from shared import quantity as q

Resources = dict[str, int]


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

    candidates: list[Running] | None = None
    """Running workloads reclaim may choose from; built on first need, dropped after a reclaim."""
    holders: dict[str, list[Tracked]] | None = None
    """Admitted and running workloads per leaf queue (quota preemption); built on first need."""

    @classmethod
    def take(cls, tree: QueueTree, ledger: Ledger, capacity: Mapping[str, int],
             reclaims: Iterable[tuple[Tracked, Sequence[Tracked]]] = ()) -> "Snapshot":
        """``reclaims``: reservations whose victims still hold quota (placement has not answered yet);
        their parents count them as ``charge`` did in the cycle that made them."""
        wanted: dict[str, Resources] = {}
        for name, amounts in ledger.demand.items():
            # a queue that takes no workloads asks for no share on behalf of its waiting ones
            wanted[name] = amounts if tree.wait_reason(name) is None else ledger.held.get(name, {})
        snap = cls(usage=tree.roll_up(ledger.held), protected=tree.roll_up(ledger.protected),
                   free=q.sub(dict(capacity), ledger.in_use), shares=deserved(tree, capacity, wanted))
        for w, victims in reclaims:
            snap.credit(tree, w, victims)
            for victim in victims:
                snap.free_capacity_of(victim)
        return snap

    def charge(self, tree: QueueTree, w: Tracked, victims: Sequence[Tracked] = ()) -> None:
        """Reserve ``w``'s demand at its leaf and every ancestor, and take it from the free pool; a level
        that also holds ``w``'s victims counts the larger of the two, not both (``credit``)."""
        self._shift(tree, w, 1)
        self.credit(tree, w, victims)

    def credit(self, tree: QueueTree, w: Tracked, victims: Sequence[Tracked]) -> None:
        """A level holding both ``w`` and some of its victims (their common ancestors; the leaf itself for
        in-queue preemption) counts max(w, victims) per resource instead of w + victims: once placement
        places ``w`` the victims are gone, and if it fails ``w`` gives its reservation back, so the level
        never holds both. Without this, a second preemption or reclaim under the same parent in the same
        instant would evict again what the first one's victims free anyway."""
        if not victims:
            return
        chains = [{spec.name for spec in tree.ancestry(v.queue)} or {v.queue} for v in victims]
        for name in [spec.name for spec in tree.ancestry(w.queue)] or [w.queue]:
            freed: Resources = {}
            for victim, chain in zip(victims, chains):
                if name in chain:
                    freed = q.add(freed, victim.demand)
            credit = {r: min(w.demand.get(r, 0), v) for r, v in freed.items() if min(w.demand.get(r, 0), v) > 0}
            if credit:
                self.usage[name] = q.sub(self.usage.get(name, {}), credit)

    def free_capacity_of(self, w: Tracked) -> None:
        """A promised victim: its nodes count as free for the rest of the cycle; its quota does not
        (only placement's eviction gives that back)."""
        self.free = q.add(self.free, w.demand, 1)

    def _shift(self, tree: QueueTree, w: Tracked, sign: int) -> None:
        for name in [spec.name for spec in tree.ancestry(w.queue)] or [w.queue]:
            self.usage[name] = q.add(self.usage.get(name, {}), w.demand, sign)
            if not w.spec.preemptible:
                self.protected[name] = q.add(self.protected.get(name, {}), w.demand, sign)
        self.free = q.add(self.free, w.demand, -sign)

    def dominant(self, queue: str) -> float:
        return dominant_share(self.usage.get(queue, {}), self.shares.get(queue, {}))
