"""The projection writer: 100,000 events of a simulated run replayed into Postgres (and SQLite).

The log comes from ``muster simulate`` on a generated scenario (RayJobs of a head and 4 workers
arriving every 100 ms on 1,000 nodes, each running 30-120 s, so capacity never runs out): the real
mix of watch events with whole pod objects, effects, placements and timers. Generating it takes
about half a minute and is not measured. The input log is kept out of the garbage collector's way
(``gc.freeze``): a projector reading Kafka never holds its whole input in memory, and collections
over it are not its cost.

Postgres: ``MUSTER_BENCH_POSTGRES`` (a server URL), else the local server at 127.0.0.1:5432; the
benchmark creates a database of its own and drops it. Figures only, never asserted.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
import uuid
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import yaml

from shared.history import schema
from shared.history.writer import ProjectionWriter, write_log
from shared.kernel.events import Envelope
from shared.runtime.simulate import simulate
from shared.sim.scenario import parse_scenario

EVENTS = 100_000
BATCH = 10_000
TARGET = 20_000


def generated_scenario(nodes: int = 1000, jobs: int = 1750, workers: int = 4, queues: int = 4, *,
                       every: float = 0.1, shutdown: bool = False, name: str = "projector-bench") -> str:
    """Volcano queues, RayJobs of a head and ``workers`` workers arriving every ``every`` seconds, each
    running 30-120 s; with ``shutdown`` a finished job's cluster goes away, freeing its nodes."""
    docs = [{"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": f"team-{i}"},
             "spec": {"weight": 1}} for i in range(queues)]
    steps: list[dict[str, Any]] = [{"at": "0s", "apply": yaml.safe_dump_all(docs)}]
    for n in range(jobs):
        job = {"apiVersion": "ray.io/v1", "kind": "RayJob",
               "metadata": {"name": f"job-{n}", "namespace": "bench",
                            "labels": {"volcano.sh/queue-name": f"team-{n % queues}"},
                            "annotations": {"muster.dev/sim-duration": f"{30 + (n * 7) % 90}s"}},
               "spec": {"entrypoint": "python train.py", **({"shutdownAfterJobFinishes": True} if shutdown else {}),
                        "rayClusterSpec": {
                   "headGroupSpec": {"template": {"spec": {"containers": [
                       {"name": "ray-head", "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}]}}},
                   "workerGroupSpecs": [{"groupName": "worker", "replicas": workers, "template": {"spec": {
                       "containers": [{"name": "ray-worker",
                                       "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}]}}}]}}}
        steps.append({"at": f"{1 + n * every:.2f}s", "apply": yaml.safe_dump(job)})
    return yaml.safe_dump({"name": name, "until": f"{jobs * every + 200:.0f}s",
                           "cluster": {"nodes": [{"count": nodes, "name_prefix": "node-",
                                                  "capacity": {"cpu": "32", "memory": "128Gi", "pods": "110"}}]},
                           "steps": steps})


def event_log(events: int = EVENTS) -> list[Envelope]:
    log = simulate(parse_scenario(generated_scenario(), origin="generated")).runtime.log
    if len(log) < events:
        raise RuntimeError(f"the generated run has {len(log)} events, fewer than {events}")
    return log[:events]


def _timed_write(url: str, log: Sequence[Envelope], *, pipelined: bool) -> tuple[float, float, int]:
    """Seconds to write the log, seconds to write it all again (every envelope skipped), rows."""
    schema.upgrade(url)
    with ProjectionWriter(url) as writer:
        started = time.perf_counter()
        if pipelined:
            counts = write_log(writer, log, batch_size=BATCH)
        else:
            for i in range(0, len(log), BATCH):
                writer.write(log[i:i + BATCH])
        first = time.perf_counter() - started
        started = time.perf_counter()
        again = write_log(writer, log, batch_size=BATCH)
        redelivered = time.perf_counter() - started
    assert again.events == 0
    return first, redelivered, counts.events if pipelined else len(log)


class NoPostgres(RuntimeError):
    """No PostgreSQL answers where the benchmark looks for one."""


@contextmanager
def postgres_database() -> Iterator[str]:
    """A database of the benchmark's own on ``MUSTER_BENCH_POSTGRES`` (else 127.0.0.1:5432), dropped after."""
    import psycopg
    from sqlalchemy.engine import make_url

    server = make_url(os.environ.get("MUSTER_BENCH_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"))
    if server.drivername in ("postgresql", "postgres"):
        server = server.set(drivername="postgresql+psycopg")

    def admin() -> psycopg.Connection:
        return psycopg.connect(host=server.host or "127.0.0.1", port=server.port or 5432, user=server.username,
                               password=server.password, dbname=server.database or "postgres", autocommit=True,
                               connect_timeout=5)

    try:
        admin().close()
    except psycopg.Error as exc:
        raise NoPostgres(f"no PostgreSQL at {server.render_as_string(hide_password=True)}: "
                         f"{str(exc).strip().splitlines()[0]}") from None
    name = f"muster_bench_{uuid.uuid4().hex[:8]}"
    with admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _postgres(log: Sequence[Envelope]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    try:
        for mode, pipelined in (("", True), ("_one_at_a_time", False)):
            with postgres_database() as url:
                first, again, _ = _timed_write(url, log, pipelined=pipelined)
            figures[f"projector_postgres{mode}_seconds"] = round(first, 2)
            figures[f"projector_postgres{mode}_events_per_second"] = round(len(log) / first)
            if pipelined:
                figures["projector_postgres_redelivered_events_per_second"] = round(len(log) / again)
    except NoPostgres as exc:
        return {"projector_postgres_skipped": str(exc)}
    return figures


def _records(log: Sequence[Envelope]) -> tuple[Any, list[Any]]:
    """The log as the Kafka projector reads it, encoded beforehand (not measured): the topics, and the
    log topic's records."""
    from collections import namedtuple

    from shared.runtime.bus import codec
    from shared.runtime.bus.topics import Topics

    topics = Topics()
    read = namedtuple("read", "topic partition offset value headers")
    return topics, [read(topics.log, 0, i, codec.encode(env), codec.envelope_headers(env)) for i, env in enumerate(log)]


def _projected(topics: Any, records: Sequence[Any], batch: int, *, chained: bool = True,
               signer: Any = None) -> float:
    """Seconds of the Kafka projector's own work on ``records``, in a database of its own: each batch of
    ``batch`` decoded and written as ``LogProjector`` does it (``chained`` and ``signer`` as the writer
    takes them). ``NoPostgres`` when no server answers."""
    from shared.history.writer import gc_paused
    from shared.runtime.bus.projector import LogProjector

    with postgres_database() as url:
        schema.upgrade(url)
        # collection held off, as a busy projector holds it
        with ProjectionWriter(url, chained=chained, signer=signer) as writer, gc_paused():
            projector = LogProjector(topics, writer)
            started = time.perf_counter()
            for i in range(0, len(records), batch):
                projector.put(projector.decode(records[i:i + batch]))
            projector.close()
            return time.perf_counter() - started


def _from_records(log: Sequence[Envelope], batch: int = 6_000) -> dict[str, Any]:
    """The Kafka projector's own work without Kafka: the log as records (encoded beforehand), each
    batch decoded and written as ``LogProjector`` does it (``batch``: what a fetch from Tansu holds).
    Between this and ``projector_postgres`` is the cost of decoding; below this, the broker's."""
    try:
        seconds = _projected(*_records(log), batch)
    except NoPostgres as exc:
        return {"projector_from_records_skipped": str(exc)}
    return {"projector_from_records_seconds": round(seconds, 2),
            "projector_from_records_events_per_second": round(len(log) / seconds)}


def _chain_cost(log: Sequence[Envelope], batch: int = 6_000, rounds: int = 3) -> dict[str, Any]:
    """What the hash chain and its signed checkpoints cost the Kafka projector: ``_from_records`` with
    and without them, in the same run, alternating (``rounds`` each), as a ratio of the best of each
    (and each round's own ratio: on a shared machine the load moves more than the chain costs).
    Chained, every envelope's record bytes are hashed (SHA-256) and a checkpoint signed (Ed25519) every
    ``CHECKPOINT_EVERY`` envelopes, its key record and checkpoints written in the batches' transactions."""
    from shared.history.integrity import CHECKPOINT_EVERY, GENESIS, Signer, link

    topics, records = _records(log)
    best: dict[bool, float] = {}
    ratios: list[float] = []
    plain_round = 0.0
    try:
        for _ in range(rounds):
            for chained in (False, True):
                seconds = _projected(topics, records, batch, chained=chained,
                                     signer=Signer.generate() if chained else None)
                best[chained] = min(seconds, best.get(chained, seconds))
                if chained:
                    ratios.append(round(seconds / plain_round, 3))
                else:
                    plain_round = seconds
    except NoPostgres as exc:
        return {"projector_chain_skipped": str(exc)}
    plain, chained_s = best[False], best[True]
    started = time.perf_counter()  # the chain's own work, alone: what the load cannot blur
    value = GENESIS
    for r in records:
        value = link(value, r.value)
    hashing = time.perf_counter() - started
    return {"projector_chain_hash_seconds": round(hashing, 3),
            "projector_chain_hash_share": round(hashing / plain, 3),
            "projector_unchained_events_per_second": round(len(log) / plain),
            "projector_chained_events_per_second": round(len(log) / chained_s),
            "projector_chain_checkpoint_every": CHECKPOINT_EVERY,
            "projector_chain_cost_ratio": round(chained_s / plain, 3),
            "projector_chain_cost_ratio_per_round": ratios}


def _sqlite(log: Sequence[Envelope]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'history.db'}"
        first, again, _ = _timed_write(url, log, pipelined=False)
    return {"projector_sqlite_seconds": round(first, 2),
            "projector_sqlite_events_per_second": round(len(log) / first),
            "projector_sqlite_redelivered_events_per_second": round(len(log) / again)}


def run(events: int = EVENTS) -> dict[str, Any]:
    started = time.perf_counter()
    log = event_log(events)
    generated = time.perf_counter() - started
    gc.collect()
    gc.freeze()
    try:
        figures: dict[str, Any] = {"projector_events": len(log), "projector_batch_size": BATCH,
                                   "projector_target_events_per_second": TARGET,
                                   "projector_generate_seconds": round(generated, 1)}
        figures.update(_postgres(log))
        figures.update(_from_records(log))
        figures.update(_chain_cost(log))
        figures.update(_sqlite(log))
    finally:
        gc.unfreeze()
    return figures


def chain_only(events: int = EVENTS) -> dict[str, Any]:
    """Only the chain's cost (``python -m bench.projector_bench chain``)."""
    log = event_log(events)
    gc.collect()
    gc.freeze()
    try:
        return {"projector_events": len(log), **_chain_cost(log)}
    finally:
        gc.unfreeze()


if __name__ == "__main__":
    import sys

    print(chain_only() if sys.argv[1:] == ["chain"] else run())
