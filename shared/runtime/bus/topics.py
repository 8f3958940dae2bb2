"""Every topic muster uses: name, partition count, partition key — the one place that says so.

=====================  ==========  ==============================  ====================================
topic                  partitions  key                             written by -> read by
=====================  ==========  ==============================  ====================================
``muster.admission``   1           the subject (``Kind/ns/name``)  ingest -> admission
``muster.queue``       1           the quota tree (``cluster``)    admission, placement, clock -> queue
``muster.placement``   1           ``placement``                   ingest, admission, queue -> placement
``muster.reconciler``  1           the subject                     admission, queue, placement -> reconciler
``muster.effects``     1           the subject                     reconciler -> the Kubernetes applier
``muster.events``      1           the subject                     every service, ingest, clock -> projector
``muster.deadletter``  1           the topic it came from          any consumer -> people
``muster.checkpoints`` 1           the log's partition             projector -> witnesses (``muster log checkpoints``)
``muster.control``     1           the service                     services -> ``simulate --bus`` driver
``muster.snapshots.S`` 1           the snapshot's part             service S -> service S on restart
=====================  ==========  ==============================  ====================================

Why one partition per inbox: a service's state and outputs are a fold over *one* totally ordered
inbox (ARCHITECTURE.md, principle 2); Kafka orders records only within a partition. The queue's
inbox is keyed by quota tree, so that every queue sharing a tree lands in one partition — and in
muster every queue shares one tree: top-level queues are siblings under the cluster (fair share and
reclaim run between them), so the key is the tree's root, ``cluster``. Placement sees one totally
ordered stream by construction. Keys still name what must stay in order, so splitting a topic
(more partitions) cannot reorder one subject's events without the key saying so.

``muster.events`` is the event log: every envelope, written once, by the service that made it,
*before* it is routed to any inbox — so the log holds every cause before its effects, which is the
order the projector folds it in. The inboxes carry multi-routed envelopes more than once and in no
order across topics; the projector reads the log instead.

Every name takes a prefix (default ``muster.``), so several stacks (or test runs) share one broker.

**Durability** (``Topics.specs``): every topic is created with its configuration spelled out, never
the broker's defaults (Kafka's is 7 days of retention). A service rebuilds its state by folding its
inbox from the first record, the projector and ``muster replay`` read the whole log, and the cluster
link applies every effect: so the inboxes, ``muster.effects``, ``muster.events`` and the dead
letters keep every record (``retention.ms=-1``, ``retention.bytes=-1``, ``cleanup.policy=delete``:
compaction would drop older records of a key, and every record of a subject counts). Only the
control topic, which the ``simulate --bus`` driver reads while a run lasts, keeps a day, and a
service's snapshot topic (``shared.runtime.bus.snapshot``) a week and at most 1 GiB: only its latest snapshot
is ever read and a new one is written every few seconds of work, so an older one is garbage; when none is left the
service rebuilds from its whole inbox, and says so. Replication
factor and ``min.insync.replicas`` come from configuration (``BusConfig``: 1 and 1 by default, for
one broker; 3 and 2 on a production cluster, with producers waiting for every in-sync replica).

A process refuses to start on a topic it reads whose retention would lose records it needs
(``retention_problem``) or whose records it needs are gone already (``lost_records``): a truncated
inbox or an emptied broker would otherwise rebuild an empty state and decide from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from shared.kernel.events import Envelope
from shared.kernel.topology import SERVICES

DEFAULT_PREFIX = "muster."

KEEP_ALL: Mapping[str, str] = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
"""The configuration of a topic whose every record someone needs: no time or size limit, no compaction."""
CONTROL_RETENTION_MS = 24 * 3600 * 1000
"""The control topic's retention: the ``simulate --bus`` driver reads it only while its run lasts."""
SNAPSHOT_RETENTION_MS = 7 * 24 * 3600 * 1000
"""A snapshot topic's retention: only the latest snapshot is read, and a missing one costs a full replay."""
SNAPSHOT_RETENTION_BYTES = 1 << 30
SNAPSHOT_SEGMENT_BYTES = 64 << 20
"""And at most about this many bytes of it (in segments this large; the segment being written is never
deleted, and it holds the latest snapshot): a busy service writes a few MB every few seconds, which
a week of would be hundreds of GB."""


@dataclass(frozen=True)
class TopicSpec:
    """How one topic is created: ``keeps_all`` says its readers need every record it ever held."""

    name: str
    partitions: int
    replication: int
    configs: Mapping[str, str]
    keeps_all: bool


QUEUE_TREE_KEY = b"cluster"
"""The queue inbox's partition key: the root of the one quota tree every queue belongs to."""


@dataclass(frozen=True)
class Topics:
    """Topic names under one prefix."""

    prefix: str = DEFAULT_PREFIX

    def inbox(self, service: str) -> str:
        if service not in SERVICES:
            raise ValueError(f"no inbox for {service!r}: services are {', '.join(SERVICES)}")
        return f"{self.prefix}{service}"

    @property
    def effects(self) -> str:
        return f"{self.prefix}effects"

    @property
    def log(self) -> str:
        return f"{self.prefix}events"

    @property
    def deadletter(self) -> str:
        return f"{self.prefix}deadletter"

    @property
    def checkpoints(self) -> str:
        """The signed checkpoints of the log's hash chain (``shared.history.integrity``), as the projector signs them."""
        return f"{self.prefix}checkpoints"

    @property
    def control(self) -> str:
        return f"{self.prefix}control"

    def snapshots(self, service: str) -> str:
        """Where ``service`` keeps its snapshots (``shared.runtime.bus.snapshot``)."""
        self.inbox(service)  # an unknown service is refused as for its inbox
        return f"{self.prefix}snapshots.{service}"

    def partitions(self) -> dict[str, int]:
        """Every topic and its partition count (created on start when missing)."""
        names = ([self.inbox(s) for s in SERVICES] + [self.effects, self.log, self.deadletter, self.control, self.checkpoints]
                 + [self.snapshots(s) for s in SERVICES])
        return {name: 1 for name in names}

    def specs(self, replication: int = 1, min_insync: int = 1) -> list[TopicSpec]:
        """Every topic as it is created: partitions, replication, and its configuration spelled out
        (see the module docstring) rather than left to the broker's defaults."""
        durable = {"min.insync.replicas": str(min_insync)}
        out = []
        bounded = {self.control: CONTROL_RETENTION_MS, **{self.snapshots(s): SNAPSHOT_RETENTION_MS for s in SERVICES}}
        for name, partitions in self.partitions().items():
            keeps_all = name not in bounded
            configs = {**durable, **KEEP_ALL} if keeps_all else {
                **durable, "retention.ms": str(bounded[name]), "cleanup.policy": "delete"}
            if name != self.control and not keeps_all:
                configs.update({"retention.bytes": str(SNAPSHOT_RETENTION_BYTES),
                                "segment.bytes": str(SNAPSHOT_SEGMENT_BYTES)})
            out.append(TopicSpec(name, partitions, replication, configs, keeps_all))
        return out

    def destination(self, dest: str) -> str:
        """The topic behind a ``shared.kernel.topology`` destination (``clock`` has none: see ``worker.Clock``)."""
        if dest == "cluster":
            return self.effects
        return self.inbox(dest)


def key(topic: str, env: Envelope, topics: Topics) -> bytes:
    """The partition key of ``env`` on ``topic`` (see the table above)."""
    if topic == topics.inbox("queue"):
        return QUEUE_TREE_KEY
    if topic == topics.inbox("placement"):
        return b"placement"
    return env.subject.encode()


def retention_problem(spec: TopicSpec, described: Mapping[str, str], reader: str) -> str | None:
    """Why the existing topic ``spec.name``, configured as the broker ``described`` it, would lose
    records ``reader`` needs; None when it keeps them (or they are not needed).

    A setting the broker does not report is taken to be the broker's default, which for retention
    is finite on Apache Kafka (7 days): a topic made without muster's configuration is refused."""
    if not spec.keeps_all:
        return None
    name = spec.name
    why = []
    ms = described.get("retention.ms")
    if ms is None:
        why.append("the broker reports no retention.ms for it (so its default applies: 7 days on Apache Kafka)")
    elif ms.strip() != "-1":
        why.append(f"retention.ms={ms} deletes records after {_duration(ms)}")
    size = described.get("retention.bytes")
    if size is not None and size.strip() != "-1":
        why.append(f"retention.bytes={size} deletes the oldest records past that size")
    if "compact" in described.get("cleanup.policy", "delete"):
        why.append(f"cleanup.policy={described['cleanup.policy']} drops older records of a key")
    if not why:
        return None
    return (f"topic {name} would lose records {reader} needs: {'; '.join(why)}. {reader} rebuilds from the "
            f"topic's first record, so it must keep all of them: kafka-configs.sh --alter --entity-type topics "
            f"--entity-name {name} --add-config retention.ms=-1,retention.bytes=-1,cleanup.policy=delete")


def _duration(ms: str) -> str:
    try:
        seconds = int(ms) / 1000
    except ValueError:
        return f"{ms} ms"
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def lost_records(topic: str, reader: str, *, start: int, end: int, resume: int | None,
                 needed_from: int = 0, snapshot: str = "") -> str | None:
    """Why ``reader`` cannot go on from what ``topic`` holds now; None when it can.

    ``start`` and ``end`` are the partition's log start and end offsets; ``resume`` where the reader's
    state says it is (its committed offset, the store's consumed offset; None: it never read the
    topic); ``needed_from`` the first offset it must read to rebuild that state (0 for a service that
    replays its inbox from the start, ``resume`` for a reader that keeps no state of the topic).

    Two ways to have lost records: the topic ends before where the reader's state says it is (the
    broker lost its data, or the topic was deleted and made again, while the offsets survived), or
    it starts after the first record the reader needs (retention, or records deleted). Either way,
    going on would rebuild a state that misses what those records did, and decide from it.
    ``snapshot``: why no snapshot of the reader's covers the deleted records (said with them)."""
    if resume is not None and resume > end:
        return (f"{topic} ends at offset {end} but {reader} has handled it up to offset {resume}: the topic was "
                "emptied or made again (broker data lost?); refusing to rebuild from what is left. Restore the "
                "topic's data, or start the stack afresh under a new MUSTER_TOPIC_PREFIX (and a new store)")
    if start > needed_from:
        return (f"{topic} starts at offset {start} but {reader} needs its records from offset {needed_from}: "
                f"records {needed_from} to {start - 1} were deleted (retention or delete-records)"
                + (f" and no usable snapshot covers them ({snapshot})" if snapshot else "") + "; refusing to "
                "rebuild without them. Restore them, or start the stack afresh under a new MUSTER_TOPIC_PREFIX "
                "(and a new store)")
    return None
