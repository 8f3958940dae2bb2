"""Services as the deployment runs them (``muster run``: arrival order, wall clock) on a real broker.

- a service handles its inbox, writes each output to the log before routing it, and its clock
  fires the timers it set into its own inbox;
- a record that is no envelope goes to the dead-letter topic with the error, is counted, and the
  consumer goes on with the next record (services and the projector alike);
- a service started again rebuilds its state from its inbox: a redelivered envelope changes
  nothing, and the next one is decided on the rebuilt state (snapshots off here: restarting from
  one is ``test_bus_snapshot``);
- a record the core raises on is dead-lettered where it was read, its workload rejected, the
  service goes on, and a restart neither dead-letters nor answers it again.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from services.admission.core import AdmissionCore
from services.reconciler.ingest import observe
from shared.kernel.events import Envelope, ObjectChanged, wrap
from shared.kernel.policy import Policy
from shared.runtime.bus import codec
from shared.runtime.bus.app import ensure_topics, service_app
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.driver import EventLoopThread
from shared.runtime.bus.projector import projector_app
from shared.runtime.cores import CORE_CLASSES
from tests.builders import node, pod, ray_cluster


READY_WAIT = 90.0
"""Longest wait for a started service to have replayed its inbox: seconds on a quiet machine, far
more on a loaded one (a full replay after an unusable snapshot timed out at 30 s at load 10)."""


@contextmanager
def running(config: BusConfig, make: Callable[[], Any]) -> Iterator[tuple[Any, EventLoopThread]]:
    bus = EventLoopThread()
    try:
        bus.run(ensure_topics(config))
        app = make()
        bus.run(app.start(), timeout=60)
        try:
            yield app, bus
        finally:
            bus.run(app.stop(), timeout=30)
    finally:
        bus.close()


def send(config: BusConfig, topic: str, *values: bytes) -> None:
    async def go() -> None:
        producer = AIOKafkaProducer(**config.aiokafka())
        await producer.start()
        try:
            for value in values:
                await producer.send_and_wait(topic, value, key=b"test")
        finally:
            await producer.stop()

    asyncio.run(go())


def read_until(config: BusConfig, topic: str, done: Callable[[list[Any]], bool], timeout: float = 60.0) -> list[Any]:
    """Records of ``topic`` from its start, until ``done(records)`` (or fail after ``timeout``)."""
    async def go() -> list[Any]:
        tp = TopicPartition(topic, 0)
        consumer = AIOKafkaConsumer(**config.aiokafka(), fetch_max_wait_ms=5, enable_auto_commit=False)
        await consumer.start()
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        records: list[Any] = []
        deadline = time.monotonic() + timeout
        try:
            while not done(records):
                assert time.monotonic() < deadline, f"{topic}: still waiting after {timeout}s; got {len(records)}"
                batch = await consumer.getmany(tp, timeout_ms=200)
                records.extend(batch.get(tp, ()))
            return records
        finally:
            await consumer.stop()

    return asyncio.run(go())


def envelopes(records: list[Any]) -> list[Envelope]:
    return [env for r in records if isinstance(env := codec.decode(r.value, r.headers), Envelope)]


def ingest(obj: dict, index: int, change: str = "Added") -> Envelope:
    return wrap(observe(change, obj), source="ingest", cause=None, index=index, at=time.time())  # type: ignore[arg-type]


def test_a_service_routes_its_outputs_after_logging_them_and_fires_its_own_timers(
        kafka_bootstrap: str, topic_prefix: str) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    topics = config.topics
    with running(config, lambda: service_app("placement", config, Policy())):
        joined = ingest(node("n1"), 1)
        # a pod of another scheduler lowers capacity: placement says so once the instant is over
        other = ingest(pod("other", requests={"cpu": "4"}, node_name="n1", scheduler="default-scheduler"), 2)
        send(config, topics.inbox("placement"), codec.encode(joined), codec.encode(other))
        log = envelopes(read_until(config, topics.log, lambda rs: sum(
            codec.decode(r.value, r.headers).type == "CapacityChanged" for r in rs) == 2))
    assert (log[0].source, log[0].type) == ("placement", "PolicyApplied")  # first, on start
    log = log[1:]
    kinds = [(e.source, e.type) for e in log]
    # the capacity timer was set, fired by the service's wall clock into its own inbox, and handled
    assert kinds == [("placement", "CapacityChanged"), ("placement", "TimerSet"), ("clock", "TimerFired"),
                     ("placement", "CapacityChanged")]
    first, timer_set, fired, lowered = log
    assert first.causation_id == joined.id and timer_set.causation_id == other.id
    assert fired.causation_id == timer_set.id and lowered.causation_id == fired.id
    assert lowered.payload.total["cpu"] == first.payload.total["cpu"] - 4000
    inbox = envelopes(read_until(config, topics.inbox("placement"), lambda rs: len(rs) >= 3))
    assert [e.id for e in inbox] == [joined.id, other.id, fired.id]
    queue = envelopes(read_until(config, topics.inbox("queue"), lambda rs: len(rs) >= 2))
    assert [e.id for e in queue] == [first.id, lowered.id]


def test_bad_records_are_dead_lettered_and_the_consumer_goes_on(kafka_bootstrap: str, topic_prefix: str) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    topics = config.topics
    good = ingest(ray_cluster("rc"), 1)
    wrong = json.loads(codec.encode(good))
    wrong["payload"]["change"] = "Exploded"
    with running(config, lambda: service_app("admission", config, Policy())) as (app, _):
        send(config, topics.inbox("admission"), b"\xff not json", json.dumps(wrong).encode(), codec.encode(good))
        log = envelopes(read_until(config, topics.log, lambda rs: any(
            codec.decode(r.value, r.headers).type == "WorkloadSubmitted" for r in rs)))
        assert app.muster_worker.dead_letters == 2
    assert [e.causation_id for e in log if e.type == "WorkloadSubmitted"] == [good.id]
    letters = [json.loads(r.value) for r in read_until(config, topics.deadletter, lambda rs: len(rs) >= 2)]
    assert [(d["topic"], d["offset"], d["consumer"]) for d in letters] == [
        (topics.inbox("admission"), 0, "admission"), (topics.inbox("admission"), 1, "admission")]
    assert letters[0]["value_encoding"] == "base64" and "not a valid envelope" in letters[0]["error"]
    assert "payload" in letters[1]["error"] and "change" in letters[1]["error"]


def test_the_projector_dead_letters_what_is_not_an_envelope(kafka_bootstrap: str, topic_prefix: str,
                                                            pg_store: str) -> None:
    from shared.history import query

    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    topics = config.topics
    good = ingest(ray_cluster("rc"), 1)
    with running(config, lambda: projector_app(config, pg_store, within=0.05)):
        send(config, topics.log, b"{}", codec.encode(good))
        letters = read_until(config, topics.deadletter, lambda rs: len(rs) >= 1)
        deadline = time.monotonic() + 30
        while not list(query.read_log(pg_store)) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert json.loads(letters[0].value)["consumer"] == "projector"
    assert [env.id for env in query.read_log(pg_store)] == [good.id]


def admission_handles(config: BusConfig, env: Envelope, *, then_wait: float) -> None:
    """Admission runs, handles ``env`` (its output reaches the log), lingers ``then_wait`` s, stops."""
    with running(config, lambda: service_app("admission", config, Policy(), snapshots=False)):
        send(config, config.topics.inbox("admission"), codec.encode(env))
        read_until(config, config.topics.log, lambda rs: any(  # a decision, not only the start's policy
            codec.decode(r.value, r.headers).type != "PolicyApplied" for r in rs))
        time.sleep(then_wait)


def test_a_service_stopped_at_once_resumes_after_what_it_handled(kafka_bootstrap: str, topic_prefix: str) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    # stopped well within the commit interval: the stop lets the batch finish and commits it
    admission_handles(config, ingest(ray_cluster("rc"), 1), then_wait=0.0)
    with running(config, lambda: service_app("admission", config, Policy(), snapshots=False)) as (app, bus):
        bus.run(asyncio.wait_for(app.muster_reader.ready.wait(), READY_WAIT))
        assert app.muster_worker.replayed == 1  # rebuilt from it, not handed it again
        assert app.muster_worker.service.handled == 1


def test_a_restarted_service_rebuilds_from_its_inbox(kafka_bootstrap: str, topic_prefix: str) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    topics = config.topics
    created = ingest(ray_cluster("rc"), 1)
    admission_handles(config, created, then_wait=1.5)  # past the commit interval: resume after it
    deleted = ingest(ray_cluster("rc"), 2, change="Deleted")
    with running(config, lambda: service_app("admission", config, Policy(), snapshots=False)) as (app, _):
        # the same envelope again (a redelivery) and then the deletion
        send(config, topics.inbox("admission"), codec.encode(created), codec.encode(deleted))
        log = envelopes(read_until(config, topics.log, lambda rs: any(
            codec.decode(r.value, r.headers).type == "WorkloadDeleted" for r in rs)))
        assert app.muster_worker.replayed == 1
        assert app.muster_worker.service.duplicates == 1
    decided = [e for e in log if e.type != "PolicyApplied"]
    assert [e.type for e in decided] == ["WorkloadSubmitted", "WorkloadDeleted"]
    assert decided[1].causation_id == deleted.id
    # each start wrote its policy (no snapshot told the second it was written): the second after the
    # input the first had handled, which it rebuilt from
    applied = [e.payload for e in log if e.type == "PolicyApplied"]
    assert [(p.services, p.after) for p in applied] == [(("admission",), None), (("admission",), created.id)]
    assert applied[0].policy_digest == Policy().digest() and applied[0].policy == Policy().as_json()


def test_a_restart_with_another_policy_writes_it_where_the_service_took_it(kafka_bootstrap: str,
                                                                           topic_prefix: str) -> None:
    """Issue 28: the policy a service decides with is in the log, and a restart under another one says so,
    placed after the last input it handled before (``shared.audit.kafka.replay_order`` puts it there)."""
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    topics = config.topics
    created = ingest(ray_cluster("rc"), 1)
    admission_handles(config, created, then_wait=1.5)
    strict = Policy(queueing="StrictFIFO")
    with running(config, lambda: service_app("admission", config, strict, snapshots=False)) as (app, bus):
        bus.run(asyncio.wait_for(app.muster_reader.ready.wait(), READY_WAIT))
        log = envelopes(read_until(config, topics.log, lambda rs: sum(
            codec.decode(r.value, r.headers).type == "PolicyApplied" for r in rs) >= 2))
    applied = [e for e in log if e.type == "PolicyApplied"]
    assert [Policy.from_mapping(e.payload.policy) for e in applied] == [Policy(), strict]
    assert applied[1].payload.after == created.id and applied[1].source == "admission"
    assert applied[1].causation_id is None and applied[0].id != applied[1].id
    assert log.index(applied[1]) > log.index(next(e for e in log if e.type == "WorkloadSubmitted"))


class PoisonedAdmission(AdmissionCore):
    """Admission with a bug: it raises on the RayCluster named ``poison`` (a core that raises on one
    record at every restart, the poison pill the services must survive)."""

    def handle(self, env: Envelope) -> list[Any]:
        if isinstance(env.payload, ObjectChanged) and env.payload.name == "poison":
            raise RuntimeError("a bug on poison")
        return super().handle(env)


def test_a_record_the_core_raises_on_is_dead_lettered_once_and_the_service_goes_on(
        kafka_bootstrap: str, topic_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(CORE_CLASSES, "admission", PoisonedAdmission)
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    topics = config.topics
    poison, good, later = ingest(ray_cluster("poison"), 1), ingest(ray_cluster("good"), 2), ingest(ray_cluster("later"), 3)

    def submitted(name: str) -> Callable[[list[Any]], bool]:
        return lambda rs: any(codec.decode(r.value, r.headers).subject == f"default/{name}" and
                              codec.decode(r.value, r.headers).type == "WorkloadSubmitted" for r in rs)

    with running(config, lambda: service_app("admission", config, Policy())) as (app, _):
        send(config, topics.inbox("admission"), codec.encode(poison), codec.encode(good))
        read_until(config, topics.log, submitted("good"))
        assert (app.muster_worker.failed, app.muster_worker.dead_letters) == (1, 1)
        time.sleep(1.5)  # past the commit interval: the restart resumes after both
    [letter] = [json.loads(r.value) for r in read_until(config, topics.deadletter, lambda rs: len(rs) >= 1)]
    assert (letter["topic"], letter["partition"], letter["offset"], letter["consumer"]) == (
        topics.inbox("admission"), 0, 0, "admission")
    assert letter["error"] == "admission failed on ObjectChanged RayCluster/default/poison: RuntimeError: a bug on poison"
    with running(config, lambda: service_app("admission", config, Policy())) as (app, bus):
        bus.run(asyncio.wait_for(app.muster_reader.ready.wait(), READY_WAIT))
        send(config, topics.inbox("admission"), codec.encode(later))
        log = envelopes(read_until(config, topics.log, submitted("later")))
        worker = app.muster_worker
        # the poison was folded again to rebuild the state, but neither dead-lettered nor answered again
        assert (worker.replayed, worker.failed, worker.dead_letters) == (2, 0, 0)
    log = [e for e in log if e.type != "PolicyApplied"]  # each start's policy (no snapshot said it was written)
    assert [(e.type, e.subject) for e in log] == [
        ("WorkloadRejected", "default/poison"), ("WorkloadSubmitted", "default/good"),
        ("WorkloadSubmitted", "default/later")]
    assert "admission failed on ObjectChanged RayCluster/default/poison" in log[0].payload.reason
