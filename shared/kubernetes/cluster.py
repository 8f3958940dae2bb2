"""``muster run cluster``: the stack's link to a real Kubernetes API server.

Two loops, neither deciding anything, each in a process of its own (two cores: one event loop
could not do both under load, ``shared.kubernetes.cluster_watch``): the Faust app
(``shared.kubernetes.app``: group ``<prefix>cluster``, the Lease, ``/metrics`` and ``/readyz``)
applies effects and starts the watching process beside it.

- **watch → inboxes** (the watching process): ``Watcher`` lists and watches every resource admission
  and placement read; each change becomes an ``ObjectChanged`` envelope (``ingest.watch_envelope``:
  its id names the object's uid and resourceVersion) written to the log topic first, then to the
  inboxes ``shared.kernel.topology.destinations`` names. A restarted bridge lists everything again and
  re-sends unchanged objects under the same ids, which the services drop as copies; after each list
  it sends ``ObjectsListed`` (the keys the list holds), from which admission and placement find the
  objects deleted while no watch was open (``shared.kernel.listing``).
- **effects → API** (the app's process): ``EffectsReader`` reads ``muster.effects`` and performs
  each ``KubeEffect`` with ``KubeApplier``: each object's effects in their order, different objects'
  side by side (up to ``EFFECT_CONCURRENCY`` requests in flight), an eviction after everything
  before it and before everything after it, effects read while earlier ones are in flight started at
  once (``ClusterBridge.admit``). An effect the API server cannot take now (throttled, unavailable)
  is retried with backoff and holds the commit, so its offset is not committed before it is done;
  one it refuses for good (forbidden, invalid) goes to the dead-letter topic with the server's
  answer, as does a record that is not an effect, or one whose application fails otherwise (a bug:
  it would fail again after every restart). Effects are idempotent, so a batch handled again after a
  crash changes nothing more.

Neither loop dies silently: a watch event that cannot be encoded or sent is dead-lettered and the
rest go on (``ClusterBridge.send_burst``), and a loop that fails all the same is started again with
backoff while ``/readyz`` says it is down (``ClusterBridge.supervised``).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from services.reconciler.ingest import Change, listing_envelopes, watch_envelope
from services.reconciler.owners import Owners
from shared.kernel.events import Envelope, KubeEffect, ObjectChanged
from shared.kernel.kube import refused
from shared.kubernetes.kubeapi import KubeApplier, Refused, Transient, Watcher, connect
from shared.kubernetes.lease import LeaseElector, LeaseKeeper
from shared.kubernetes.resources import RAY_CLUSTER, RAY_JOB, WATCHED, Resource
from shared.runtime.bus import codec, stagetrace
from shared.runtime.bus.app import BATCH, BATCH_WAIT, PartitionReader, cancelled
from shared.runtime.bus.codec import BadRecord
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.topics import Topics
from shared.runtime.bus.worker import Incoming, Producer, Record, dead_letter_record, logged_and_routed
from shared.runtime.service import Seen
from shared.runtime.cycles import CycleGuard

CYCLE_WINDOW = 10.0
"""Seconds of event time within which one effect applied ``shared.runtime.cycles.MAX_REPEATS`` times is a
cycle: a live cycle takes an API round trip per turn, so it repeats within seconds, while a workload's
legitimate repeats (Queued, Admitted, Queued again) are spread over its scheduling."""

log = logging.getLogger("muster.cluster")

MAX_RECORD_BYTES = 1_000_000
"""Largest watch event the link sends (Kafka's default ``message.max.bytes`` is 1,048,588; the
broker refuses larger records): a larger one is dead-lettered (``ClusterBridge.send_burst``)."""

EFFECT_CONCURRENCY = 32
"""Requests to the API server in flight at once (``ClusterBridge.admit``)."""

EFFECTS_AHEAD = 10 * BATCH
"""Effects read but not yet settled (applied, or waiting behind one that is not) a reader may hold:
past it, it reads no more until the oldest are settled (``ClusterBridge.admit``)."""


@dataclass
class _Admitted:
    """An effects record read: whether it is settled (applied, refused, or nothing to do) and its dead letter."""

    offset: int
    done: bool = False
    letter: Record | None = None


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
    """Wait until this bridge holds the Lease (``shared.kubernetes.lease``): a standby waits here,
    before it watches anything or joins the effects consumer group, running ``meanwhile`` (its
    health endpoint: alive, not ready) until then."""
    api = await target.connect()
    side = asyncio.create_task(meanwhile()) if meanwhile is not None else None
    try:
        await lease.check(api)  # a ServiceAccount that may not use the Lease would stand by forever
        await lease.acquire(api, on_wait=lambda holder: say(
            f"standing by: the lease {lease.where} is held by {holder or 'nobody yet'}"))
    finally:
        if side is not None:
            await cancelled([side])
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
    """The two loops without Faust (``cluster_app`` wires the effects side, ``cluster_watch`` the
    watch side, each in its own process): see the module docstring."""

    name = "cluster"

    def __init__(self, topics: Topics, *, retry_first: float = 0.2, retry_max: float = 30.0) -> None:
        self.topics = topics
        self.retry_first, self.retry_max = retry_first, retry_max
        self.applier: KubeApplier | None = None
        self.connected = asyncio.Event()
        """Both sides connected to the API server: the applier (``connect``) and the watching process
        (``watch_connected``); ``/readyz`` is false until then."""
        self._sides: set[str] = set()
        self.on_pod_gone: Callable[[str, str], Awaitable[None]] | None = None
        """Where the watch reports a pod deleted (the watching process: a line to the parent, whose
        applier's binds may wait for it, ``KubeApplier.pod_gone``)."""
        self.on_pods_listed: Callable[[], Awaitable[None]] | None = None
        """Where the watch reports a list of every pod taken (the watching process: a line to the parent,
        whose applier then asks after the evicted pods no watch saw go, ``KubeApplier.pods_listed``)."""
        self.listed = asyncio.Event()
        """Every watched resource listed once by the current watch (``watch``): effects wait for it, as a
        controller waits for its informers' caches to sync. Applied earlier, a bind could let a user
        delete the object before the list, and a watcher that never saw it cannot report it gone."""
        self.seen = Seen()
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.dead_letters = 0
        self.retries = 0
        self.observed = 0
        self.unsent = 0
        """Watch events dead-lettered instead of sent (``send_burst``)."""
        self.refused: collections.Counter[str] = collections.Counter()
        """Watch events ingest reduced to their identity (``kube.REFUSED``), per kind: admission rejects
        such a workload, queue or pod's workload; placement leaves such a node out of scheduling."""
        self.max_record_bytes = MAX_RECORD_BYTES
        self.down: dict[str, str] = {}
        """Tasks of the link that failed and wait to start again, and why (``supervised``)."""
        self.tracer: Any = None
        """With tracing on (``shared.observability.tracing.live.HopTracer``): a span per effect applied."""
        self.owners = Owners()
        """Which RayJob each pod serves (``services.reconciler.owners``), learned from the watch."""
        self._watcher: Watcher | None = None
        self._changes: asyncio.Queue[Envelope | Record] = asyncio.Queue()
        """Watch events to send, in the order seen (and the dead letters of those that cannot be)."""
        self._admitted: collections.deque[_Admitted] = collections.deque()
        """Effects records read, in offset order, until settled and taken by ``settle``."""
        self._running: set[asyncio.Task[None]] = set()
        self._tails: dict[tuple[str, str, str], asyncio.Task[None]] = {}
        """Per object, the task of its latest effect: the next one on that object waits for it."""
        self._barrier: asyncio.Task[None] | None = None
        """The latest eviction's task: every effect read after it waits for it."""
        self._queued: set[str] = set()
        self._progress = asyncio.Event()
        self._slots = asyncio.Semaphore(EFFECT_CONCURRENCY)
        self.cycles = CycleGuard(window=CYCLE_WINDOW)
        """An effect that comes again and again (its watch event causes it) is set aside (``shared.runtime.cycles``)."""

    def connect(self, api: Any) -> None:
        """The applier's API client (the effects reader's, ``cluster_app``)."""
        self.applier = KubeApplier(api)
        self._side("apply", True)

    def watch_connected(self, up: bool) -> None:
        """The watching process has made its API client (True), or has ended (False)."""
        self._side("watch", up)

    def _side(self, side: str, up: bool) -> None:
        if up:
            self._sides.add(side)
        else:
            self._sides.discard(side)
        if self._sides == {"apply", "watch"}:
            self.connected.set()
        else:
            self.connected.clear()

    # ------------------------------------------------------------------ effects -> API
    async def apply_batch(self, batch: Sequence[Incoming], producer: Producer) -> None:
        """Apply a batch's effects and wait until all are settled (``admit``, then ``drain``); dead
        letters go out in the order of the batch. The effects reader does not wait so: it admits each
        fetch and settles between fetches (``PartitionReader._fetched``)."""
        await self.admit(batch)
        await self.drain(producer)

    async def admit(self, batch: Sequence[Incoming]) -> None:
        """Start applying a batch's effects without waiting for them: each object's effects go one
        after another, in their order, different objects' side by side, up to ``EFFECT_CONCURRENCY``
        requests in flight, as kube-scheduler binds each pod in a goroutine of its own while it goes on
        scheduling; an eviction waits for every effect read before it and holds back every one read
        after it (a bind to a node waits for the pods evicted from it, which it knows of only once
        their eviction has started). ``settle`` then takes them in offset order as they finish.

        Effects read while earlier ones are in flight start at once: a reader that applied a batch
        whole before reading the next held each new effect behind the slowest request of the batch
        before it, and under load the batches, and that wait, grew from one to the next.
        Returns once the batch is started; with ``EFFECTS_AHEAD`` effects unsettled, first waits for
        the oldest to settle."""
        assert self.applier is not None, "connect() first"
        while len(self._admitted) >= EFFECTS_AHEAD and not self._admitted[0].done:
            self._progress.clear()  # the reader settles the oldest once this returns (``settle``)
            await self._progress.wait()
        for incoming in batch:
            entry = _Admitted(incoming.offset)
            self._admitted.append(entry)
            try:
                env = codec.decode(incoming.value, incoming.headers)
                if not isinstance(env, Envelope) or not isinstance(env.payload, KubeEffect):
                    raise BadRecord(f"not a KubeEffect envelope: {type(env).__name__}")
            except BadRecord as exc:
                entry.done, entry.letter = True, self._dead_letter(incoming, str(exc))
                continue
            if env.id in self.seen or env.id in self._queued:
                entry.done = True
                continue
            self._queued.add(env.id)
            if env.payload.op == "evict":
                waits = list(self._running)
                task = asyncio.ensure_future(self._after(waits, entry, incoming, env, slot=False))
                self._barrier = task
            else:
                obj = _object_of(env.payload)
                before = [t for t in (self._tails.get(obj), self._barrier) if t is not None and not t.done()]
                task = asyncio.ensure_future(self._after(before, entry, incoming, env, slot=True))
                self._tails[obj] = task
                task.add_done_callback(lambda t, obj=obj: self._tails.pop(obj) if self._tails.get(obj) is t else None)
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _after(self, before: list[asyncio.Task[None]], entry: _Admitted, incoming: Incoming, env: Envelope,
                     *, slot: bool) -> None:
        """Apply ``env`` once the tasks ``before`` it are done (a slot of ``EFFECT_CONCURRENCY`` with ``slot``)."""
        if before:
            await asyncio.wait(before)
        try:
            if slot:
                async with self._slots:
                    entry.letter = await self._apply_one(incoming, env)
            else:
                entry.letter = await self._apply_one(incoming, env)
        finally:
            self._queued.discard(env.id)
        entry.done = True
        self._progress.set()

    async def settle(self, producer: Producer) -> int | None:
        """Take the settled effects at the head of what was read, in offset order, and send their dead
        letters; the offset after the last one taken (what may be committed), None when none was."""
        letters: list[Record] = []
        through = None
        while self._admitted and self._admitted[0].done:
            entry = self._admitted.popleft()
            through = entry.offset + 1
            if entry.letter is not None:
                letters.append(entry.letter)
        if letters:
            await producer.send_all(letters)
        return through

    async def drain(self, producer: Producer) -> int | None:
        """Wait for every effect admitted to settle; ``settle``'s answer."""
        while self._running:
            await asyncio.wait(list(self._running))
        return await self.settle(producer)

    async def abandon(self) -> None:
        """Cancel the effects in flight and forget those read (a stopped or restarted reader reads them
        again from its committed offset; effects are idempotent)."""
        await cancelled(list(self._running))
        self._admitted.clear()
        self._tails.clear()
        self._queued.clear()
        self._barrier = None

    async def _apply_one(self, incoming: Incoming, env: Envelope) -> Record | None:
        """Apply one effect (a span of its own with tracing on); its dead letter when the API server
        refuses it for good."""
        letter = None
        stopped = self.cycles.allows(env.payload, env.occurred_at)
        if stopped is not None:
            self.seen.add(env.id)
            return self._dead_letter(incoming, stopped)
        try:
            started = time.time()
            outcome = await self._apply(env)
            self.outcomes[outcome] += 1
            if (trace := stagetrace.current()) is not None:
                trace.note("apply", started, time.time(), env.payload.op)
            if self.tracer is not None:
                self._traced(env, incoming, started, outcome)
        except Refused as exc:
            letter = self._dead_letter(incoming, str(exc))
        except Exception as exc:  # noqa: BLE001 - a failure neither refusal nor outage (a bug, an odd
            # effect): the same record would fail the same way after every restart, so it is set aside
            log.exception("effect %s failed", env.id)
            letter = self._dead_letter(incoming, f"cannot be applied: {type(exc).__name__}: {_first_line(exc)}")
        self.seen.add(env.id)
        return letter

    async def _apply(self, env: Envelope) -> str:
        """Apply, waiting out throttling and outages: the effect is not skipped, it is late."""
        assert self.applier is not None
        delay = self.retry_first
        while True:
            try:
                return await self.applier.apply(env.payload, env.id)
            except (Transient, asyncio.TimeoutError, ConnectionError) as exc:
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
        """The watcher's sink: event time is when the change was seen. An object that cannot even
        become an envelope is dead-lettered (``_unsent``); the watch goes on."""
        self.observed += 1
        if (trace := stagetrace.current()) is not None:
            trace.note("watch", time.time(), obj.get("kind"), change)
        try:
            await self._look_up_owner(obj)
            item: Envelope | Record = watch_envelope(change, self.owners.stamped(change, obj), time.time())
        except Exception as exc:  # noqa: BLE001 - whatever the object makes ingest raise, it is bad input
            item = self._unsent(change, obj, f"cannot be read: {type(exc).__name__}: {_first_line(exc)}")
        else:
            self._note_refused(item)
        await self._changes.put(item)
        if change == "Deleted" and obj.get("kind") == "Pod" and self.on_pod_gone is not None:
            metadata = obj.get("metadata") or {}
            await self.on_pod_gone(str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))

    async def _look_up_owner(self, obj: dict[str, Any]) -> None:
        """Ask the API server for a pod's RayCluster (or its Job's RayJob) the watch has not shown yet.
        If it cannot answer now, the pod goes as its RayCluster's, and its next change asks again."""
        wanted = self.owners.look_up(obj)
        if wanted is None or self._watcher is None:
            return
        kind, namespace, name = wanted
        try:
            found = await self._watcher.get(RAY_CLUSTER if kind == "RayCluster" else RAY_JOB, namespace, name)
        except Exception as exc:  # noqa: BLE001 - the watch goes on; the lookup is made again next time
            log.warning("reading %s %s/%s for a pod's owner: %s", kind, namespace, name, _first_line(exc))
            return
        self.owners.learn(wanted, found)

    async def inventory(self, resource: Resource, version: str, objects: list[dict[str, Any]]) -> None:
        """After a list: ``ObjectsListed`` (``ingest.listing_envelopes``), queued behind the list's own
        changes, so that the cores find what they hold and the list lacks (``shared.kernel.listing``)."""
        for env in listing_envelopes(resource.kind, resource.api_version, version, objects, time.time()):
            await self._changes.put(env)
        if resource.kind == "Pod" and self.on_pods_listed is not None:
            await self.on_pods_listed()  # an evicted pod whose deletion no watch saw

    def _note_refused(self, env: Envelope) -> None:
        """A log line and a count per kind for an object ingest refused: for a Node, the only report
        (no workload to reject), saying that it is left out of scheduling until it can be read."""
        p = env.payload
        reason = refused(p.object) if isinstance(p, ObjectChanged) else None
        if reason is None:
            return
        self.refused[p.kind] += 1
        effect = ("left out of scheduling until a version muster can read comes" if p.kind == "Node"
                  else "its workload is rejected" if p.kind == "Pod" else "rejected")
        log.warning("%s %s refused at ingest (%s): %s", p.kind, env.subject.partition("/")[2], effect, reason)

    async def watch(self, api: Any, watcher: Watcher | None = None) -> None:
        """Watch every resource and publish what changes, until cancelled."""
        watcher = self._watcher = watcher or Watcher(api)
        unlisted = set(WATCHED)
        self.listed.clear()

        def listed(resource: Resource) -> Callable[[], None]:
            def done() -> None:
                unlisted.discard(resource)
                if not unlisted:
                    self.listed.set()
            return done

        tasks = [asyncio.create_task(watcher.run(resource, self.observe, listed(resource), self.inventory))
                 for resource in WATCHED]
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
            started = time.time()
            await self.send_burst(burst, producer)
            if (trace := stagetrace.current()) is not None:
                trace.note("publish", started, time.time(), len(burst))

    async def send_burst(self, burst: Sequence[Envelope | Record], producer: Producer) -> None:
        """Write a burst as ``send_logged`` does, each envelope on its own when it has to be: one the
        codec cannot encode (text JSON cannot hold, nesting past the encoder's limit) or larger than
        the broker takes (``max_record_bytes``) is dead-lettered before anything is sent, and one
        the broker refuses for good is found by sending the burst one envelope at a time and
        dead-lettered too; the others go on. What the broker cannot take now (it is down, a leader
        moves) is retried with backoff and holds the burst: nothing is lost or sent out of order."""
        letters = [item for item in burst if isinstance(item, Record)]
        ready: list[tuple[Envelope, Record, list[Record]]] = []
        for env in burst:
            if isinstance(env, Record):
                continue
            try:
                first, rest, _ = logged_and_routed(self.topics, env)
            except Exception as exc:  # noqa: BLE001 - an encoder's refusal comes in many types
                letters.append(self._unsent_envelope(env, f"cannot be encoded: {type(exc).__name__}: "
                                                          f"{_first_line(exc)}"))
                continue
            if len(first.value) > self.max_record_bytes:
                letters.append(self._unsent_envelope(env, f"{len(first.value)} bytes encoded, more than the "
                                                          f"broker takes ({self.max_record_bytes})"))
                continue
            ready.append((env, first, rest))
        if letters:
            await self._retrying(producer, letters)
        try:
            await self._send_pairs(producer, ready)
        except Exception as exc:  # noqa: BLE001 - refused for good (retriable errors were waited out)
            log.warning("the broker refused a burst of %d watch events (%s); sending them one at a time",
                        len(ready), _first_line(exc))
            for env, first, rest in ready:
                try:
                    await self._send_pairs(producer, [(env, first, rest)])
                except Exception as one:  # noqa: BLE001
                    await self._retrying(producer, [self._unsent_envelope(
                        env, f"refused by the broker: {type(one).__name__}: {_first_line(one)}")])

    async def _send_pairs(self, producer: Producer, ready: Sequence[tuple[Envelope, Record, list[Record]]]) -> None:
        """The log records, then the routed ones (the log never holds an effect before its cause)."""
        if ready:
            await self._retrying(producer, [first for _, first, _ in ready])
            routed = [record for _, _, rest in ready for record in rest]
            if routed:
                await self._retrying(producer, routed)

    async def _retrying(self, producer: Producer, records: Sequence[Record]) -> list[int]:
        """``send_all``, waiting out what the broker cannot take now; a refusal for good is raised."""
        delay = self.retry_first
        while True:
            try:
                return await producer.send_all(records)
            except KafkaError as exc:
                if not exc.retriable:
                    raise
                self.retries += 1
                log.warning("sending watch events: %s; trying again in %.1fs", _first_line(exc) or type(exc).__name__,
                            delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_max)

    def _unsent_envelope(self, env: Envelope, error: str) -> Record:
        p = env.payload
        obj = p.object if isinstance(p, ObjectChanged) else {}
        return self._unsent(getattr(p, "change", ""), obj, error, kind=getattr(p, "kind", ""))

    def _unsent(self, change: str, obj: Any, error: str, *, kind: str = "") -> Record:
        """The dead letter of a watch event that cannot go to the inboxes: where it was read (the
        object's kind, namespace, name, uid and resourceVersion; never the object, which may be what
        is wrong), the error, counted and logged."""
        self.dead_letters += 1
        self.unsent += 1
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        where = {"change": change, "kind": kind or (obj.get("kind") if isinstance(obj, dict) else "")}
        for field in ("namespace", "name", "uid", "resourceVersion"):
            where[field] = meta.get(field)
        text = json.dumps(where, default=repr)[:2_000]  # ASCII: a lone surrogate is escaped, not refused
        what = f"{where['kind']} {where['namespace'] or ''}/{where['name']}".replace(" /", " ")
        error = f"{what}: {error}"
        log.error("watch event dead-lettered: %s", error)
        return Record(self.topics.deadletter, b"kubernetes", codec.dead_letter(
            text.encode(), [], topic="kubernetes", partition=-1, offset=-1, consumer=self.name, error=error), [])

    # ------------------------------------------------------------------ health
    async def supervised(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        """Run ``run`` until cancelled; when it fails, say so (``down``: ``/readyz`` is false) and run
        it again after a backoff. A task of the link never stops silently."""
        delay = self.retry_first
        while True:
            started = time.monotonic()
            try:
                await run()
                reason = "ended"
            except Exception as exc:  # noqa: BLE001 - whatever stopped it, it is restarted
                reason = f"{type(exc).__name__}: {_first_line(exc)}"
                log.exception("cluster link: %s stopped; starting it again in %.1fs", name, delay)
            if time.monotonic() - started > self.retry_max:
                delay = self.retry_first  # it ran a while: a new failure, not the same one again
            self.down[name] = f"{name} is down ({reason}); starting again in {delay:.1f}s"
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.retry_max)
            self.down.pop(name, None)

    def not_ready(self) -> str | None:
        """Why ``/readyz`` is false: not connected yet, or a task down (None: ready)."""
        if self.down:
            return "; ".join(self.down[name] for name in sorted(self.down))
        if self.connected.is_set():
            return None
        if "watch" not in self._sides and "apply" in self._sides:
            return "the watching process has not connected to the Kubernetes API server yet"
        return "not connected to the Kubernetes API server yet"


async def first_to_end(*loops: Awaitable[None]) -> None:
    """Run ``loops`` side by side until one ends; cancel the others; raise what it raised."""
    tasks = [asyncio.ensure_future(loop) for loop in loops]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    finally:
        await cancelled(tasks)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""


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
    read (``PartitionReader``): Faust's stream costs many times a plain consumer's CPU a record, and a
    RayCluster of 9 pods brings 13 effects. Nothing to rebuild on assignment (the bridge keeps no
    state but its dedupe): it resumes at the committed offset, which only ever passes applied batches."""

    def __init__(self, config: BusConfig, bridge: ClusterBridge, producer: Producer) -> None:
        super().__init__(config, f"{config.prefix}cluster", config.topics.effects, "effects")
        self.bridge, self.producer = bridge, producer

    async def run(self) -> None:
        self._task = asyncio.current_task()  # ``stop`` ends it while it waits for the API server too
        await self.bridge.listed.wait()  # caches synced first (``ClusterBridge.listed``)
        try:
            await super().run()
        finally:
            await self.bridge.abandon()  # the next run reads what was not settled again

    async def _handle(self, records: Sequence[Any]) -> None:
        """Start the batch's effects (``ClusterBridge.admit``) and read on: ``_fetched`` settles them."""
        await self.bridge.admit([Incoming(m.value, m.headers, m.partition, m.offset) for m in records])

    async def _fetched(self) -> None:
        """The effects settled so far: their dead letters out, then ``processed`` past them (what is
        committed). Done between fetches, so that a failure to send a dead letter ends ``run`` and
        ``supervised`` starts it again, as when batches were applied whole."""
        through = await self.bridge.settle(self.producer)
        if through is not None:
            self.processed = through

    async def _assigned(self, consumer: AIOKafkaConsumer) -> None:
        """Read on from the committed offset (from the start when none is)."""
        committed = await consumer.committed(self.tp)
        self._in_order.next = committed if committed is not None else \
            (await consumer.beginning_offsets([self.tp]))[self.tp]
