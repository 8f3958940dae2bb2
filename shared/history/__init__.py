"""The history store: the scheduling history as SQL tables, in PostgreSQL or a local SQLite file.

    models.py   the tables (SQLAlchemy 2 declarative); migrations/ creates them
    rows.py     envelopes -> rows: a pure fold (ResultProjection's rules, not a second copy)
    writer.py   ProjectionWriter: a batch per transaction, with the consumed offsets
    query.py    reading it back: a workload's timeline, queue usage, the event log
    header.py   the ``log_header`` row: muster and schema version, the policy the log was made under
    integrity.py  the hash chain over the event log and the Ed25519-signed records anchoring it
    schema.py   Alembic upgrade/downgrade, creating an empty store
    engine.py   URLs, engines, errors a person can act on
    stream.py   LogStream: a run's log written while it is made (``muster simulate --store URL``)

``record(url, log)`` writes a log held whole (``simulate --cluster --store``, tests);
``muster simulate --store URL`` streams its run's log instead (``stream.LogStream``), with the same
rule: a store holds one history.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from shared.history.engine import ENV, OtherHistory, StoreError, display
from shared.history.integrity import Signer
from shared.history.writer import ProjectionWriter, WriteCounts, write_log
from shared.kernel.events import Envelope

__all__ = ["ENV", "OtherHistory", "ProjectionWriter", "StoreError", "WriteCounts", "record"]


def record(url: str, log: Sequence[Envelope], *, batch_size: int = 5_000, header: dict[str, Any] | None = None,
           progress: Callable[[int], None] | None = None, signer: Signer | None = None) -> WriteCounts:
    """Write one run's event log into the store at ``url`` (tables created if it is empty), with
    the ``header`` it was made under (``shared.history.header``) when given.

    The log is chained and signed as a deployment's projector signs it: by ``signer``, or by a key
    made for this run (its public half is in the store: ``muster log key``); the header is signed
    first and a final checkpoint seals the run.

    A store holds one history: recording the same run again changes nothing, but a store that
    already holds a different run is refused (``OtherHistory``: two runs would mix workloads of
    the same names).
    """
    from sqlalchemy import func, select

    from shared.history import schema
    from shared.history.engine import errors_explained
    from shared.history.header import write_header
    from shared.history.models import EventLog

    schema.ensure(url)
    with ProjectionWriter(url, signer=signer or Signer.generate()) as writer:
        with errors_explained(writer.engine), writer.engine.connect() as conn:
            held = conn.execute(select(func.count()).select_from(EventLog.__table__)).scalar_one()
            if held:
                ids = {env.id for env in log}
                present = len(writer.stored_ids(conn, sorted(ids)))
                if present != len(ids) or held != present:
                    raise OtherHistory(f"the store at {display(url)} already holds another history ({held} events); "
                                       "give each run a store of its own (e.g. a new sqlite:/// file)")
                return WriteCounts(skipped=len(log))
        if header is not None:
            writer.sign_header(header)
        counts = write_log(writer, log, batch_size=batch_size, progress=progress)
        writer.seal()
    if header is not None:
        write_header(url, header)
    return counts
