"""The Faust wiring: each service is a Faust app with one agent on its one inbox.

``service_app(name, ...)`` is the one wiring for all four services; ``muster run NAME`` runs it as
a Faust worker. The agent does no scheduling: it rebuilds the worker from the inbox's past
(``replay``), then feeds it the records in batches (``InboxWorker.process_batch``), while a second
task fires the service's due timers into its own inbox. Faust commits a batch's offsets once the
agent has handled it, i.e. after its outputs were acknowledged by the broker.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from pathlib import Path
from typing import Any, AsyncIterator, Literal, Sequence

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from faust.transport.drivers import aiokafka as faust_aiokafka

from shared.bus.config import BusConfig
from shared.bus.sequencing import Arrival, Rounds
from shared.bus.worker import Clock, InboxWorker, Incoming, Record
from shared.embedded import CORE_CLASSES
from shared.policy import Policy
from shared.service import Service

log = logging.getLogger("muster.bus")

Ordering = Literal["arrival", "rounds"]

BATCH, BATCH_WAIT = 1_000, 0.002
"""A worker takes what its inbox holds, up to ``BATCH`` records, waiting at most ``BATCH_WAIT``
seconds for more: a burst is handled and sent in a few round trips to the broker, a lone record
waits 2 ms."""


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


class _Transport(faust_aiokafka.Transport):
    Consumer = _Consumer


class MusterApp(faust.App):
    """A Faust app on muster's transport (everything else is stock Faust)."""

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)


def base_app(app_id: str, config: BusConfig) -> MusterApp:
    """A Faust app that joins its group within seconds and declares no topics of its own. Its data
    folder (Faust keeps table state there; muster has no tables) goes under the temp folder, not
    into the working directory."""
    datadir = Path(tempfile.gettempdir()) / "muster-faust"
    datadir.mkdir(parents=True, exist_ok=True)
    app = MusterApp(
        app_id, **config.faust(), datadir=str(datadir / app_id),
        web_enabled=False, topic_disable_leader=True, topic_allow_declare=False,
        consumer_auto_offset_reset="earliest", key_serializer="raw", value_serializer="raw",
        broker_rebalance_timeout=2, broker_session_timeout=6, broker_heartbeat_interval=1,
        broker_commit_interval=1.0, stream_wait_empty=False,
    )
    app.conf.muster_fetch_wait_ms = config.fetch_wait_ms
    return app


class FaustProducer:
    """``worker.Producer`` over the app's own producer."""

    def __init__(self, app: faust.App) -> None:
        self.app = app

    async def send_all(self, records: Sequence[Record]) -> list[int]:
        pending = [await self.app.producer.send(r.topic, r.key, r.value, None, None, r.headers) for r in records]
        return [meta.offset for meta in await asyncio.gather(*pending)]


# --------------------------------------------------------------------------- topics and the past
async def ensure_topics(config: BusConfig) -> list[str]:
    """Create every missing topic with its partition count; the names created."""
    admin = AIOKafkaAdminClient(**config.aiokafka())
    await admin.start()
    try:
        present = set(await admin.list_topics())
        missing = {name: n for name, n in config.topics.partitions().items() if name not in present}
        if missing:
            await admin.create_topics([NewTopic(name, n, 1) for name, n in missing.items()])
        return sorted(missing)
    finally:
        await admin.close()


async def committed_offset(config: BusConfig, group: str, topic: str) -> int:
    """Where ``group`` resumes on ``topic`` (partition 0): 0 when it never committed."""
    admin = AIOKafkaAdminClient(**config.aiokafka())
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group, partitions=[TopicPartition(topic, 0)])
    finally:
        await admin.close()
    meta = offsets.get(TopicPartition(topic, 0))
    return max(meta.offset, 0) if meta is not None else 0


async def read_range(config: BusConfig, topic: str, end: int) -> AsyncIterator[Any]:
    """Records of ``topic`` (partition 0) from its start up to ``end`` (exclusive)."""
    if end <= 0:
        return
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(**config.aiokafka(), enable_auto_commit=False, fetch_max_wait_ms=config.fetch_wait_ms)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        while True:
            batch = await consumer.getmany(tp, timeout_ms=1000, max_records=5000)
            for message in batch.get(tp, ()):
                if message.offset >= end:
                    return
                yield message
            if await consumer.position(tp) >= end:
                return
    finally:
        await consumer.stop()


# --------------------------------------------------------------------------- a service
def service_app(service: str, config: BusConfig, policy: Policy, *, ordering: Ordering = "arrival") -> MusterApp:
    """The app behind ``muster run SERVICE``: group ``<prefix><service>``, one agent on its inbox."""
    if service not in CORE_CLASSES:
        raise ValueError(f"unknown service {service!r}: one of {', '.join(CORE_CLASSES)}")
    group = f"{config.prefix}{service}"
    app = base_app(group, config)
    clock = Clock() if ordering == "arrival" else None
    worker = InboxWorker(Service(CORE_CLASSES[service](policy)), config.topics,
                         Arrival() if ordering == "arrival" else Rounds(), clock=clock)
    app.muster_worker = worker  # type: ignore[attr-defined]
    producer = FaustProducer(app)
    inbox = app.topic(worker.inbox, key_type=bytes, value_type=bytes)
    ready = asyncio.Event()

    @app.agent(inbox, name=f"{service}-inbox", concurrency=1)
    async def handle(stream: faust.StreamT) -> None:
        resume = await committed_offset(config, group, worker.inbox)
        async for message in read_range(config, worker.inbox, resume):
            worker.replay(message.value, message.headers)
        log.info("%s: rebuilt from %d inbox records; resuming at offset %d", service, worker.replayed, resume)
        ready.set()
        async for events in stream.take_events(BATCH, within=BATCH_WAIT):
            await worker.process_batch([Incoming(e.message.value, list(e.message.headers or ()), e.message.partition,
                                                 e.message.offset) for e in events], producer)

    if clock is not None:
        @app.task
        async def fire_timers() -> None:
            await ready.wait()
            while True:
                worker.wake.clear()
                next_at = clock.next_at()
                if next_at is not None and next_at <= time.time():
                    await worker.fire_due(time.time(), producer)
                    continue
                timeout = None if next_at is None else next_at - time.time()
                try:
                    await asyncio.wait_for(worker.wake.wait(), timeout)
                except asyncio.TimeoutError:
                    pass

    return app


def run_app(app: faust.App, *, loglevel: str = "info") -> None:
    """Run one app as a Faust worker until it is stopped (SIGINT/SIGTERM)."""
    faust.Worker(app, loglevel=loglevel, quiet=True).execute_from_commandline()
