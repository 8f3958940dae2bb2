"""``muster run cluster``: the stack's link to a real Kubernetes API server.

Two loops in one Faust app (group ``<prefix>cluster``), neither deciding anything:

- **watch → inboxes**: ``Watcher`` lists and watches every resource admission and placement read;
  each change becomes an ``ObjectChanged`` envelope (``ingest.watch_envelope``: its id names the
  object's uid and resourceVersion) written to the log topic first, then to the inboxes
  ``shared.topology.destinations`` names. A restarted bridge lists everything again and re-sends
  unchanged objects under the same ids, which the services drop as copies.
- **effects → API**: ``EffectsReader`` reads ``muster.effects`` and performs each ``KubeEffect`` with
  ``KubeApplier``: each object's effects in their order, different objects' side by side (up to
  ``EFFECT_CONCURRENCY`` requests in flight), an eviction after everything before it and before
  everything after it. An effect the API server cannot take now (throttled, unavailable) is retried with
  backoff and holds the batch, so its offset is not committed before it is done; one it refuses for
  good (forbidden, invalid) goes to the dead-letter topic with the server's answer, as does a record
  that is not an effect. Effects are idempotent, so a batch handled again after a crash changes
  nothing more.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from aiokafka import AIOKafkaConsumer

from services.reconciler.ingest import Change, watch_envelope
from services.reconciler.kubeapi import KubeApplier, Refused, Transient, Watcher, connect
from services.reconciler.lease import LeaseElector, LeaseKeeper
from services.reconciler.resources import WATCHED
from shared.bus import codec
from shared.bus.app import BATCH, BATCH_WAIT, FaustProducer, MusterApp, PartitionReader, base_app
from shared.bus.codec import BadRecord
from shared.bus.config import BusConfig
from shared.bus.topics import Topics
from shared.bus.worker import Incoming, Producer, Record, dead_letter_record, logged_and_routed
from shared.events import Envelope, KubeEffect
from shared.service import Seen

log = logging.getLogger("muster.cluster")

EFFECT_CONCURRENCY = 32
"""Requests to the API server in flight at once (``ClusterBridge._apply_side_by_side``)."""


@dataclass(frozen=True)
class KubeTarget:
    """Where the API server is: a URL (``kubectl proxy``, tests), or a kubeconfig and context; with
    neither, the pod's service account inside a cluster, else ``$KUBECONFIG`` / ``~/.kube/config``."""

    url: str | None = None
    kubeconfig: str | None = None
    context: str | None = None
    identity: str = ""
    """Who this bridge is (its lease identity): the API server sees it in every request's User-Agent."""

    async def connect(self) -> Any:
        api = await connect(self.url, self.kubeconfig, self.context)
        if self.identity:
            api.user_agent = f"muster-cluster/{self.identity}"
        return api


async def take_lease(target: KubeTarget, lease: LeaseElector, say: Any = print,
                     meanwhile: Callable[[], Awaitable[None]] | None = None) -> None:
    """Wait until this bridge holds the Lease (``services.reconciler.lease``): a standby waits here,
    before it watches anything or joins the effects consumer group, running ``meanwhile`` (its
    health endpoint: alive, not ready) until then."""
    api = await target.connect()
    side = asyncio.create_task(meanwhile()) if meanwhile is not None else None
    try:
        await lease.acquire(api, on_wait=lambda holder: say(
            f"standing by: the lease {lease.where} is held by {holder or 'nobody yet'}"))
    finally:
        if side is not None:
            side.cancel()
            await asyncio.gather(side, return_exceptions=True)
        await api.close()
    say(f"holding the lease {lease.where} as {lease.identity}")


def keep_lease(target: KubeTarget, lease: LeaseElector) -> LeaseKeeper:
    """Renew the Lease from now on; when it is lost, exit the process at once (exit code 1): another
    bridge may be applying by then, and a batch half applied must not go on. Its Deployment restarts
    it as a standby, as controller-runtime's managers do."""
    def lost(reason: str) -> None:
        log.critical("%s: stopping at once, so that only one bridge applies effects", reason)
        logging.shutdown()
        os._exit(1)

    return LeaseKeeper(lease, target.connect, lost).start()


async def reachable(target: KubeTarget) -> str | None:
    """None when the API server answers a list of nodes, else what went wrong, in one line."""
    try:
        api = await target.connect()
    except Exception as exc:  # noqa: BLE001 - kubeconfig trouble comes in many types
        return f"cannot load the client configuration: {exc}"
    try:
        await Watcher(api).probe()
        return None
    except Exception as exc:  # noqa: BLE001
        return f"{target.url or target.kubeconfig or 'the configured cluster'} does not answer: {exc}"
    finally:
        await api.close()


class ClusterBridge:
    """The two loops without Faust (``cluster_app`` wires them): see the module docstring."""

    name = "cluster"

    def __init__(self, topics: Topics, *, retry_first: float = 0.2, retry_max: float = 30.0) -> None:
        self.topics = topics
        self.retry_first, self.retry_max = retry_first, retry_max
        self.applier: KubeApplier | None = None
        self.connected = asyncio.Event()
        self.seen = Seen()
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.dead_letters = 0
        self.retries = 0
        self.observed = 0
        self.tracer: Any = None
        """With tracing on (``shared.tracing.live.HopTracer``): a span per effect applied."""
        self._changes: asyncio.Queue[Envelope] = asyncio.Queue()

    def connect(self, api: Any) -> None:
        self.applier = KubeApplier(api)
        self.connected.set()

    # ------------------------------------------------------------------ effects -> API
    async def apply_batch(self, batch: Sequence[Incoming], producer: Producer) -> None:
        """Apply a batch's effects: in order for each object, objects side by side (``_apply_side_by_side``);
        an eviction waits for everything before it and holds back everything after it. Dead letters go
        out in the order of the batch."""
        assert self.applier is not None, "connect() first"
        letters: list[Record | None] = []
        run: list[tuple[Incoming, Envelope]] = []
        places: list[int] = []
        """Where each effect of ``run`` puts its dead letter in ``letters``."""
        queued: set[str] = set()

        async def settle_run() -> None:
            for place, letter in zip(places, await self._apply_side_by_side(run)):
                letters[place] = letter
            run.clear()
            places.clear()
            queued.clear()

        for incoming in batch:
            try:
                env = codec.decode(incoming.value, incoming.headers)
                if not isinstance(env, Envelope) or not isinstance(env.payload, KubeEffect):
                    raise BadRecord(f"not a KubeEffect envelope: {type(env).__name__}")
            except BadRecord as exc:
                letters.append(self._dead_letter(incoming, str(exc)))
                continue
            if env.id in self.seen or env.id in queued:
                continue
            if env.payload.op == "evict":
                await settle_run()
                letters.append(await self._apply_one(incoming, env))
            else:
                run.append((incoming, env))
                places.append(len(letters))
                letters.append(None)
                queued.add(env.id)
        await settle_run()
        if any(letters):
            await producer.send_all([letter for letter in letters if letter is not None])

    async def _apply_side_by_side(self, run: Sequence[tuple[Incoming, Envelope]]) -> list[Record | None]:
        """Effects on different objects commute: each object's effects go one after another, in their
        order, and up to ``EFFECT_CONCURRENCY`` requests are in flight at once, as kube-scheduler binds
        in goroutines of its own; one round trip after another, binding 9,000 pods took longer than
        deciding where they go. Evictions are left out (``apply_batch``): a bind to a node waits for
        the pods evicted from it, which it knows of only once their eviction has started.
        The dead letters, in the order of ``run``."""
        if len(run) <= 1:
            return [await self._apply_one(incoming, env) for incoming, env in run]
        chains: dict[tuple[str, str, str], list[int]] = {}
        for index, (_, env) in enumerate(run):
            chains.setdefault(_object_of(env.payload), []).append(index)
        letters: list[Record | None] = [None] * len(run)
        slots = asyncio.Semaphore(EFFECT_CONCURRENCY)

        async def chain(indexes: list[int]) -> None:
            for index in indexes:
                async with slots:
                    letters[index] = await self._apply_one(*run[index])
        await asyncio.gather(*(chain(indexes) for indexes in chains.values()))
        return letters

    async def _apply_one(self, incoming: Incoming, env: Envelope) -> Record | None:
        """Apply one effect (a span of its own with tracing on); its dead letter when the API server
        refuses it for good."""
        letter = None
        try:
            started = time.time()
            outcome = await self._apply(env)
            self.outcomes[outcome] += 1
            if self.tracer is not None:
                self._traced(env, incoming, started, outcome)
        except Refused as exc:
            letter = self._dead_letter(incoming, str(exc))
        self.seen.add(env.id)
        return letter

    async def _apply(self, env: Envelope) -> str:
        """Apply, waiting out throttling and outages: the effect is not skipped, it is late."""
        assert self.applier is not None
        delay = self.retry_first
        while True:
            try:
                return await self.applier.apply(env.payload, env.id)
            except Transient as exc:
                self.retries += 1
                log.warning("%s; trying again in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_max)

    def _traced(self, env: Envelope, incoming: Incoming, started: float, outcome: str) -> None:
        effect = env.payload
        self.tracer.read(env.id, incoming.partition, incoming.offset)
        self.tracer.handled(env, [], started, time.time(), name=f"apply {effect.op}", extra={
            "muster.effect.op": effect.op, "muster.effect.outcome": outcome, "k8s.object.kind": effect.kind,
            "k8s.namespace.name": effect.namespace, "k8s.object.name": effect.name, "k8s.node.name": effect.node})

    def _dead_letter(self, incoming: Incoming, error: str) -> Record:
        self.dead_letters += 1
        log.warning("effect at offset %d dead-lettered: %s", incoming.offset, error)
        return dead_letter_record(self.topics, incoming, topic=self.topics.effects, consumer=self.name, error=error)

    # ------------------------------------------------------------------ watch -> inboxes
    async def observe(self, change: Change, obj: dict[str, Any]) -> None:
        """The watcher's sink: event time is when the change was seen."""
        self.observed += 1
        await self._changes.put(watch_envelope(change, obj, time.time()))
        if change == "Deleted" and obj.get("kind") == "Pod" and self.applier is not None:
            metadata = obj.get("metadata") or {}
            await self.applier.pod_gone(str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))

    async def watch(self, api: Any, watcher: Watcher | None = None) -> None:
        """Watch every resource and publish what changes, until cancelled."""
        watcher = watcher or Watcher(api)
        tasks = [asyncio.create_task(watcher.run(resource, self.observe)) for resource in WATCHED]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def publish(self, producer: Producer) -> None:
        """Send observed changes in the order seen, a burst at a time, until cancelled."""
        while True:
            burst = [await self._changes.get()]
            await asyncio.sleep(BATCH_WAIT)
            while not self._changes.empty() and len(burst) < BATCH:
                burst.append(self._changes.get_nowait())
            await send_logged(self.topics, burst, producer)


def _object_of(effect: KubeEffect) -> tuple[str, str, str]:
    """The object an effect writes: a workload's effects (``kind`` "" means RayJob, else RayCluster)
    and an Event about an object count as that object's."""
    kind = "workload" if effect.kind in ("", "RayJob", "RayCluster") else effect.kind
    return kind, effect.namespace, effect.name


async def send_logged(topics: Topics, envelopes: Sequence[Envelope], producer: Producer) -> list[int]:
    """Write ``envelopes`` to the log, then to the inboxes they are routed to (the log never holds an
    effect before its cause); the log offsets."""
    logged: list[Record] = []
    routed: list[Record] = []
    for env in envelopes:  # watch events: none is for the clock
        first, rest, _ = logged_and_routed(topics, env)
        logged.append(first)
        routed.extend(rest)
    offsets = await producer.send_all(logged)
    if routed:
        await producer.send_all(routed)
    return offsets


class EffectsReader(PartitionReader):
    """``muster.effects`` on a plain consumer in group ``<prefix>cluster``, as a service's inbox is
    read (``PartitionReader``): Faust's stream cost ≈ 300 µs of CPU a record, and a RayCluster of 9
    pods brings 13 effects. Nothing to rebuild on assignment (the bridge keeps no state but its
    dedupe): it resumes at the committed offset, which only ever passes applied batches."""

    def __init__(self, config: BusConfig, bridge: ClusterBridge, producer: Producer) -> None:
        super().__init__(config, f"{config.prefix}cluster", config.topics.effects, "effects")
        self.bridge, self.producer = bridge, producer

    async def run(self) -> None:
        self._task = asyncio.current_task()  # ``stop`` ends it while it waits for the API server too
        await self.bridge.connected.wait()
        await super().run()

    async def _handle(self, records: Sequence[Any]) -> None:
        await self.bridge.apply_batch([Incoming(m.value, m.headers, m.partition, m.offset) for m in records],
                                      self.producer)
        self.processed = records[-1].offset + 1

    async def _assigned(self, consumer: AIOKafkaConsumer) -> None:
        """Read on from the committed offset (from the start when none is)."""
        committed = await consumer.committed(self.tp)
        self._in_order.next = committed if committed is not None else \
            (await consumer.beginning_offsets([self.tp]))[self.tp]


class ClusterApp(MusterApp):
    """``muster run cluster``'s app: Faust runs the process and the producer, ``EffectsReader`` the
    effects (Faust's own consumer is not started)."""

    producer_only = True
    muster_effects: EffectsReader | None = None

    async def on_stop(self) -> None:
        if self.muster_effects is not None:
            await self.muster_effects.stop()  # before the producer its dead letters go out with stops
        await super().on_stop()


def cluster_app(config: BusConfig, target: KubeTarget, *, sink: Any = None) -> MusterApp:
    """The app behind ``muster run cluster`` (which takes the Lease first: ``take_lease``); with a
    ``sink`` (tracing on) each effect applied is a span."""
    app = base_app(f"{config.prefix}cluster", config, cls=ClusterApp)
    bridge = ClusterBridge(config.topics)
    if sink is not None:
        from shared.tracing.live import HopTracer

        bridge.tracer = HopTracer("cluster", sink, topic=config.topics.effects, group=f"{config.prefix}cluster")
    app.muster_bridge = bridge  # type: ignore[attr-defined]
    producer = FaustProducer(app)
    effects = EffectsReader(config, bridge, producer)
    app.muster_effects = effects  # type: ignore[attr-defined]

    @app.task
    async def apply_effects() -> None:
        await effects.run()

    @app.task
    async def watch_and_publish() -> None:
        api = await target.connect()
        bridge.connect(api)
        publisher = asyncio.create_task(bridge.publish(producer))
        try:
            await bridge.watch(api)
        finally:
            publisher.cancel()
            await api.close()

    return app
