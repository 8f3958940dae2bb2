"""``muster simulate --bus``: one scenario through the services on Kafka, same decisions as embedded.

The driver plays what the scenario needs besides the services: the simulated cluster (its watch
events are the ingest), the virtual clock, and the round keeper. It is the embedded runtime
(``shared.runtime.embedded``) with one step replaced: instead of calling the cores, a round is handed to
the services over Kafka —

    1. what the driver made (watch events, fired timers) is written to the log and the inboxes
    2. each service gets a ``Release`` in its inbox naming its envelopes of the round, in order
    3. each service handles them, writes its outputs (log, then inboxes) and answers ``Finished``
    4. the driver reads the round's outputs back from the log and publishes them in delivery
       order, exactly as the embedded runtime would — which is also the order the next round is
       released in, and the order the result view folds

Virtual time moves only when a round produced nothing more: every inbox is drained. Services run
as Faust apps, either as tasks on the driver's event loop (``services="tasks"``, the default) or as
``muster run`` processes (``services="processes"``); with a store, the projector runs too and the
run ends once it has written the whole log.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import Future, TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Literal, Sequence, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from shared.kernel.events import Envelope
from shared.kernel.policy import Policy
from shared.kernel.topology import SERVICES
from shared.runtime.bus import codec
from shared.runtime.bus.codec import Finished, Release
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.snapshotkey import KEY_VARIABLE
from shared.runtime.bus.worker import Record, envelope_record
from shared.runtime.embedded import Delivery, EmbeddedRuntime, Outputs
from shared.runtime.service import Seen
from shared.runtime.simulate import Run, actions, new_cluster, play
from shared.sim.cluster import SimCluster
from shared.sim.scenario import Scenario

T = TypeVar("T")
ServiceMode = Literal["tasks", "processes"]


class DriverError(RuntimeError):
    """The distributed run cannot go on (a service stopped answering, the broker went away)."""


class EventLoopThread:
    """An asyncio loop on a thread of its own: the runtime's rounds are synchronous, Kafka is not."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="muster-bus", daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[T], timeout: float | None = None) -> T:
        """``coro``'s result; past ``timeout``, a TimeoutError naming where each of the loop's tasks waits."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]
        try:
            return future.result(timeout)
        except FutureTimeout:
            raise FutureTimeout(f"not done in {timeout} s; the loop's tasks wait at:\n{self.waiting()}") from None

    def waiting(self) -> str:
        """Each unfinished task of the loop and the line it waits at (a hang's diagnosis)."""
        lines = []
        for task in asyncio.all_tasks(self.loop):
            chain, coro = [], task.get_coro()
            while coro is not None and len(chain) < 30:  # a suspended task's stack is its top frame only
                frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
                if frame is not None:
                    chain.append(f"{frame.f_code.co_name} ({Path(frame.f_code.co_filename).name}:{frame.f_lineno})")
                coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
            lines.append(f"  {task.get_name()}: " + (" > ".join(chain) or "(not started)"))
        return "\n".join(sorted(lines))

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


async def gather_all(coros: Iterable[Awaitable[Any]]) -> list[Any]:
    """``asyncio.gather`` over an iterable, as one coroutine for ``EventLoopThread.run``."""
    return await asyncio.gather(*coros)


class AioProducer:
    """``worker.Producer`` over a plain aiokafka producer (the driver's own)."""

    def __init__(self, config: BusConfig) -> None:
        self.config = config

    async def start(self) -> None:
        """On the loop that will use it (aiokafka binds a client to the running loop)."""
        self.producer = AIOKafkaProducer(**self.config.producing(), linger_ms=0)
        await self.producer.start()

    async def stop(self) -> None:
        await self.producer.stop()

    async def send_all(self, records: Sequence[Record]) -> list[int]:
        pending = [await self.producer.send(r.topic, r.value, key=r.key, headers=r.headers) for r in records]
        return [meta.offset for meta in await asyncio.gather(*pending)]


@dataclass
class RoundKeeper:
    """The driver's side of a round (see the module docstring), on the event loop thread."""

    config: BusConfig
    round_timeout: float = 120.0
    nudge: float = 10.0
    """Seconds without an answer before a round's ``Release`` is sent again to the silent services
    (a service answers a repeated release without handling anything twice)."""
    round: int = 0
    nudged: int = 0
    written: Seen = field(default_factory=Seen)
    """Ids of envelopes the driver made that are in the log already."""

    async def start(self) -> None:
        topics = self.config.topics
        self.producer = AioProducer(self.config)
        await self.producer.start()
        # One consumer per partition: a consumer holding records of one partition answers a
        # getmany on the other only after its fetch backoff (100 ms), which every round would pay.
        self.control, self.log = TopicPartition(topics.control, 0), TopicPartition(topics.log, 0)
        self.replies = await self._consumer(self.control)
        self.reader = await self._consumer(self.log)
        await self.replies.seek_to_end(self.control)
        await self.reader.seek_to_beginning(self.log)
        # Records strictly in offset order: several producers write both topics at once (InOrder).
        from shared.runtime.bus.app import InOrder

        self._replies_order = InOrder(self.control, name="control")
        self._log_order = InOrder(self.log, 0, name="log")

    async def _consumer(self, tp: TopicPartition) -> AIOKafkaConsumer:
        consumer = AIOKafkaConsumer(**self.config.aiokafka(), enable_auto_commit=False,
                                    fetch_max_wait_ms=self.config.fetch_wait_ms)
        await consumer.start()
        consumer.assign([tp])
        return consumer

    async def stop(self) -> None:
        await self.replies.stop()
        await self.reader.stop()
        await self.producer.stop()

    async def handle(self, deliveries: list[Delivery]) -> Outputs:
        self.round += 1
        topics = self.config.topics
        records: list[Record] = []
        order: dict[str, list[str]] = defaultdict(list)
        for service, env in deliveries:
            if env.source not in SERVICES:  # made by the driver: not on the bus yet
                if self.written.add(env.id):
                    records.append(envelope_record(topics, topics.log, env))
                records.append(envelope_record(topics, topics.inbox(service), env))
            order[service].append(env.id)
        if records:
            await self.producer.send_all(records)
        releases = {}
        for service, ids in order.items():
            body, headers = codec.encode_control(Release(self.round, tuple(ids)))
            releases[service] = Record(topics.inbox(service), b"release", body, headers)
        await self.producer.send_all(list(releases.values()))
        last = await self._finished(releases)
        wanted = {(service, env.id) for service, env in deliveries}
        return await self._outputs(last, wanted)

    async def record(self, env: Envelope) -> None:
        """Write ``env``, which the driver made and no inbox reads (the run's ``PolicyApplied``), to the
        log, once: so the log on Kafka names the run's policy as the embedded one does."""
        if self.written.add(env.id):
            await self.producer.send_all([envelope_record(self.config.topics, self.config.topics.log, env)])

    async def _finished(self, releases: dict[str, Record]) -> int:
        """Wait for every service's ``Finished`` of this round; the highest log offset they wrote."""
        waiting, last = set(releases), -1
        deadline = time.monotonic() + self.round_timeout
        nudge_at = time.monotonic() + self.nudge
        while waiting:
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                raise DriverError(f"round {self.round}: no answer from {', '.join(sorted(waiting))} within "
                                  f"{self.round_timeout:g}s (is the service running and reaching the broker?); "
                                  f"release sent {self.nudged + 1} times; {await self._where(waiting)}")
            if now >= nudge_at:
                await self.producer.send_all([releases[s] for s in sorted(waiting)])
                self.nudged += 1
                nudge_at = now + self.nudge
            batch = await self.replies.getmany(self.control, timeout_ms=int(min(left, 1.0) * 1000))
            for message in self._replies_order.take(self.replies, batch.get(self.control, ())):
                reply = codec.decode(message.value, message.headers)
                if isinstance(reply, Finished) and reply.round == self.round and reply.service in waiting:
                    waiting.discard(reply.service)
                    last = max(last, reply.log_offset)
        return last

    async def _where(self, services: set[str]) -> str:
        """How far each silent service got in its inbox: tells a stuck consumer from a lost record."""
        from shared.runtime.bus.app import committed_offset

        topics = self.config.topics
        inboxes = [TopicPartition(topics.inbox(s), 0) for s in sorted(services)]
        ends = await self.reader.end_offsets(inboxes)
        parts = []
        for service, tp in zip(sorted(services), inboxes):
            committed = await committed_offset(self.config, f"{self.config.prefix}{service}", tp.topic)
            parts.append(f"{service} inbox: {ends[tp]} records, committed up to {committed}")
        return "; ".join(parts)

    async def _outputs(self, last: int, wanted: set[tuple[str, str]]) -> Outputs:
        """Read the log up to ``last``: the outputs of this round's deliveries, first copy of each."""
        outputs: Outputs = {}
        seen: set[str] = set()
        while last >= 0 and (self._log_order.next or 0) <= last:
            batch = await self.reader.getmany(self.log, timeout_ms=1000, max_records=10_000)
            for message in self._log_order.take(self.reader, batch.get(self.log, ())):
                env = codec.decode(message.value, message.headers)
                if not isinstance(env, Envelope) or env.source not in SERVICES or env.id in seen:
                    continue
                slot = (env.source, env.causation_id or "")
                if slot in wanted:
                    seen.add(env.id)
                    outputs.setdefault(slot, []).append(env)
        return outputs

    async def log_end(self) -> int:
        return (await self.reader.end_offsets([self.log]))[self.log]


class DistributedRuntime(EmbeddedRuntime):
    """The embedded runtime whose rounds are handled by the services on Kafka."""

    def __init__(self, policy: Policy, cluster: SimCluster, keeper: RoundKeeper, loop: EventLoopThread,
                 *, before_round: Callable[[int], None] | None = None) -> None:
        super().__init__(policy, cluster, cores={})
        self.keeper = keeper
        self.bus = loop
        self.before_round = before_round

    def announce(self) -> Envelope | None:
        """The embedded runtime's ``PolicyApplied``, on the Kafka log too (the services under
        ``simulate --bus`` write none of their own)."""
        env = super().announce()
        if env is not None:
            self.bus.run(self.keeper.record(env))
        return env

    def handle_round(self, deliveries: list[Delivery]) -> Outputs:
        if not deliveries:
            return {}
        if self.before_round is not None:
            self.before_round(self.keeper.round + 1)
        return self.bus.run(self.keeper.handle(deliveries))


# --------------------------------------------------------------------------- the services
class ServiceHost:
    """Starts and stops the five apps: as tasks on the driver's loop, or as ``muster run`` processes."""

    def __init__(self, config: BusConfig, policy: Policy, mode: ServiceMode, bus: EventLoopThread,
                 store: str | None = None, *, sink: Any = None, metrics_ports: dict[str, int] | None = None) -> None:
        self.config, self.policy, self.mode, self.bus, self.store = config, policy, mode, bus, store
        self.sink = sink
        """Tracing on (``shared.observability.tracing.otel.SpanSink``): services trace, processes keep ``OTEL_*``."""
        self.metrics_ports = metrics_ports or {}
        """Service -> port of its ``/metrics`` (none where not given)."""
        self.apps: list[Any] = []
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._policy_file: str | None = None
        self._key_file: str | None = None
        """The run's snapshot key for its service processes (``snapshotkey``), unless the config names one."""
        self.logs: Path | None = None
        """Where each service process writes its output (``processes`` only)."""

    @property
    def names(self) -> list[str]:
        return list(SERVICES) + (["projector"] if self.store else [])

    def start(self) -> None:
        if self.mode == "tasks":
            from shared.runtime.bus.app import service_app
            from shared.runtime.bus.projector import projector_app

            from shared.observability.metrics import server as metrics

            self.apps = [service_app(name, self.config, self.policy, ordering="rounds", sink=self.sink)
                         for name in SERVICES]
            if self.store:
                self.apps.append(projector_app(self.config, self.store, sink=self.sink))
            for name, app in zip(self.names, self.apps):
                if self.metrics_ports.get(name):
                    exposition = (metrics.projector_exposition(app) if name == "projector"
                                  else metrics.service_exposition(app, name))
                    exposition.attach(app, metrics.bind(self.metrics_ports[name], "127.0.0.1"))
            self.bus.run(gather_all(app.start() for app in self.apps), timeout=60)
            return
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            f.write(self.policy.model_dump_json())
            self._policy_file = f.name
        if self.config.snapshot_key_file is None:  # a key of the run's own: restarted processes load their snapshots
            fd, self._key_file = tempfile.mkstemp(prefix="muster-snapshot-", suffix=".key")  # readable by its owner only
            with os.fdopen(fd, "w") as key:
                key.write(os.urandom(32).hex())
        self.logs = Path(tempfile.mkdtemp(prefix="muster-services-"))
        for name in self.names:
            self.spawn(name)

    def spawn(self, name: str) -> subprocess.Popen[bytes]:
        """Start (or start again) one service as a process."""
        args = [sys.executable, "-m", "shared.cli.main", "run", name]
        if name == "projector":
            args += ["--store", str(self.store)]
        else:
            args += ["--ordering", "rounds", "--policy", str(self._policy_file)]
        args += ["--metrics-port", str(self.metrics_ports.get(name, 0))]
        env = {**os.environ, **self.config.env(), "PYTHONUNBUFFERED": "1"}
        if self._key_file is not None:
            env[KEY_VARIABLE] = self._key_file
        if self.sink is not None:
            from shared.observability.tracing.config import EPOCH_ENV

            env[EPOCH_ENV] = repr(self.sink.epoch)
        else:  # the run's traces go out with --trace only
            from shared.observability.tracing.config import ENDPOINTS

            for variable in ENDPOINTS:
                env.pop(variable, None)
        assert self.logs is not None, "start() the host first"
        out = open(self.logs / f"{name}.log", "ab")
        self.processes[name] = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                cwd=Path(__file__).resolve().parents[3])
        return self.processes[name]

    def kill(self, name: str) -> None:
        """SIGKILL one service process (the crash test's hand)."""
        process = self.processes[name]
        process.kill()
        process.wait()

    def stop(self) -> None:
        for app in reversed(self.apps):
            try:
                self.bus.run(app.stop(), timeout=30)
            except Exception:  # noqa: BLE001 - stopping is best effort; the loop goes away next
                pass
        self.apps = []
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for temporary in (self._policy_file, self._key_file):
            if temporary:
                os.unlink(temporary)
        self._policy_file = self._key_file = None


def run_prefix(name: str) -> str:
    """A topic prefix of a run's own, so runs never read each other's records."""
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:40] or "run"
    return f"muster.sim.{safe}.{uuid.uuid4().hex[:8]}."


async def wait_for_projector(config: BusConfig, store: str, end: int, timeout: float) -> None:
    """Until the store's consumed offset on the log reaches ``end`` (the projector caught up)."""
    from sqlalchemy import select

    from shared.history.engine import connect
    from shared.history.models import ConsumedOffset

    engine = connect(store)
    table = ConsumedOffset.__table__
    deadline = time.monotonic() + timeout
    try:
        while True:
            with engine.connect() as conn:
                done = conn.execute(select(table.c.offset).where(table.c.topic == config.topics.log)).scalar()
            if done is not None and done >= end:
                return
            if time.monotonic() > deadline:
                raise DriverError(f"the projector wrote the log up to {done} of {end} within {timeout:g}s")
            await asyncio.sleep(0.1)
    finally:
        engine.dispose()


def simulate_on_bus(scenario: Scenario, config: BusConfig, policy: Policy | None = None, *,
                    services: ServiceMode = "tasks", store: str | None = None, round_timeout: float = 120.0,
                    before_round: Callable[[int, ServiceHost], None] | None = None, keep_logs: bool = False,
                    sink: Any = None, metrics_ports: dict[str, int] | None = None,
                    after_run: Callable[[Run, ServiceHost], None] | None = None) -> Run:
    """Run ``scenario`` through the services on Kafka (topics under ``config.prefix``, created when
    missing); with ``store``, the projector writes the history there and the run waits for it.
    ``before_round(round, host)`` is called before each round is released (the crash test kills
    and restarts services there). Service processes write their output to ``host.logs``: kept when
    the run fails (its error names the folder) or with ``keep_logs``, removed otherwise.

    ``sink`` (``shared.observability.tracing.otel.SpanSink``, tracing on): the services send their hop spans, and
    the projector (with ``store``; else the driver, from the run's log) every workload's root and
    phases, all in event time placed at ``sink.epoch``. ``metrics_ports``: service -> port of its
    ``/metrics`` while the run lasts; ``after_run(run, host)`` is called before the services stop."""
    from shared.runtime.bus.app import TopicUnfit, ensure_topics

    effective = scenario.effective_policy(policy)
    cluster = new_cluster(scenario, effective)
    actions(scenario, cluster)  # a malformed scenario fails before anything starts
    if store is not None:
        from shared.history import schema

        schema.ensure(store)
    bus = EventLoopThread()
    host = ServiceHost(config, effective, services, bus, store, sink=sink, metrics_ports=metrics_ports)
    keeper = RoundKeeper(config, round_timeout)
    started = succeeded = False
    try:
        try:
            bus.run(ensure_topics(config))
        except TopicUnfit as exc:
            raise DriverError(str(exc)) from None
        host.start()
        bus.run(keeper.start())
        started = True
        hook = (lambda n: before_round(n, host)) if before_round is not None else None
        run = play(scenario, effective, DistributedRuntime(effective, cluster, keeper, bus, before_round=hook))
        if store is not None:
            bus.run(wait_for_projector(config, store, bus.run(keeper.log_end()), round_timeout))
        elif sink is not None:
            from shared.observability.tracing.spans import SpanBuilder

            sink.send(SpanBuilder(hops=False).build(run.runtime.log))
        if after_run is not None:
            after_run(run, host)
        succeeded = True
        return run
    except DriverError as exc:
        if host.logs is not None:
            raise DriverError(f"{exc} (the services' output: {host.logs})") from None
        raise
    finally:
        if started:
            bus.run(keeper.stop())
        host.stop()
        bus.close()
        if succeeded and not keep_logs and host.logs is not None:
            shutil.rmtree(host.logs, ignore_errors=True)
