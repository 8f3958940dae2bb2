"""The ledger's per-queue totals always equal a recount over every workload."""

from __future__ import annotations

import pytest

from services.queue.core import QueueCore
from shared.kernel import quantity as q
from shared.kernel.footprint import retained
from tests.builders import queue_spec
from tests.builders.queue import (
    QueueDriver, capacity, cpu_gang, defined, deleted, failed, finished, job, placed, preempted, removed, running,
    submitted, updated,
)


def _recount(core: QueueCore) -> dict:
    held: dict = {}
    protected: dict = {}
    demand: dict = {}
    pending: dict = {}
    parked: dict = {}
    for w in core._workloads.values():
        demand[w.queue] = q.add(demand.get(w.queue, {}), w.demand)
        if w.holds_quota:
            held[w.queue] = q.add(held.get(w.queue, {}), w.demand)
            if not w.spec.preemptible:
                protected[w.queue] = q.add(protected.get(w.queue, {}), w.demand)
        if w.state == "pending":  # those waiting for room or quota apart: no cycle walks them
            (parked if w.room_key or w.quota_key else pending).setdefault(w.queue, []).append(w.key)
    running = sorted(w.key for w in core._workloads.values() if w.state == "running")
    running_of: dict = {}
    for w in core._workloads.values():
        if w.state == "running":
            running_of.setdefault(w.queue, []).append(w.key)
    return {"held": held, "protected": protected, "demand": demand, "pending": pending, "parked": parked,
            "running": running, "running_of": {k: sorted(v) for k, v in sorted(running_of.items())}}


def _nonzero(table: dict) -> dict:
    return {k: {r: v for r, v in res.items() if v} for k, res in table.items() if any(res.values())}


def _ledger(core: QueueCore) -> dict:
    book = core._ledger
    return {"held": _nonzero(book.held), "protected": _nonzero(book.protected), "demand": _nonzero(book.demand),
            "pending": {k: list(v) for k, v in book.pending.items()},
            "parked": {k: list(v) for k, v in book.parked.items()}, "running": sorted(book.running),
            "running_of": {k: sorted(v) for k, v in sorted(book.running_of.items())}}


def test_ledger_matches_a_recount_after_every_event():
    d = QueueDriver()
    gpu = {"nvidia.com/gpu": "1"}
    events = [
        (0.0, capacity(cpu="8", **gpu)), (0.0, defined(queue_spec("a", limit={"cpu": "4"}))), (0.0, defined(queue_spec("b"))),
        (1.0, submitted(job("ns/a1", "a", cpu="2", at=1.0))), (1.0, submitted(job("ns/a2", "a", cpu="3", at=1.0))),
        (1.0, submitted(job("ns/b1", "b", at=1.0, priority=100, gang_=cpu_gang("2", **gpu)))),
        (1.0, placed("ns/a1", "a")), (2.0, running("ns/a1")), (2.0, failed("ns/b1", "b")),
        (3.0, updated(job("ns/a2", "b", cpu="1", at=1.0))), (3.0, placed("ns/a2", "b")), (4.0, running("ns/a2")),
        (5.0, preempted("ns/a1", "ns/b1")), (6.0, finished("ns/a2")), (7.0, deleted("ns/b1")), (8.0, deleted("ns/a1")),
    ]
    for at, payload in events:
        d.step(payload, at)
        assert _ledger(d.core) == _nonzero_recount(d.core), payload


def _nonzero_recount(core: QueueCore) -> dict:
    counted = _recount(core)
    for key in ("held", "protected", "demand"):
        counted[key] = _nonzero(counted[key])
    return counted


@pytest.mark.parametrize("ending", ["deleted, then its queue removed", "its queue removed, then deleted",
                                    "moved out of a queue that never existed"])
def test_a_queue_nobody_books_any_more_leaves_no_totals_behind(ending):
    """The totals are per queue name: once the queue is gone and no workload books there, its (zero)
    totals go too, so queues made and removed, or a mistyped name, are not kept for months."""
    d = QueueDriver()
    d.step(capacity(cpu="8", memory="8Gi"))
    for payload in (submitted(job("ns/w", cpu="1")), placed("ns/w"), deleted("ns/w")):  # the default queue's
        d.step(payload)  # totals stay (it always exists), and those over all queues, per resource name
    before = retained(d.core._ledger).entries
    d.step(defined(queue_spec("team")))
    if ending == "moved out of a queue that never existed":
        d.step(submitted(job("ns/a", "tema", cpu="1")))
        d.step(updated(job("ns/a", "team", cpu="1")))
    else:
        d.step(submitted(job("ns/a", "team", cpu="1")))
    d.step(placed("ns/a", "team"))
    d.step(running("ns/a"))
    gone = [deleted("ns/a"), removed("team")]
    for payload in reversed(gone) if ending.startswith("its queue removed") else gone:
        d.step(payload)
    assert _ledger(d.core) == _nonzero_recount(d.core)
    assert retained(d.core._ledger).entries == before


def test_a_move_that_raises_still_books_the_workload_back():
    d = QueueDriver()
    d.step(capacity(cpu="8"), 0.0)
    d.step(submitted(job("ns/a", cpu="2", at=0.0)), 0.0)
    d.step(placed("ns/a"), 0.0)
    w = d.core._workloads["ns/a"]
    try:
        with d.core._ledger.moving(w) as moved:
            assert moved is w and _ledger(d.core)["held"] == {}  # out of every aggregate while it moves
            w.state = "running"
            raise RuntimeError("a bug in the body")
    except RuntimeError:
        pass
    assert _ledger(d.core) == _nonzero_recount(d.core) and _ledger(d.core)["running"] == ["ns/a"]
