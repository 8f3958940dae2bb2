"""``muster run cluster``: the stack's link to a real Kubernetes API server.

Two loops in one Faust app (group ``<prefix>cluster``), neither deciding anything:

- **watch → inboxes**: ``Watcher`` lists and watches every resource admission and placement read;
  each change becomes an ``ObjectChanged`` envelope (``ingest.watch_envelope``: its id names the
  object's uid and resourceVersion) written to the log topic first, then to the inboxes
  ``shared.topology.destinations`` names. A restarted bridge lists everything again and re-sends
  unchanged objects under the same ids, which the services drop as copies.
- **effects → API**: an agent on ``muster.effects`` performs each ``KubeEffect`` with
  ``KubeApplier``. An effect the API server cannot take now (throttled, unavailable) is retried with
  backoff and holds the batch, so its offset is not committed before it is done; one it refuses for
  good (forbidden, invalid) goes to the dead-letter topic with the server's answer, as does a record
  that is not an effect. Effects are idempotent, so a batch handled again after a crash changes
  nothing more.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass
from typing import Any, Sequence

import faust

from services.reconciler.ingest import Change, watch_envelope
from services.reconciler.kubeapi import KubeApplier, Refused, Transient, Watcher, connect
from services.reconciler.resources import WATCHED
from shared.bus import codec
from shared.bus.app import BATCH, BATCH_WAIT, FaustProducer, MusterApp, base_app
from shared.bus.codec import BadRecord
from shared.bus.config import BusConfig
from shared.bus.topics import Topics
from shared.bus.worker import Incoming, Producer, Record, dead_letter_record, logged_and_routed
from shared.events import Envelope, KubeEffect
from shared.service import Seen

log = logging.getLogger("muster.cluster")


@dataclass(frozen=True)
class KubeTarget:
    """Where the API server is: a URL (``kubectl proxy``, tests), or a kubeconfig and context; with
    neither, the pod's service account inside a cluster, else ``$KUBECONFIG`` / ``~/.kube/config``."""

    url: str | None = None
    kubeconfig: str | None = None
    context: str | None = None

    async def connect(self) -> Any:
        return await connect(self.url, self.kubeconfig, self.context)


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
        assert self.applier is not None, "connect() first"
        letters: list[Record] = []
        for incoming in batch:
            try:
                env = codec.decode(incoming.value, incoming.headers)
                if not isinstance(env, Envelope) or not isinstance(env.payload, KubeEffect):
                    raise BadRecord(f"not a KubeEffect envelope: {type(env).__name__}")
            except BadRecord as exc:
                letters.append(self._dead_letter(incoming, str(exc)))
                continue
            if env.id in self.seen:
                continue
            try:
                started = time.time()
                outcome = await self._apply(env)
                self.outcomes[outcome] += 1
                if self.tracer is not None:
                    self._traced(env, incoming, started, outcome)
            except Refused as exc:
                letters.append(self._dead_letter(incoming, str(exc)))
            self.seen.add(env.id)
        if letters:
            await producer.send_all(letters)

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


def cluster_app(config: BusConfig, target: KubeTarget, *, sink: Any = None) -> MusterApp:
    """The app behind ``muster run cluster``; with a ``sink`` (tracing on) each effect applied is a span."""
    app = base_app(f"{config.prefix}cluster", config)
    bridge = ClusterBridge(config.topics)
    if sink is not None:
        from shared.tracing.live import HopTracer

        bridge.tracer = HopTracer("cluster", sink, topic=config.topics.effects, group=f"{config.prefix}cluster")
    app.muster_bridge = bridge  # type: ignore[attr-defined]
    producer = FaustProducer(app)
    effects = app.topic(config.topics.effects, key_type=bytes, value_type=bytes)

    @app.agent(effects, name="cluster-effects", concurrency=1)
    async def apply(stream: faust.StreamT) -> None:
        await bridge.connected.wait()
        async for events in stream.take_events(BATCH, within=BATCH_WAIT):
            await bridge.apply_batch([Incoming(e.message.value, list(e.message.headers or ()), e.message.partition,
                                               e.message.offset) for e in events], producer)

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
