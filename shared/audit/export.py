"""``muster log export`` and ``muster log import``: a log taken out of a deployment, or put into a store.

Export writes the envelopes' bytes as the source holds them (the bus's own JSON; a store gives each
back serialised as the bus carried it), in replay order, under a header naming what they were made
under; ``--since``/``--until`` keep a window of event time (marked in the header when it leaves an
envelope out: such a log cannot be verified, which needs the whole history). Import decodes every line (a bad one stops it with
the line named, before anything is written to an empty store), writes the envelopes through the
projector's writer (the same rows ``muster run projector`` writes) and records the header.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

from shared.audit.errors import OtherRun, SourceError
from shared.audit.header import LogHeader
from shared.audit.header import CHAINED
from shared.audit.logfile import END_KEY, LogFile, LogSource, decode, write_log
from shared.kernel.events import Envelope

_AT_KEY = b',"occurred_at":'


def occurred_at(raw: bytes) -> float:
    """An envelope's event time, read off its bytes (muster's layout), else by decoding it."""
    at = raw.find(_AT_KEY)
    if at > 0:
        start = at + len(_AT_KEY)
        end = raw.find(b",", start)
        try:
            return float(raw[start:end])
        except ValueError:
            pass
    import json

    return float(json.loads(raw)["occurred_at"])


def first_time(source: LogSource) -> float | None:
    """The event time of the log's first envelope (None: an empty log), read without going on: what
    tells a deployment's log from a simulated run's and what ``--since +90s`` counts from."""
    records = source.records()
    try:
        for record in records:
            return occurred_at(record.raw)
        return None
    finally:
        close = getattr(records, "close", None)
        if close is not None:
            close()


def export(source: LogSource, out: Path, *, since: float | None = None, until: float | None = None,
           tick: Callable[[], None] | None = None) -> int:
    """Write ``source`` to ``out`` (see the module docstring); the number of envelopes written.

    A bound marks the header only if it left an envelope out: ``--since 0`` on a whole history is the
    whole history, which can still be verified."""
    header = source.header
    cut = {"since": False, "before": False}

    def windowed() -> LogHeader:
        return header.model_copy(update={
            "since": since if cut["since"] else header.since,
            "before": until if cut["before"] else header.before})

    def keep(raw: bytes) -> bool:
        t = occurred_at(raw)
        if since is not None and t < since:
            cut["since"] = True
            return False
        if until is not None and t > until:
            cut["before"] = True
            return False
        return True

    def records() -> Iterator[bytes]:
        n = 0
        for record in source.records():
            decode(record)  # a line that is not an envelope stops the export, named
            yield record.raw
            n += 1
            if tick is not None and n % 4096 == 0:
                tick()

    if since is None and until is None:
        chained = _chained_lines(source, tick)
        if chained is not None:
            return write_log(out, header.model_copy(update={"muster_log": CHAINED}), chained)
        return write_log(out, header, records())
    return write_log(out, windowed, records(), keep)


def _chained_lines(source: LogSource, tick: Callable[[], None] | None) -> Iterator[bytes] | None:
    """The lines of a chained export of ``source`` (its links and signed records kept), or None when
    it holds no chain or nothing signed it: a Kafka log (the chain is the projector's, in the store), a
    store written before the chain existed or by a projector without a signing key, an unchained file
    imported (exported again as it was)."""
    from shared.audit.integrity import chain_lines
    from shared.audit.logfile import StoreLog

    if isinstance(source, LogFile) and source.header.chained:
        def copied() -> Iterator[bytes]:
            for n, line in source.raw_lines():
                if line.startswith(END_KEY):
                    return
                yield line[:-1]
                if tick is not None and n % 4096 == 0:
                    tick()
        return copied()
    if isinstance(source, StoreLog) and source.chained():
        signed = source.signed()
        if not signed:  # links nothing vouches for (an unchained log imported, a projector without a key)
            return None
        def rows() -> Iterator[tuple[bytes, int, int, str]]:
            for n, row in enumerate(source.chain(), 1):
                yield row
                if tick is not None and n % 4096 == 0:
                    tick()
        return chain_lines(rows(), signed, source.starts())
    return None


def import_log(source: LogFile, url: str, *, batch_size: int = 5_000,
               tick: Callable[[], None] | None = None) -> tuple[int, int]:
    """Load the exported log ``source`` into the store at ``url``: (envelopes written, already there).

    A store holds one history: one that holds envelopes this log does not have is another run's
    (``OtherRun``); one that holds a part of this log (an import cut short) is completed."""
    from sqlalchemy import func, select

    from shared.history import StoreError, schema
    from shared.history.engine import display, errors_explained
    from shared.history.header import write_header
    from shared.history.models import EventLog
    from shared.history.rows import Located
    from shared.history.writer import ProjectionWriter

    source.header.whole("import into a store")
    signed: list[dict[str, Any]] = []
    if source.header.chained:  # a broken chain is refused before anything is written, the line named
        from shared.audit.integrity import check, parse_signed
        from shared.audit.logfile import SIGNED_KEY

        check(source)
        signed = [parse_signed(line, "") for _, line in source.raw_lines() if line.startswith(SIGNED_KEY)]

    def batches() -> Iterator[list[Located]]:
        batch: list[Located] = []
        for n, record in enumerate(source.records(), 1):
            batch.append(Located(decode(record), raw=record.raw))  # chained over the bytes the file holds
            if len(batch) >= batch_size:
                yield batch
                batch = []
            if tick is not None and n % 4096 == 0:
                tick()
        if batch:
            yield batch

    try:
        schema.ensure(url)
        with ProjectionWriter(url) as writer:
            with errors_explained(writer.engine), writer.engine.connect() as conn:
                held = conn.execute(select(func.count()).select_from(EventLog.__table__)).scalar_one()
                if held:
                    found = sum(len(writer.stored_ids(conn, [e.envelope.id for e in batch])) for batch in batches())
                    if found != held:
                        raise OtherRun(f"the store at {display(url)} already holds another history ({held} events, "
                                       f"{found} of them in this log): import into a store of its own")
            counts = writer.write_many(batches())
            writer.keep_signed(signed)
        write_header(url, source.header.for_store())
    except StoreError as exc:
        raise SourceError(str(exc)) from None
    return counts.events, counts.skipped
