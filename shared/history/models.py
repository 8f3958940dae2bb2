"""The history store's tables: SQLAlchemy 2 typed declarative models, one class per table.

Portable between PostgreSQL (the deployment) and SQLite (the embedded runtime's local file):
JSON columns are JSONB on Postgres (except ``event_log.payload``, see there), times are event time
in seconds (``occurred_at`` of the envelope, scenario seconds in the embedded runtime) as double
precision, and resource amounts are integers in milli-units (``shared.kernel.quantity``).

``migrations/versions/0001_projections.py`` creates exactly these tables and indexes by hand; the
integration tests compare the migrated schema with this metadata, so the two cannot drift apart.

    event_log             every envelope, once (unique event id), with where it was read
    workloads             current state per workload
    workload_transitions  every change of phase or reason, with the event that caused it
    placements            pod -> node, GPU device/fraction, one row per bound interval
    queues                the queue tree as defined, and the usage each queue holds now
    queue_usage           usage per queue and resource over time
    decisions             every service output, with its service, input event and reason
    consumed_offsets      how far the projector has read each topic partition
    log_header            what the log was made under: muster and schema version, the policy
    log_signed            the signed records anchoring the event log's hash chain: keys, header, checkpoints
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Double, ForeignKey, Index, Integer, MetaData, String, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JSONDocument = JSON().with_variant(JSONB(), "postgresql")
"""A JSON value: JSONB on Postgres (indexable, compact), JSON text on SQLite."""

Seq = BigInteger().with_variant(Integer(), "sqlite")
"""An auto-incrementing 64-bit key (SQLite only auto-increments ``INTEGER PRIMARY KEY``)."""

EventId = String(64)
"""``shared.kernel.events.derive_id`` gives 24 hex digits; room for other producers' ids."""


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {float: Double(), dict[str, Any]: JSONDocument, str: Text()}


class EventLog(Base):
    """Every envelope, exactly once. ``seq`` is the order the projector wrote them in (replay order).

    ``payload`` is plain JSON, not JSONB, on purpose: Postgres keeps JSON text as written, so an
    envelope read back serialises to the same bytes it had on the bus (JSONB would reorder keys).
    """

    __tablename__ = "event_log"

    seq: Mapped[int] = mapped_column(Seq, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(EventId, unique=True)
    type: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str]
    source: Mapped[str] = mapped_column(String(64))
    occurred_at: Mapped[float]
    causation_id: Mapped[str | None] = mapped_column(EventId)
    correlation_id: Mapped[str] = mapped_column(EventId)
    schema_version: Mapped[int]
    trace: Mapped[dict[str, Any]]
    payload: Mapped[dict[str, Any]] = mapped_column(JSON())
    workload_key: Mapped[str | None] = mapped_column(Text)
    """``namespace/name`` of the workload the event is about (its pods' events included), else NULL."""
    topic: Mapped[str | None] = mapped_column(Text)
    partition: Mapped[int | None] = mapped_column(Integer)
    offset: Mapped[int | None] = mapped_column(BigInteger)
    """Where the projector read it (Kafka topic, partition, offset); NULL in the embedded runtime."""
    chain_offset: Mapped[int | None] = mapped_column(BigInteger)
    chain: Mapped[str | None] = mapped_column(String(64))
    """The envelope's place in its partition's hash chain and its link there, in hex
    (``shared.history.integrity``); NULL in a store written before the chain existed (migration 0003)."""

    __table_args__ = (
        Index("ix_event_log_workload_key_seq", "workload_key", "seq"),
        Index("ix_event_log_occurred_at", "occurred_at"),
    )


class Workload(Base):
    """Current state of one workload: what ``ResultProjection`` holds for it after the last event."""

    __tablename__ = "workloads"

    key: Mapped[str] = mapped_column(Text, primary_key=True)
    namespace: Mapped[str]
    name: Mapped[str]
    kind: Mapped[str] = mapped_column(String(32))
    queue: Mapped[str | None] = mapped_column(Text)
    priority: Mapped[int]
    min_member: Mapped[int]
    resources: Mapped[dict[str, Any]]
    """What the whole gang requests, milli-units per resource."""
    demand: Mapped[dict[str, Any]]
    """What the gang charges against quota (resources plus fractional GPUs), milli-units."""
    phase: Mapped[str | None] = mapped_column(String(16))
    reason: Mapped[str]
    holds_quota: Mapped[bool] = mapped_column(Boolean)
    queue_state: Mapped[str] = mapped_column(String(16))
    """``pending``, ``backoff``, ``active`` or empty."""
    requeue_at: Mapped[float | None]
    ordinal: Mapped[int] = mapped_column(Integer)
    """Order in which muster first heard of the workload (ties in queue positions)."""
    transition_count: Mapped[int] = mapped_column(Integer)
    first_seen_at: Mapped[float]
    phase_since: Mapped[float | None]
    """Time of the last transition (change of phase or reason)."""
    last_event_at: Mapped[float]
    fold_state: Mapped[dict[str, Any]]
    """The projector's own state for this workload: every field of ``ResultProjection``'s
    ``WorkloadView`` but its transitions, as pydantic serialises it. The columns above are read
    from it; read them, not this."""

    __table_args__ = (
        Index("ix_workloads_queue_phase", "queue", "phase"),
        Index("ix_workloads_holds_quota", "holds_quota"),
        Index("ix_workloads_ordinal", "ordinal"),
    )


class WorkloadTransition(Base):
    """One change of a workload's phase or of the reason it is in it (``seq`` counts from 0)."""

    __tablename__ = "workload_transitions"

    workload_key: Mapped[str] = mapped_column(Text, ForeignKey("workloads.key", ondelete="CASCADE"),
                                              primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    t: Mapped[float]
    phase: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str]
    event_id: Mapped[str] = mapped_column(EventId)
    """The envelope that caused it (join ``decisions`` for the service and its input)."""

    __table_args__ = (Index("ix_workload_transitions_t", "t"),)


class Placement(Base):
    """A pod of a workload: where it went and when it was bound, one row per bound interval.

    A pod muster knows but that was never bound has one row with ``bound_at`` NULL (``node`` is the
    planned node once placement assigned it). ``node``/``gpu_*``/``gone`` describe the pod and are
    the same on each of its rows. Pods may arrive before their workload (a plain pod gang is
    submitted once enough pods exist), so there is no foreign key to ``workloads``.
    """

    __tablename__ = "placements"

    workload_key: Mapped[str] = mapped_column(Text, primary_key=True)
    pod: Mapped[str] = mapped_column(Text, primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    pod_ordinal: Mapped[int] = mapped_column(Integer)
    """Order in which the workload's pods were first seen."""
    pod_set: Mapped[str]
    node: Mapped[str | None] = mapped_column(Text)
    gpu_devices: Mapped[list[int] | None] = mapped_column(JSONDocument)
    gpu_fraction: Mapped[float | None]
    bound_at: Mapped[float | None]
    unbound_at: Mapped[float | None]
    gone: Mapped[bool] = mapped_column(Boolean)

    __table_args__ = (
        Index("ix_placements_node_bound_at", "node", "bound_at"),
        Index("ix_placements_bound_at", "bound_at"),
    )


class Queue(Base):
    """A queue as last defined (``spec`` is the normalised ``QueueSpec``), and the usage it holds.

    A queue that holds usage without ever being defined (the implicit default queue) has a row
    with ``spec`` NULL. ``usage`` is rolled up from the leaves, like ``ResultProjection``.
    """

    __tablename__ = "queues"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    parent: Mapped[str | None] = mapped_column(Text)
    dialect: Mapped[str | None] = mapped_column(String(32))
    guarantee: Mapped[dict[str, Any]]
    limit: Mapped[dict[str, Any]]
    """Milli-units per resource; -1 means unlimited (KAI's convention, ``shared.kernel.model.UNLIMITED``)."""
    spec: Mapped[dict[str, Any] | None]
    usage: Mapped[dict[str, Any]]
    rejected: Mapped[str | None]
    """Why the queue's last definition was refused (an earlier definition, if any, still holds)."""
    defined_at: Mapped[float | None]
    removed_at: Mapped[float | None]
    updated_at: Mapped[float]


class QueueUsage(Base):
    """Usage of one resource in one queue from ``t`` on (rolled up; one row per change per instant)."""

    __tablename__ = "queue_usage"

    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    resource: Mapped[str] = mapped_column(Text, primary_key=True)
    t: Mapped[float] = mapped_column(primary_key=True)
    used: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_queue_usage_t", "t"),)


class Decision(Base):
    """Every envelope a service emitted: which service, in answer to which input, and why."""

    __tablename__ = "decisions"

    event_id: Mapped[str] = mapped_column(EventId, primary_key=True)
    """The decision's own envelope in ``event_log`` (written in the same transaction, so no foreign
    key is needed to keep them together, and the projector's inserts skip checking one)."""
    service: Mapped[str] = mapped_column(String(64))
    type: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str]
    workload_key: Mapped[str | None] = mapped_column(Text)
    input_event_id: Mapped[str | None] = mapped_column(EventId)
    t: Mapped[float]
    reason: Mapped[str]

    __table_args__ = (
        Index("ix_decisions_workload_key_t", "workload_key", "t"),
        Index("ix_decisions_input_event_id", "input_event_id"),
    )


class ConsumedOffset(Base):
    """The next offset to read per consumer and topic partition (Kafka's committed-offset meaning),
    written in the same transaction as the rows the consumed events produced."""

    __tablename__ = "consumed_offsets"

    consumer: Mapped[str] = mapped_column(Text, primary_key=True)
    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    offset: Mapped[int] = mapped_column(BigInteger)


class LogHeader(Base):
    """What the history was made under, one row (``id`` 1): the muster and event schema versions and
    the policy the services decided with. An exported log carries the same as its first line, so
    ``muster replay --verify`` can build the cores the log was made with. Written by ``muster
    simulate --store``, ``muster log import`` and a projector started with ``--policy``; a store
    the projector wrote without one has no row (``policy`` unknown)."""

    __tablename__ = "log_header"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    muster_version: Mapped[str]
    schema_version: Mapped[int]
    policy: Mapped[dict[str, Any] | None]
    origin: Mapped[str] = mapped_column(String(32))
    """Who made the log: ``simulate``, ``kafka`` (a deployment), ``import``."""
    scenario: Mapped[str | None]
    until: Mapped[float | None]
    """The scenario time the run went to (a simulated run), else NULL."""


class LogSigned(Base):
    """A record the log's signer signed (``shared.history.integrity``): a key (the first self-signed,
    a rotation signed by the old key), the header, or a checkpoint of the chain. ``record`` is its JSON
    as signed; ``kind``, ``partition`` and ``offset`` repeat what it says, for reading it in order."""

    __tablename__ = "log_signed"

    seq: Mapped[int] = mapped_column(Seq, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))
    partition: Mapped[int | None] = mapped_column(Integer)
    offset: Mapped[int | None] = mapped_column(BigInteger)
    record: Mapped[str] = mapped_column(Text)


TABLES = tuple(Base.metadata.sorted_tables)
TABLE_NAMES = frozenset(t.name for t in TABLES)
