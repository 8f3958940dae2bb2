"""Waiting for room: a gang placement found no node and no victim for does not retry on a
timer; a release naming room for its shape wakes as many as fit, in queue order."""

from __future__ import annotations

from shared.kernel.events import BackedOff, CapacityChanged, Dequeued, PlacementFailed, TimerSet
from shared.kernel.footprint import retained
from tests.builders.queue import QueueDriver, capacity, deleted, job, names, placed, submitted


def _no_room(key: str) -> PlacementFailed:
    return PlacementFailed(key=key, queue="default", reason="0/1 nodes are available: 1 Insufficient cpu",
                           room_key="shape-a")


def _two_waiting() -> QueueDriver:
    d = QueueDriver()
    d.step(capacity(cpu="100"), 0.0)
    for key, at in (("ns/a", 1.0), ("ns/b", 2.0)):
        d.step(submitted(job(key, cpu="1", at=at)), at)
        d.step(_no_room(key))
    return d


def test_a_gang_without_room_backs_off_without_a_timer_and_is_no_head():
    d = _two_waiting()
    [first, _] = d.of(BackedOff)
    assert first.reason.endswith("Insufficient cpu") and first.requeue_at == 1.0  # in line, not on a timer
    assert not [t for t in d.of(TimerSet) if t.at > 2.0]
    assert d.step(capacity(cpu="100", released=False), 100.0) == []
    quota_back = CapacityChanged(total={"cpu": 100_000}, nodes=1, released=True, room={})
    assert d.step(quota_back, 101.0) == []  # a release with room for no waiting shape wakes none


def test_a_release_wakes_only_as_many_as_its_room_holds_in_queue_order():
    d = _two_waiting()
    out = d.step(CapacityChanged(total={"cpu": 100_000}, nodes=1, released=True, room={"shape-a": 1}), 50.0)
    assert names(out) == [("Dequeued", "ns/a")]
    out = d.step(CapacityChanged(total={"cpu": 100_000}, nodes=2, released=True, room=None), 60.0)
    assert names(out) == [("Dequeued", "ns/b")]  # nodes joined: every waiting gang may try


def test_a_lower_priority_admitted_to_its_queue_wakes_a_waiting_gang_that_may_preempt_it():
    d = QueueDriver()
    d.step(capacity(cpu="100"), 0.0)
    d.step(submitted(job("ns/high", cpu="1", at=1.0, priority=100)), 1.0)
    d.step(_no_room("ns/high"))
    d.step(submitted(job("ns/low", cpu="1", at=2.0, priority=1)), 2.0)
    out = d.step(placed("ns/low"))
    assert [x.key for x in out if isinstance(x, Dequeued)] == ["ns/high"]


def test_gangs_gone_while_they_waited_for_room_leave_nothing_in_the_waits():
    """A room key is a shape: one no release names again kept the entries of every workload deleted
    while it waited there, for as long as the stack ran. A key nobody waits under goes, and a key
    someone still waits under keeps about as many entries as wait (stale ones are dropped)."""
    d = QueueDriver()
    d.step(capacity(cpu="100"), 0.0)
    waits = d.core._room
    before = retained(waits, exclude=[d.core._ledger]).entries
    d.step(submitted(job("ns/stays", cpu="1", at=0.5)), 0.5)
    d.step(_no_room("ns/stays"))
    for i in range(100):
        key, at = f"ns/w{i}", 1.0 + i
        d.step(submitted(job(key, cpu="1", at=at)), at)
        d.step(PlacementFailed(key=key, queue="default", reason="0/1 nodes are available: 1 Insufficient cpu",
                               room_key=f"shape-{i}" if i % 2 else "shape-a"))
        d.step(deleted(key), at)
    assert len(waits._heaps["shape-a"]) <= 2 * len(waits) + 16
    d.step(deleted("ns/stays"), 200.0)
    assert retained(waits, exclude=[d.core._ledger]).entries == before
