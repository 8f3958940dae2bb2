"""A log read off Kafka: ``muster.events``, put in an order in which every inbox is the log's own.

The log topic holds every envelope once (copies a restarted service sent again are dropped by id,
as the projector drops them), causes before effects, and each service's outputs in the order it
made them. What it does not hold is the order in which each service *read* its inputs: several
services write at once, so the log interleaves their outputs in whatever order they were written,
while each inbox has its own — the order the service handled, in arrival order (the deployment),
or in the order the ``simulate --bus`` driver released each round in (``shared.runtime.bus.sequencing``).
Replaying the log in its topic order could hand a service two inputs the other way round.

So the inboxes are read too, each into the order its service handled it (the same ``Arrival`` and
``Rounds`` the workers use), and the log is laid out again: causes before effects, every service's
outputs in the order it made them, every inbox in the order it was handled, and otherwise as close
to the topic's own order as those allow (a topological sort that always takes the earliest offset
it can). In that order the log *is* each inbox, filtered by ``shared.kernel.topology``, which is what
``shared.audit.replay`` and an exported file rely on. In the deployment two services may read two
envelopes both were sent in opposite orders; then no one order keeps both inboxes, and the log
cannot be written as one file (``Unordered``, naming the envelopes).

**The chain.** The projector chains each envelope it writes (``shared.history.integrity``): the log
topic's records in offset order, per partition, the ones that are envelopes and the first of each id.
Reading the topic in the same order, ``KafkaLog`` computes the same links over the same bytes, so each
envelope keeps its place ``at`` in the chain whatever line of the replay order it stands on; the
projector's signed records (key, header, checkpoints) are read off the checkpoints topic, *before*
the log, so that every checkpoint read signs envelopes the log read after it holds. ``muster log
export`` writes them as a chained log in replay order (``LogHeader.replay_order``), checked against
the checkpoints first (``mismatch``).

A service's ``PolicyApplied`` (written on a start with a policy its log may not show) goes where the
service took it in its inbox's order: after the last input it had handled before (its ``after``) and
before the next, so a replay switches that service's policy exactly where the live one did. The header
of such a log names the policy the log starts with, unless ``--policy`` gave one.
"""

from __future__ import annotations

import asyncio
import heapq
from typing import Any, Iterator

from aiokafka import AIOKafkaConsumer, TopicPartition

from shared.audit.errors import SourceError, Unordered
from shared.audit.header import LogHeader
from shared.audit.logfile import Record
from shared.history.integrity import GENESIS, link
from shared.kernel.events import Envelope
from shared.kernel.policy import Policy
from shared.kernel.topology import SERVICES
from shared.runtime.bus import codec
from shared.runtime.bus.codec import BadRecord, Release
from shared.runtime.bus.config import BusConfig, BusConfigError
from shared.runtime.bus.sequencing import Arrival, Ordering, Rounds, SequencingError


class KafkaLog:
    """``kafka://HOST:PORT``: the stack's log topic (and inboxes), read to their ends once."""

    def __init__(self, spec: str, *, policy: Policy | None = None, prefix: str | None = None) -> None:
        from shared.parts.localbroker import kafka_answers

        try:
            self.config = BusConfig.from_env(spec, prefix=prefix)
        except BusConfigError as exc:
            raise SourceError(str(exc)) from None
        problem = kafka_answers(",".join(self.config.servers))
        if problem:
            raise SourceError(f"Kafka at {spec} does not answer: {problem}")
        self.name = f"{spec} ({self.config.topics.log})"
        self._header = LogHeader.made_now(policy, origin="kafka")
        self._given = policy is not None
        self.skipped = 0
        """Records of the log topic that are not envelopes (the projector dead-lettered them)."""
        self._ordered: list[tuple[int, bytes, int, bytes]] | None = None
        """(topic offset, bytes, offset in the chain, link) of each envelope, in replay order."""
        self._signed: list[dict[str, Any]] = []
        self._read = 0

    @property
    def header(self) -> LogHeader:
        """Made now (a Kafka log holds no header), naming the policy ``--policy`` gave, else the one the
        log starts with (its first ``PolicyApplied``): so reading it reads the topics."""
        if self._ordered is None:
            self._ordered = asyncio.run(self._load())
            if not self._given:
                first = next((raw for _, raw, _, _ in self._ordered if b'"type":"PolicyApplied"' in raw), None)
                env = codec.decode(first, None) if first is not None else None
                if isinstance(env, Envelope) and env.type == "PolicyApplied":
                    self._header = self._header.model_copy(update={"policy": env.payload.policy})
        return self._header

    @property
    def signed(self) -> list[dict[str, Any]]:
        """The projector's signed records, as the checkpoints topic holds them (none: a projector without
        a signing key, or a deployment from before the chain); reading them reads the topics."""
        self.header
        return self._signed

    def size(self) -> tuple[int, str] | None:
        return (len(self._ordered), "events") if self._ordered is not None else None

    def hint(self) -> str:
        return (f"{self.skipped} record(s) of the log topic were not envelopes (dead-lettered), left out"
                if self.skipped else "")

    def progress(self) -> int:
        return self._read

    def records(self) -> Iterator[Record]:
        self.header  # reads the topics once
        assert self._ordered is not None
        self._read = 0
        for offset, raw, _, _ in self._ordered:
            self._read += 1
            yield Record(f"offset {offset}", raw)

    def chain(self) -> Iterator[tuple[bytes, int, int, str]]:
        """Each envelope in replay order with its place in the projector's chain: (bytes, partition,
        offset, link), as ``shared.audit.integrity.chain_lines`` takes them."""
        self.header
        assert self._ordered is not None
        self._read = 0
        for _, raw, at, value in self._ordered:
            self._read += 1
            yield raw, 0, at, value.hex()

    def mismatch(self) -> str | None:
        """Where the chain computed here differs from one the projector signed (None: it agrees with every
        checkpoint): an envelope the store refused (dead-lettered by the projector, so no place in its
        chain) or a log topic rewritten since it was signed. A file exported anyway would not verify."""
        self.header
        assert self._ordered is not None
        links = {at: value.hex() for _, _, at, value in self._ordered}
        for record in self._signed:
            if record.get("kind") != "checkpoint" or record.get("partition") != 0:
                continue
            held = links.get(record.get("offset"))  # type: ignore[arg-type]
            if held is None:
                return (f"checkpoint {record.get('number')} signs offset {record.get('offset')} of the chain, "
                        f"which the log topic no longer reaches ({len(links)} envelopes)")
            if held != record.get("chain"):
                return (f"the log topic's link at offset {record.get('offset')} of the chain is not the one checkpoint "
                        f"{record.get('number')} signed: the topic holds other records than the projector chained "
                        "there (one the store refused and dead-lettered, or the topic was rewritten)")
        return None

    async def _load(self) -> list[tuple[int, bytes, int, bytes]]:
        topics = self.config.topics
        try:
            signed = await read_topic(self.config, topics.checkpoints, missing_ok=True)  # first: see the docstring
            log = await read_topic(self.config, topics.log)
            inboxes = {s: await read_topic(self.config, topics.inbox(s)) for s in SERVICES}
        except SourceError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broker that fails mid-read: one line
            raise SourceError(f"reading {topics.log} from {self.config.bootstrap}: {type(exc).__name__}: {exc}") from None
        self._signed = signed_records(signed)
        entries: list[tuple[int, bytes, Envelope, bytes]] = []
        seen: set[str] = set()
        chain = GENESIS
        for offset, value, headers in log:
            try:
                env = codec.decode(value, headers)
            except BadRecord:
                self.skipped += 1
                continue
            if isinstance(env, Envelope) and env.id not in seen:  # what the projector chains (module docstring)
                seen.add(env.id)
                chain = link(chain, value or b"")
                entries.append((offset, value or b"", env, chain))
        handled = {s: handling_order(records, s) for s, records in inboxes.items()}
        return [(entries[i][0], entries[i][1], i, entries[i][3])
                for i in replay_order([e[2] for e in entries], handled)]


def signed_records(records: list[tuple[int, bytes | None, Any]]) -> list[dict[str, Any]]:
    """The signed records of the checkpoints topic, in the order the projector signed them; a record
    that is not one is left out (verify names what a missing one breaks)."""
    import json

    out = []
    for _, value, _ in records:
        try:
            record = json.loads(value or b"")
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("kind") in ("key", "header", "checkpoint"):
            out.append(record)
    return out


async def read_topic(config: BusConfig, topic: str, *, missing_ok: bool = False) -> list[tuple[int, bytes | None, Any]]:
    """Every record of partition 0 of ``topic`` up to its end when asked: (offset, value, headers);
    none for a topic that does not exist when ``missing_ok``."""
    from shared.runtime.bus.app import InOrder

    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(**config.aiokafka(), enable_auto_commit=False, fetch_max_wait_ms=100,
                                max_partition_fetch_bytes=16 * 1024 * 1024)
    await consumer.start()
    try:
        if topic not in await consumer.topics():
            if missing_ok:
                return []
            raise SourceError(f"there is no topic {topic} on {config.bootstrap} (is the topic prefix right? "
                              "--topic-prefix / MUSTER_TOPIC_PREFIX)")
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        order = InOrder(tp, 0, name=topic)
        out: list[tuple[int, bytes | None, Any]] = []
        while order.next is not None and order.next < end:
            batch = await consumer.getmany(tp, timeout_ms=1000, max_records=10_000)
            out.extend((m.offset, m.value, m.headers) for m in order.take(consumer, batch.get(tp, ())))
        # Tansu answers "latest" with the base offset of the last record batch plus one, not the offset
        # after its last record (shared.runtime.bus.app._last_offset_read): the rest of that batch came with the
        # fetch that reached ``end``. Take it, and whatever else that fetch holds, never waiting for more.
        while order.next is not None and order.next >= end:
            rest = (await consumer.getmany(tp, timeout_ms=0, max_records=10_000)).get(tp, ())
            if not rest:
                break
            out.extend((m.offset, m.value, m.headers) for m in order.take(consumer, rest))
        return out
    finally:
        await consumer.stop()


def handling_order(records: list[tuple[int, bytes | None, Any]], service: str) -> list[str]:
    """The ids ``service`` handled, in the order it handled them: arrival order, or the order of the
    driver's releases when the inbox holds any (``simulate --bus``). Each id once (the dedupe)."""
    decoded: list[Envelope | Release] = []
    for _, value, headers in records:
        try:
            item = codec.decode(value, headers)
        except BadRecord:
            continue  # dead-lettered by the service: never handled
        if isinstance(item, (Envelope, Release)):
            decoded.append(item)
    ordering: Ordering = Rounds() if any(isinstance(i, Release) for i in decoded) else Arrival()
    ids: dict[str, None] = {}
    for item in decoded:
        try:
            taken = ordering.release(item) if isinstance(item, Release) else ordering.offer(item)
        except SequencingError as exc:
            raise SourceError(f"the {service} inbox: {exc}") from None
        for env in taken:
            ids.setdefault(env.id, None)
    return list(ids)


def replay_order(log: list[Envelope], handled: dict[str, list[str]]) -> list[int]:
    """Indexes of ``log`` (topic order) in replay order: a topological sort of causes before effects,
    each producer's outputs in its order, each inbox in its handling order; ties by topic order."""
    index = {env.id: i for i, env in enumerate(log)}
    after: list[list[int]] = [[] for _ in log]
    before = [0] * len(log)

    def edge(a: int, b: int) -> None:
        after[a].append(b)
        before[b] += 1

    last_of: dict[str, int] = {}
    for i, env in enumerate(log):
        cause = index.get(env.causation_id or "")
        if cause is not None and cause != i:
            edge(cause, i)
        if env.source in SERVICES or env.source == "ingest":  # one producer each: its order stands
            if env.source in last_of:
                edge(last_of[env.source], i)
            last_of[env.source] = i
    for service, ids in handled.items():
        prev = None
        for event_id in ids:
            i = index.get(event_id)
            if i is None:
                continue
            if prev is not None:
                edge(prev, i)
            prev = i
    positions: dict[str, dict[str, int]] = {}
    for i, env in enumerate(log):  # a service's policy: where it took it in its inbox (module docstring)
        if env.type != "PolicyApplied" or env.source not in handled:
            continue
        ids = handled[env.source]
        if env.source not in positions:
            positions[env.source] = {event_id: k for k, event_id in enumerate(ids)}
        at = positions[env.source]
        last = env.payload.after
        k = at.get(last) if last is not None else -1
        if k is None:
            continue  # an input the inbox no longer holds: the producer's order places it
        if k >= 0 and (j := index.get(ids[k])) is not None and j != i:
            edge(j, i)
        for event_id in ids[k + 1:]:  # the next input the log holds
            if (j := index.get(event_id)) is not None:
                if j != i:
                    edge(i, j)
                break
    ready = [i for i in range(len(log)) if before[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in after[i]:
            before[j] -= 1
            if before[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(log):
        stuck = sorted(i for i in range(len(log)) if before[i] > 0)[:2]
        names = ", ".join(f"{log[i].type} {log[i].subject} ({log[i].id})" for i in stuck)
        raise Unordered(f"the log cannot be laid out in one order that keeps every inbox's own: {names} and what "
                        "waits on them reached two services in opposite orders")
    return order
