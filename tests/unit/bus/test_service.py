"""shared/runtime/service.py: the dedupe window and a service's derived output ids."""

from __future__ import annotations

import pytest

from shared.kernel.events import Enqueued, GangRunning, TimerFired, TimerSet, WorkloadDeleted, derive_id, wrap
from shared.runtime.service import Seen, Service
from tests.builders.shared import FakeCore, at

OUTPUTS = [Enqueued(key="default/w", queue="q", reason="waiting"), GangRunning(key="default/w", reason="up")]


def _service(**kwargs) -> Service:
    return Service(FakeCore("queue", [], lambda env: OUTPUTS), **kwargs)


def _input(index: int = 0):
    return at(WorkloadDeleted(key="default/w"), 1.0, index=index)


def test_seen_never_holds_more_than_its_capacity():
    seen = Seen(3)
    for i in range(10):
        seen.add(str(i))
    assert len(seen) == 3


def test_seen_forgets_the_oldest_id_first():
    seen = Seen(2)
    for event_id in ("a", "b", "c"):
        seen.add(event_id)
    assert "a" not in seen
    assert "b" in seen and "c" in seen


def test_seen_reports_a_duplicate():
    seen = Seen(2)
    assert seen.add("a") is True
    assert seen.add("a") is False


@pytest.mark.parametrize("capacity", [0, -1])
def test_seen_rejects_a_capacity_below_one(capacity):
    with pytest.raises(ValueError):
        Seen(capacity)


def test_a_duplicate_yields_nothing_and_is_counted():
    service = _service()
    env = _input()
    service.handle(env)
    assert service.handle(env) == []
    assert (service.handled, service.duplicates) == (1, 1)
    assert service.core.handled == [env]


def test_a_copy_of_a_decision_never_reaches_the_core_that_would_answer_it_again():
    """The one dedupe: the cores keep no window of ids of their own. Placement answers a second
    Dequeued for a gang it placed with the GangPlaced again (a new request may ask), so a copy must
    be stopped before it: the service's window does, on every runtime (each builds its cores behind
    a ``Service``)."""
    from services.placement.core import PlacementCore
    from shared.kernel.events import Dequeued, GangPlaced
    from shared.kernel.policy import Policy
    from tests.builders import node, workload
    from tests.builders.placement import node_changed

    service = Service(PlacementCore(Policy()))
    service.handle(at(node_changed(node("n1", cpu="4")), 0.0))
    w = workload("ns/w")
    dequeued = at(Dequeued(key=w.key, queue="default", workload=w, reason="r"), 1.0, source="queue")
    assert [type(o.payload) for o in service.handle(dequeued)] == [GangPlaced]
    assert service.handle(dequeued) == [] and service.duplicates == 1


def test_an_id_outside_the_dedupe_window_is_handled_again():
    service = _service(dedupe_window=1)
    first, second = _input(0), _input(1)
    for env in (first, second, first):
        service.handle(env)
    assert service.handled == 3


def test_output_ids_derive_from_service_cause_and_position():
    env = _input()
    outputs = _service().handle(env)
    assert [o.id for o in outputs] == [derive_id("queue", env.id, i) for i in range(len(OUTPUTS))]
    assert all(o.causation_id == env.id and o.source == "queue" for o in outputs)


def test_two_fresh_services_give_identical_outputs():
    env = _input()
    assert _service().handle(env) == _service().handle(env)


# --------------------------------------------------------------------------- a core that raises
def _raising(on: str = "default/poison") -> Service:
    """A queue service whose core raises on the workload ``on`` and answers every other one."""
    def react(env):
        if getattr(env.payload, "key", None) == on:
            raise ValueError("no such slot\nsecond line")
        return OUTPUTS
    return Service(FakeCore("queue", [], react))


def test_a_core_that_raises_rejects_what_the_envelope_concerns_and_the_service_goes_on():
    from shared.kernel.events import GangPlaced, WorkloadRejected

    service = _raising()
    poison = at(GangPlaced(key="default/poison", queue="q", kind="RayCluster", gate="pods", slots=(), reason="x"), 1.0)
    [rejected] = service.handle(poison)
    assert isinstance(rejected.payload, WorkloadRejected)
    assert (rejected.payload.key, rejected.payload.kind) == ("default/poison", "RayCluster")
    assert "queue failed on GangPlaced default/poison: ValueError: no such slot" in rejected.payload.reason
    assert "second line" not in rejected.payload.reason and "apply it again" in rejected.payload.reason
    assert rejected.id == derive_id("queue", poison.id, 0) and rejected.causation_id == poison.id
    [fault] = service.take_faults()
    assert (fault.service, fault.envelope, service.failed) == ("queue", poison, 1)
    assert service.take_faults() == []
    assert len(service.handle(_input(1))) == len(OUTPUTS)  # the next envelope as if nothing happened
    assert service.handle(poison) == []  # a copy of the poison is a duplicate like any other


def test_two_services_failing_on_the_same_envelope_give_the_same_rejection():
    from shared.kernel.events import GangPlaced

    poison = at(GangPlaced(key="default/poison", queue="q", kind="RayJob", gate="pods", slots=(), reason="x"), 1.0)
    assert _raising().handle(poison) == _raising().handle(poison)


def test_seen_forgets_each_sources_oldest_only_when_that_source_overflows():
    seen = Seen(2)
    seen.add("a1", "a")
    seen.add("b1", "b")
    seen.add("a2", "a")
    seen.add("a3", "a")  # a's window is full: a1 goes, b1 stays
    assert "a1" not in seen and "b1" in seen and "a2" in seen and "a3" in seen
    assert seen.add("a1", "b") is True  # forgotten: taken again, now in b's window
    seen.add("b2", "b")
    assert "b1" not in seen and "a1" in seen and len(seen) == 4


def test_an_envelope_stamped_before_the_services_time_is_handled_at_that_time():
    """A timer due at 9 handled after an input of 10 (the queue's cycle after a submission that
    raced it): the core sees 10, and what the timer causes is not stamped before the submission."""
    core = FakeCore("queue", [], lambda env: OUTPUTS[:1] if env.type == "TimerFired" else ())
    service = Service(core)
    timer_set = at(TimerSet(key="cycle", at=9.0), 9.0, source="queue")
    service.handle(at(WorkloadDeleted(key="default/w"), 10.0))
    fired = wrap(TimerFired(key="cycle", at=9.0), source="clock", cause=timer_set, index=0, at=9.0)
    (out,) = service.handle(fired)
    assert core.handled[-1].occurred_at == 10.0 and core.handled[-1].id == fired.id
    assert (out.occurred_at, out.causation_id) == (10.0, fired.id)
    assert core.handled[-1].payload.due(10.0) == 9.0, "the core still knows which instant it was set for"


def test_a_service_time_only_moves_forwards():
    service = _service()
    service.handle(at(WorkloadDeleted(key="default/a"), 5.0))
    service.handle(at(WorkloadDeleted(key="default/b"), 3.0))
    assert service.now == 5.0
    (first, _) = service.handle(at(WorkloadDeleted(key="default/c"), 7.0))
    assert (service.now, first.occurred_at) == (7.0, 7.0)
