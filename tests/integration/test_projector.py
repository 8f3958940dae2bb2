"""The Kafka projector (``muster run projector``): it resumes where the store says it stopped, a
record read again changes nothing, bad records are dead-lettered and counted and move the offset
on, and a store that fails for a while is waited out, not given up on."""

from __future__ import annotations

import asyncio
import json
import time
from collections import namedtuple
from typing import Sequence

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from sqlalchemy import text

from shared.history import query
from shared.history.engine import connect
from shared.history.writer import ProjectionWriter
from shared.kernel.events import Envelope, ObjectChanged, wrap
from shared.runtime.bus import codec
from shared.runtime.bus import projector as projector_module
from shared.runtime.bus.app import ensure_topics
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.driver import AioProducer, wait_for_projector
from shared.runtime.bus.projector import LogProjector, projector_app
from shared.runtime.bus.topics import Topics
from shared.runtime.bus.worker import Record, envelope_record
from tests.integration.conftest import SCENARIOS, scenario_run
from tests.integration.test_bus_service import read_until, running
from tests.integration.test_writer import expected, histories

FAIR_SHARE = next(p for p in SCENARIOS if p.stem == "fair-share-two-teams")


def produce(config: BusConfig, records: Sequence[Record]) -> None:
    async def go() -> None:
        producer = AioProducer(config)
        await producer.start()
        try:
            await producer.send_all(records)
        finally:
            await producer.stop()

    asyncio.run(go())


def log_records(config: BusConfig, envs: Sequence[Envelope]) -> list[Record]:
    return [envelope_record(config.topics, config.topics.log, env) for env in envs]


def caught_up(config: BusConfig, store: str, end: int, timeout: float = 60.0) -> None:
    asyncio.run(wait_for_projector(config, store, end, timeout))


def test_a_restarted_projector_reads_on_from_the_stored_offset(kafka_bootstrap: str, topic_prefix: str,
                                                               pg_store: str) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    log = scenario_run(FAIR_SHARE).runtime.log
    half = len(log) // 2
    with running(config, lambda: projector_app(config, pg_store, within=0.05)) as (app, _):
        produce(config, log_records(config, log[:half]))
        caught_up(config, pg_store, half)
    assert app.muster_projector.written.events == half
    # the second half, the last envelope of the first again (a producer's retry), and a bad record
    bad = log_records(config, log[:1])[0]
    bad = Record(bad.topic, bad.key, b'{"id": "truncated', bad.headers)
    with running(config, lambda: projector_app(config, pg_store, within=0.05)) as (app, _):
        produce(config, log_records(config, log[half:] + log[half - 1:half]) + [bad])
        caught_up(config, pg_store, len(log) + 2)
    projector = app.muster_projector
    assert (projector.written.events, projector.written.skipped) == (len(log) - half, 1)  # nothing older read again
    assert (projector.dead_letters, projector.failures) == (1, 0)
    assert [e.id for e in query.read_log(pg_store)] == [e.id for e in log]
    assert histories(pg_store, FAIR_SHARE) == expected(FAIR_SHARE)
    letter = json.loads(read_until(config, config.topics.deadletter, lambda rs: len(rs) >= 1)[0].value)
    assert (letter["offset"], letter["consumer"]) == (len(log) + 1, "projector")
    assert "not a valid envelope" in letter["error"]


def test_the_projector_waits_out_a_failing_store(kafka_bootstrap: str, topic_prefix: str, pg_store: str) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    log = scenario_run(FAIR_SHARE).runtime.log
    engine = connect(pg_store)
    moved = False
    try:
        with engine.begin() as conn:   # the store is there but not usable: "relation event_log does not exist"
            conn.execute(text("ALTER TABLE event_log RENAME TO event_log_away"))
            moved = True
        with running(config, lambda: projector_app(config, pg_store, within=0.05)) as (app, _):
            produce(config, log_records(config, log))
            deadline = time.monotonic() + 30
            while app.muster_projector.failures < 2:
                assert time.monotonic() < deadline, "the projector never tried to write"
                time.sleep(0.1)
            with engine.begin() as conn:
                conn.execute(text("ALTER TABLE event_log_away RENAME TO event_log"))
                moved = False
            caught_up(config, pg_store, len(log))
    finally:
        if moved:
            with engine.begin() as conn:
                conn.execute(text("ALTER TABLE event_log_away RENAME TO event_log"))
        engine.dispose()
    assert [e.id for e in query.read_log(pg_store)] == [e.id for e in log]
    assert histories(pg_store, FAIR_SHARE) == expected(FAIR_SHARE)


def test_an_envelope_the_store_refuses_is_dead_lettered_and_the_rest_written(
        kafka_bootstrap: str, topic_prefix: str, pg_store: str) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    log = scenario_run(FAIR_SHARE).runtime.log
    nul = wrap(ObjectChanged(change="Added", kind="ConfigMap", namespace="ns", name="a\x00b", object={}),
               source="ingest", cause=None, index=0, at=log[40].occurred_at)  # Postgres text holds no NUL
    sent = log[:40] + [nul] + log[40:]
    with running(config, lambda: projector_app(config, pg_store, within=0.05)) as (app, _):
        produce(config, log_records(config, sent))
        caught_up(config, pg_store, len(sent))
        assert app.muster_projector.written.events == len(log)
        assert (app.muster_projector.dead_letters, app.muster_projector.failures) == (1, 1)
        produce(config, log_records(config, log[:3]))  # the log goes on: redelivered envelopes change nothing
        caught_up(config, pg_store, len(sent) + 3)
    assert [e.id for e in query.read_log(pg_store)] == [e.id for e in log]
    assert histories(pg_store, FAIR_SHARE) == expected(FAIR_SHARE)
    (letter,) = [json.loads(r.value) for r in read_until(config, config.topics.deadletter, lambda rs: len(rs) >= 1)]
    assert (letter["offset"], letter["consumer"]) == (40, "projector")
    assert "not storable" in letter["error"] and "NUL" in letter["error"]
    assert codec.decode(letter["value"].encode()) == nul


def test_a_store_that_refuses_everything_is_waited_out_not_dead_lettered_into(
        kafka_bootstrap: str, topic_prefix: str, pg_store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A schema at fault (here a constraint no row meets) refuses every envelope: the projector
    dead-letters a few, then takes the store to be at fault and waits until it is mended."""
    monkeypatch.setattr(projector_module, "REFUSED_IN_A_ROW", 3)
    monkeypatch.setattr(projector_module, "RETRY_FIRST", 0.1)
    monkeypatch.setattr(projector_module, "RETRY_MAX", 0.2)
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    log = scenario_run(FAIR_SHARE).runtime.log
    engine = connect(pg_store)
    try:
        with engine.begin() as conn:  # COPY meets it as psycopg's own IntegrityError (a check violation)
            conn.execute(text("ALTER TABLE event_log ADD CONSTRAINT refuse_all CHECK (false) NOT VALID"))
        with running(config, lambda: projector_app(config, pg_store, within=0.05)) as (app, _):
            produce(config, log_records(config, log))
            projector = app.muster_projector
            deadline = time.monotonic() + 30
            while projector.failures < 4:  # the first refusal, then the store taken to be at fault, again and again
                assert time.monotonic() < deadline, projector.failures
                time.sleep(0.05)
            assert (projector.dead_letters, projector.written.events) == (3, 0)
            with engine.begin() as conn:
                conn.execute(text("ALTER TABLE event_log DROP CONSTRAINT refuse_all"))
            caught_up(config, pg_store, len(log))
            # the three dead-lettered before their offsets were stored are read and written again
            assert (projector.dead_letters, projector.written.events) == (3, len(log))
    finally:
        engine.dispose()
    assert [e.id for e in query.read_log(pg_store)] == [e.id for e in log]


class HandsOverALaterBatchFirst(AIOKafkaConsumer):
    """The consumer as Tansu can serve it while several producers write one partition: the first
    answer of several records lacks its first ones, and the position has moved past them."""

    skipped = 0

    async def getmany(self, *partitions: TopicPartition, timeout_ms: int = 0,
                      max_records: int | None = None) -> dict[TopicPartition, list]:
        got = await super().getmany(*partitions, timeout_ms=timeout_ms, max_records=max_records)
        if not type(self).skipped:
            for tp, records in got.items():
                if len(records) > 2:
                    type(self).skipped = 2
                    got[tp] = records[2:]
        return got


def test_the_projector_takes_the_log_in_offset_order_when_a_later_batch_comes_first(
        kafka_bootstrap: str, topic_prefix: str, pg_store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    log = scenario_run(FAIR_SHARE).runtime.log
    monkeypatch.setattr(projector_module, "AIOKafkaConsumer", HandsOverALaterBatchFirst)
    asyncio.run(ensure_topics(config))
    produce(config, log_records(config, log))  # all there before the projector starts: one big first answer
    with running(config, lambda: projector_app(config, pg_store, within=0.05)) as (app, _):
        caught_up(config, pg_store, len(log))
    assert HandsOverALaterBatchFirst.skipped == 2
    assert app.muster_projector.written.events == len(log)
    assert [e.id for e in query.read_log(pg_store)] == [e.id for e in log]


Read = namedtuple("Read", "topic partition offset value headers")


def test_whatever_a_record_makes_the_decoder_do_it_is_dead_lettered(sqlite_store: str) -> None:
    topics = Topics()
    good = scenario_run(FAIR_SHARE).runtime.log[0]
    raw = codec.encode(good)
    values = [
        raw,
        b"[" * 100_000,                                    # deeper than the parser goes (RecursionError)
        None,                                              # a tombstone
        raw.replace(b'"id":"', b'"id":"\\ud800', 1),      # half a surrogate pair: no database takes it
        raw.replace(b'"id":"', b'"id":"\\ud83d\\ude00', 1),  # a whole one (an emoji) is fine
    ]
    reads = [Read(topics.log, 0, i, v, codec.envelope_headers(good)) for i, v in enumerate(values)]
    reads.append(Read(topics.log, 0, 5, raw, [(codec.CONTROL_HEADER, b"release")]))
    with ProjectionWriter(sqlite_store) as writer:
        decoded = LogProjector(topics, writer).decode(reads)
    assert [item.offset for item in decoded.items] == [0, 4]
    assert [where[2] for where in decoded.consumed] == [1, 2, 3, 5]
    assert [json.loads(r.value)["offset"] for r in decoded.letters] == [1, 2, 3, 5]
    assert "nested too deeply" in decoded.errors[0] and "surrogate" in decoded.errors[2]
    assert "control message" in decoded.errors[3]


class Scripted:
    """A consumer of one partition whose every fetch brings the next of ``sizes`` records (what
    ``max_records`` leaves over is handed out first the next time, as a consumer's buffer is)."""

    def __init__(self, tp: TopicPartition, sizes: list[int]) -> None:
        self.tp, self.sizes, self.next, self.calls = tp, list(sizes), 0, 0

    async def getmany(self, *partitions: TopicPartition, timeout_ms: int = 0,
                      max_records: int | None = None) -> dict[TopicPartition, list]:
        self.calls += 1
        fetched = self.sizes.pop(0) if self.sizes else 0
        size = fetched if max_records is None else min(fetched, max_records)
        if fetched > size:
            self.sizes.insert(0, fetched - size)
        records = [Read(self.tp.topic, 0, self.next + i, b"", []) for i in range(size)]
        self.next += size
        return {self.tp: records} if records else {}

    def seek(self, tp: TopicPartition, offset: int) -> None:  # pragma: no cover - offsets here have no gaps
        raise AssertionError("no gap to fetch again")


@pytest.mark.parametrize("sizes, batches", [
    ([5_800, 5_800, 5_800, 100], [[5_800, 5_800], [5_800, 100]]),        # a backlog: two whole fetches a batch
    ([1_500, 3, 3, 3, 3], [[1_500, 3], [3], [3], [3]]),                  # then a trickle: no waiting for a full batch
    ([10, 5_000], [[10], [5_000]]),                                       # a trickle first: what came, at once
    ([9_000, 9_000, 50], [[9_000, 9_000], [50]]),                         # no fetch taken in part
])
def test_the_projector_reads_on_only_while_a_backlog_keeps_coming(sqlite_store: str, sizes, batches) -> None:
    topics = Topics()
    tp = TopicPartition(topics.log, 0)
    consumer = Scripted(tp, sizes)
    with ProjectionWriter(sqlite_store) as writer:
        projector = LogProjector(topics, writer)
        orders, through = {tp: projector_module.InOrder(tp, 0)}, {}
        got = [asyncio.run(projector._read(consumer, [tp], orders, through, projector_module.BATCH, 0.01))
               for _ in batches]
    assert [len(b) for b in got] == [sum(sizes_) for sizes_ in batches]
    assert [r.offset for b in got for r in b] == list(range(sum(sizes)))
    assert through == {(topics.log, 0): sum(sizes) - 1}


def test_an_envelope_the_fold_raises_on_is_dead_lettered_and_the_rest_written(
        sqlite_store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fold that raises on one envelope (a bug) would fail its batch at every retry: it is taken
    as data the store refuses, found by halving, and dead-lettered; the rest is written."""
    from shared.history.engine import Unstorable

    topics = Topics()
    log = scenario_run(FAIR_SHARE).runtime.log[:20]
    bad = log[7]
    convert = ProjectionWriter._convert

    def buggy(self, conn, items, **kwargs):  # type: ignore[no-untyped-def]
        if any(item.envelope.id == bad.id for item in items):
            raise KeyError("a fold bug")
        return convert(self, conn, items, **kwargs)

    monkeypatch.setattr(ProjectionWriter, "_convert", buggy)
    reads = [Read(topics.log, 0, i, codec.encode(e), codec.envelope_headers(e)) for i, e in enumerate(log)]
    with ProjectionWriter(sqlite_store) as writer:
        projector = LogProjector(topics, writer)
        decoded = projector.decode(reads)
        with pytest.raises(Unstorable, match="the projection cannot fold it: KeyError: 'a fold bug'"):
            projector.put(decoded)
        projector.reset()
        letter, rest = projector.put_carefully(decoded, reads)
        assert projector.put_carefully(rest, reads) is None
    found = json.loads(letter.value)
    assert (found["offset"], found["consumer"]) == (7, "projector") and "KeyError" in found["error"]
    assert [e.id for e in query.read_log(sqlite_store)] == [e.id for e in log if e.id != bad.id]
