"""Usage, free capacity and fair shares as one cycle sees them; reservations update it in place.

Kueue's "snapshot" step: built once per cycle from the ledger's per-queue aggregates, so every
decision in the cycle sees the reservations made before it in the same cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

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
    def take(cls, tree: QueueTree, ledger: Ledger, capacity: Mapping[str, int]) -> "Snapshot":
        wanted: dict[str, Resources] = {}
        for name, amounts in ledger.demand.items():
            # a queue that takes no workloads asks for no share on behalf of its waiting ones
            wanted[name] = amounts if tree.wait_reason(name) is None else ledger.held.get(name, {})
        return cls(usage=tree.roll_up(ledger.held), protected=tree.roll_up(ledger.protected),
                   free=q.sub(dict(capacity), ledger.in_use), shares=deserved(tree, capacity, wanted))

    def charge(self, tree: QueueTree, w: Tracked) -> None:
        """Reserve ``w``'s demand at its leaf and every ancestor, and take it from the free pool."""
        self.charge_amount(tree, w.queue, w.demand, w.spec.preemptible)

    def charge_amount(self, tree: QueueTree, queue: str, demand: Mapping[str, int], preemptible: bool) -> None:
        """Reserve ``demand`` (a workload's, or one elastic pod's) at ``queue`` and every ancestor."""
        for name in [spec.name for spec in tree.ancestry(queue)] or [queue]:
            self.usage[name] = q.add(self.usage.get(name, {}), demand, 1)
            if not preemptible:
                self.protected[name] = q.add(self.protected.get(name, {}), demand, 1)
        self.free = q.add(self.free, demand, -1)

    def free_capacity_of(self, w: Tracked) -> None:
        """A promised victim: its nodes count as free for the rest of the cycle; its quota does not
        (only placement's eviction gives that back)."""
        self.free = q.add(self.free, w.demand, 1)

    def dominant(self, queue: str) -> float:
        return dominant_share(self.usage.get(queue, {}), self.shares.get(queue, {}))
