"""The distributed stack's figures: services and projector as Faust apps on a Kafka-protocol broker.

- ``decision`` (``decision_pods_per_second``): the 2,000-node generated scenario's inputs (nodes,
  queues, 1,000 RayClusters and their 9,000 pending pods, as the simulated cluster's watch stream
  gives them) written into the inboxes (and the log) at once, batched as every muster producer
  sends (``send_records``), encoded before the clock starts; admission, queue and placement
  (``muster run`` apps, arrival order, wall clock) decide. Span: from the first write of a watch
  event until the log holds a bind decision (``PodAssigned``) for every pod — no reconciler, no
  binding, no API server (``e2e_bench`` measures those).
- ``latency``: RayClusters (with their pods) submitted at a steady 50 per second on an empty
  cluster; per workload, the time from writing its watch event to reading its ``GangPlaced`` back
  from the log (a decision, as above).

Each of the two is run ``RUNS`` times on fresh topics and apps: the median, with the spread.

The log reader decodes only the records it waits for (it tells them by their ``muster-type``
header): it shares the services' core, and decoding all 40,000 envelopes would be its own load.
- ``projector``: 100,000 envelopes of a simulated run written to the log topic; ``muster run
  projector``, a process of its own, replays them into PostgreSQL; measured from its first read
  until the store's consumed offset reaches the end.
- ``tracing``: the decision run again, ``TRACING_RUNS`` rounds of three runs in turn: without the
  tracing hooks (the worker's and the service's checks taken out, ``_no_tracing_hooks``), tracing
  off (the hooks present, no exporter: what every deployment without ``OTEL_*`` pays), and tracing
  on (every hop a span, exported over OTLP/HTTP to ``bench/null_collector.py``, a process of its
  own); the medians, and what off and on cost as the median of the per-round ratios (pairs run
  back to back, so the machine's drift cancels). Issue 13's target: off costs < 2%.

The services run as tasks in this one process (one core for all of their Python), on an Apache
Kafka broker of the bench's own (``make tools`` builds it) unless ``MUSTER_BENCH_KAFKA`` names one; Postgres as in projector_bench.
Figures only, never asserted.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import subprocess
import sys
import threading
import time
import uuid
from contextlib import ExitStack, asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Callable, Iterable, Iterator, Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench import projector_bench, scenario_bench
from bench.stats import percentile, spread
from shared.kernel.events import Envelope, wrap
from shared.kernel.policy import Policy
from shared.kernel.topology import destinations
from shared.parts.kafka import broker_for
from shared.runtime.bus import codec
from shared.runtime.bus.app import BATCH_BYTES, InOrder, ensure_topics, send_records, service_app
from shared.runtime.bus.codec import Release
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.driver import AioProducer, EventLoopThread, gather_all, wait_for_projector
from shared.runtime.bus.worker import Record, envelope_record
from shared.runtime.simulate import simulate
from shared.sim.scenario import parse_scenario

DECIDERS = ("admission", "queue", "placement")


def _inputs(log: Iterable[Envelope]) -> list[Envelope]:
    """The watch events that do not depend on any decision: objects as their owners created them."""
    return [e for e in log if e.source == "ingest" and e.payload.change == "Added"
            and (e.payload.kind != "Pod" or not (e.payload.object.get("spec") or {}).get("nodeName"))]


def _records(config: BusConfig, envs: Iterable[Envelope]) -> list[Record]:
    """Watch events as ingest writes them: to the log, then to each inbox they are routed to."""
    topics, out = config.topics, []
    for env in envs:
        out.append(envelope_record(topics, topics.log, env))
        out.extend(envelope_record(topics, topics.inbox(dest), env) for dest in destinations(env))
    return out


@asynccontextmanager
async def _log_reader(config: BusConfig) -> AsyncIterator[tuple[AIOKafkaConsumer, TopicPartition]]:
    """A consumer on the log topic, from its start."""
    tp = TopicPartition(config.topics.log, 0)
    consumer = AIOKafkaConsumer(**config.aiokafka(), enable_auto_commit=False, fetch_max_wait_ms=config.fetch_wait_ms,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        yield consumer, tp
    finally:
        await consumer.stop()


async def _tail(config: BusConfig, types: frozenset[str], until: Callable[[Envelope, float], bool],
                timeout: float) -> None:
    """Read the log as it grows, calling ``until(envelope, arrival time)`` for the envelopes of
    ``types`` until it says stop."""
    deadline = time.monotonic() + timeout
    wanted = {t.encode() for t in types}
    async with _log_reader(config) as (consumer, tp):
        in_order = InOrder(tp, 0)  # a live reader of a log several producers write (see InOrder)
        while time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=200, max_records=20_000)
            now = time.perf_counter()
            for message in in_order.take(consumer, batch.get(tp, ())):
                if dict(message.headers or ()).get(codec.TYPE_HEADER) not in wanted:
                    continue
                env = codec.decode(message.value, message.headers)
                if isinstance(env, Envelope) and until(env, now):
                    return
    raise TimeoutError(f"the log did not show what was awaited within {timeout:g}s")


async def _settle(config: BusConfig, quiet: float = 2.0, timeout: float = 600.0) -> None:
    """Until the log has not grown for ``quiet`` seconds: the services have nothing left to do."""
    deadline = time.monotonic() + timeout
    last = time.monotonic()
    async with _log_reader(config) as (consumer, tp):
        while time.monotonic() - last < quiet and time.monotonic() < deadline:
            if (await consumer.getmany(tp, timeout_ms=200, max_records=20_000)).get(tp):
                last = time.monotonic()


class _Feed(AioProducer):
    """The bench's ingest: it sends as every muster producer does (``send_records``)."""

    async def start(self) -> None:
        self.producer = AIOKafkaProducer(**self.config.producing(), linger_ms=0, max_batch_size=BATCH_BYTES)
        await self.producer.start()

    async def send_all(self, records: Sequence[Record]) -> list[int]:
        return await send_records(self.producer, records)


@functools.lru_cache(maxsize=1)
def _policy() -> Policy:
    """The generated scenario's policy, as ``muster simulate`` runs it: muster also answers to the
    scheduler name the simulated KubeRay gives its pods (``volcano`` for these Volcano-labelled
    RayClusters); with bare ``Policy()`` placement counts them as another scheduler's and binds none."""
    return parse_scenario(scenario_bench.generated_scenario(nodes=1, clusters=1), origin="generated").effective_policy()


@contextmanager
def _deciders(config: BusConfig, sink: Any = None) -> Iterator[tuple[EventLoopThread, AioProducer]]:
    """Admission, queue and placement as `muster run` apps (arrival order, wall clock) on a loop
    thread, and a producer to feed their inboxes; all stopped afterwards. With ``sink`` they trace."""
    from shared.observability.metrics.server import service_exposition

    bus = EventLoopThread()
    apps = [service_app(name, config, _policy(), sink=sink) for name in DECIDERS]
    for name, app in zip(DECIDERS, apps):
        service_exposition(app, name)  # as `muster run` has them: the queue's metrics fold watches its inbox
    producer = _Feed(config)
    try:
        bus.run(ensure_topics(config))
        bus.run(gather_all(app.start() for app in apps), timeout=120)
        # joined their groups and rebuilt from their (empty) inboxes: what follows is deciding only
        bus.run(gather_all(app.muster_reader.ready.wait() for app in apps), timeout=120)
        bus.run(producer.start())
        try:
            yield bus, producer
        finally:
            bus.run(producer.stop())
    finally:
        bus.run(gather_all(app.stop() for app in apps), timeout=60)
        bus.close()


RUNS = 3
"""Runs of each figure; the median is quoted, with the spread (see ``bench.stats``)."""


def _decision_inputs() -> list[Envelope]:
    """The 2,000-node scenario's watch events that depend on no decision."""
    scenario = parse_scenario(scenario_bench.generated_scenario(), origin="generated")
    return _inputs(simulate(scenario).runtime.log)


def throughput(bootstrap: str, runs: int = RUNS) -> dict[str, Any]:
    """``decision_pods_per_second``: watch events in → a bind decision for every pod in the log."""
    inputs = _decision_inputs()
    walls, bound = [], []
    for _ in range(runs):
        wall, pods = _decide_all(bootstrap, inputs)
        walls.append(wall)
        bound.append(pods)
    wall = spread(walls)
    return {"decision_span": "watch events written to the inboxes -> a PodAssigned (bind decision) in the log "
                             "for every pod; admission, queue and placement, no reconciler, binding or API server",
            "decision_nodes": 2000, "decision_rayclusters": 1000, "decision_pods_bound": min(bound),
            "decision_wall_seconds": wall,
            "decision_pods_per_second": spread([p / w for p, w in zip(bound, walls)], 1),
            "decision_target_pods_per_second": 3000}


def _decide_all(bootstrap: str, inputs: list[Envelope], sink: Any = None) -> tuple[float, int]:
    """One decision run on fresh topics and apps (tracing with ``sink``): (wall seconds, pods with a
    bind decision)."""
    pods = sum(1 for e in inputs if e.payload.kind == "Pod")
    config = BusConfig(bootstrap, prefix=f"bench.{uuid.uuid4().hex[:8]}.")
    with _deciders(config, sink) as (bus, producer):
        assigned: set[str] = set()

        def all_bound(env: Envelope, _: float) -> bool:
            if env.type == "PodAssigned":
                assigned.add(env.payload.pod)
            return len(assigned) >= pods

        records = _records(config, inputs)
        with _frozen():
            started = time.perf_counter()
            bus.run(producer.send_all(records))
            bus.run(_tail(config, frozenset({"PodAssigned"}), all_bound, timeout=900))
            wall = time.perf_counter() - started
    return wall, len(assigned)


def latency(bootstrap: str, rate: float = 50.0, workloads: int = 500, runs: int = RUNS) -> dict[str, Any]:
    """Watch event written → ``GangPlaced`` read back, per workload, at ``rate`` workloads a second."""
    scenario = parse_scenario(scenario_bench.generated_scenario(clusters=workloads), origin="generated")
    inputs = _inputs(simulate(scenario).runtime.log)
    p50s, p99s, counted = [], [], []
    for _ in range(runs):
        waits = _latencies(bootstrap, inputs, rate)
        p50s.append(percentile(waits, 0.50))
        p99s.append(percentile(waits, 0.99))
        counted.append(len(waits))
    return {"latency_span": "a RayCluster's watch event written -> its GangPlaced read back from the log, "
                            "on an empty cluster", "latency_rate_per_second": rate,
            "latency_workloads": min(counted), "latency_p50_ms": spread(p50s, 1), "latency_p99_ms": spread(p99s, 1),
            "latency_target_p99_ms": 100}


def _latencies(bootstrap: str, inputs: list[Envelope], rate: float) -> list[float]:
    """One latency run on fresh topics and apps: each workload's wait in milliseconds, sorted."""
    setup = [e for e in inputs if e.payload.kind in ("Node", "Queue")]
    per_workload: dict[str, list[Envelope]] = {}
    for env in inputs:
        if env.payload.kind == "RayCluster":
            per_workload[f"{env.payload.namespace}/{env.payload.name}"] = [env]
    for env in inputs:
        if env.payload.kind == "Pod":
            owner = (env.payload.object.get("metadata") or {}).get("labels", {}).get("ray.io/cluster")
            per_workload.get(f"{env.payload.namespace}/{owner}", []).append(env)
    config = BusConfig(bootstrap, prefix=f"bench.{uuid.uuid4().hex[:8]}.")
    submitted: dict[str, float] = {}
    placed: dict[str, float] = {}
    with _frozen(), _deciders(config) as (bus, producer):

        def watch(env: Envelope, arrived: float) -> bool:
            if env.type == "GangPlaced":
                placed.setdefault(env.payload.key, arrived)
            return len(placed) >= len(per_workload)

        # the tail reads past the setup's records while it settles, not on the clock
        tail = asyncio.run_coroutine_threadsafe(_tail(config, frozenset({"GangPlaced"}), watch, timeout=300),
                                                bus.loop)
        bus.run(producer.send_all(_records(config, [_now(e) for e in setup])))
        bus.run(_settle(config))  # the 2,000 nodes and the queues are known before the clock starts
        start = time.perf_counter()
        for i, (key, envs) in enumerate(per_workload.items()):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            submitted[key] = time.perf_counter()
            bus.run(producer.send_all(_records(config, [_now(e) for e in envs])))
        tail.result(timeout=300)
    return sorted((placed[k] - submitted[k]) * 1000 for k in placed if k in submitted)


@contextmanager
def _frozen() -> Iterator[None]:
    """Keep the bench's own objects (the scenario, its inputs) out of the collector's way while it
    measures: they share the process with the services and would make every full collection
    theirs too (a `muster run` process holds none of them)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _now(env: Envelope) -> Envelope:
    """The same watch event, stamped now: in the deployment event time is wall time."""
    return wrap(env.payload, source="ingest", cause=None, index=hash(env.id) & 0xFFFFFFF, at=time.time())


PROJECTOR_RUNS = 3
"""The projector replay is timed this many times; the figure is the median. One replay takes a few
seconds, and this 2-core machine's speed wanders by a quarter over minutes: one run alone said
as much of the hour as of the projector."""


def projector(bootstrap: str) -> dict[str, Any]:
    """``muster run projector`` as deployed, a process of its own, ``PROJECTOR_RUNS`` times (each
    on topics and a database of its own): this process holds the 100,000 envelopes and the
    simulated run they came from, and a projector sharing its heap measured about a third less
    (every collection, every cache miss is the bench's as well). Timed from the projector's first
    read of the log (its log line; the process start is not throughput) until the store's consumed
    offset reaches the end."""
    log = projector_bench.event_log()
    runs: list[dict[str, Any]] = []
    for _ in range(PROJECTOR_RUNS):
        run = _replay(bootstrap, log)
        if "bus_projector_skipped" in run:
            return run
        runs.append(run)
    per_second = sorted(r["events_per_second"] for r in runs)
    median = per_second[len(per_second) // 2]
    return {"bus_projector_events": projector_bench.EVENTS,
            "bus_projector_events_per_second": median,
            "bus_projector_runs_events_per_second": [r["events_per_second"] for r in runs],
            "bus_projector_runs_wall_seconds": [r["wall_seconds"] for r in runs],
            "bus_projector_target_events_per_second": 20_000, "bus_projector_process": "muster run projector",
            "bus_projector_written": min(r["written"] for r in runs),
            "bus_projector_troubles": sum(r["troubles"] for r in runs)}


def _replay(bootstrap: str, log: Sequence[Envelope]) -> dict[str, Any]:
    """One timed replay of ``log`` by a fresh ``muster run projector``."""
    config = BusConfig(bootstrap, prefix=f"bench.{uuid.uuid4().hex[:8]}.")
    with ExitStack() as stack:
        try:
            url = stack.enter_context(projector_bench.postgres_database())
        except projector_bench.NoPostgres as exc:
            return {"bus_projector_skipped": str(exc)}
        bus = EventLoopThread()
        stack.callback(bus.close)
        bus.run(ensure_topics(config))
        producer = AioProducer(config)
        bus.run(producer.start())
        bus.run(producer.send_all([envelope_record(config.topics, config.topics.log, e) for e in log]))
        bus.run(producer.stop())
        from shared.history import schema

        schema.ensure(url)
        gc.collect()
        reading, lines = threading.Event(), []
        process = subprocess.Popen(
            [sys.executable, "-m", "shared.cli.main", "run", "projector", "--metrics-port", "0", "--kafka", bootstrap,
             "--topic-prefix", config.prefix, "--store", url, "--log-level", "info"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        stack.callback(_stop, process)

        def watch() -> None:
            assert process.stderr is not None
            for line in process.stderr:
                lines.append(line)
                if "projector: reading" in line:
                    reading.set()

        threading.Thread(target=watch, daemon=True).start()
        if not reading.wait(120):
            raise RuntimeError("the projector did not start reading the log:\n" + "".join(lines[-20:]))
        started = time.perf_counter()
        bus.run(wait_for_projector(config, url, len(log), timeout=300))
        wall = time.perf_counter() - started
        written = _events_in(url)
        troubles = [line.strip() for line in lines if "projector:" in line and ("[ERROR]" in line or "[WARNING]" in line)]
    return {"events_per_second": round(len(log) / wall), "wall_seconds": round(wall, 2), "written": written,
            "troubles": len(troubles)}


def _events_in(url: str) -> int:
    from sqlalchemy import func, select

    from shared.history.engine import opened
    from shared.history.models import EventLog

    with opened(url) as engine, engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(EventLog.__table__)).scalar_one()


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


TRACING_RUNS = 5
"""Rounds of ``throughput`` without hooks, with tracing off and on, in turn: the machine's speed wanders."""


@contextmanager
def _no_tracing_hooks() -> Iterator[None]:
    """The deciders without the tracing checks of the worker's and the service's handle (the
    baseline 'tracing off' is measured against): copies of ``InboxWorker._handle`` and
    ``Service.handle`` minus those lines, else the same (tests/unit/bench/test_tracing_baseline.py
    checks they decide alike). One check per record read stays in both."""
    from shared.kernel.faults import Fault, describe, rejections
    from shared.runtime.bus.worker import InboxWorker, log
    from shared.runtime.service import Service

    def handle(self: Any, item: Any, *, live: bool = True) -> list[Envelope]:
        if isinstance(item, Release):
            ready = self.ordering.release(item)
        elif self.service.handled_before(item):
            return []
        else:
            ready = self.ordering.offer(item)
        if not self.watchers:
            return [out for env in ready for out in self.service.handle(env)]
        outputs: list[Envelope] = []
        for env in ready:
            made = self.service.handle(env)
            for watch in self.watchers:
                try:
                    watch(env, made)
                except Exception:  # noqa: BLE001 - as the worker does
                    log.exception("%s: a watcher failed on %s %s", self.service.name, env.type, env.id)
            outputs.extend(made)
        return outputs

    def service_handle(self: Any, env: Envelope) -> list[Envelope]:
        if not self.seen.add(env.id):
            self.duplicates += 1
            return []
        self.handled += 1
        try:
            payloads = self.core.handle(env)
        except Exception as exc:  # noqa: BLE001 - as the service does
            error = describe(self.name, env, exc)
            self.failed += 1
            self.faults.append(Fault(self.name, env, error))
            payloads = rejections(self.name, env, error)
        return [wrap(payload, source=self.name, cause=env, index=i) for i, payload in enumerate(payloads)]

    saved = InboxWorker._handle, Service.handle
    InboxWorker._handle, Service.handle = handle, service_handle  # type: ignore[method-assign]
    try:
        yield
    finally:
        InboxWorker._handle, Service.handle = saved  # type: ignore[method-assign]


def _ratio_cost(runs: list[float], base: list[float]) -> float:
    """Percent of throughput lost against ``base``: the median of the per-round ratios."""
    ratios = sorted(r / b for r, b in zip(runs, base))
    return round(100 * (1 - ratios[len(ratios) // 2]), 1)


def tracing(bootstrap: str, rounds: int = TRACING_RUNS) -> dict[str, Any]:
    """What tracing costs the deciders: the decision run without hooks, tracing off and on, in turn."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from shared.observability.tracing.otel import SpanSink
    from shared.parts.localbroker import free_port

    port = free_port()
    collector = subprocess.Popen([sys.executable, "-m", "bench.null_collector", str(port)],
                                 stdout=subprocess.PIPE, text=True)
    plain: list[float] = []
    off: list[float] = []
    on: list[float] = []
    sent = 0
    try:
        time.sleep(1.0)
        inputs = _decision_inputs()
        for _ in range(rounds):
            with _no_tracing_hooks():
                wall, pods = _decide_all(bootstrap, inputs)
            plain.append(round(pods / wall, 1))
            wall, pods = _decide_all(bootstrap, inputs)
            off.append(round(pods / wall, 1))
            sink = SpanSink(exporter=OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces"))
            try:
                wall, pods = _decide_all(bootstrap, inputs, sink)
                on.append(round(pods / wall, 1))
            finally:
                sink.close()
                sent += sink.sent
    finally:
        collector.terminate()
        output, _ = collector.communicate(timeout=30)
    received = max((int(line.split()[1]) for line in output.splitlines() if line.startswith("spans ")), default=0)
    median = {name: sorted(runs)[len(runs) // 2] for name, runs in (("plain", plain), ("off", off), ("on", on))}
    return {"decision_tracing_no_hooks_pods_per_second": median["plain"],
            "decision_tracing_off_pods_per_second": median["off"], "decision_tracing_on_pods_per_second": median["on"],
            "decision_tracing_no_hooks_runs": plain, "decision_tracing_off_runs": off, "decision_tracing_on_runs": on,
            "decision_tracing_off_cost_percent": _ratio_cost(off, plain),
            "decision_tracing_off_target_cost_percent": 2.0,
            "decision_tracing_on_cost_percent": _ratio_cost(on, off),
            "decision_tracing_spans_sent": sent, "decision_tracing_spans_received": received}


def run_tracing() -> dict[str, Any]:
    """``make bench SECTIONS=tracing``: the tracing figures alone, on a broker of their own."""
    given = os.environ.get("MUSTER_BENCH_KAFKA")
    with ExitStack() as stack:
        bootstrap, broker = broker_for(stack, given)
        return {"broker": broker,
                "decision_tracing_rounds": TRACING_RUNS, **tracing(bootstrap)}


def run() -> dict[str, Any]:
    given = os.environ.get("MUSTER_BENCH_KAFKA")
    with ExitStack() as stack:
        bootstrap, broker = broker_for(stack, given)
        figures: dict[str, Any] = {"broker": broker}
        for part in (throughput, latency, projector):
            print(f"  bus: {part.__name__} ...", flush=True)
            figures.update(part(bootstrap))
        return figures


if __name__ == "__main__":
    print(run())
