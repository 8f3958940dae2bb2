"""shared/runtime/clock.py: the clock rule (one timer per service, key and instant) and its bookkeeping."""

from __future__ import annotations

from shared.kernel.events import TimerSet
from shared.runtime.clock import Timers, armed_as, instant, instant_of
from tests.builders.shared import at


def test_a_timer_fires_at_its_at_or_when_it_was_set_if_later():
    assert instant(5.0, 3.0) == 5.0
    assert instant(5.0, 7.5) == 7.5
    assert instant_of(at(TimerSet(key="cycle", at=5.0), 3.0)) == 5.0
    assert instant_of(at(TimerSet(key="cycle", at=5.0), 7.5)) == 7.5


def test_a_timer_set_is_armed_as_its_source_key_and_instant():
    assert armed_as(at(TimerSet(key="cycle", at=2.0), 4.0, source="queue")) == ("queue", "cycle", 4.0)


def test_one_timer_per_target_key_and_instant():
    timers = Timers()
    assert timers.arm("queue", "cycle", 5.0, 1.0)
    assert not timers.arm("queue", "cycle", 5.0, 2.0)        # the same instant: nothing more
    assert not timers.arm("queue", "cycle", 3.0, 5.0)        # asked earlier, set at 5: the same instant
    assert timers.arm("placement", "cycle", 5.0, 1.0)        # another target
    assert timers.arm("queue", "backoff", 5.0, 1.0)          # another key
    assert timers.arm("queue", "cycle", 6.0, 1.0)            # another instant
    assert len(timers) == 4


def test_timers_fire_earliest_first_then_by_phase_then_in_arming_order():
    timers = Timers()
    timers.arm("queue", "b", 2.0, 0.0, phase=1)
    timers.arm("queue", "a", 2.0, 0.0, phase=1)
    timers.arm("cluster", "pod", 2.0, 0.0, phase=0)
    timers.arm("queue", "early", 1.0, 0.0, phase=1)
    assert timers.next_at() == 1.0
    assert timers.pop(0.5) is None                           # nothing due yet
    fired = [(t.target, t.key, t.at) for t in iter(lambda: timers.pop(2.0), None)]
    assert fired == [("queue", "early", 1.0), ("cluster", "pod", 2.0), ("queue", "b", 2.0), ("queue", "a", 2.0)]
    assert timers.next_at() is None and len(timers) == 0


def test_a_fired_timer_can_be_armed_again():
    timers = Timers()
    timers.arm("queue", "cycle", 5.0, 0.0, cause="first")
    assert timers.pop(5.0).cause == "first"
    assert timers.arm("queue", "cycle", 5.0, 5.0, cause="again")
    assert timers.pop(5.0).cause == "again"


def test_a_disarmed_timer_does_not_fire_and_is_no_longer_pending():
    timers = Timers()
    timers.arm("queue", "a", 1.0, 0.0, cause="a")
    timers.arm("queue", "b", 2.0, 0.0, cause="b")
    timers.arm("queue", "c", 3.0, 0.0, cause="c")
    assert timers.disarm("queue", "b", 2.0)
    assert not timers.disarm("queue", "b", 2.0)              # not armed any more
    assert not timers.disarm("queue", "a", 9.0)              # no such instant
    assert [t.cause for t in timers.pending()] == ["a", "c"]
    assert len(timers) == 3                                   # kept in the heap until it would fire
    assert [t.cause for t in iter(lambda: timers.pop(10.0), None)] == ["a", "c"]
