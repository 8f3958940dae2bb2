"""The queue's read-only view per queue (``QueueCore.status``): read by ``muster explain`` and the
scheduling metrics, never by a decision."""

from __future__ import annotations

from typing import TypedDict

from services.queue import backoff
from services.queue.ledger import Ledger
from services.queue.ordering import ORDER
from services.queue.snapshot import Snapshot
from services.queue.tree import QueueTree
from services.queue.workload import Tracked


def status(tree: QueueTree, ledger: Ledger, capacity: dict[str, int], workloads: dict[str, Tracked],
       now: float) -> dict[str, QueueStatus]:
    """Per queue: usage (rolled up), guarantee, limit, fair share, active, pending, backoff."""
    snap = Snapshot.take(tree, ledger, capacity)  # what is held, credits aside
    members: dict[str, list[Tracked]] = {}
    for w in workloads.values():
        members.setdefault(w.queue, []).append(w)
    names = sorted(dict.fromkeys([*tree.names(), *members, *snap.usage]))
    view: dict[str, QueueStatus] = {}
    for name in names:
        spec = tree.get(name)
        mine = members.get(name, [])
        active = sorted((w for w in mine if w.holds_quota), key=lambda w: w.reserved_seq)
        queued = sorted((w for w in mine if w.state == "pending"), key=ORDER)
        resting = [w for w in queued if backoff.backing_off(w.requeue_at, now)]
        ready = [w for w in queued if not backoff.backing_off(w.requeue_at, now)]  # waiting for room too
        view[name] = {
            "exists": spec is not None,
            "parent": tree.parent_of(name) if spec else None,
            "state": spec.state if spec else None,
            "usage": {r: v for r, v in sorted(snap.usage.get(name, {}).items()) if v},
            "guarantee": dict(spec.guarantee) if spec else {},
            "limit": dict(spec.limit) if spec else {},
            "fair_share": dict(snap.shares.get(name, {})),
            "active": [w.key for w in active],
            "pending": [{"workload": w.key, "position": i + 1} for i, w in enumerate(ready)],
            "backoff": [{"workload": w.key, "requeue_at": w.requeue_at} for w in resting],
        }
    return view


class PendingEntry(TypedDict):
    workload: str
    position: int
    """1 for the queue's head."""


class BackoffEntry(TypedDict):
    workload: str
    requeue_at: float | None


class QueueStatus(TypedDict):
    """One queue of ``QueueCore.status``: read by ``muster explain`` and the scheduling metrics."""

    exists: bool
    parent: str | None
    state: str | None
    usage: dict[str, int]
    guarantee: dict[str, int]
    limit: dict[str, int]
    fair_share: dict[str, int]
    active: list[str]
    pending: list[PendingEntry]
    backoff: list[BackoffEntry]

