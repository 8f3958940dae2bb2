"""shared/runtime/bus/worker.py: the clock's timers and one inbox's loop, driven with an in-memory producer.

The core is a ``FakeCore`` (tests/builders/shared.py) answering every envelope with scripted payloads,
so these tests see only the worker's rules: dead letters, log before routing, timers, rounds, replay.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Sequence

import pytest

from shared.kernel.events import Enqueued, TimerSet, WorkloadDeleted, WorkloadWithdrawn
from shared.runtime.bus import codec
from shared.runtime.bus.codec import Finished, Release
from shared.runtime.bus.sequencing import Arrival, Ordering, Rounds
from shared.runtime.bus.topics import Topics
from shared.runtime.bus.worker import Clock, InboxWorker, Incoming, Record
from shared.runtime.service import Service
from tests.builders.shared import FakeCore, at

TOPICS = Topics()


class FakeProducer:
    """Records every ``send_all`` call; offsets increase across all calls."""

    def __init__(self) -> None:
        self.calls: list[list[Record]] = []
        self.next_offset = 0

    async def send_all(self, records: Sequence[Record]) -> list[int]:
        self.calls.append(list(records))
        offsets = list(range(self.next_offset, self.next_offset + len(records)))
        self.next_offset += len(records)
        return offsets


def _env(name: str = "w", t: float = 1.0):
    return at(WorkloadDeleted(key=f"default/{name}"), t)


def _timer_set(at_: float, occurred_at: float = 1.0, key: str = "cycle"):
    return at(TimerSet(key=key, at=at_), occurred_at, source="queue")


def _worker(*payloads: Any, ordering: Ordering | None = None, clock: Clock | None = None) -> InboxWorker:
    """A queue worker whose core answers every envelope with ``payloads``."""
    core = FakeCore("queue", [], lambda env: payloads)
    return InboxWorker(Service(core), TOPICS, ordering or Arrival(), clock=clock)


def _process(worker: InboxWorker, value: bytes | None, headers=None, producer: FakeProducer | None = None,
             offset: int = 0) -> FakeProducer:
    producer = producer or FakeProducer()
    asyncio.run(worker.process(value, headers, partition=0, offset=offset, producer=producer))
    return producer


def _deliver(worker: InboxWorker, env, producer: FakeProducer | None = None) -> FakeProducer:
    return _process(worker, codec.encode(env), codec.envelope_headers(env), producer)


def _release(worker: InboxWorker, message: Release, producer: FakeProducer | None = None) -> FakeProducer:
    return _process(worker, *codec.encode_control(message), producer=producer)


ENQUEUED = Enqueued(key="default/w", queue="q", reason="waiting")  # -> reconciler
WITHDRAWN = WorkloadWithdrawn(key="default/w", reason="gone")  # -> placement


# --------------------------------------------------------------------------- clock
def test_an_empty_clock_has_no_next_timer():
    assert Clock().next_at() is None


def test_a_timer_is_due_at_its_time_and_not_before():
    clock = Clock()
    clock.arm(_timer_set(5.0))
    assert clock.next_at() == 5.0
    assert clock.due(4.9) == []
    assert len(clock.due(5.0)) == 1
    assert len(clock) == 0


def test_timers_fire_in_time_order():
    clock = Clock()
    clock.arm(_timer_set(7.0, key="late"))
    clock.arm(_timer_set(3.0, key="early"))
    assert [env.payload.key for env in clock.due(10.0)] == ["early", "late"]


def test_the_same_key_and_time_is_armed_once():
    clock = Clock()
    clock.arm(_timer_set(5.0))
    clock.arm(_timer_set(5.0, occurred_at=2.0))
    assert len(clock) == 1


def test_a_timer_set_in_the_past_fires_at_its_envelope_time():
    clock = Clock()
    clock.arm(_timer_set(2.0, occurred_at=4.0))
    assert clock.next_at() == 4.0
    assert clock.due(4.0)[0].occurred_at == 4.0


def test_a_fired_timer_is_caused_by_its_timer_set():
    clock = Clock()
    timer_set = _timer_set(5.0)
    clock.arm(timer_set)
    (fired,) = clock.due(6.0)
    assert (fired.type, fired.payload.key, fired.source) == ("TimerFired", "cycle", "clock")
    assert (fired.causation_id, fired.payload.at) == (timer_set.id, 5.0)
    assert fired.occurred_at == 6.0, "stamped when it fired, a second late: the time its effects happen"


# --------------------------------------------------------------------------- live
def test_outputs_go_to_the_log_then_to_their_inboxes():
    env = _env()
    producer = _deliver(worker := _worker(ENQUEUED, WITHDRAWN), env)
    log, routed = producer.calls
    outputs = [codec.decode(r.value) for r in log]
    assert worker.service.core.handled == [env]
    assert [r.topic for r in log] == [TOPICS.log, TOPICS.log]
    assert [o.type for o in outputs] == ["Enqueued", "WorkloadWithdrawn"]
    assert [r.topic for r in routed] == [TOPICS.inbox("reconciler"), TOPICS.inbox("placement"), TOPICS.inbox("reconciler")]
    assert [codec.decode(r.value) for r in routed] == [outputs[0], outputs[1], outputs[1]]


def test_a_timer_set_is_armed_not_sent():
    clock = Clock(now=lambda: 5.0)
    worker = _worker(TimerSet(key="cycle", at=9.0), clock=clock)
    producer = _deliver(worker, _env())
    assert [[r.topic for r in call] for call in producer.calls] == [[TOPICS.log]]
    assert clock.next_at() == 9.0
    assert worker.wake.is_set()


def test_a_timer_already_due_fires_with_its_batch():
    clock = Clock(now=lambda: 10.0)
    worker = _worker(TimerSet(key="cycle", at=9.0), ENQUEUED, clock=clock)
    producer = _deliver(worker, _env())
    first, routed = producer.calls
    timer_set, enqueued, fired, own = (codec.decode(r.value) for r in first)
    # logged right after the TimerSet that caused it; its copy for the service's own inbox rides along
    assert [r.topic for r in first] == [TOPICS.log] * 3 + [TOPICS.inbox("queue")]
    assert (timer_set.type, enqueued.type, fired.type) == ("TimerSet", "Enqueued", "TimerFired")
    assert (fired.causation_id, fired.payload.at, fired.occurred_at) == (timer_set.id, 9.0, 10.0)
    assert own == fired
    # the routes to other services only once the log has their envelopes
    assert [r.topic for r in routed] == [TOPICS.inbox("reconciler")]
    assert len(clock) == 0


def test_the_log_offset_of_a_batch_ignores_the_timer_sent_to_the_own_inbox():
    worker = _worker(TimerSet(key="cycle", at=9.0), clock=Clock(now=lambda: 10.0))
    producer = FakeProducer()
    producer.next_offset = 40
    assert asyncio.run(worker.emit([at(TimerSet(key="cycle", at=9.0), 1.0, source="queue")], producer)) == 41
    assert worker.log_high == 41  # the TimerSet at 40, the TimerFired at 41; the inbox copy's 42 is not the log's


def test_the_clock_fires_what_came_due_later_into_the_log_then_the_inbox():
    now = [5.0]
    clock = Clock(now=lambda: now[0])
    worker = _worker(TimerSet(key="cycle", at=9.0), clock=clock)
    _deliver(worker, _env())
    now[0] = 9.5
    producer = FakeProducer()
    assert asyncio.run(worker.fire_due(clock.now(), producer)) == 1
    (log,), (inbox,) = producer.calls
    assert (log.topic, inbox.topic) == (TOPICS.log, TOPICS.inbox("queue"))
    assert codec.decode(log.value).type == "TimerFired" and log.value == inbox.value


def test_a_bad_record_is_dead_lettered_and_counted():
    worker = _worker(ENQUEUED)
    producer = _process(worker, b"{not json", [("x", b"y")], offset=17)
    ((record,),) = producer.calls
    letter = json.loads(record.value)
    assert record.topic == TOPICS.deadletter
    assert (letter["topic"], letter["offset"], letter["consumer"], letter["value"]) == (
        TOPICS.inbox("queue"), 17, "queue", "{not json")
    assert worker.dead_letters == 1


@pytest.mark.parametrize("bad", [None, b"[" * 100_000, codec.encode(_env()).replace(b'"id":"', b'"id":"\\udc00', 1)],
                         ids=["tombstone", "nested-too-deeply", "half-a-surrogate-pair"])
def test_the_worker_keeps_working_after_a_bad_record(bad):
    worker = _worker(ENQUEUED)
    letters = _process(worker, bad)
    assert [r.topic for call in letters.calls for r in call] == [TOPICS.deadletter]
    producer = _deliver(worker, _env())
    assert len(worker.service.core.handled) == 1
    assert len(producer.calls) == 2


def test_a_finished_reply_in_an_inbox_is_dead_lettered():
    worker = _worker()
    producer = _process(worker, *codec.encode_control(Finished(0, "queue", 3)))
    assert [r.topic for call in producer.calls for r in call] == [TOPICS.deadletter]
    assert worker.dead_letters == 1


# --------------------------------------------------------------------------- rounds
def test_rounds_hold_envelopes_until_released():
    worker = _worker(ENQUEUED, ordering=Rounds())
    producer = _deliver(worker, _env("a"))
    assert producer.calls == []
    assert worker.service.core.handled == []


def test_a_release_handles_the_held_envelopes_in_its_order():
    worker = _worker(ordering=Rounds())
    a, b = _env("a"), _env("b")
    for env in (a, b):
        _deliver(worker, env)
    _release(worker, Release(0, (b.id, a.id)))
    assert worker.service.core.handled == [b, a]


def test_finished_names_the_last_log_offset_written():
    worker = _worker(ENQUEUED, ordering=Rounds())
    a, b = _env("a"), _env("b")
    for env in (a, b):
        _deliver(worker, env)
    producer = FakeProducer()
    producer.next_offset = 100
    _release(worker, Release(0, (a.id, b.id)), producer)
    log, routed, (control,) = producer.calls
    assert [r.topic for r in log] == [TOPICS.log, TOPICS.log]  # offsets 100, 101; routed got 102, 103
    assert control.topic == TOPICS.control
    assert codec.decode(control.value, control.headers) == Finished(0, "queue", 101)


def test_finished_says_minus_one_when_nothing_was_written():
    worker = _worker(ordering=Rounds())
    _deliver(worker, a := _env("a"))
    ((control,),) = _release(worker, Release(0, (a.id,))).calls
    assert codec.decode(control.value, control.headers) == Finished(0, "queue", -1)


# --------------------------------------------------------------------------- replay
def test_replay_rebuilds_state_and_a_live_copy_is_a_duplicate():
    worker = _worker(ENQUEUED)
    env = _env()
    worker.replay(codec.encode(env), codec.envelope_headers(env))
    assert worker.service.core.handled == [env]
    assert _deliver(worker, env).calls == []


def test_replay_rearms_pending_timers():
    clock = Clock()
    worker = _worker(TimerSet(key="cycle", at=9.0), clock=clock)
    env = _env()
    worker.replay(codec.encode(env), codec.envelope_headers(env))
    assert clock.next_at() == 9.0


def test_replay_of_a_held_round_handles_it_once():
    worker = _worker(ENQUEUED, ordering=Rounds())
    a = _env("a")
    release = Release(0, (a.id,))
    worker.replay(codec.encode(a), codec.envelope_headers(a))
    worker.replay(*codec.encode_control(release))
    assert worker.service.core.handled == [a]
    assert _deliver(worker, a).calls == []


def test_replay_skips_a_bad_record_without_dead_lettering_it_again():
    worker = _worker()
    worker.replay(b"junk", None)
    assert (worker.replayed, worker.dead_letters) == (1, 0)


def test_a_release_sent_again_is_answered_again_without_handling_anything_twice():
    worker = _worker(ENQUEUED, ordering=Rounds())
    _deliver(worker, a := _env("a"))
    producer = FakeProducer()
    producer.next_offset = 100
    _release(worker, Release(0, (a.id,)), producer)
    again = _release(worker, Release(0, (a.id,)))
    ((control,),) = again.calls  # nothing logged or routed: only the answer
    assert codec.decode(control.value, control.headers) == Finished(0, "queue", 100)
    assert worker.service.core.handled == [a]


# --------------------------------------------------------------------------- timers handed over at once
class TopicProducer:
    """Offsets count per topic, as a broker's partitions do; ``ahead`` puts records of others into topics first."""

    def __init__(self, **ahead: int) -> None:
        self.calls: list[list[Record]] = []
        self.ends: dict[str, int] = {}
        self.ahead = ahead

    async def send_all(self, records: Sequence[Record]) -> list[int]:
        self.calls.append(list(records))
        offsets = []
        for record in records:
            end = self.ends.get(record.topic, 0) + self.ahead.pop(record.topic.rsplit(".", 1)[-1], 0)
            offsets.append(end)
            self.ends[record.topic] = end + 1
        return offsets


def _cycling_worker() -> InboxWorker:
    """A queue whose core asks for a cycle now on a deletion and dequeues on the cycle."""
    def react(env):
        if env.type == "WorkloadDeleted":
            return [ENQUEUED, TimerSet(key="cycle", at=env.occurred_at)]
        if env.type == "TimerFired":
            return [WITHDRAWN]
        return []
    return InboxWorker(Service(FakeCore("queue", [], react)), TOPICS, Arrival(), clock=Clock(now=lambda: 100.0))


def _batch(worker: InboxWorker, producer, offset: int, *envs):
    batch = [Incoming(codec.encode(env), codec.envelope_headers(env), 0, offset + i) for i, env in enumerate(envs)]
    return asyncio.run(worker.process_batch(batch, producer))


def test_a_timer_that_lands_right_after_the_batch_is_handled_at_once():
    worker, producer = _cycling_worker(), TopicProducer()
    producer.ends[TOPICS.inbox("queue")] = 5  # the batch below is the inbox's records 0..4
    env = _env()
    assert _batch(worker, producer, 4, env) == 5  # the TimerFired landed at 5: handled, the reader skips it
    assert [e.type for e in worker.service.core.handled] == ["WorkloadDeleted", "TimerFired"]
    first, second, routed = producer.calls
    assert [(r.topic, codec.decode(r.value).type) for r in first] == [
        (TOPICS.log, "Enqueued"), (TOPICS.log, "TimerSet"), (TOPICS.log, "TimerFired"), (TOPICS.inbox("queue"), "TimerFired")]
    # the cycle's outputs are logged in turn, and every route goes out once the log has them all
    assert [(r.topic, codec.decode(r.value).type) for r in second] == [(TOPICS.log, "WorkloadWithdrawn")]
    assert [(r.topic, codec.decode(r.value).type) for r in routed] == [
        (TOPICS.inbox("reconciler"), "Enqueued"), (TOPICS.inbox("placement"), "WorkloadWithdrawn"),
        (TOPICS.inbox("reconciler"), "WorkloadWithdrawn")]


def test_a_timer_behind_records_of_others_is_left_to_be_read_in_its_turn():
    worker, producer = _cycling_worker(), TopicProducer(queue=1)  # another service wrote into the inbox first
    producer.ends[TOPICS.inbox("queue")] = 5
    assert _batch(worker, producer, 4, _env()) == 4
    assert [e.type for e in worker.service.core.handled] == ["WorkloadDeleted"]
    first, routed = producer.calls
    assert (first[-1].topic, codec.decode(first[-1].value).type) == (TOPICS.inbox("queue"), "TimerFired")
    assert [r.topic for r in routed] == [TOPICS.inbox("reconciler")]


def test_a_replay_of_the_inbox_folds_what_was_handed_over_in_the_same_order():
    live, producer = _cycling_worker(), TopicProducer()
    producer.ends[TOPICS.inbox("queue")] = 1
    env = _env()
    _batch(live, producer, 0, env)
    inbox = [(codec.encode(env), codec.envelope_headers(env))] + [
        (r.value, r.headers) for call in producer.calls for r in call if r.topic == TOPICS.inbox("queue")]
    again = _cycling_worker()
    for value, headers in inbox:
        again.replay(value, headers)
    assert [e.id for e in again.service.core.handled] == [e.id for e in live.service.core.handled]


# --------------------------------------------------------------------------- a core that raises
def _poisoned_worker() -> InboxWorker:
    """A queue worker whose core raises on workload ``default/poison`` and answers others with ENQUEUED."""
    def react(env):
        if env.payload.key == "default/poison":
            raise RuntimeError("a bug")
        return [ENQUEUED]
    return InboxWorker(Service(FakeCore("queue", [], react)), TOPICS, Arrival())


def _poison():
    from shared.kernel.events import GangPlaced

    return at(GangPlaced(key="default/poison", queue="q", kind="RayJob", gate="pods", slots=(), reason="x"), 1.0)


def test_a_record_the_core_raises_on_is_dead_lettered_where_it_was_read_and_its_workload_rejected():
    worker = _poisoned_worker()
    poison, good = _poison(), _env("good")
    producer = FakeProducer()
    batch = [Incoming(codec.encode(env), codec.envelope_headers(env), 0, offset)
             for offset, env in ((41, poison), (42, good))]
    assert asyncio.run(worker.process_batch(batch, producer)) == 42
    letters, logged, routed = producer.calls
    [letter] = [json.loads(r.value) for r in letters]
    assert (letter["topic"], letter["partition"], letter["offset"], letter["consumer"]) == (
        TOPICS.inbox("queue"), 0, 41, "queue")
    assert letter["error"] == "queue failed on GangPlaced default/poison: RuntimeError: a bug"
    assert codec.decode(letter["value"].encode()).id == poison.id
    kinds = [(codec.decode(r.value).type, codec.decode(r.value).subject) for r in logged]
    assert kinds == [("WorkloadRejected", "default/poison"), ("Enqueued", "default/w")]  # and the next one
    assert (worker.failed, worker.dead_letters) == (1, 1)
    assert {r.topic for r in routed} == {TOPICS.inbox("queue"), TOPICS.inbox("reconciler")}


def test_a_replay_folds_a_failed_record_again_without_dead_lettering_it_twice():
    worker = _poisoned_worker()
    poison = _poison()
    worker.replay(codec.encode(poison), codec.envelope_headers(poison))
    assert (worker.failed, worker.dead_letters, worker.service.failed) == (0, 0, 1)
    assert worker.service.faults == []
    assert _deliver(worker, poison).calls == []  # the live copy after the replay: a duplicate


def test_a_watcher_that_raises_stops_nothing():
    worker = _worker(ENQUEUED)

    def broken(env, outputs):
        raise ZeroDivisionError

    worker.watchers.append(broken)
    assert len(_deliver(worker, _env()).calls) == 2
    assert worker.failed == 0
