"""Waiting for room (issue 16): a gang placement found no node and no victim for does not retry on a
timer; a release naming room for its shape wakes as many as fit, in queue order."""

from __future__ import annotations

from shared.events import BackedOff, CapacityChanged, Dequeued, PlacementFailed, TimerSet
from shared.model import room_key
from tests.builders.queue import QueueDriver, capacity, job, names, placed, submitted


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


def _shape_of(d: QueueDriver, key: str, at: float, **kw) -> str:
    return room_key(d.policy.placement_for("default"), job(key, cpu="1", at=at, **kw).gang)


def test_a_newcomer_behind_a_gang_of_its_shape_waiting_for_room_waits_too_without_an_attempt():
    d = QueueDriver()
    d.step(capacity(cpu="100"), 0.0)
    d.step(submitted(job("ns/a", cpu="1", at=1.0)), 1.0)
    shape = _shape_of(d, "ns/a", 1.0)
    d.step(PlacementFailed(key="ns/a", queue="default", reason="5/9 tasks could not be placed: 0/3 nodes are "
                           "available: 3 Insufficient cpu.", room_key=shape))
    out = d.step(submitted(job("ns/b", cpu="1", at=2.0)), 2.0)
    assert [(type(x).__name__, x.key) for x in out if not isinstance(x, TimerSet)] == [
        ("Enqueued", "ns/b"), ("BackedOff", "ns/b")]  # no Dequeued: placement would find no room for it either
    assert d.of(BackedOff, "ns/b")[0].reason == "5/9 tasks could not be placed: 0/3 nodes are available: " \
                                                "3 Insufficient cpu."
    out = d.step(CapacityChanged(total={"cpu": 100_000}, nodes=3, released=True, room={shape: 1}), 3.0)
    assert names(out) == [("Dequeued", "ns/a")]  # the first in line goes first
    out = d.step(CapacityChanged(total={"cpu": 100_000}, nodes=3, released=True, room={shape: 1}), 4.0)
    assert names(out) == [("Dequeued", "ns/b")]


def test_a_newcomer_ahead_of_the_waiting_gangs_of_its_shape_tries_placement():
    d = QueueDriver()
    d.step(capacity(cpu="100"), 0.0)
    d.step(submitted(job("ns/a", cpu="1", at=1.0)), 1.0)
    d.step(PlacementFailed(key="ns/a", queue="default", reason="no room", room_key=_shape_of(d, "ns/a", 1.0)))
    out = d.step(submitted(job("ns/boss", cpu="1", at=2.0, priority=10)), 2.0)
    assert names(out) == [("Enqueued", "ns/boss"), ("Dequeued", "ns/boss")]  # it may preempt what ns/a may not
