"""shared/audit/timeorder.py: a log whose time runs backwards along a cause or within a service."""

from __future__ import annotations

from shared.audit.timeorder import backwards
from shared.kernel.events import Enqueued, TimerFired, TimerSet, WorkloadDeleted, wrap
from shared.runtime.service import Service
from tests.builders.shared import FakeCore, at


def _log(handled_at_its_own_time: bool) -> list:
    """The race of a deployment: the queue arms a cycle at 5, an input stamped 5.088 reaches its
    inbox before the timer fires, and the cycle decides. Built through ``Service`` (its time
    kept) or by wrapping the timer's output at the timer's own time (what muster did before)."""
    start = at(WorkloadDeleted(key="default/a"), 5.0, source="admission")
    timer_set = wrap(TimerSet(key="cycle", at=5.0), source="queue", cause=start, index=0)
    submitted = at(WorkloadDeleted(key="default/b"), 5.088, source="admission")
    fired = wrap(TimerFired(key="cycle", at=5.0), source="clock", cause=timer_set, index=0, at=5.0)
    dequeue = [Enqueued(key="default/c", queue="q", reason="waiting")]
    if handled_at_its_own_time:
        service = Service(FakeCore("queue", [], lambda env: dequeue if env.type == "TimerFired" else ()))
        service.handle(start)
        service.handle(submitted)
        outputs = service.handle(fired)
    else:
        outputs = [wrap(dequeue[0], source="queue", cause=fired, index=0)]
    return [start, timer_set, submitted, fired, *outputs]


def test_a_decision_stamped_before_an_input_its_service_handled_first_is_found():
    (found,) = backwards(_log(handled_at_its_own_time=False))
    assert (found.rule, found.env.type, found.before) == ("service", "Enqueued", 5.088)
    assert "0.088000s before queue's time when it handled the cause" in str(found)


def test_a_service_that_keeps_its_time_writes_a_log_that_runs_forwards():
    log = _log(handled_at_its_own_time=True)
    assert backwards(log) == []
    assert log[-1].occurred_at == 5.088


def test_an_effect_stamped_before_its_cause_is_found():
    cause = at(WorkloadDeleted(key="default/a"), 7.0, source="admission")
    effect = wrap(Enqueued(key="default/a", queue="q", reason="waiting"), source="queue", cause=cause, index=0, at=6.5)
    found = backwards([cause, effect])
    assert [(b.rule, b.before) for b in found] == [("cause", 7.0), ("service", 7.0)]
