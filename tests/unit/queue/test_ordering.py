"""Pending order, StrictFIFO vs BestEffortFIFO, blocked queues, and one cycle per instant."""

from __future__ import annotations

from shared.kernel.events import BackedOff, Dequeued, Enqueued, TimerSet
from shared.kernel.policy import Policy, QueuePolicy
from tests.builders import queue_spec
from tests.builders.queue import QueueDriver, capacity, defined, job, names, placed, submitted


def test_order_in_queue_is_priority_then_submission_then_key_never_message_order():
    d = QueueDriver()
    d.send(submitted(job("ns/late-low", at=5.0, priority=0)), 5.0)
    d.send(submitted(job("ns/b-high", at=5.0, priority=10)))
    d.send(submitted(job("ns/early-low", at=1.0, priority=0)))
    d.send(submitted(job("ns/a-high", at=5.0, priority=10)))
    out = d.settle()
    assert [x.key for x in out if isinstance(x, Dequeued)] == ["ns/a-high", "ns/b-high", "ns/early-low", "ns/late-low"]


def test_submission_is_enqueued_with_its_queue_and_one_cycle_timer_per_instant():
    d = QueueDriver()
    first = d.send(submitted(job("ns/a")), 3.0)
    second = d.send(submitted(job("ns/b")))
    assert first == [Enqueued(key="ns/a", queue="default", reason="waiting in queue default"),
                     TimerSet(key="cycle", at=3.0)]
    assert second == [Enqueued(key="ns/b", queue="default", reason="waiting in queue default")]


def _blocked_head(policy: Policy) -> QueueDriver:
    """Queue q (limit 4 cpu) holds 2; head h wants 3 (cannot go), s behind it wants 1 (could)."""
    d = QueueDriver(policy)
    d.step(defined(queue_spec("q", limit={"cpu": "4"})), 0.0)
    d.step(submitted(job("ns/x", "q", cpu="2", at=0.0)))
    d.step(placed("ns/x", "q"))
    return d


def test_best_effort_fifo_skips_a_head_that_cannot_go():
    d = _blocked_head(Policy(queueing="BestEffortFIFO"))
    d.send(submitted(job("ns/h", "q", cpu="3", at=1.0)), 1.0)
    d.send(submitted(job("ns/s", "q", cpu="1", at=2.0)))
    out = d.settle()
    assert names(out) == [("BackedOff", "ns/h"), ("Dequeued", "ns/s")]


def test_strict_fifo_stops_the_queue_at_its_head_also_while_the_head_backs_off():
    d = _blocked_head(Policy(queueing="StrictFIFO"))
    d.send(submitted(job("ns/h", "q", cpu="3", at=1.0)), 1.0)
    d.send(submitted(job("ns/s", "q", cpu="1", at=2.0)))
    assert names(d.settle()) == [("BackedOff", "ns/h")]
    # another cycle at 1.5 (a new arrival elsewhere) must not let s pass h while h backs off
    assert names(d.step(submitted(job("ns/other", "default", at=1.5)), 1.5)) == [("Enqueued", "ns/other"),
                                                                               ("Dequeued", "ns/other")]
    # h waits for quota (no retry while nothing under q changed) and still holds s back
    assert names(d.settle(2.0)) == []
    assert d.core.status()["q"]["pending"] == [{"workload": "ns/h", "position": 1}, {"workload": "ns/s", "position": 2}]


def test_strict_fifo_per_queue_override_and_a_blocked_queue_never_blocks_another():
    policy = Policy(queueing="BestEffortFIFO", queues={"q": QueuePolicy(queueing="StrictFIFO")})
    d = _blocked_head(policy)
    d.step(defined(queue_spec("other", limit={"cpu": "1"})))
    d.send(submitted(job("ns/h", "q", cpu="3", at=1.0)), 1.0)
    d.send(submitted(job("ns/s", "q", cpu="1", at=2.0)))
    d.send(submitted(job("ns/o1", "other", cpu="1", at=1.0)))
    d.send(submitted(job("ns/o2", "other", cpu="1", at=2.0)))
    d.send(submitted(job("ns/o3", "other", cpu="500m", at=3.0)))
    out = d.settle()
    # no capacity known: every share is 0, q (holding 2) ranks inf; "other" goes first, then
    # ranks inf too after o1 and wins the tie by name. h blocks q only: s is never tried.
    assert names(out) == [("Dequeued", "ns/o1"), ("BackedOff", "ns/o2"), ("BackedOff", "ns/o3"),
                          ("BackedOff", "ns/h")]


def test_same_instant_arrivals_are_served_by_fair_share_not_by_message_order():
    d = QueueDriver()
    d.send(capacity(cpu="4"), 0.0)
    d.send(defined(queue_spec("a")))
    d.send(defined(queue_spec("b")))
    d.settle()
    for key in ("ns/b1", "ns/b2", "ns/b3", "ns/a1", "ns/a2", "ns/a3"):  # b's arrive first
        d.send(submitted(job(key, key[3], cpu="1", at=1.0)), 1.0)
    out = d.settle()
    assert [x.key for x in out if isinstance(x, Dequeued)] == ["ns/a1", "ns/b1", "ns/a2", "ns/b2", "ns/a3", "ns/b3"]


def test_same_instant_arrivals_go_by_queue_priority_first():
    d = QueueDriver()
    d.send(capacity(cpu="4"), 0.0)
    d.send(defined(queue_spec("a")))
    d.send(defined(queue_spec("b", priority=1)))
    d.settle()
    for key in ("ns/a1", "ns/a2", "ns/b1", "ns/b2"):
        d.send(submitted(job(key, key[3], cpu="1", at=1.0)), 1.0)
    out = d.settle()
    assert [x.key for x in out if isinstance(x, Dequeued)] == ["ns/b1", "ns/b2", "ns/a1", "ns/a2"]


def test_queue_already_using_more_of_its_share_goes_after_the_less_served_one():
    d = QueueDriver()
    d.send(capacity(cpu="8"), 0.0)
    d.send(defined(queue_spec("a")))
    d.send(defined(queue_spec("b")))
    d.step(submitted(job("ns/a0", "a", cpu="3", at=0.0)))
    d.step(placed("ns/a0", "a"))
    d.send(submitted(job("ns/a1", "a", cpu="1", at=1.0)), 1.0)
    d.send(submitted(job("ns/b1", "b", cpu="1", at=1.0)))
    out = d.settle()
    # a: usage 3 of share 4 (0.75) -> b (0) first, though "a" sorts first by name
    assert [x.key for x in out if isinstance(x, Dequeued)] == ["ns/b1", "ns/a1"]
    assert not [x for x in out if isinstance(x, BackedOff)]
