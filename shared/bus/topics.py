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
``muster.control``     1           the service                     services -> ``simulate --bus`` driver
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
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.events import Envelope
from shared.topology import SERVICES

DEFAULT_PREFIX = "muster."

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
    def control(self) -> str:
        return f"{self.prefix}control"

    def partitions(self) -> dict[str, int]:
        """Every topic and its partition count (created on start when missing)."""
        names = [self.inbox(s) for s in SERVICES] + [self.effects, self.log, self.deadletter, self.control]
        return {name: 1 for name in names}

    def destination(self, dest: str) -> str:
        """The topic behind a ``shared.topology`` destination (``clock`` has none: see ``worker.Clock``)."""
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
