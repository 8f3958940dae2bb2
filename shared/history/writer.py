"""The projection writer: one batch of envelopes, one transaction, consumed offsets included.

Pipeline per batch (Armada's ingester; pyeventsourcing's tracking record):

    1. lock out other projectors (Postgres advisory lock, SQLite ``BEGIN IMMEDIATE``); on Postgres
       the same round trip reads the highest seq (``_PREAMBLE``)
    2. which of the batch's event ids does ``event_log`` hold already?    -> skipped
       (``Pipeline`` skips the question after a batch that held none: ``check_ids``)
    3. load what the projector does not hold yet (``Projector.needs``)
    4. ``Projector.convert``: rows per table (pure)
    5. write them and the consumed offsets; commit (on Postgres: ``event_log`` and ``decisions``
       COPYed, every other table in one more round trip, ``_finish``)

``Pipeline`` (behind ``write_many`` and the Kafka projector) overlaps step 4 of one batch with
step 5 of the one before (Postgres only).

A redelivered envelope is skipped by its id, so writing a batch again, or a batch overlapping the
last one, changes nothing but (at most) the offsets.

The ``Projector`` keeps what it folded for the next batch instead of reading it back. That is only
right while nobody else writes the store: every transaction compares the highest ``event_log.seq``
with the one this writer left, and starts cold (reads everything it needs again) when another
writer has been there or when a transaction failed.
"""

from __future__ import annotations

import gc
import json
import threading
import zlib
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from operator import itemgetter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import psycopg
import pydantic_core
from psycopg import sql
from sqlalchemy import (
    JSON, Connection, Engine, Table, any_, bindparam, case, event, func, insert, select,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError

from shared.history import rows
from shared.history.engine import StoreError, connect, dump_json, errors_explained
from shared.history.integrity import Chainer, Signer, digest, package_version
from shared.kernel.events import Envelope, to_json
from shared.history.models import (
    ConsumedOffset, Decision, EventLog, LogSigned, Placement, Queue, QueueUsage, Workload, WorkloadTransition,
)

LOCK_ID = zlib.crc32(b"muster.projector")
"""The Postgres advisory lock every projection writer takes for its transaction."""


@dataclass(frozen=True)
class WriteCounts:
    """What one ``write`` did: envelopes stored and skipped, rows written per table."""

    events: int = 0
    skipped: int = 0
    decisions: int = 0
    workloads: int = 0
    transitions: int = 0
    placements: int = 0
    queues: int = 0
    queue_usage: int = 0
    offsets: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)

    def __add__(self, other: "WriteCounts") -> "WriteCounts":
        return WriteCounts(**{k: v + getattr(other, k) for k, v in self.__dict__.items()})


_TABLES: dict[str, Table] = {name: model.__table__ for name, model in (  # type: ignore[misc]
    ("event_log", EventLog), ("decisions", Decision), ("workloads", Workload), ("transitions", WorkloadTransition),
    ("placements", Placement), ("queues", Queue), ("queue_usage", QueueUsage), ("offsets", ConsumedOffset),
    ("signed", LogSigned))}


class _Incoherent(Exception):
    """Another writer changed the store since this writer's projector last saw it."""


_RACED = (IntegrityError, psycopg.IntegrityError)
"""A unique key another writer took first (COPY raises psycopg's own error): fold again, cold.
Raised again after ``retries``, it is the data's (``Unstorable``)."""


def _locate(batch: Iterable[Envelope | rows.Located]) -> list[rows.Located]:
    return [x if isinstance(x, rows.Located) else rows.Located(x) for x in batch]


class ProjectionWriter:
    """Writes batches of envelopes into the history store at ``url``.

    The tables must exist (``muster db upgrade``, or ``shared.history.schema.ensure``).
    ``max_workloads`` bounds how many workloads the projector keeps in memory between batches.

    Every envelope written is chained (``shared.history.integrity``: its link and place in
    ``event_log``), so the store is the log of record for the projector and the embedded runtime
    alike. With a ``signer`` the writer also signs checkpoints (every ``checkpoint_every`` envelopes,
    every ``checkpoint_seconds``) into ``log_signed``, in the same transaction as the envelopes
    they cover, and introduces its key there first (signed by ``rotated_from``, the old key, when
    one is given: a rotation).
    """

    def __init__(self, url: str | Engine, *, consumer: str = "projector", retries: int = 3,
                 max_workloads: int = 50_000, signer: Signer | None = None, rotated_from: Signer | None = None,
                 checkpoint_every: int | None = None, checkpoint_seconds: float | None = None,
                 chained: bool = True) -> None:
        owned = not isinstance(url, Engine)
        self.engine = connect(url)
        self.consumer = consumer
        self.retries = retries
        self.max_workloads = max_workloads
        self.projector = rows.Projector(max_workloads=max_workloads)
        self._high_water: int | None = None
        self.check_ids = True
        """Whether ``Pipeline`` asks the store for each batch's stored ids before folding it: after
        a batch that held envelopes stored already (a redelivery, a replayed producer), until a
        batch holds none. A fresh log skips the query (a visible part of a batch's time); a duplicate it
        did not expect fails the commit on the unique event id and is written again, checked."""
        self._postgres = self.engine.dialect.name == "postgresql"
        self._chunk = 10_000 if self._postgres else 900
        self.chained = chained
        """False only to measure what the chain costs (``bench/projector_bench.py``): no link is written."""
        self.signer = signer if chained else None
        self.rotated_from = rotated_from
        self._chain_options = {k: v for k, v in (("every", checkpoint_every), ("seconds", checkpoint_seconds))
                               if v is not None}
        self._version = package_version()
        self.chainer = self._new_chainer()
        self._chain_loaded = False
        self.signed: list[dict[str, Any]] = []
        """The records signed with the batches committed so far (the projector publishes them)."""
        if owned and not self._postgres:
            _begin_immediate(self.engine)

    def write(self, batch: Iterable[Envelope | rows.Located], *,
              consumed: Sequence[rows.Position] = ()) -> WriteCounts:
        """Store ``batch`` (in order) in one transaction; returns what was written.

        ``consumed``: where records read with the batch that were no envelopes were (the Kafka
        projector dead-letters them); their offsets are stored as consumed too."""
        items = _locate(batch)
        if not items and not consumed:
            return WriteCounts()
        with errors_explained(self.engine):
            for attempt in range(1, self.retries + 1):
                try:
                    with self.engine.begin() as conn:
                        self._sync(conn, self._take_lock(conn))
                        ops = self._convert(conn, items, consumed=consumed)
                        counts = self._store(conn, ops)
                    self._committed(ops)
                    return counts
                except _RACED:   # another writer stored some of these first: fold again on its state
                    self._go_cold()
                    if attempt == self.retries:
                        raise
                except BaseException:
                    self._go_cold()
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def write_many(self, batches: Iterable[Iterable[Envelope | rows.Located]]) -> WriteCounts:
        """Store batch after batch, each in its own transaction, as ``write`` would.

        On Postgres the next batch is folded while the last one commits (``Pipeline``).
        """
        total = WriteCounts()
        with Pipeline(self) as pipeline:
            for batch in batches:
                total = total + pipeline.put(batch)
            return total + pipeline.flush()

    def consumed_offsets(self, topic: str) -> dict[int, int]:
        """The next offset to read per partition of ``topic``, as this writer's consumer stored it."""
        t = ConsumedOffset.__table__
        with errors_explained(self.engine), self.engine.connect() as conn:
            return dict(conn.execute(select(t.c.partition, t.c.offset)  # type: ignore[arg-type]
                                     .where(t.c.consumer == self.consumer, t.c.topic == topic)).all())

    def seal(self) -> list[dict[str, Any]]:
        """Sign a final checkpoint of every partition (a run that has ended) and store it; what was signed.
        Nothing without a signer, or when nothing was written."""
        if self.signer is None:
            return []
        with errors_explained(self.engine), self.engine.begin() as conn:
            self._sync(conn, self._take_lock(conn))
            self._load_chain(conn)
            records = self.chainer.seal()
            self._insert(conn, "signed", _signed_rows(records))
        self.signed.extend(records)
        return records

    def sign_due(self) -> list[dict[str, Any]]:
        """Store the checkpoints that have come due with no batch to carry them (an idle log whose last
        envelopes wait ``checkpoint_seconds`` for one); what was signed."""
        if self.signer is None or not self._chain_loaded:
            return []
        records = self.chainer.due()
        if not records:
            return []
        try:
            with errors_explained(self.engine), self.engine.begin() as conn:
                if self._take_lock(conn) != self._high_water:
                    raise StoreError("another writer wrote the store meanwhile")
                self._insert(conn, "signed", _signed_rows(records))
        except BaseException:
            self._go_cold()
            raise
        self.signed.extend(records)
        return records

    def sign_header(self, header: dict[str, Any]) -> None:
        """Store the header the log was made under, signed (with the key's record first if the store
        has none of it yet), unless the last signed header says the same. Nothing without a signer."""
        if self.signer is None:
            return
        with errors_explained(self.engine), self.engine.begin() as conn:
            self._sync(conn, self._take_lock(conn))
            self._load_chain(conn)
            s = LogSigned.__table__
            last = conn.execute(select(s.c.record).where(s.c.kind == "header").order_by(s.c.seq.desc())
                                .limit(1)).scalar()
            if last is not None and json.loads(last).get("header") == dict(header) and not self.chainer.pending:
                return
            signed = self.signer.header_record(header)
            records = [*self.chainer.pending, signed]
            self.chainer.pending = []
            self.chainer.header = digest(signed)
            self._insert(conn, "signed", _signed_rows(records))
        self.signed.extend(records)

    def keep_signed(self, records: Sequence[dict[str, Any]]) -> None:
        """Store signed records as another signer made them (``muster log import`` of a chained log),
        unless the store holds signed records already (an import done before)."""
        if not records:
            return
        with errors_explained(self.engine), self.engine.begin() as conn:
            self._take_lock(conn)
            if conn.execute(select(LogSigned.__table__.c.seq).limit(1)).first() is None:
                self._insert(conn, "signed", _signed_rows(records))

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "ProjectionWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the steps
    def _go_cold(self) -> None:
        self.projector = rows.Projector(max_workloads=self.max_workloads)
        self._high_water = None
        self.chainer = self._new_chainer()
        self._chain_loaded = False

    def _new_chainer(self) -> Chainer:
        return Chainer(self.signer, self._version, **self._chain_options)  # type: ignore[arg-type]

    def _load_chain(self, conn: Connection) -> None:
        """Where each partition's chain is in the store, and the last checkpoint of it (the writer
        goes on from there); the signer's key record queued when the store has none of it yet."""
        if self._chain_loaded:
            return
        e, s = EventLog.__table__, LogSigned.__table__
        part = func.coalesce(e.c.partition, 0)
        last = select(part.label("p"), func.max(e.c.chain_offset).label("o")).where(
            e.c.chain_offset.is_not(None)).group_by(part).subquery()
        heads = conn.execute(select(last.c.p, last.c.o, e.c.chain).join(
            e, (func.coalesce(e.c.partition, 0) == last.c.p) & (e.c.chain_offset == last.c.o))).all()
        signed = {p: (o, n) for p, o, n in conn.execute(select(s.c.partition, func.max(s.c.offset), func.count()).where(
            s.c.kind == "checkpoint").group_by(s.c.partition)).all()}
        for p, offset, chain in heads:
            last, count = signed.get(p, (-1, 0))
            self.chainer.start(p, offset + 1, bytes.fromhex(chain), last + 1, count)
        for p, (last, count) in signed.items():
            if p not in self.chainer.heads:  # every stored envelope archived and pruned: go on from the last checkpoint
                record = json.loads(conn.execute(select(s.c.record).where(
                    s.c.kind == "checkpoint", s.c.partition == p, s.c.offset == last).limit(1)).scalar_one())
                self.chainer.start(p, last + 1, bytes.fromhex(record["chain"]), last + 1, count)
        if self.signer is not None:
            header = conn.execute(select(s.c.record).where(s.c.kind == "header").order_by(s.c.seq.desc())
                                  .limit(1)).scalar()
            self.chainer.header = None if header is None else digest(json.loads(header))
            keys = [json.loads(r) for r in conn.execute(select(s.c.record).where(s.c.kind == "key")).scalars()]
            if all(k.get("key_id") != self.signer.id for k in keys):
                self.chainer.pending.append(self.signer.key_record(self.rotated_from))
        self._chain_loaded = True

    def _chain(self, conn: Connection, items: Sequence[rows.Located], ops: rows.RowOps) -> None:
        """Give each new ``event_log`` row its place and link in its partition's chain (``items`` are
        the batch's envelopes the store does not hold yet, in the order of those rows), and the
        checkpoints that come due to ``ops.signed``."""
        self._load_chain(conn)
        add = self.chainer.add
        for row, item in zip(ops.event_log, items):
            raw = item.raw if item.raw is not None else to_json(item.envelope)
            offset, value = add(item.partition or 0, raw)
            row["chain_offset"] = offset
            row["chain"] = value.hex()
        ops.signed = _signed_rows(self.chainer.due())

    def _take_lock(self, conn: Connection) -> int:
        """Lock out other writers for the transaction; the highest ``event_log.seq`` then.

        On Postgres in one round trip: on a busy projector every round trip of the committing
        thread waits for the GIL after it, a few milliseconds each."""
        if not self._postgres:
            return self._seq(conn)
        return _last_number(conn, _PREAMBLE)

    def _seq(self, conn: Connection) -> int:
        return conn.execute(select(func.coalesce(func.max(EventLog.__table__.c.seq), 0))).scalar_one()

    def _sync(self, conn: Connection, seq: int | None = None) -> None:
        """Start cold unless the store is exactly as this writer left it (at ``seq``, read if not given)."""
        seq = self._seq(conn) if seq is None else seq
        if seq != self._high_water:
            self._go_cold()
            self._high_water = seq

    def _convert(self, conn: Connection, items: list[rows.Located], in_flight: Sequence[rows.Located] = (),
                 consumed: Sequence[rows.Position] = (), *, check: bool = True) -> rows.RowOps:
        """``check``: ask ``event_log`` which of the batch's envelopes it holds already (or the batch
        in flight, ``in_flight``, is storing); unchecked (``Pipeline``), one it holds makes the
        commit fail on the unique event id instead."""
        stored: set[str] = set()
        if check:
            ids = [item.envelope.id for item in items]
            stored = self.stored_ids(conn, ids) | ({i.envelope.id for i in in_flight} & set(ids))
        prepared = rows.prepare(items, stored, consumed)
        if check:
            self.check_ids = prepared.skipped > 0
        need = self.projector.needs(prepared)
        if need:
            self.projector.seed(self._load(conn, need))
        with gc_paused():
            ops = self.projector.convert(prepared, consumer=self.consumer)
        if self.chained:
            self._chain(conn, prepared.items, ops)
        return ops

    def _commit(self, ops: rows.RowOps) -> WriteCounts:
        """A pipelined batch's own transaction (runs on the writer thread)."""
        with self.engine.begin() as conn:
            if self._take_lock(conn) != self._high_water:
                raise _Incoherent()
            counts = self._store(conn, ops)
        self._committed(ops)
        return counts

    def _committed(self, ops: rows.RowOps) -> None:
        if ops.signed:
            self.signed.extend(json.loads(r["record"]) for r in ops.signed)

    def _store(self, conn: Connection, ops: rows.RowOps) -> WriteCounts:
        self._insert(conn, "event_log", ops.event_log)
        self._insert(conn, "decisions", ops.decisions)
        self._insert(conn, "signed", ops.signed)
        rest = [_Part("workloads", ops.workloads), _Part("transitions", ops.transitions, upsert=False),
                _Part("placements", ops.placements), _Part("queues", ops.queues),
                _Part("queue_usage", ops.queue_usage), _Part("offsets", ops.offsets, keep_larger="offset")]
        if self._postgres:
            self._high_water = _finish(conn, rest)
        else:
            for part in rest:
                if part.upsert:
                    self._upsert(conn, part.name, part.values, keep_larger=part.keep_larger)
                else:
                    self._insert(conn, part.name, part.values)
            self._high_water = self._seq(conn)
        c = ops.counts()
        return WriteCounts(events=c["event_log"], skipped=ops.skipped, decisions=c["decisions"],
                           workloads=c["workloads"], transitions=c["transitions"], placements=c["placements"],
                           queues=c["queues"], queue_usage=c["queue_usage"], offsets=c["offsets"])

    def _chunks(self, values: Sequence[Any]) -> Iterable[Sequence[Any]]:
        for i in range(0, len(values), self._chunk):
            yield values[i:i + self._chunk]

    def _in(self, column: Any, values: Sequence[Any]) -> Any:
        """``column IN values``: one array parameter on Postgres (a long IN list is slow to send)."""
        if self._postgres:
            return column == any_(bindparam(None, list(values), type_=ARRAY(column.type)))
        return column.in_(values)

    def stored_ids(self, conn: Connection, ids: Sequence[str]) -> set[str]:
        """Which of ``ids`` ``event_log`` holds."""
        col = EventLog.__table__.c.event_id
        found: set[str] = set()
        for chunk in self._chunks(sorted(set(ids))):
            found.update(conn.execute(select(col).where(self._in(col, chunk))).scalars())
        return found

    def _load(self, conn: Connection, need: rows.Needs) -> rows.StoredState:
        w, p, qt = Workload.__table__, Placement.__table__, Queue.__table__
        state = rows.StoredState(workload_keys=need.workload_keys)
        for chunk in self._chunks(sorted(need.workload_keys)):
            for row in conn.execute(select(w).where(self._in(w.c.key, chunk))).mappings():
                state.workloads[row["key"]] = dict(row)
            for row in conn.execute(select(p).where(self._in(p.c.workload_key, chunk))
                                    .order_by(p.c.workload_key, p.c.pod_ordinal, p.c.seq)).mappings():
                state.placements.setdefault(row["workload_key"], []).append(dict(row))
        if need.holding_quota:
            state.holding = {row["key"]: dict(row)
                             for row in conn.execute(select(w).where(w.c.holds_quota.is_(True))).mappings()}
        if need.queues:
            state.queues = {row["name"]: dict(row) for row in conn.execute(select(qt)).mappings()}
            state.next_ordinal = conn.execute(select(func.coalesce(func.max(w.c.ordinal) + 1, 0))).scalar_one()
        return state

    def _insert(self, conn: Connection, name: str, values: Sequence[dict[str, Any]]) -> None:
        if not values:
            return
        if self._postgres:
            _copy(conn, _TABLES[name], values)
        else:
            conn.execute(insert(_TABLES[name]), values)

    def _upsert(self, conn: Connection, name: str, values: Sequence[dict[str, Any]], *,
                keep_larger: str | None = None) -> None:
        """SQLite's upserts (Postgres writes them in ``_finish``)."""
        if not values:
            return
        table = _TABLES[name]
        keys = [c.name for c in table.primary_key.columns]
        stmt = sqlite_insert(table)
        if keep_larger is not None:
            new, old = stmt.excluded[keep_larger], table.c[keep_larger]
            update = {keep_larger: case((new > old, new), else_=old)}
        else:
            update = {c.name: stmt.excluded[c.name] for c in table.columns if c.name not in keys}
        conn.execute(stmt.on_conflict_do_update(index_elements=keys, set_=update), values)


@dataclass
class _Flight:
    """A batch whose transaction is being committed on the pipeline's thread."""

    commit: "Future[WriteCounts]"
    items: list[rows.Located]
    consumed: Sequence[rows.Position]


class Pipeline:
    """``write_many`` one batch at a time, for a caller whose batches arrive over time (the Kafka
    projector): ``put`` folds a batch while the one before commits on the pipeline's own thread.

    Call ``put`` and ``flush`` from one thread. Postgres only overlaps; on SQLite ``put`` is
    ``write``. If a commit finds that another writer has been there, or stored some of the same
    events, the two batches concerned are written again one at a time, cold. When ``put`` or
    ``flush`` raises, the batch in flight has ended (committed or not) and the writer is cold:
    read again from the stored offsets.
    """

    def __init__(self, writer: ProjectionWriter) -> None:
        self.writer = writer
        self._flight: _Flight | None = None
        self._pool = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="muster-projector")
                      if writer._postgres else None)

    def put(self, batch: Iterable[Envelope | rows.Located], *,
            consumed: Sequence[rows.Position] = ()) -> WriteCounts:
        """Fold ``batch`` and start its commit; returns what the batch before wrote, once committed."""
        w = self.writer
        items = _locate(batch)
        if not items and not consumed:
            return WriteCounts()
        if self._pool is None:
            return w.write(items, consumed=consumed)
        try:
            with errors_explained(w.engine):
                with w.engine.connect() as read, read.begin():
                    if self._flight is None:
                        w._sync(read)
                    ops = w._convert(read, items, in_flight=self._flight.items if self._flight else (),
                                     consumed=consumed, check=w.check_ids)
                done = WriteCounts()
                if self._flight is not None:
                    done, refused = self._land()
                    if refused:  # this batch was folded on what the refused commit assumed: again, cold
                        return done + w.write(items, consumed=consumed)
                self._flight = _Flight(self._pool.submit(w._commit, ops), items, consumed)
                return done
        except BaseException:
            self._abandon()
            raise

    def flush(self) -> WriteCounts:
        """Wait for the batch in flight; what it wrote."""
        if self._flight is None:
            return WriteCounts()
        try:
            with errors_explained(self.writer.engine):
                return self._land()[0]
        except BaseException:
            self._abandon()
            raise

    def close(self) -> None:
        """Wait for the batch in flight (whatever its outcome) and stop the thread."""
        self._abandon(cold=False)
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _land(self) -> tuple[WriteCounts, bool]:
        """Wait for the commit in flight. If it was refused (another writer had been there), write
        its batch again, cold, and say so: whatever was folded meanwhile assumed the refused commit."""
        assert self._flight is not None
        flight, self._flight = self._flight, None
        try:
            return flight.commit.result(), False
        except (_Incoherent, *_RACED):
            self.writer._go_cold()
            self.writer.check_ids = True
            return self.writer.write(flight.items, consumed=flight.consumed), True

    def _abandon(self, *, cold: bool = True) -> None:
        flight, self._flight = self._flight, None
        if flight is not None:
            wait([flight.commit])  # its outcome is in the store (or not): the caller reads offsets again
            cold = cold or flight.commit.exception() is not None
        if cold:
            self.writer._go_cold()


def _signed_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"kind": r["kind"], "partition": r.get("partition"), "offset": r.get("offset"),
             "record": json.dumps(r, separators=(",", ":"), ensure_ascii=False)} for r in records]


def _driver(conn: Connection) -> Any:
    """The psycopg connection under ``conn``'s transaction (for COPY and multi-statement SQL)."""
    raw = conn.connection.driver_connection
    if raw is None:  # pragma: no cover
        raise StoreError("the database connection went away during a write")
    return raw


def _copy(conn: Connection, table: Table, values: Sequence[dict[str, Any]]) -> None:
    """Postgres ``COPY ... FROM STDIN`` on the transaction's own connection: the fastest bulk insert."""
    columns = [c for c in table.columns if c.name in values[0]]
    names = [c.name for c in columns]
    as_json = [isinstance(c.type, JSON) for c in columns]  # JSONB variants are JSON too
    quote = conn.dialect.identifier_preparer.quote
    statement = f"COPY {quote(table.name)} ({', '.join(quote(n) for n in names)}) FROM STDIN"
    raw = _driver(conn)
    pick = itemgetter(*names)
    json_at = [i for i, j in enumerate(as_json) if j and not isinstance(values[0][names[i]], rows.JsonText)]
    with raw.cursor() as cursor, cursor.copy(statement) as copy:
        write = copy.write_row
        for row in values:
            record = pick(row)
            if json_at:  # JSON values not already text (the converter writes event payloads as text)
                record = [dump_json(v) if i in json_at and v is not None else v for i, v in enumerate(record)]
            write(record)


_HIGHEST_SEQ = "SELECT coalesce(max(seq), 0) FROM event_log"
_PREAMBLE = f"SELECT pg_advisory_xact_lock({LOCK_ID}); {_HIGHEST_SEQ}"
"""A Postgres write transaction's first round trip (``ProjectionWriter._take_lock``)."""


def _last_number(conn: Connection, statements: str) -> int:
    """Run ``statements`` (several, one round trip, no parameters) on ``conn``'s transaction: the
    number the last one selects."""
    with _driver(conn).cursor() as cursor:
        cursor.execute(statements)
        while cursor.nextset():
            pass
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


class _Part(NamedTuple):
    """A table's rows for ``_finish``: inserted, or upserted by primary key (every column
    overwritten, or only ``keep_larger``, which keeps the larger value)."""

    name: str
    values: Sequence[dict[str, Any]]
    upsert: bool = True
    keep_larger: str | None = None


def _finish(conn: Connection, parts: Sequence[_Part]) -> int:
    """Postgres: every table but the two large ones (``event_log`` and ``decisions``, COPYed) in one
    round trip, then the highest seq (``_Part``s written in order). The tables are
    small per batch (a few hundred rows) and were a large part of the commit as COPYs and upserts of
    their own: on a busy projector every round trip waits for the GIL after it.

    Rows travel as one JSON array per table (``json_to_recordset``); a value that is JSON text
    already (``JsonText``) travels as a string and is cast back."""
    quote, raw = conn.dialect.identifier_preparer.quote, _driver(conn)
    statements = []
    for name, values, upsert, keep_larger in parts:
        if not values:
            continue
        table = _TABLES[name]
        names = [c.name for c in table.columns if c.name in values[0]]
        as_text = {n for n in names if isinstance(values[0][n], rows.JsonText)}
        types = {n: table.c[n].type.compile(dialect=conn.dialect) for n in names}
        columns = ", ".join(quote(n) for n in names)
        shape = ", ".join(f"{quote(n)} {'text' if n in as_text else types[n]}" for n in names)
        picked = ", ".join(f"r.{quote(n)}::{types[n]}" if n in as_text else f"r.{quote(n)}" for n in names)
        data = pydantic_core.to_json(values, inf_nan_mode="strings").decode()
        statement = (f"INSERT INTO {quote(table.name)} ({columns}) SELECT {picked} "
                     f"FROM json_to_recordset({sql.Literal(data).as_string(raw)}) AS r({shape})")
        keys = [c.name for c in table.primary_key.columns]
        conflict = f" ON CONFLICT ({', '.join(quote(k) for k in keys)}) DO UPDATE SET"
        if keep_larger is not None:
            column = quote(keep_larger)
            statement += f"{conflict} {column} = greatest({quote(table.name)}.{column}, EXCLUDED.{column})"
        elif upsert:
            statement += conflict + " " + ", ".join(f"{quote(n)} = EXCLUDED.{quote(n)}" for n in names if n not in keys)
        statements.append(statement)
    return _last_number(conn, "; ".join([*statements, _HIGHEST_SEQ]))


_gc_lock = threading.Lock()
_gc_holds = 0
_gc_was_enabled = False


def hold_gc() -> None:
    """Pause cyclic garbage collection (the process's) until as many ``release_gc`` calls; holds
    from several threads nest, and collection resumes only if it was on before the first."""
    global _gc_holds, _gc_was_enabled
    with _gc_lock:
        if _gc_holds == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_holds += 1


def release_gc() -> None:
    global _gc_holds
    with _gc_lock:
        _gc_holds -= 1
        if _gc_holds == 0 and _gc_was_enabled:
            gc.enable()


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a batch is decoded or converted. Its envelopes and rows
    are plain objects without cycles (reference counting frees them), but there are many of them,
    and collections triggered by them (full ones, as they survive long enough) cost a large part of
    the projector's time; collection resumes as soon as the batch is done."""
    hold_gc()
    try:
        yield
    finally:
        release_gc()


def _begin_immediate(engine: Engine) -> None:
    """SQLite: take the write lock when the transaction begins, not at its first write, so the
    high-water check and the writes see the same database."""

    @event.listens_for(engine, "connect")
    def _no_implicit_begin(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


class Recorder:
    """A ``runtime.subscribe`` listener that writes what it sees in batches of ``batch_size``:
    ``runtime.subscribe(recorder)`` before the run, ``recorder.flush()`` after it."""

    def __init__(self, writer: ProjectionWriter, batch_size: int = 5_000) -> None:
        self.writer = writer
        self.batch_size = batch_size
        self.pending: list[Envelope] = []
        self.counts = WriteCounts()

    def __call__(self, env: Envelope) -> None:
        self.pending.append(env)
        if len(self.pending) >= self.batch_size:
            self.flush()

    def flush(self) -> WriteCounts:
        if self.pending:
            batch, self.pending = self.pending, []
            self.counts = self.counts + self.writer.write(batch)
        return self.counts


def write_log(writer: ProjectionWriter, log: Sequence[Envelope], *, batch_size: int = 5_000,
              progress: Callable[[int], None] | None = None) -> WriteCounts:
    """Write a whole event log (e.g. ``run.runtime.log``) in batches of ``batch_size``."""
    def batches() -> Iterator[Sequence[Envelope]]:
        for i in range(0, len(log), batch_size):
            yield log[i:i + batch_size]
            if progress is not None:
                progress(i + batch_size)

    return writer.write_many(batches())
