"""The Faust wiring: each service is a Faust app that reads its one inbox in batches.

``service_app(name, ...)`` is the one wiring for all four services; ``muster run NAME`` runs it as
a Faust worker. Faust hosts the process (signals, logging, lifecycle) and the producer; the inbox
itself is read by ``InboxReader`` with a plain aiokafka consumer on the app's own event loop, which
assigns itself the inbox's one partition and commits its offsets under group ``<prefix><service>``
(no group membership: a start costs no join, see ``PartitionReader``). Faust's stream machinery
costs many times the CPU per record of aiokafka's ``getmany`` (a task per message, a consumer
thread on a loop of its own, a 2 ms take timer that keeps firing while idle), and the services are
CPU-bound.

On start the reader rebuilds the worker from the inbox's past (its latest snapshot and the records
after it up to the committed offset, ``shared.runtime.bus.snapshot``; from the start without one), then
hands it what each fetch returns, up to ``BATCH`` records (``InboxWorker.process_batch``); a second task fires the service's due timers into its own inbox.
Offsets are committed every ``COMMIT_INTERVAL`` seconds and on stop, only ever past a
batch whose outputs the broker acknowledged: at-least-once, and the copies are dropped by id. Each
fetch goes through ``InOrder`` first: under concurrent producers Tansu (the fallback of ``muster
broker``) can hand a live consumer a later batch before an earlier one, which it would otherwise skip
for good; Apache Kafka never does, and there ``InOrder`` only ever passes records through.

Every producer here (``FaustProducer``) sends a call's records as one batch per partition
(``send_records``): one produce request for a service's whole batch instead of one record at a time.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Literal, Mapping, Sequence

import faust
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka import errors
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (CoordinatorLoadInProgressError, GroupCoordinatorNotAvailableError, KafkaError,
                             NotCoordinatorError)
from aiokafka.partitioner import DefaultPartitioner
from faust.transport.drivers import aiokafka as faust_aiokafka

from shared.kernel.dedupe import dedupe_window
from shared.kernel.events import wrap
from shared.kernel.policy import Policy
from shared.runtime.build import policy_applied
from shared.runtime.bus import stagetrace
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.sequencing import Arrival, Rounds
from shared.runtime.bus.snapshot import SnapshotKeeper, Snapshots
from shared.runtime.bus.snapshot import reason as snapshot_reason
from shared.runtime.bus.topics import lost_records, retention_problem
from shared.runtime.bus.worker import Clock, InboxWorker, Incoming, Producer, Record, envelope_record
from shared.runtime.cores import CORE_CLASSES
from shared.runtime.service import Service, collect_less

if TYPE_CHECKING:
    from shared.observability.tracing.otel import SpanSink

log = logging.getLogger("muster.bus")

Ordering = Literal["arrival", "rounds"]

BATCH, BATCH_WAIT = 1_000, 0.002
"""A worker takes what its inbox holds, up to ``BATCH`` records: a burst is handled and sent in a
few round trips to the broker. ``BATCH_WAIT`` is the wait of the Faust agents that use ``take``
(``muster run cluster``); an inbox reader waits for nothing but the fetch."""

BATCH_BYTES = 1_000_000
"""Largest record batch a producer builds (aiokafka's ``max_batch_size``, 16 KiB by default): a
batch of 1,000 records of 1 KiB goes out in one produce request, not in 60 one after another (a
producer has one request in flight per broker). Below Kafka's default ``message.max.bytes``."""

COMMIT_INTERVAL = 1.0
"""Seconds between two commits of an inbox's offset (Faust's ``broker_commit_interval``)."""

COMMIT_BACKOFF_MAX = 30.0
"""Longest wait between two commits while they keep failing: the wait doubles from ``COMMIT_INTERVAL``
after each failure, so a broker that refuses commits for an hour costs about 120 log lines, not 3,600."""

END_PATIENCE = 3.0
"""Seconds a start-up check fetches at a reader's committed offset before it believes the partition
ends before it (``_last_offset_read``)."""

GAP_PATIENCE = 2.0
"""Seconds a reader keeps fetching again at a gap in a partition's offsets before it takes the gap
as real (``InOrder``)."""


# --------------------------------------------------------------------------- Faust, tuned
class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust fixes the consumer's fetch wait at 1.5 s; a broker that only answers a fetch when the
    wait is over (Tansu) would add that to every hop. Ours comes from ``BusConfig.fetch_wait_ms``."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = self.app.conf.muster_fetch_wait_ms  # read when the fetcher starts
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _Producer(faust_aiokafka.Producer):
    """Faust makes its producer idempotent only inside transactions; muster's is wherever the broker
    can (``BusConfig.idempotent``): a send retried after a lost acknowledgement is not written twice."""

    def _settings_extra(self) -> Mapping[str, Any]:
        return {**super()._settings_extra(), "enable_idempotence": self.app.conf.muster_idempotent}


class _Transport(faust_aiokafka.Transport):
    Consumer = _Consumer
    Producer = _Producer


class MusterApp(faust.App):
    """A Faust app on muster's transport (everything else is stock Faust)."""

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)


def base_app(app_id: str, config: BusConfig, *, cls: type[MusterApp] = MusterApp) -> MusterApp:
    """A Faust app that joins its group within seconds and declares no topics of its own. Its data
    folder (Faust keeps table state there; muster has no tables) goes under the temp folder, not
    into the working directory."""
    datadir = Path(tempfile.gettempdir()) / "muster-faust"
    datadir.mkdir(parents=True, exist_ok=True)
    app = cls(
        app_id, **config.faust(), datadir=str(datadir / app_id),
        web_enabled=False, topic_disable_leader=True, topic_allow_declare=False,
        consumer_auto_offset_reset="earliest", key_serializer="raw", value_serializer="raw",
        broker_rebalance_timeout=2, broker_session_timeout=config.session_timeout_ms / 1000,
        broker_heartbeat_interval=config.heartbeat_ms / 1000,
        broker_commit_interval=COMMIT_INTERVAL, stream_wait_empty=False, producer_max_batch_size=BATCH_BYTES,
        producer_acks=-1,  # every in-sync replica has it (``BusConfig.min_insync``), Faust's default said out loud
    )
    app.conf.muster_fetch_wait_ms = config.fetch_wait_ms
    app.conf.muster_idempotent = config.idempotent
    return app


_PARTITIONER = DefaultPartitioner()
"""The partition of a keyed record, as every Kafka client's default computes it (murmur2 of the key)."""


async def send_records(producer: AIOKafkaProducer, records: Sequence[Record]) -> list[int]:
    """Send ``records`` and wait until the broker has every one; their offsets, in order.

    The records of one partition go out as one batch (more when they exceed ``BATCH_BYTES``), in
    the order given, and every partition's batch is queued before the producer next wakes, so one
    produce request carries the whole call: per record, this costs a few microseconds instead of a
    future and a callback each (aiokafka's ``send``). Partitions are chosen as ``send`` chooses (the
    default partitioner: muster configures no other)."""
    if not records:
        return []
    counts: dict[str, set[int]] = {}
    by_partition: dict[tuple[str, int], list[int]] = {}
    for index, record in enumerate(records):
        partitions = counts.get(record.topic)
        if partitions is None:
            partitions = counts[record.topic] = await producer.partitions_for(record.topic)
        partition = next(iter(partitions)) if len(partitions) == 1 else _PARTITIONER(
            record.key, sorted(partitions), sorted(partitions))
        by_partition.setdefault((record.topic, partition), []).append(index)
    offsets = [0] * len(records)
    sent: list[tuple[asyncio.Future[Any], list[int]]] = []
    for (topic, partition), indices in by_partition.items():
        start = 0
        while start < len(indices):
            batch, end = producer.create_batch(), start
            while end < len(indices):
                r = records[indices[end]]
                if batch.append(key=r.key, value=r.value, timestamp=None, headers=r.headers) is None:
                    break  # full (the first record always fits): the rest goes in the next batch
                end += 1
            batch.close()
            sent.append((await producer.send_batch(batch, topic, partition=partition), indices[start:end]))
            start = end
    for meta, indices in zip(await asyncio.gather(*(future for future, _ in sent)), (i for _, i in sent)):
        for position, index in enumerate(indices):
            offsets[index] = meta.offset + position
    return offsets


class FaustProducer:
    """``worker.Producer`` over the app's own producer (aiokafka underneath), see ``send_records``."""

    def __init__(self, app: faust.App) -> None:
        self.app = app

    async def send_all(self, records: Sequence[Record]) -> list[int]:
        trace = stagetrace.current()
        if trace is None:
            return await send_records(self.app.producer._ensure_producer(), records)
        started = time.time()
        offsets = await send_records(self.app.producer._ensure_producer(), records)
        trace.note("send", started, time.time(), trace.process, len(records))
        return offsets


# --------------------------------------------------------------------------- topics and the past
class TopicUnfit(RuntimeError):
    """A topic a process reads would lose, or has lost, records it needs; the message says which and why."""


TOPIC_EXISTS = 36
"""Kafka's TOPIC_ALREADY_EXISTS: another process made the topic first, which is no error."""


async def ensure_topics(config: BusConfig, *, reads: Sequence[str] = (), reader: str = "") -> list[str]:
    """Create every missing topic as ``Topics.specs`` says (partitions, replication, retention); the
    names created. Each topic of ``reads`` that existed already must keep every record its readers
    need (``retention_problem``), else ``TopicUnfit``; a topic the broker refuses to create is a
    ``TopicUnfit`` naming the broker's reason (a replication factor above its broker count, say)."""
    if config.idempotent:
        await producer_ids(config)
    specs = {spec.name: spec for spec in config.topics.specs(config.replication, config.min_insync)}
    admin = AIOKafkaAdminClient(**config.aiokafka())
    await admin.start()
    try:
        present = set(await admin.list_topics())
        missing = [spec for name, spec in specs.items() if name not in present]
        if missing:
            answer = await admin.create_topics([
                NewTopic(spec.name, spec.partitions, spec.replication, topic_configs=dict(spec.configs))
                for spec in missing])
            for name, code, message in (error[:3] for error in answer.topic_errors):
                if code == TOPIC_EXISTS:  # made a moment ago, by another process or a hand: its settings
                    present.add(name)     # are checked as an existing topic's (the listing had missed it)
                    missing = [spec for spec in missing if spec.name != name]
                elif code:
                    raise TopicUnfit(f"the broker would not create topic {name} (replication factor "
                                     f"{config.replication}, min.insync.replicas {config.min_insync}): "
                                     f"{message or errors.for_code(code).__name__}")
        existing = [specs[name] for name in reads if name in present and name in specs]
        if existing:
            described = await _topic_configs(admin, [spec.name for spec in existing])
            for spec in existing:
                problem = retention_problem(spec, described.get(spec.name, {}), reader or "its reader")
                if problem:
                    raise TopicUnfit(problem)
        if missing:
            await _led(admin, {spec.name for spec in missing})
        return sorted(spec.name for spec in missing)
    finally:
        await admin.close()


async def _led(admin: AIOKafkaAdminClient, names: set[str], patience: float = 30.0) -> None:
    """Until every partition of ``names`` has a leader. Apache Kafka answers CreateTopics before the
    controller has elected them: a producer that comes at once is told NotLeaderForPartition and
    retries, and a reader's first offset lookup fails the same way (Tansu's topics led at once)."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        described = {d["topic"]: d for d in await admin.describe_topics()}  # every topic: see ``topic_partitions``
        if all(name in described and not described[name]["error_code"] and described[name]["partitions"]
               and all(p["leader"] >= 0 for p in described[name]["partitions"]) for name in names):
            return
        await asyncio.sleep(0.05)


async def producer_ids(config: BusConfig, patience: float = 60.0) -> None:
    """Ask the broker for a producer id as an idempotent producer's first request does; a broker that
    cannot give one is ``TopicUnfit`` saying how to run without (else every producer would fail later,
    deep in its sender: Tansu answers InitProducerId with an unknown error)."""
    from aiokafka.client import AIOKafkaClient
    from aiokafka.protocol.transaction import InitProducerIdRequest

    client = AIOKafkaClient(**config.aiokafka())
    await client.bootstrap()
    deadline = time.monotonic() + patience
    try:
        while True:
            answer = await client.send(client.get_random_node(),
                                       InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60_000))
            if not answer.error_code or not errors.for_code(answer.error_code).retriable or time.monotonic() > deadline:
                break
            # a broker just started loads its coordinators first (CoordinatorLoadInProgress): retriable,
            # as for ``group_offset``
            await asyncio.sleep(0.2)
    finally:
        await client.close()
    if answer.error_code:
        raise TopicUnfit(f"the broker at {','.join(config.servers)} gives no producer id for idempotent "
                         f"producers ({errors.for_code(answer.error_code).__name__}); set "
                         "MUSTER_KAFKA_IDEMPOTENT=0 to run muster's producers without idempotence there")


async def _topic_configs(admin: AIOKafkaAdminClient, names: Sequence[str],
                         patience: float = 10.0) -> dict[str, dict[str, str]]:
    """Each topic's configuration as the broker reports it (Apache Kafka: every setting, defaults
    included; Tansu: those given at creation). A topic made a moment before may be unknown to the
    broker that answers (its metadata not there yet, UnknownTopicOrPartition, retriable): asked again
    for up to ``patience`` seconds before that is an answer."""
    deadline = time.monotonic() + patience
    while True:
        out: dict[str, dict[str, str]] = {}
        late: list[str] = []
        for response in await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names]):
            for code, message, _, name, entries, *_ in response.resources:
                if code and errors.for_code(code).retriable and time.monotonic() < deadline:
                    late.append(name)
                elif code:
                    raise TopicUnfit(f"the broker would not describe topic {name}: "
                                     f"{message or errors.for_code(code).__name__}")
                else:
                    out[name] = {entry[0]: entry[1] for entry in entries if entry[1] is not None}
        if not late:
            return out
        await asyncio.sleep(0.1)


async def topic_partitions(config: BusConfig, topic: str) -> list[int]:
    """The partitions of ``topic``; none while it does not exist. Asks for every topic's metadata:
    asking for one topic by name would have a broker with ``auto.create.topics.enable`` (Apache
    Kafka's default) create it with the broker's defaults instead of ``Topics.specs``."""
    admin = AIOKafkaAdminClient(**config.aiokafka())
    await admin.start()
    try:
        for described in await admin.describe_topics():
            if described["topic"] == topic and not described["error_code"]:
                return sorted(p["partition"] for p in described["partitions"])
        return []
    finally:
        await admin.close()


async def ready_to_read(config: BusConfig, topic: str, reader: str, *, group: str | None = None,
                        resume: int | None = None, replays: bool = False,
                        snapshots: SnapshotKeeper | None = None) -> None:
    """Before ``reader`` starts on partition 0 of ``topic``: the topics exist, ``topic`` keeps what
    ``reader`` needs, and what it needs is still there (``lost_records``), else ``TopicUnfit``.

    Where the reader resumes is its ``group``'s committed offset, or ``resume`` (the projector's,
    from the store); a reader that ``replays`` rebuilds from the topic's first record, any other
    needs the records from where it resumes. A service whose inbox's first records were deleted
    needs them from its latest snapshot on (``snapshots``: its keeper), if that snapshot is signed
    with its key and made by this code under this policy (``SnapshotKeeper.verify``; whether its
    state decodes is found on load, which stops the service if it does not)."""
    await ensure_topics(config, reads=[topic], reader=reader)
    tp = TopicPartition(topic, 0)
    if group is not None:
        resume = await group_offset(config, group, topic)
    consumer = AIOKafkaConsumer(**config.aiokafka(), fetch_max_wait_ms=config.fetch_wait_ms)
    await consumer.start()
    try:
        start = (await consumer.beginning_offsets([tp]))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        if resume is not None and resume > end:
            end = max(end, await _last_offset_read(consumer, tp, resume - 1) + 1)
    finally:
        await consumer.stop()
    needed_from, why = 0 if replays else (resume or 0), ""
    if replays and start > 0:
        needed_from, why = await _covered_from(snapshots)
    problem = lost_records(topic, reader, start=start, end=end, resume=resume, needed_from=needed_from, snapshot=why)
    if problem:
        raise TopicUnfit(problem)


async def _covered_from(keeper: SnapshotKeeper | None) -> tuple[int, str]:
    """The inbox offset from which ``keeper``'s latest snapshot needs the records (0 without one),
    and why there is none usable."""
    if keeper is None:
        return 0, "snapshots are off: no MUSTER_SNAPSHOT_KEY_FILE"
    try:
        loaded = await keeper.latest()
        if loaded is None:
            return 0, "there is no snapshot"
        keeper.verify(loaded.manifest, loaded.blob)
    except Exception as exc:  # noqa: BLE001 - whatever is wrong with it, it is not usable: said
        return 0, snapshot_reason(exc)
    return loaded.manifest.offset, ""


def delete_topics(config: BusConfig, *, timeout: float = 10.0) -> list[str]:
    """Delete every topic on the broker whose name starts with ``config.prefix``; the names asked for.

    For what a run or a test made under a prefix of its own. Best effort, never failing nor stalling
    the caller: errors are ignored and the exchange runs on a daemon thread bounded by ``timeout``
    (so it works with or without a running event loop); left behind, the topics are only uniquely
    named clutter."""
    prefix = config.prefix
    if not prefix:
        raise ValueError("an empty prefix would delete every topic on the broker")
    doomed: list[str] = []

    async def run() -> None:
        admin = AIOKafkaAdminClient(**config.aiokafka(), request_timeout_ms=int(timeout * 1000))
        try:
            await admin.start()
            doomed.extend(sorted(t for t in await admin.list_topics() if t.startswith(prefix)))
            if doomed:
                await admin.delete_topics(doomed, timeout_ms=int(timeout * 1000))
        finally:
            await asyncio.wait_for(admin.close(), 2.0)

    def work() -> None:
        try:
            asyncio.run(asyncio.wait_for(run(), timeout))
        except BaseException:  # noqa: BLE001 - best effort, see above
            pass

    worker = threading.Thread(target=work, name="muster-delete-topics", daemon=True)
    worker.start()
    worker.join(timeout + 3.0)
    return doomed


async def _last_offset_read(consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int,
                            patience: float = END_PATIENCE) -> int:
    """The highest offset at or past ``offset`` that a fetch from ``offset`` returns within
    ``patience`` seconds; -1 when none does (the partition ends before it).

    Asked before concluding that a partition ends before a reader's committed offset: Tansu, the test
    broker, answers a ListOffsets for the latest offset with the base offset of the last record
    batch, not the offset after its last record, so its "end" trails a reader who has read that
    batch. A record read is proof. Apache Kafka's end (the high watermark) never trails a reader:
    there this is asked only when records were truly lost, and costs ``patience`` once."""
    consumer.assign([tp])
    consumer.seek(tp, offset)
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        fetched = await consumer.getmany(tp, timeout_ms=200)
        found = [record.offset for record in fetched.get(tp, ()) if record.offset >= offset]
        if found:
            return max(found)
        if fetched.get(tp):  # reset to the start: ``offset`` is out of range
            return -1
    return -1


async def group_offset(config: BusConfig, group: str, topic: str) -> int | None:
    """Where ``group`` resumes on ``topic`` (partition 0); None when it never committed."""
    admin = AIOKafkaAdminClient(**config.aiokafka())
    await admin.start()
    try:
        while True:
            try:
                offsets = await admin.list_consumer_group_offsets(group, partitions=[TopicPartition(topic, 0)])
                break
            except (GroupCoordinatorNotAvailableError, CoordinatorLoadInProgressError, NotCoordinatorError):
                # A broker just started has no coordinator until it has made __consumer_offsets (Apache
                # Kafka takes a second or two): retriable, as Kafka's own clients treat it.
                await asyncio.sleep(0.2)
    finally:
        await admin.close()
    meta = offsets.get(TopicPartition(topic, 0))
    return meta.offset if meta is not None and meta.offset >= 0 else None


async def committed_offset(config: BusConfig, group: str, topic: str) -> int:
    """Where ``group`` resumes on ``topic`` (partition 0): 0 when it never committed."""
    return await group_offset(config, group, topic) or 0


async def cancelled(tasks: Sequence[asyncio.Future[Any]], every: float = 1.0) -> None:
    """Cancel ``tasks`` and wait until they are done, cancelling again every ``every`` seconds those that
    are not: a task can swallow a cancellation (Python 3.11's ``asyncio.wait_for`` returns its inner
    result when both finish at once, gh-86296) and go on, and a plain ``gather`` then waits for ever (a
    snapshot keeper did, under a stopping service, and held its stop up)."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=every)
    await asyncio.gather(*tasks, return_exceptions=True)  # their outcomes taken: none is left unretrieved


# --------------------------------------------------------------------------- reading in order
class InOrder:
    """What a live reader of one partition takes from each fetch: the records in offset order, none
    seen twice, none skipped.

    Muster's topics are neither compacted nor transactional, so a partition's offsets have no holes,
    yet a live consumer can be handed a later batch before an earlier one: Tansu, the test broker,
    lets a batch appended by one producer be fetched while another producer's batch at lower
    offsets is still being appended, when several producers write a partition at once (each
    request spanning several partitions, as muster's do). The consumer's position then passes the
    earlier batch and it is never delivered; a reader that comes later sees both. So at a gap the
    reader takes the records before it, seeks back to the first missing offset and fetches again;
    only a gap still there after ``patience`` seconds is taken as real (logged). Records before the
    next expected offset (fetched again after a rewind) are dropped: they were taken already.

    Apache Kafka hands a consumer only what lies below the high watermark, which moves past a batch
    once it is appended: no gap, no rewind (never "fetching again", which the bus parity tests on
    Kafka check). Kept for Tansu, which ``muster broker`` runs where Kafka is not built."""

    def __init__(self, tp: TopicPartition, next_offset: int | None = None, *, patience: float = GAP_PATIENCE,
                 name: str = "") -> None:
        self.tp = tp
        self.next = next_offset
        """The offset of the next record to take (None: whatever comes first)."""
        self.patience = patience
        self.name = name or tp.topic
        self.refetches = 0
        self._gap: tuple[int, float] | None = None

    def take(self, consumer: AIOKafkaConsumer, records: Sequence[Any]) -> list[Any]:
        taken: list[Any] = []
        for record in records:
            if self.next is not None and record.offset < self.next:
                continue
            if self.next is not None and record.offset > self.next and not self._waited_out(record.offset):
                consumer.seek(self.tp, self.next)  # drops what was fetched after it; fetch again
                self.refetches += 1
                log.info("%s: offset %d came before %d; fetching again", self.name, record.offset, self.next)
                break
            taken.append(record)
            self.next = record.offset + 1
        return taken

    def _waited_out(self, offset: int) -> bool:
        now = time.monotonic()
        if self._gap is None or self._gap[0] != self.next:
            self._gap = (self.next, now)  # type: ignore[assignment]
            return False
        if now - self._gap[1] < self.patience:
            return False
        log.warning("%s: offsets %d to %d never came; going on at %d", self.name, self.next, offset - 1, offset)
        self._gap = None
        return True


# --------------------------------------------------------------------------- one partition, read
class PartitionReader:
    """Partition 0 of one topic on a plain aiokafka consumer in group ``group``, in the app's own loop.

    ``run`` assigns itself the partition, calls ``_assigned``, then hands every batch of records, in
    offset order (``InOrder``), to ``_handle`` until it is cancelled; ``_handle`` sets ``processed``
    (the offset after what is done), which is committed every ``commit_interval`` seconds and at the
    end. A service's inbox (``InboxReader``) and ``muster run cluster``'s effects (``EffectsReader``)
    are read so.

    The group is used for its committed offsets only, never joined: a join cost seconds on every start
    (a crashed member's session more) before a record was read, and each of these topics has one
    partition read by one process (a service's Deployment runs one replica, replaced not rolled; the
    cluster link's second replica waits for its Lease before it reads). A second process started on
    the same inbox by mistake would handle the same records again: the same outputs under the same
    ids, which every reader drops, but twice the work.

    This was reverted once because the fault test then lost a workload's deletion; the deletion had
    happened while the test had the cluster link SIGKILLed, and a restarted link lists only what
    exists (docs/design/runtime.md, "Inbox readers assign their partition"). The join's wait at every
    restart had only moved the test's binds away from that kill."""

    def __init__(self, config: BusConfig, group: str, topic: str, name: str, *, batch: int = BATCH,
                 commit_interval: float = COMMIT_INTERVAL) -> None:
        self.config, self.group, self.name = config, group, name
        self.batch, self.commit_interval = batch, commit_interval
        self.tp = TopicPartition(topic, 0)
        self.processed: int | None = None
        """The offset after the last record handled (its outputs sent and acknowledged): what to commit."""
        self.committed: int | None = None
        self.commit_failures = 0
        """Commits refused in a row (they back off: ``commit_delay``)."""
        self._in_order = InOrder(self.tp, name=name)
        self._lock = asyncio.Lock()
        self._task: asyncio.Future[Any] | None = None
        self._consumer: AIOKafkaConsumer | None = None

    async def _handle(self, records: Sequence[Any]) -> None:
        raise NotImplementedError

    async def _assigned(self, consumer: AIOKafkaConsumer) -> None:
        raise NotImplementedError

    async def _fetched(self) -> None:
        """After every fetch, with records or not (at least once a second): what a reader whose
        batches finish after ``_handle`` returns does to move ``processed`` on. A failure here ends
        ``run``, as one in ``_handle`` does."""

    def _helpers(self) -> list[Awaitable[Any]]:
        """Loops that run beside the reading (the clock's), cancelled with it."""
        return []

    async def run(self) -> None:
        self._task = asyncio.current_task()
        collect_less()
        consumer = self._consumer = AIOKafkaConsumer(
            **self.config.aiokafka(), group_id=self.group, enable_auto_commit=False, auto_offset_reset="earliest",
            fetch_max_wait_ms=self.config.fetch_wait_ms)
        helpers: list[asyncio.Future[Any]] = []
        trace = stagetrace.current()  # the process started it (``service_app``, ``cluster_app``), named for itself
        try:  # stopped while it starts, it still stops its consumer
            await consumer.start()
            consumer.assign([self.tp])  # no group membership: nothing to join, no rebalance to wait out
            await self._assigned(consumer)
            probes = [trace.lag_probe()] if trace is not None else []
            helpers = [asyncio.ensure_future(helper) for helper in (self._commit_every(), *self._helpers(), *probes)]
            while True:
                fetched = await consumer.getmany(timeout_ms=1_000, max_records=self.batch)
                records = self._in_order.take(consumer, fetched.get(self.tp, ()))
                if records:
                    async with self._lock:
                        if trace is None:
                            await self._handle(records)
                        else:
                            await self._traced(trace, records)
                await self._fetched()
        finally:
            await cancelled(helpers)
            await self._commit()
            await consumer.stop()

    async def _traced(self, trace: stagetrace.StageTrace, records: Sequence[Any]) -> None:
        """``_handle``, its records' ages at the fetch and its own time noted (``stagetrace``)."""
        started = time.time()
        trace.note("fetch", started, self.name, [round(started - m.timestamp / 1000, 4) for m in records])
        await self._handle(records)
        trace.note("batch", started, time.time(), self.name, len(records))

    def lag(self) -> int:
        """Records of the partition not handled yet, as of the last fetch (0 before the first)."""
        consumer, taken = self._consumer, self._in_order.next
        high = consumer.highwater(self.tp) if consumer is not None and self.tp in consumer.assignment() else None
        return max(high - taken, 0) if high is not None and taken is not None else 0

    async def stop(self) -> None:
        task = self._task
        if task is None or task.done():
            return
        async with self._lock:  # not in the middle of a batch
            task.cancel()
        await cancelled([task])

    async def _commit(self) -> bool:
        """Commit ``processed``; False when the broker refused (logged once per failure: see
        ``_commit_every`` for how often that can be)."""
        offset, consumer = self.processed, self._consumer
        if offset is None or offset == self.committed or consumer is None:
            return True
        try:
            await consumer.commit({self.tp: offset})
        except KafkaError as exc:  # the broker away or refusing for now: the next commit catches up
            self.commit_failures += 1
            log.warning("%s: offset %d not committed (%d failures in a row; next try in %.0f s): %r", self.name,
                        offset, self.commit_failures, commit_delay(self.commit_interval, self.commit_failures), exc)
            return False
        if self.commit_failures:
            log.info("%s: offset %d committed after %d failures", self.name, offset, self.commit_failures)
        self.committed, self.commit_failures = offset, 0
        return True

    async def _commit_every(self) -> None:
        while True:
            await asyncio.sleep(commit_delay(self.commit_interval, self.commit_failures))
            await self._commit()


def commit_delay(interval: float, failures: int, cap: float = COMMIT_BACKOFF_MAX) -> float:
    """Seconds until the next commit after ``failures`` failed ones in a row: ``interval``, doubled
    per failure, at most ``cap`` (never below ``interval``)."""
    return max(interval, min(interval * 2.0 ** min(failures, 32), cap))


# --------------------------------------------------------------------------- a service
class InboxReader(PartitionReader):
    """A service's inbox (see the module docstring and ``PartitionReader``): on the first assignment
    it replays the past, then handles batches live; one inbox partition, read by one process."""

    def __init__(self, config: BusConfig, group: str, worker: InboxWorker, producer: Producer, *,
                 batch: int = BATCH, commit_interval: float = COMMIT_INTERVAL,
                 snapshots: "Snapshots | None" = None) -> None:
        super().__init__(config, group, worker.inbox, f"{worker.service.name} inbox", batch=batch,
                         commit_interval=commit_interval)
        self.worker, self.producer = worker, producer
        self.snapshots = snapshots
        """Restart from a snapshot (``shared.runtime.bus.snapshot``); None: always from the inbox's start."""
        self.ready = asyncio.Event()
        """Set once the past is replayed: live records (and the clock) may go."""
        self._replay_end: int | None = None
        self.resumed = False
        """True when this start resumed from a committed offset (the group ran before: a restart)."""
        self.on_batch: Callable[[float], None] | None = None
        """Told how long each live batch took (the batch latency metric)."""
        self._starting = False
        """True while the first assignment finds where to start: records fetched meanwhile are dropped."""
        self._assigned_at = time.perf_counter()
        self.rebuild_seconds = 0.0
        """From the inbox's assignment to ready: loading a snapshot and folding the tail (or the past)."""
        self.policy: Policy | None = None
        """The policy the service decides with, written to the log on start (``_announce``); None: not
        written (``simulate --bus``, whose driver writes the run's one)."""

    def _helpers(self) -> list[Awaitable[Any]]:
        helpers = [self._fire_timers()] if self.worker.clock is not None else []
        return helpers + ([self.snapshots.keep()] if self.snapshots is not None else [])

    def caught_up(self, within: int) -> str | None:
        """None when the past is replayed and at most ``within`` records wait; else why not (``/readyz``)."""
        if not self.ready.is_set():
            return f"rebuilding from the inbox ({self.worker.replayed} of {self._replay_end or 0} records)"
        behind = self.lag()
        return None if behind <= within else f"{behind} inbox records behind (ready at {within} or fewer)"

    async def _handle(self, records: Sequence[Any]) -> None:
        if self._starting:
            return  # fetched while the first assignment is still deciding where to start: read again
        replay_end = self._replay_end or 0
        live: list[Incoming] = []
        for m in records:
            if m.offset < replay_end:
                self.worker.replay(m.value, m.headers)
                if self.snapshots is not None and not self.snapshots.replayed(m.offset):
                    return  # the snapshot did not reproduce its outputs: replaying from the start
            else:
                live.append(Incoming(m.value, m.headers, m.partition, m.offset))
        if not self.ready.is_set() and records[-1].offset + 1 >= replay_end:
            await self._rebuilt()
        if live:
            started = time.perf_counter()
            through = await self.worker.process_batch(live, self.producer)
            if self.on_batch is not None:
                self.on_batch(time.perf_counter() - started)
            self.processed = max(live[-1].offset, through or 0) + 1
            # timers the worker fired into the inbox and handed over itself: not read twice
            self._in_order.next = max(self._in_order.next or 0, self.processed)

    async def _rebuilt(self) -> None:
        log.info("%s: rebuilt from %d inbox records; resuming at offset %d", self.worker.service.name,
                 self.worker.replayed, self._replay_end or 0)
        if self.snapshots is not None:
            self.snapshots.rebuilt()
        await self._announce()
        self.rebuild_seconds = time.perf_counter() - self._assigned_at
        self.ready.set()

    async def _announce(self) -> None:
        """Write the ``PolicyApplied`` of this start to the log, before any live record is handled and
        before any snapshot is written: the log then names the policy every later decision was made
        with, right after the last input handled before (``after``, how ``shared.audit.kafka`` lays it
        out). Not when a snapshot was loaded: its checks passed, so it was made under this policy and
        code, by a start that wrote its own event first. Sent to the log only (it is no one's input),
        outside the output digest (a replay of the inbox does not make it)."""
        if self.policy is None or (self.snapshots is not None and self.snapshots.loaded_at is not None):
            return
        worker = self.worker
        now = worker.clock.now() if worker.clock is not None else time.time()
        env = wrap(policy_applied(self.policy, (worker.service.name,), after=worker.last_handled),
                   source=worker.service.name, cause=None, index=0, at=now)
        offsets = await self.producer.send_all([envelope_record(worker.topics, worker.topics.log, env)])
        worker.log_high = max(worker.log_high, *offsets)
        log.info("%s: decides with policy %s (written to the log: %s)", worker.service.name,
                 env.payload.policy_digest, env.id)

    async def _assigned(self, consumer: AIOKafkaConsumer) -> None:
        """On start: load the latest snapshot and replay from it (or from the start) up to the
        committed offset (a second call changes nothing: the state is here)."""
        if self._replay_end is not None or self._starting:
            return
        self._starting = True
        try:
            await self._start(consumer)
        finally:
            self._starting = False

    async def _start(self, consumer: AIOKafkaConsumer) -> None:
        self._assigned_at = time.perf_counter()
        committed = await consumer.committed(self.tp) or 0
        self._replay_end = committed
        self.resumed = committed > 0
        # whether it replays or never committed, it reads from the start (or from a snapshot)
        start = (await consumer.beginning_offsets([self.tp]))[self.tp]
        if self.snapshots is not None:
            start = await self.snapshots.load(consumer, start, self._replay_end)  # may move _replay_end on
            self._replay_end = max(self._replay_end, start)
        self._in_order.next = start
        if self._replay_end > start:
            consumer.seek(self.tp, start)
        else:
            consumer.seek(self.tp, self._replay_end)
            await self._rebuilt()

    async def _fire_timers(self) -> None:
        await self.ready.wait()
        worker, clock = self.worker, self.worker.clock
        assert clock is not None
        while True:
            worker.wake.clear()
            next_at, now = clock.next_at(), clock.now()
            if next_at is not None and next_at <= now:
                await worker.fire_due(now, self.producer)
                continue
            timeout = None if next_at is None else next_at - now
            try:
                await asyncio.wait_for(worker.wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass


class ServiceApp(MusterApp):
    """A service's app: Faust runs the process and the producer, ``InboxReader`` the inbox (Faust's own
    consumer is not started: ``producer_only``)."""

    producer_only = True
    muster_reader: InboxReader | None = None

    async def on_stop(self) -> None:
        if self.muster_reader is not None:
            await self.muster_reader.stop()  # before the producer it sends with stops
        await super().on_stop()


def service_app(service: str, config: BusConfig, policy: Policy, *, ordering: Ordering = "arrival",
                sink: "SpanSink | None" = None, snapshots: SnapshotKeeper | None | Literal[False] = None) -> MusterApp:
    """The app behind ``muster run SERVICE``: group ``<prefix><service>``, one reader on its inbox.
    With a ``sink`` (tracing on) its outputs carry trace context and each hop is a span. It restarts
    from its latest snapshot (``shared.runtime.bus.snapshot``; ``snapshots`` sets how often one is written,
    False turns them off)."""
    if service not in CORE_CLASSES:
        raise ValueError(f"unknown service {service!r}: one of {', '.join(CORE_CLASSES)}")
    group = f"{config.prefix}{service}"
    app = base_app(group, config, cls=ServiceApp)
    stagetrace.start(service)
    clock = Clock() if ordering == "arrival" else None
    tracer = None
    if sink is not None:
        from shared.observability.tracing.live import HopTracer

        tracer = HopTracer(service, sink, topic=config.topics.inbox(service), group=group,
                           clock="wall" if ordering == "arrival" else "event")
    def fresh() -> tuple[Service, Arrival | Rounds]:
        return (Service(CORE_CLASSES[service](policy), traced=sink is not None,
                        dedupe_window=dedupe_window(COMMIT_INTERVAL)),
                Arrival() if ordering == "arrival" else Rounds())

    first, order = fresh()
    worker = InboxWorker(first, config.topics, order, clock=clock, tracer=tracer)
    keeper = None if snapshots is False else snapshots or SnapshotKeeper(config, service, policy)
    reader = InboxReader(config, group, worker, FaustProducer(app), commit_interval=COMMIT_INTERVAL)
    if ordering == "arrival":
        reader.policy = policy
    if keeper is not None:
        reader.snapshots = Snapshots(keeper, reader, fresh)
    app.muster_worker = worker  # type: ignore[attr-defined]
    app.muster_reader = reader  # type: ignore[attr-defined]

    @app.task
    async def read_inbox() -> None:
        await reader.run()

    return app


def run_app(app: faust.App, *, loglevel: str = "info") -> None:
    """Run one app as a Faust worker until it is stopped (SIGINT/SIGTERM)."""
    faust.Worker(app, loglevel=loglevel, quiet=True).execute_from_commandline()
