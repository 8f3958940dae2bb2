"""``muster run projector``: the log topic into the history store.

The app is a Faust app (worker, signals, the producer that sends dead letters), but the log is read
by a plain aiokafka consumer of the projector's own, not by a Faust agent: a Faust stream's CPU per
record alone held the projector far below the events per second it must write. Per batch:

    1. read: whole fetches until the batch holds ``batch`` records or more (waiting at most
       ``within`` for any, and reading on only while a backlog keeps coming: ``MORE_WAIT``),
       strictly in offset order (``InOrder``: several services write the log at once)
    2. decode, on the projector's thread (off the event loop): a record that is no envelope goes to
       the dead-letter topic with the error, counted, before its offset can be committed
    3. ``Pipeline.put`` (shared.history.writer), on the same thread: the batch is folded while the
       one before commits, and each batch's rows and consumed offsets go in one transaction

While records keep coming, cyclic garbage collection waits (``GcWhileBusy``).

Where to read from is the store's, not Kafka's: the consumed offsets the writer commits with the
rows (the tracking record; dead-lettered records count as consumed). A restart resumes right after
the last committed batch, and a batch read twice changes nothing (envelopes are skipped by id). The
projector joins no consumer group, so each one reads every partition of the log; the writer's
advisory lock and coherence check keep two projectors on one store correct, the second one only
doing the same work again.

The consumer never stops: a bad record is dead-lettered; a store that fails (unreachable, a
transaction refused) is logged and retried with backoff, reading again from the stored offsets. An
envelope that decodes but that the store cannot hold (``Unstorable``: a NUL character in a name, an
integer out of a column's range) would fail its batch for ever: the batches read up to the failure
are read again and written a part at a time, halving what the store refuses down to that envelope,
which is dead-lettered like a bad record (``put_carefully``) — unless the store refuses everything,
when it is the store that is at fault and is waited out. A fold that raises on an envelope is
treated the same way (``fold_faults_unstorable``): that envelope is dead-lettered, the rest written.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterator, Sequence, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from sqlalchemy.exc import SQLAlchemyError

from shared.history import rows
from shared.history.engine import StoreError, Unstorable
from shared.history.integrity import Signer
from shared.history.writer import Pipeline, ProjectionWriter, WriteCounts, gc_paused, hold_gc, release_gc
from shared.kernel.events import Envelope
from shared.runtime.bus import codec
from shared.runtime.bus.app import FaustProducer, InOrder, MusterApp, base_app, topic_partitions
from shared.runtime.bus.codec import BadRecord
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.topics import Topics
from shared.runtime.bus.worker import Incoming, Producer, Record, dead_letter_record

log = logging.getLogger("muster.projector")

T = TypeVar("T")

CONSUMER = "projector"
BATCH, BATCH_WAIT = 10_000, 0.2
"""A batch is whole fetches, ``BATCH`` records or more: a backlog comes in batches of about two of
Tansu's fetches, because a commit has costs whatever its size (two fetches a batch wrote a backlog
faster than one). Whole, because the consumer asks for the next fetch only once it has handed out
all of the last: taken whole, the next one arrives while the batch is folded. Taking part of one
left the rest waiting and added a fetch's wait to every batch."""
MORE_WAIT = 0.15
"""How long to wait for the broker's next fetch while a backlog fills a batch."""
FETCH_WAIT_MS = 100
"""The projector's fetch wait, at least: it is about throughput, not latency. Apache Kafka answers
a fetch as soon as there is data (the wait only paces polls of an idle log), but Tansu gathers
records for as long as the wait lasts and, at 5 ms on a busy machine, answers a few dozen at a time."""
FETCH_BYTES = 16 * 1024 * 1024
"""Up to this much of a partition per fetch: room for a whole batch (two of Tansu's fetches)."""
RETRY_FIRST, RETRY_MAX = 0.5, 30.0
REFUSED_IN_A_ROW = 100
"""Envelopes the store may refuse one after the other, nothing written in between, before the
projector stops dead-lettering them and takes the store to be at fault (``put_carefully``)."""
BUSY, COLLECT_EVERY = 1_000, 250_000
"""While batches of at least ``BUSY`` records keep coming (a backlog, a replay), cyclic garbage
collection is held off (``GcWhileBusy``) and run in full after every ``COLLECT_EVERY`` records."""


@dataclass
class Decoded:
    """A batch of records read from the log, decoded."""

    items: list[rows.Located] = field(default_factory=list)
    letters: list[Record] = field(default_factory=list)
    consumed: list[rows.Position] = field(default_factory=list)
    """Where the dead-lettered records were: consumed too, stored with the batch's offsets."""
    errors: list[str] = field(default_factory=list)
    """What was wrong with each of them."""

    def reject(self, topics: Topics, record: Any, error: str) -> None:
        """``record`` (as the consumer read it) as a dead letter saying ``error``; its position consumed."""
        incoming = Incoming(record.value, list(record.headers or ()), record.partition, record.offset)
        self.letters.append(dead_letter_record(topics, incoming, topic=record.topic, consumer=CONSUMER, error=error))
        self.consumed.append((record.topic, record.partition, record.offset))
        self.errors.append(error)


class GcWhileBusy:
    """Cyclic garbage collection held off while the projector works through a backlog (batches of
    ``BUSY`` records or more), resumed when it is idle or keeping up with a trickle, and run in full
    every ``COLLECT_EVERY`` records meanwhile.

    The batches in flight (a decoded one, a folded one, the one committing) are hundreds of
    thousands of objects without cycles, freed by reference counting. Any collection while they
    live scans them, and a busy projector always has some alive: held off, collection took a fifth
    of a replay. The switch is the process's (other apps in it are not collected either meanwhile)."""

    def __init__(self) -> None:
        self.held = False
        self.since = 0

    def busy(self, records: int) -> bool:
        """Hold collection off; True when a full collection is due."""
        if not self.held:
            hold_gc()
            self.held = True
        self.since += records
        if self.since < COLLECT_EVERY:
            return False
        self.since = 0
        return True

    def idle(self) -> None:
        if self.held:
            release_gc()
            self.held = False


@contextmanager
def fold_faults_unstorable() -> Iterator[None]:
    """A fold that raises on an envelope (a bug, or a shape nobody anticipated) would fail its batch
    at every retry, as a value the store refuses does: ``Unstorable``, so that envelope is found and
    dead-lettered (``put_carefully``). What the store or its driver raise stays what it is."""
    try:
        yield
    except (StoreError, SQLAlchemyError):
        raise
    except Exception as exc:  # noqa: BLE001 - any other failure is the fold's, on this data
        text = str(exc).strip().splitlines()
        raise Unstorable(f"the projection cannot fold it: {type(exc).__name__}"
                         + (f": {text[0][:300]}" if text else "")) from exc


class LogProjector:
    """The log into the store (see the module docstring). ``decode``, ``put``, ``flush`` and
    ``reset`` run on one thread of their own; ``run`` is the consumer, on the event loop."""

    def __init__(self, topics: Topics, writer: ProjectionWriter) -> None:
        self.topics = topics
        self.writer = writer
        self.dead_letters = 0
        self.failures = 0
        self.written = WriteCounts()
        """What the committed batches wrote."""
        self.refused_in_a_row = 0
        """Envelopes the store refused since it last took one (``put_carefully``)."""
        self._pipeline = Pipeline(writer)
        self.behind = 0
        """Records of the log read by no batch yet, as of the last fetch (the lag metric, ``/readyz``)."""
        self.watchers: list[Callable[[list[Envelope]], None]] = []
        """See each batch's envelopes once it is put (on the projector's thread): the workload spans."""

    # ------------------------------------------------------------------ on the projector's thread
    def decode(self, records: Sequence[Any]) -> Decoded:
        """Envelopes, located where they were read; every other record as its dead letter."""
        with gc_paused():
            return self._decode(records)

    def _decode(self, records: Sequence[Any]) -> Decoded:
        out = Decoded()
        for r in records:
            try:
                env, text = codec.decode_to_fold(r.value, r.headers)
                if not isinstance(env, Envelope):
                    raise BadRecord("a control message does not belong in the log")
            except Exception as exc:  # noqa: BLE001 - whatever a record makes the decoder raise, it is bad input
                error = str(exc) if isinstance(exc, BadRecord) else f"cannot decode: {type(exc).__name__}: {exc}"
                out.reject(self.topics, r, error)
                continue
            out.items.append(rows.Located(env, r.topic, r.partition, r.offset, text, r.value))
        return out

    def put_carefully(self, batch: Decoded, records: Sequence[Any]) -> tuple[Record, Decoded] | None:
        """``put`` once the store has refused data (``Unstorable``): ``batch`` written a part at a time,
        each in a transaction of its own, a refused part halved down to the envelope the store
        refuses. None when all of it is written. Else that envelope's dead letter (made of its
        record, found in ``records``) and the rest of the batch, unwritten, with the refused
        envelope's position as consumed: send the letter first, then put the rest carefully too (a
        letter goes out before its offset is stored).

        A store that refuses ``REFUSED_IN_A_ROW`` envelopes with nothing written in between is taken
        to be at fault itself (a constraint or column its schema should not have): ``StoreError``,
        retried with backoff like any failing store, rather than the whole log dead-lettered."""
        self.flush()
        found = self._first_refused(batch.items)
        if found is None:
            if batch.consumed:
                self.written = self.written + self.writer.write([], consumed=batch.consumed)
            return None
        at, error = found
        if self.refused_in_a_row >= REFUSED_IN_A_ROW:
            raise StoreError(f"{error} — and so were the {REFUSED_IN_A_ROW} envelopes before it, with nothing "
                             "written in between: the store itself looks at fault (check its schema)")
        self.refused_in_a_row += 1
        item = batch.items[at]
        record = next(r for r in records if (r.topic, r.partition, r.offset) == (item.topic, item.partition, item.offset))
        refused = Decoded()
        refused.reject(self.topics, record, error)
        return refused.letters[0], Decoded(items=batch.items[at + 1:], consumed=[*batch.consumed, *refused.consumed])

    def _first_refused(self, items: Sequence[rows.Located], start: int = 0) -> tuple[int, str] | None:
        """Write ``items`` in order, halving what the store refuses: the index of the first envelope
        it refuses and why (all before it written, nothing after), or None when all is written."""
        if not items:
            return None
        try:
            with fold_faults_unstorable():
                self.written = self.written + self.writer.write(items)
            self.refused_in_a_row = 0
            self._watch(items)
            return None
        except Unstorable as exc:
            if len(items) == 1:
                return start, f"not storable: {exc}"
        half = len(items) // 2
        return self._first_refused(items[:half], start) or self._first_refused(items[half:], start + half)

    def put(self, batch: Decoded) -> None:
        with fold_faults_unstorable():
            self.written = self.written + self._pipeline.put(batch.items, consumed=batch.consumed)
        self._watch(batch.items)

    def _watch(self, items: Sequence[rows.Located]) -> None:
        """Hand the written envelopes to the watchers; one that fails (the spans of a workload)
        is logged and stops nothing: the batch is stored, and reading it again would fail again."""
        if self.watchers:
            envelopes = [item.envelope for item in items]
            for watch in self.watchers:
                try:
                    watch(envelopes)
                except Exception:  # noqa: BLE001
                    log.exception("projector: a watcher failed on a batch of %d envelopes", len(envelopes))

    def flush(self) -> None:
        self.written = self.written + self._pipeline.flush()

    def reset(self) -> None:
        """After a failure: let the batch in flight end (a failed one leaves the writer cold)."""
        self._pipeline.close()
        self._pipeline = Pipeline(self.writer)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._pipeline.close()

    # ------------------------------------------------------------------ on the event loop
    async def run(self, config: BusConfig, producer: Producer, *, batch: int = BATCH,
                  within: float = BATCH_WAIT) -> None:
        """Read the log into the store until cancelled."""
        loop = asyncio.get_running_loop()
        thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="muster-projector-fold")

        def on_thread(fn: Callable[..., T], *args: Any) -> Awaitable[T]:
            return loop.run_in_executor(thread, fn, *args)

        consumer = AIOKafkaConsumer(
            **config.aiokafka(), enable_auto_commit=False, auto_offset_reset="earliest",
            fetch_max_wait_ms=max(config.fetch_wait_ms, FETCH_WAIT_MS),
            max_partition_fetch_bytes=FETCH_BYTES, fetch_max_bytes=max(FETCH_BYTES, 50 * 1024 * 1024))
        collection = GcWhileBusy()
        await consumer.start()
        try:
            partitions: list[TopicPartition] = []
            orders: dict[TopicPartition, InOrder] = {}
            put_through: dict[tuple[str, int], int] = {}
            """The last offset read, per partition: a commit that fails is of a batch up to there."""
            careful: dict[tuple[str, int], int] = {}
            """After the store refused data: up to where the log is put carefully (``put_carefully``)."""
            delay, seek = RETRY_FIRST, True
            while True:
                try:
                    if not partitions:
                        partitions = await self._partitions(config)
                        consumer.assign(partitions)
                    if seek:
                        orders = await self._seek(consumer, partitions, on_thread)
                        seek = False
                    records = await self._read(consumer, partitions, orders, put_through, batch, within)
                    self.behind = sum(max((consumer.highwater(tp) or 0) - (orders[tp].next or 0), 0)
                                      for tp in partitions)
                    if len(records) < BUSY:
                        collection.idle()
                    elif collection.busy(len(records)):
                        await on_thread(gc.collect)
                    if not records:
                        await on_thread(self.flush)
                        await on_thread(self.writer.sign_due)
                        await self._publish(producer)
                        continue
                    decoded = await on_thread(self.decode, records)
                    if decoded.letters:
                        await producer.send_all(decoded.letters)
                        self.dead_letters += len(decoded.letters)
                        log.warning("projector: %d record(s) of the log dead-lettered, e.g. offset %d: %s",
                                    len(decoded.letters), decoded.consumed[0][2], decoded.errors[0])
                    if careful and any(r.offset <= careful.get((r.topic, r.partition), -1) for r in records):
                        await self._put_carefully(decoded, records, producer, on_thread)
                        careful = {where: last for where, last in careful.items()
                                   if put_through.get(where, -1) < last}  # none left: back to pipelining
                    else:
                        await on_thread(self.put, decoded)
                    await self._publish(producer)
                    delay = RETRY_FIRST
                except Unstorable as exc:  # one envelope or more the store cannot hold: find them, then go on
                    self.failures += 1
                    collection.idle()
                    careful = {where: max(last, careful.get(where, -1)) for where, last in put_through.items()}
                    log.error("projector: %s; writing the log again from the stored offsets a part at a time, "
                              "to dead-letter what the store refuses", exc)
                    await on_thread(self.reset)
                    seek = True
                except Exception as exc:  # noqa: BLE001 - the store or the broker failed: retry, never stop
                    self.failures += 1
                    collection.idle()
                    again = f"reading again from the stored offsets in {delay:.1f}s"
                    if isinstance(exc, StoreError):  # says what is wrong and what to do: no traceback
                        log.error("projector: %s; %s", exc, again)
                    else:
                        log.exception("projector: a batch failed; %s", again)
                    await on_thread(self.reset)
                    await asyncio.sleep(delay)
                    delay, seek = min(delay * 2, RETRY_MAX), True
        finally:
            collection.idle()
            try:
                await on_thread(self.close)
            finally:
                thread.shutdown(wait=False)
                await consumer.stop()

    async def _publish(self, producer: Producer) -> None:
        """The signed records of the batches committed since the last call, to the checkpoint topic: a
        copy for whoever watches the log's checkpoints there (a witness); the store holds them anyway.
        A record that fails to go out is logged, not retried: it is in the store (``muster log checkpoints``)."""
        if not self.writer.signed:
            return
        records, self.writer.signed = self.writer.signed, []
        topic = self.topics.checkpoints
        try:
            await producer.send_all([Record(topic, str(r.get("partition", "")).encode(),
                                            json.dumps(r, separators=(",", ":")).encode(), []) for r in records])
        except Exception:  # noqa: BLE001
            log.exception("projector: %d signed record(s) not sent to %s (they are in the store)", len(records), topic)

    async def _put_carefully(self, batch: Decoded, records: Sequence[Any], producer: Producer,
                             on_thread: Callable[..., Awaitable[Any]]) -> None:
        rest: Decoded | None = batch
        while rest is not None:
            refused = await on_thread(self.put_carefully, rest, records)
            if refused is None:
                return
            letter, rest = refused
            await producer.send_all([letter])
            self.dead_letters += 1
            log.warning("projector: the envelope at offset %d of the log dead-lettered: %s",
                        rest.consumed[-1][2], json.loads(letter.value)["error"])

    async def _read(self, consumer: AIOKafkaConsumer, partitions: Sequence[TopicPartition],
                    orders: dict[TopicPartition, InOrder], put_through: dict[tuple[str, int], int],
                    batch: int, within: float) -> list[Any]:
        """Records in offset order, whole fetches until there are ``batch`` or more (``BATCH``): what
        comes within ``within``, then, while a backlog keeps coming (each fetch brings ``BUSY``
        records or more), what the next brings."""
        records: list[Any] = []
        wait = within
        while len(records) < batch:
            got = await consumer.getmany(*partitions, timeout_ms=int(wait * 1000))
            before = len(records)
            for tp in sorted(got):
                taken = orders[tp].take(consumer, got[tp])
                if taken:
                    records.extend(taken)
                    put_through[(tp.topic, tp.partition)] = taken[-1].offset
            if len(records) - before < BUSY:  # idle, or keeping up with a trickle: go with what came
                break
            wait = MORE_WAIT
        return records

    async def _partitions(self, config: BusConfig) -> list[TopicPartition]:
        """Every partition of the log (waiting for the topic to exist)."""
        while True:
            found = await topic_partitions(config, self.topics.log)
            if found:
                return [TopicPartition(self.topics.log, p) for p in found]
            log.warning("projector: topic %s does not exist yet; waiting for it", self.topics.log)
            await asyncio.sleep(1.0)

    async def _seek(self, consumer: AIOKafkaConsumer, partitions: Sequence[TopicPartition],
                    on_thread: Callable[..., Awaitable[Any]]) -> dict[TopicPartition, InOrder]:
        """Each partition to where the store says the last committed batch ended; what reads it
        from there in offset order (every service writes the log at once: see ``InOrder``)."""
        stored: dict[int, int] = await on_thread(self.writer.consumed_offsets, self.topics.log)
        orders: dict[TopicPartition, InOrder] = {}
        fresh = [tp for tp in partitions if tp.partition not in stored]
        beginnings = await consumer.beginning_offsets(fresh) if fresh else {}
        for tp in partitions:
            start = stored[tp.partition] if tp.partition in stored else beginnings[tp]
            consumer.seek(tp, start)
            orders[tp] = InOrder(tp, start, name=f"projector: {tp.topic}[{tp.partition}]")
        log.info("projector: reading %s from %s", self.topics.log, ", ".join(
            f"partition {tp.partition} offset {stored[tp.partition]}" if tp.partition in stored
            else f"partition {tp.partition} its start" for tp in partitions))
        return orders


def projector_app(config: BusConfig, store: str, *, batch: int = BATCH, within: float = BATCH_WAIT,
                  sink: Any = None, signer: Signer | None = None, rotated_from: Signer | None = None,
                  checkpoint_every: int | None = None, checkpoint_seconds: float | None = None) -> MusterApp:
    """The app behind ``muster run projector``: the Faust app runs ``LogProjector`` as a task and
    consumes nothing through Faust itself (it only produces: dead letters, and the signed checkpoints of the
    log's hash chain when it has a ``signer``: ``shared.history.integrity``). With a ``sink``
    (``shared.observability.tracing.otel.SpanSink``: tracing on) it also sends every workload's root and phase spans."""
    app = base_app(f"{config.prefix}projector", config)
    app.producer_only = True
    writer = ProjectionWriter(store, consumer=CONSUMER, signer=signer, rotated_from=rotated_from,
                              checkpoint_every=checkpoint_every, checkpoint_seconds=checkpoint_seconds)
    projector = LogProjector(config.topics, writer)
    if sink is not None:
        from shared.observability.tracing.live import WorkloadSpans

        projector.watchers.append(WorkloadSpans(sink).fold)
    producer = FaustProducer(app)
    app.muster_writer = writer  # type: ignore[attr-defined]
    app.muster_projector = projector  # type: ignore[attr-defined]

    @app.task
    async def project() -> None:
        try:
            await projector.run(config, producer, batch=batch, within=within)
        finally:
            writer.close()

    return app
