"""Restart-to-ready against history length, with and without snapshots (issue 14 §2).

For each history length N the admission service (``service_app``, in process, on a real broker)
has handled N watch events — RayJobs created and, 2 x LIVE events later, deleted, so about LIVE jobs
are alive at any time while the history grows — and stops as an operator's restart (or a crash)
would, wherever its periodic snapshot happened to be. Then it starts again on the same inbox and
committed offset: with snapshots (the default) and, up to ``FULL_REPLAY_UP_TO`` events, with them
off (a full replay, the behaviour before). The figure is the time from ``app.start()`` to ``ready``
(``/readyz`` true: the past folded), and the part of it from the inbox's assignment to ready
(``rebuild``: the snapshot loaded and the tail folded, or the whole inbox), and the records each
start replayed. With snapshots the time follows the tail (bounded by ``EVERY_RECORDS`` records and
``INTERVAL`` seconds of work) and the live state, so it stays flat as N grows; without, it grows
with N.

How the N events came to be handled (``how`` in each row):

- ``live`` (N up to ``LIVE_UP_TO``): the service ran and handled them from its inbox, writing its
  outputs and its snapshots as it does in production, then stopped.
- ``folded`` (larger N): handling a million events live on this machine takes an hour, so the
  service's own fold (``InboxWorker.replay``, what a restart runs) folds them without a broker in
  between, and its ``SnapshotKeeper`` writes the snapshot ``EVERY_RECORDS`` records before the end
  (the longest tail the record bound allows), the checkpoint at the end, and the group commits N:
  what a service that handled them live leaves behind, bar the outputs it sent (a restart does not
  read them).

The inbox is filled from two encoded templates (a watch event adding and deleting a RayJob) with
each record's id, name and time written in, so that producing a million records takes seconds.

    python -m bench.restart_bench [N ...]
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time
import uuid
from contextlib import ExitStack
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.soak_bench import rayjob
from services.reconciler.ingest import observe
from shared.kernel.events import wrap
from shared.kernel.policy import Policy
from shared.parts.kafka import broker_for
from shared.runtime.bus import codec
from shared.runtime.bus.app import BATCH_BYTES, delete_topics, ensure_topics, send_records, service_app
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.driver import EventLoopThread
from shared.runtime.bus.snapshot import EVERY_RECORDS, GENESIS, INTERVAL, SnapshotKeeper, capture
from shared.runtime.bus.worker import Record, envelope_record

SIZES = (5_000, 50_000, 200_000, 1_000_000)
LIVE = 200
LIVE_UP_TO = 50_000
FULL_REPLAY_UP_TO = 50_000
TARGET_SECONDS = 5.0
T0 = 1_700_000_000.0
TOKEN = 987_654_321
"""The job number in the templates, replaced by each record's."""


def _job(i: int) -> tuple[str, int]:
    """The ``i``th event: LIVE jobs created, then one created and the oldest deleted, by turns."""
    if i < LIVE:
        return "Added", i
    j = i - LIVE
    return ("Added", LIVE + j // 2) if j % 2 == 0 else ("Deleted", j // 2)


class History:
    """The inbox records of N watch events, written into two encoded templates (see the docstring)."""

    def __init__(self, topics: Any) -> None:
        self.topics, self.inbox = topics, topics.inbox("admission")
        self.templates = {}
        for change in ("Added", "Deleted"):
            env = wrap(observe(change, rayjob(TOKEN, 600)), source="ingest", cause=None, index=0, at=T0)
            record = envelope_record(topics, self.inbox, env)
            value = record.value.replace(env.id.encode(), b"%(id)s").replace(str(TOKEN).encode(), b"%(n)d")
            value = value.replace(b'"occurred_at":%s' % repr(T0).encode(), b'"occurred_at":%(at)s')
            self.templates[change] = (value.replace(b"%(", b"\0(").replace(b"%", b"%%").replace(b"\0(", b"%("),
                                      record.headers)
        self._check()

    def record(self, i: int) -> Record:
        change, n = _job(i)
        template, headers = self.templates[change]
        event_id = hashlib.blake2b(b"restart-bench:%d" % i, digest_size=12).hexdigest()
        value = template % {b"id": event_id.encode(), b"n": n, b"at": repr(T0 + i * 0.01).encode()}
        return Record(self.inbox, b"RayJob/soak/job-%d" % n, value, headers)

    def _check(self) -> None:
        """A record written so decodes to the envelope it says, and encodes back to the same bytes."""
        for i in (0, LIVE + 1):
            record = self.record(i)
            env = codec.decode(record.value, record.headers)
            change, n = _job(i)
            assert env.payload.change == change and env.payload.name == f"job-{n}" and env.occurred_at == T0 + i * 0.01
            assert codec.encode(env) == record.value, "a bench record is not written as muster writes it"


async def _fill(config: BusConfig, n: int) -> None:
    producer = AIOKafkaProducer(**config.producing(), max_batch_size=BATCH_BYTES, linger_ms=5)
    await producer.start()
    try:
        history = History(config.topics)
        for start in range(0, n, 10_000):
            await send_records(producer, [history.record(i) for i in range(start, min(start + 10_000, n))])
    finally:
        await producer.stop()


async def _fold(config: BusConfig, n: int) -> float:
    """Handle the ``n`` events as the service's own fold does and leave what it would: its snapshot
    ``EVERY_RECORDS`` before the end, a checkpoint at the end, the group's offset at ``n``. Seconds taken."""
    started = time.perf_counter()
    app = service_app("admission", config, Policy())  # never started: its worker is the one a start builds
    worker = app.muster_worker
    worker.digest = GENESIS
    history = History(config.topics)
    keeper = SnapshotKeeper(config, "admission", Policy())
    snapshot_at = max(n - EVERY_RECORDS, 1)
    try:
        for i in range(n):
            record = history.record(i)
            worker.replay(record.value, record.headers)
            if i + 1 == snapshot_at:
                await keeper.write(capture(worker), snapshot_at, worker.digest)
        await keeper.checkpoint(n, worker.digest)
    finally:
        await keeper.close()
    consumer = AIOKafkaConsumer(**config.aiokafka(), group_id=f"{config.prefix}admission", enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(config.topics.inbox("admission"), 0)
        consumer.assign([tp])
        await consumer.commit({tp: n})
    finally:
        await consumer.stop()
    return time.perf_counter() - started


def _start(config: BusConfig, bus: EventLoopThread, *, snapshots: bool, until: int | None = None) -> tuple[Any, float]:
    app = service_app("admission", config, Policy(), snapshots=None if snapshots else False)
    started = time.perf_counter()
    bus.run(app.start(), timeout=120)
    reader = app.muster_reader

    async def ready() -> None:
        await reader.ready.wait()
        while until is not None and (reader.processed or 0) < until:
            await asyncio.sleep(0.05)

    bus.run(ready(), timeout=3600)
    return app, time.perf_counter() - started


def one(bootstrap: str, n: int) -> dict[str, Any]:
    config = BusConfig(bootstrap, prefix=f"bench.restart.{uuid.uuid4().hex[:8]}.")
    bus = EventLoopThread()
    try:
        bus.run(ensure_topics(config))
        started = time.perf_counter()
        bus.run(_fill(config, n), timeout=3600)
        row: dict[str, Any] = {"events": n, "fill_seconds": round(time.perf_counter() - started, 1)}
        if n <= LIVE_UP_TO:
            app, handled_in = _start(config, bus, snapshots=True, until=n)
            bus.run(app.stop(), timeout=60)
            row.update(how="live", handled_seconds=round(handled_in, 1))
        else:
            row.update(how="folded", handled_seconds=round(bus.run(_fold(config, n), timeout=7200), 1))
        for mode, on in (("snapshot", True), ("full_replay", False)):
            if not on and n > FULL_REPLAY_UP_TO:
                continue
            app, seconds = _start(config, bus, snapshots=on)
            reader = app.muster_reader
            row[f"{mode}_ready_seconds"] = round(seconds, 2)
            row[f"{mode}_rebuild_seconds"] = round(reader.rebuild_seconds, 2)
            row[f"{mode}_replayed"] = app.muster_worker.replayed
            if on:
                row["snapshot_offset"] = reader.snapshots.loaded_at
                row["snapshot_read_seconds"], row["snapshot_decode_seconds"] = (
                    round(x, 2) for x in reader.snapshots.load_seconds)
                row["fallbacks"] = reader.snapshots.keeper.fallbacks
            bus.run(app.stop(), timeout=60)
        return row
    finally:
        bus.close()
        delete_topics(config)


def run(sizes: tuple[int, ...] = SIZES) -> dict[str, Any]:
    given = os.environ.get("MUSTER_BENCH_KAFKA")
    with ExitStack() as stack:
        bootstrap, broker = broker_for(stack, given)
        rows = []
        for n in sizes:
            print(f"  restart: {n} events ...", flush=True)
            rows.append(one(bootstrap, n))
    return {"broker": broker,
            "snapshot_every_records": EVERY_RECORDS, "snapshot_interval_seconds": INTERVAL,
            "target_ready_seconds": TARGET_SECONDS, "restarts": rows}


if __name__ == "__main__":
    print(json.dumps(run(tuple(int(a) for a in sys.argv[1:]) or SIZES), indent=2))
