"""Where a log comes from and how an exported one is laid out.

An exported log is JSON Lines (gzip-compressed when its name ends ``.gz``)::

    {"muster_log": 1, "muster_version": ..., "schema_version": 1, "policy": {...}, ...}   the header
    {"id": "...", "type": "ObjectChanged", ...}                                          one envelope a line,
    ...                                                                                   bytes as the bus carried it
    {"muster_log_end": {"events": 1234}}                                                  the end line

The end line is what tells a whole file from one cut short at a line boundary.

A LOG argument is a file (``log.jsonl[.gz]``), a history store URL (``sqlite:///h.db``,
``postgresql+psycopg://...``) or a Kafka address (``kafka://HOST:PORT``, see ``shared.audit.kafka``).
Each is a ``LogSource``: its header and its envelopes as JSON bytes, in the order to replay them, each
with where it was found (``line 12``, ``event 12``, ``offset 12``). Nothing here decodes an envelope:
the reader that needs one decodes it (``decode``), and a replay compares most of them as bytes.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tempfile
import zlib
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator, Protocol

from shared.audit.errors import CannotReproduce, NotAnEnvelope, SourceError, TruncatedLog
from shared.audit.header import LogHeader
from shared.kernel.events import Envelope, to_json
from shared.kernel.policy import Policy
from shared.runtime.bus.codec import BadRecord, decode as decode_record

END_KEY = b'{"muster_log_end"'
CHAIN_KEY = b'{"chain":"'
SIGNED_KEY = b'{"muster_signed":'
_ENVELOPE_AT = b',"envelope":'


class Record(tuple):
    """``(where, raw)``: where the envelope was found and its JSON bytes (no trailing newline)."""

    __slots__ = ()

    def __new__(cls, where: str, raw: bytes) -> "Record":
        return tuple.__new__(cls, (where, raw))

    @property
    def where(self) -> str:
        return self[0]

    @property
    def raw(self) -> bytes:
        return self[1]


_record = tuple.__new__


class LogSource(Protocol):
    """A log to read: its header, and its envelopes as bytes in replay order."""

    header: LogHeader
    name: str
    """How to name the log in messages."""

    def records(self) -> Iterator[Record]:
        """The envelopes, from the start, each time it is called (a replay may read twice)."""
        ...

    def size(self) -> tuple[int, str] | None:
        """How much there is to read, for a progress bar: (total, unit) with unit ``bytes`` or ``events``."""
        ...

    def progress(self) -> int:
        """How much of ``size`` has been read so far."""
        ...

    def hint(self) -> str:
        """What to keep in mind when a replay of this log diverges ('' for nothing)."""
        ...


def decode(record: Record) -> Envelope:
    """The envelope of a record; ``NotAnEnvelope`` (or ``CannotReproduce`` for a newer schema) naming where."""
    try:
        env = decode_record(record[1])  # ``record.raw`` without the property's call
    except BadRecord as exc:
        text = str(exc)
        if "event schema version" in text:  # newer than this muster's, or before the first (``upcast``)
            raise CannotReproduce(f"{record.where}: {text.removeprefix('not a valid envelope: ')}") from None
        raise NotAnEnvelope(f"{record.where}: {text}") from None
    if not isinstance(env, Envelope):
        raise NotAnEnvelope(f"{record.where}: a control message, not an envelope")
    return env


def envelopes(source: LogSource) -> Iterator[Envelope]:
    """Every envelope of ``source``, decoded (a bad one stops the reading, named)."""
    for record in source.records():
        yield decode(record)


# --------------------------------------------------------------------------- files
def is_compressed(path: Path) -> bool:
    return path.name.endswith(".gz")


def _open_read(path: Path) -> IO[bytes]:
    try:
        raw = open(path, "rb", buffering=1 << 20)  # a read call per megabyte, not per 8 KiB (those were a large part of a line's cost)
    except OSError as exc:
        raise SourceError(f"cannot read the log {path}: {exc.strerror or exc}") from None
    if is_compressed(path):
        return io.BufferedReader(gzip.GzipFile(fileobj=raw, mode="rb"), buffer_size=1 << 20)  # type: ignore[arg-type]
    return raw


class LogFile:
    """An exported log on disk (see the module docstring); checks its shape while it is read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path)
        self._raw: IO[bytes] | None = None
        with self._lines() as lines:
            self.header_line = self._first(lines)
            self.header = LogHeader.parse(self.header_line, f"{path}: line 1")

    def _first(self, lines: IO[bytes]) -> bytes:
        try:
            first = lines.readline()
        except (OSError, EOFError, zlib.error) as exc:
            raise self._broken(exc, 1) from None
        if not first:
            raise TruncatedLog(f"{self.path}: the file is empty (an exported log starts with its header line)")
        if not first.endswith(b"\n"):
            raise TruncatedLog(f"{self.path}: line 1 ends without a newline: the file was cut short")
        return first

    def _lines(self) -> IO[bytes]:
        stream = _open_read(self.path)
        self._raw = stream
        return stream

    def _broken(self, exc: BaseException, line: int) -> Exception:
        if isinstance(exc, EOFError):
            return TruncatedLog(f"{self.path}: the compressed stream ends early, after line {self._whole_lines()}: "
                                "the file was cut short")
        if isinstance(exc, gzip.BadGzipFile):
            return NotAnEnvelope(f"{self.path}: not a gzip file ({exc}), though its name ends .gz")
        return SourceError(f"{self.path}: cannot read line {line}: {exc}")

    def _whole_lines(self) -> int:
        """How many whole lines the compressed stream gives before it breaks. The reader's own count
        says little: its buffer reads a megabyte ahead, so a smaller file breaks before line 1 is
        handed out. ``read1`` hands out what each step decompressed, so none is lost to the break."""
        count = 0
        try:
            with gzip.open(self.path, "rb") as stream:
                while chunk := stream.read1(1 << 16):
                    count += chunk.count(b"\n")
        except (OSError, EOFError, zlib.error):
            pass
        return count

    def hint(self) -> str:
        return ""

    def size(self) -> tuple[int, str] | None:
        try:
            return self.path.stat().st_size, "bytes"
        except OSError:
            return None

    def progress(self) -> int:
        raw = self._raw
        if raw is None or raw.closed:
            return 0
        inner = getattr(getattr(raw, "raw", None), "fileobj", None)  # the compressed file under gzip
        try:
            return (inner or raw).tell()
        except (OSError, ValueError):
            return 0

    def raw_lines(self) -> Iterator[tuple[int, bytes]]:
        """Every line after the header as it is, newline included, with its number (the chain check
        reads these: ``shared.audit.integrity``); the file's shape is checked as ``records`` does."""
        path = self.path
        with self._lines() as lines:
            self._first(lines)
            number = 1
            try:
                for line in lines:
                    number += 1
                    if not line.endswith(b"\n"):
                        raise TruncatedLog(f"{path}: line {number} ends without a newline: the file was cut short")
                    yield number, line
            except (OSError, EOFError, zlib.error) as exc:
                raise self._broken(exc, number + 1) from None

    def records(self) -> Iterator[Record]:
        if self.header.chained:
            yield from self._chained_records()
            return
        path = self.path
        with self._lines() as lines:
            self._first(lines)
            number, count = 1, 0
            try:
                for line in lines:
                    number += 1
                    if not line.endswith(b"\n"):
                        raise TruncatedLog(f"{path}: line {number} ends without a newline: the file was cut short")
                    if line.startswith(END_KEY):
                        self._end(line, number, count, lines)
                        return
                    count += 1
                    yield _record(Record, (f"line {number}", line[:-1]))  # ``Record(...)`` without its frame
            except (OSError, EOFError, zlib.error) as exc:
                raise self._broken(exc, number + 1) from None
        raise TruncatedLog(f"{path}: no end line after line {number} (an exported log ends with "
                           '{"muster_log_end": ...}): the file was cut short')

    def _chained_records(self) -> Iterator[Record]:
        """A chained log's envelopes, unwrapped (their bytes as the bus carried them); signed lines skipped.
        Whether the chain holds is ``shared.audit.integrity``'s to say, before a replay reads these."""
        path = self.path
        count = 0
        lines = self.raw_lines()
        for number, line in lines:
            if line.startswith(SIGNED_KEY):
                continue
            if line.startswith(END_KEY):
                self._end(line, number, count, (rest for _, rest in lines))
                return
            at = line.find(_ENVELOPE_AT, 80) if line.startswith(CHAIN_KEY) else -1
            if at < 0 or not line.endswith(b"}\n"):
                raise NotAnEnvelope(f"{path}: line {number}: not a chained envelope line of a chained log")
            count += 1
            yield _record(Record, (f"line {number}", line[at + len(_ENVELOPE_AT):-2]))
        raise TruncatedLog(f"{path}: no end line (an exported log ends with "
                           '{"muster_log_end": ...}): the file was cut short')

    def _end(self, line: bytes, number: int, count: int, rest: Iterable[bytes]) -> None:
        try:
            events = json.loads(line)["muster_log_end"]["events"]
        except (ValueError, KeyError, TypeError):
            raise NotAnEnvelope(f"{self.path}: line {number}: a bad end line") from None
        if events != count:
            raise TruncatedLog(f"{self.path}: the end line says {events} events, the file holds {count}: "
                               "lines are missing")
        for extra in rest:
            if extra.strip():
                raise NotAnEnvelope(f"{self.path}: line {number + 1}: more after the end line")
            number += 1


def write_log(path: Path, header: LogHeader | Callable[[], LogHeader], records: Iterable[bytes],
              keep: Callable[[bytes], bool] | None = None) -> int:
    """Write an exported log: header, each envelope's bytes a line, the end line; the count written.

    A header given as a function is asked for once every record has been read (an export window is
    marked only if ``keep`` left an envelope out): the lines are kept in a temporary file till then.
    Written to a temporary name and renamed, so a failed export never leaves half a file that looks whole."""
    tmp = path.with_name(path.name + ".partial")
    signed = [0]

    def counted(raws: Iterable[bytes]) -> Iterator[bytes]:
        for raw in raws:
            if raw.startswith(SIGNED_KEY):
                signed[0] += 1
            yield raw

    records = counted(records)

    def lines(out: IO[bytes]) -> int:
        count = 0
        for raw in records:
            if keep is not None and not keep(raw):
                continue
            out.write(raw)
            out.write(b"\n")
            count += 1
        return count - signed[0]

    try:
        opener = gzip.open if is_compressed(path) else open
        with opener(tmp, "wb") as out:  # type: ignore[operator]
            if isinstance(header, LogHeader):
                out.write(header.line())
                count = lines(out)
            else:
                with tempfile.TemporaryFile(dir=path.parent) as body:
                    count = lines(body)
                    out.write(header().line())
                    body.seek(0)
                    shutil.copyfileobj(body, out, 1 << 20)
            out.write(b'{"muster_log_end":{"events":%d}}\n' % count)
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise SourceError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return count


# --------------------------------------------------------------------------- stores
class StoreLog:
    """The ``event_log`` table of a history store, in the order the projector wrote it."""

    def __init__(self, url: str, policy: Policy | None = None) -> None:
        from shared.history import StoreError
        from shared.history.engine import display
        from shared.history.header import read_header
        from shared.history.query import event_count

        self.url = url
        self.name = display(url)
        self._read = 0
        try:
            stored = read_header(url)
            self._total = event_count(url)
        except StoreError as exc:
            raise SourceError(str(exc)) from None
        if stored is None:
            from shared.runtime.build import muster_version

            stored = {"muster_version": muster_version(), "origin": "store"}
        header = LogHeader.model_validate({k: v for k, v in stored.items() if v is not None or k == "policy"})
        update: dict[str, Any] = {} if policy is None else {"policy": policy.model_dump(mode="json")}
        if self._from_kafka():
            update["inbox_order"] = False
        self.header = header.model_copy(update=update) if update else header

    def size(self) -> tuple[int, str] | None:
        return self._total, "events"

    def _from_kafka(self) -> bool:
        """Whether the projector wrote this store from the Kafka log topic (its rows say where each
        envelope was read): then it holds that topic's order, not every inbox's (``LogHeader.inbox_order``)."""
        from sqlalchemy import select

        from shared.history import StoreError
        from shared.history.engine import errors_explained, opened
        from shared.history.models import EventLog

        e = EventLog.__table__
        try:
            with errors_explained(self.url), opened(self.url, existing=True) as engine, engine.connect() as conn:
                return conn.execute(select(e.c.seq).where(e.c.topic.is_not(None)).limit(1)).first() is not None
        except StoreError as exc:
            raise SourceError(str(exc)) from None

    def hint(self) -> str:
        return ""

    def progress(self) -> int:
        return self._read

    def chained(self) -> bool:
        """Whether every stored envelope carries its link (a store written since the chain exists)."""
        from shared.history import StoreError
        from shared.history.query import chained

        try:
            return self._total > 0 and chained(self.url)
        except StoreError as exc:
            raise SourceError(str(exc)) from None

    def chain(self) -> Iterator[tuple[bytes, int, int, str]]:
        """Every envelope's bytes with its partition, offset and link in the chain, in store order."""
        from shared.history import StoreError
        from shared.history.query import read_chain

        self._read = 0
        try:
            for env, partition, offset, link in read_chain(self.url):
                self._read += 1
                yield to_json(env), partition, offset, link
        except StoreError as exc:
            raise SourceError(str(exc)) from None

    def starts(self) -> dict[int, int]:
        """Each partition's first stored offset in the chain (above 0 after ``muster log archive --prune``)."""
        from shared.history import StoreError
        from shared.history.query import chain_starts

        try:
            return chain_starts(self.url)
        except StoreError as exc:
            raise SourceError(str(exc)) from None

    def signed(self) -> list[dict[str, Any]]:
        from shared.history import StoreError
        from shared.history.query import read_signed

        try:
            return read_signed(self.url)
        except StoreError as exc:
            raise SourceError(str(exc)) from None

    def records(self) -> Iterator[Record]:
        from shared.history import StoreError
        from shared.history.query import read_log

        self._read = 0
        try:
            for env in read_log(self.url):
                self._read += 1
                yield Record(f"event {self._read}", to_json(env))
        except StoreError as exc:
            raise SourceError(str(exc)) from None


# --------------------------------------------------------------------------- an archive and what follows it
class Joined:
    """An archive (``muster log archive``) and the log that goes on from it, read as one log: the
    archive's envelopes (named ``archive line N``), then the log's. The header is the log's."""

    def __init__(self, archive: LogFile, rest: LogSource) -> None:
        self.archive, self.rest = archive, rest
        self.header = rest.header
        self.name = f"{archive.name} + {rest.name}"

    def records(self) -> Iterator[Record]:
        for record in self.archive.records():
            yield Record(f"archive {record.where}", record.raw)
        yield from self.rest.records()

    def size(self) -> tuple[int, str] | None:
        return None

    def progress(self) -> int:
        return 0

    def hint(self) -> str:
        return self.rest.hint()


# --------------------------------------------------------------------------- choosing
def is_store_url(spec: str) -> bool:
    return spec.startswith(("sqlite:", "postgresql", "postgres:"))


def is_kafka(spec: str) -> bool:
    return spec.startswith("kafka://")


def open_log(spec: str, *, policy: Policy | None = None, topic_prefix: str | None = None) -> LogSource:
    """The log ``spec`` names: a store URL, ``kafka://HOST:PORT`` or a file. ``policy`` stands in for
    the one the log records (a Kafka log records none); ``topic_prefix`` picks a Kafka stack's topics."""
    if is_kafka(spec):
        from shared.audit.kafka import KafkaLog

        return KafkaLog(spec, policy=policy, prefix=topic_prefix)
    if is_store_url(spec):
        return StoreLog(spec, policy)
    source = LogFile(Path(spec))
    if policy is not None:
        source.header = source.header.model_copy(update={"policy": policy.model_dump(mode="json")})
    return source
