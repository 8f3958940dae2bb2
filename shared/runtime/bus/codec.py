"""Envelopes and control messages as Kafka records, and what a record that is neither becomes.

An envelope is its JSON (``shared.kernel.events.to_json``) with headers ``muster-type`` and
``muster-source`` so tools can filter without parsing. A control message — the driver's
``Release`` of a round, a service's ``Finished`` reply (``simulate --bus`` only) — carries the
header ``muster-control`` and is never an event: it is not in the log and no core sees it.

A record that fails to parse or validate becomes a ``DeadLetter``: the original bytes (as text, or
base64 when they are not UTF-8), where it was read, and the error.

Every consumer decodes with ``decode``; the history store's projector with ``decode_to_fold``,
which accepts and refuses the same records but builds only what the fold reads and keeps the
payload's text as it came (``payload_text``).
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import Any, Literal, Sequence

import msgspec
import pydantic_core
from pydantic import ValidationError

from shared.kernel.events import _ENVELOPE, SCHEMA_VERSION, Envelope, ObjectChanged, from_json, to_json, upcast
from shared.kernel.fastmodel import built
from shared.kernel.projection import ENVELOPE_READ

Headers = Sequence[tuple[str, bytes]]

TYPE_HEADER = "muster-type"
SOURCE_HEADER = "muster-source"
CONTROL_HEADER = "muster-control"


class BadRecord(ValueError):
    """A record on a muster topic that is not a valid envelope or control message."""


@dataclass(frozen=True)
class Release:
    """Driver -> service: handle these buffered envelopes now, in this order (round ``round``)."""

    round: int
    ids: tuple[str, ...]


@dataclass(frozen=True)
class Finished:
    """Service -> driver: round ``round`` is handled; its outputs are in the log up to ``log_offset``."""

    round: int
    service: str
    log_offset: int
    """The highest log offset this service wrote for the round, -1 if it wrote nothing."""


Control = Release | Finished


TRACEPARENT_HEADER = "traceparent"


def envelope_headers(env: Envelope) -> list[tuple[str, bytes]]:
    """Type and source; and the W3C ``traceparent`` when the envelope carries one (tracing on), so
    tools that read Kafka headers follow the trace without parsing the body."""
    headers = [(TYPE_HEADER, env.type.encode()), (SOURCE_HEADER, env.source.encode())]
    if env.trace:
        parent = env.trace.get(TRACEPARENT_HEADER)
        if parent:
            headers.append((TRACEPARENT_HEADER, parent.encode()))
    return headers


def encode(env: Envelope) -> bytes:
    return to_json(env)


def encode_control(message: Control) -> tuple[bytes, list[tuple[str, bytes]]]:
    if isinstance(message, Release):
        body: dict[str, Any] = {"round": message.round, "ids": list(message.ids)}
        kind = b"release"
    else:
        body = {"round": message.round, "service": message.service, "log_offset": message.log_offset}
        kind = b"finished"
    return json.dumps(body).encode(), [(CONTROL_HEADER, kind)]


def control_kind(headers: Headers | None) -> str | None:
    """``release`` / ``finished`` for a control record, None for an envelope."""
    for name, value in headers or ():
        if name == CONTROL_HEADER:
            return value.decode("utf-8", "replace")
    return None


def decode(value: bytes | None, headers: Headers | None = None) -> Envelope | Control:
    """Parse a record; ``BadRecord`` says what is wrong with it."""
    if value is None:
        raise BadRecord("empty record (no value)")
    kind = control_kind(headers) if headers else None  # a log's record has no headers
    if kind is None:
        env = _parse_envelope(value)
        if env is None:
            try:
                env = from_json(value)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first.get("loc", ())) or "envelope"
                raise BadRecord(f"not a valid envelope: {where}: {first.get('msg', 'invalid')} "
                                f"({exc.error_count()} error(s))") from None
            except RecursionError:
                raise BadRecord("not a valid envelope: nested too deeply to parse") from None
            except (ValueError, UnicodeDecodeError) as exc:
                raise BadRecord(f"not a valid envelope: {exc}") from None
        if _BACKSLASH in value and (b"\\ud" in value or b"\\uD" in value):
            _encodable(env)
        return env
    try:
        body = json.loads(value)
        if kind == "release":
            ids = body["ids"]
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise TypeError("ids must be a list of strings")
            return Release(round=int(body["round"]), ids=tuple(ids))
        if kind == "finished":
            return Finished(round=int(body["round"]), service=str(body["service"]), log_offset=int(body["log_offset"]))
    except (ValueError, KeyError, TypeError, RecursionError, OverflowError) as exc:
        raise BadRecord(f"not a valid {kind} control message: {type(exc).__name__}: {exc}") from None
    raise BadRecord(f"unknown control message {kind!r}")


_BACKSLASH = ord("\\")  # an int: ``in`` looks for one byte (memchr), much faster than for b"\\"


def _encodable(env: Envelope) -> None:
    """JSON can escape half of a UTF-16 surrogate pair (``\\ud800``): Python reads it into a string
    that cannot be encoded again, so every output caused by the envelope, and its row in the
    history store, would fail for good. Bad input, told apart where records are read."""
    try:
        encode(env)
    except ValueError as exc:  # pydantic's serialisation error is one
        raise BadRecord(f"not a valid envelope: holds half a UTF-16 surrogate pair "
                        f"({str(exc).splitlines()[0]})") from None


_VALIDATE = _ENVELOPE.validator.validate_python
"""``_ENVELOPE.validate_python`` without TypeAdapter's Python wrapper (a visible part of a decode)."""


def _parse_envelope(value: bytes) -> Envelope | None:
    """``shared.kernel.events.from_json`` with the JSON parsed by pydantic-core (Rust) instead of ``json``:
    the same upcast and validation of the same dict, in much less time per envelope — every
    consumer decodes every record it reads. None for anything that does not go through cleanly;
    ``from_json`` then gives the answer or the error, so a bad record reads exactly as before."""
    try:
        if _WATCH_TYPE in value[:_WATCH_TYPE_WITHIN]:
            env = _typed_watch_event(value)
            if env is not None:
                return env
        raw = pydantic_core.from_json(value)
        if type(raw) is not dict:
            return None
        return _VALIDATE(upcast(raw))
    except Exception:  # noqa: BLE001 - any trouble: the reference path decides
        return None


class _WatchPayload(msgspec.Struct, forbid_unknown_fields=True):
    """``ObjectChanged`` as muster writes it: every field, no other (see ``_typed_watch_event``)."""

    type: Literal["ObjectChanged"]
    change: Literal["Added", "Modified", "Deleted"]
    kind: str
    api_version: str
    namespace: str
    name: str
    object: dict[str, Any]


class _WatchRecord(msgspec.Struct, forbid_unknown_fields=True):
    """An ``Envelope`` of an ``ObjectChanged`` as muster writes it."""

    id: str
    type: Literal["ObjectChanged"]
    subject: str
    source: str
    occurred_at: float
    causation_id: str | None
    correlation_id: str
    schema_version: int
    trace: dict[str, str]
    payload: _WatchPayload


_WATCH_TYPE = b',"type":"ObjectChanged",'
_WATCH_TYPE_WITHIN = 64
"""The envelope's type follows its 24-character id: a watch event says so in its first bytes."""
_WATCH_DECODER = msgspec.json.Decoder(_WatchRecord)


def _typed_watch_event(value: bytes) -> Envelope | None:
    """A watch event (most of any log, and the largest records) parsed and type-checked in one pass by
    msgspec, then built without the validator (cheaper than pydantic-core's parse and the build;
    docs/benchmarks.md, ``replay_*``). It only skips checks that would pass: every field must be
    present, once or last-wins like pydantic-core, no other, of exactly the JSON type validation would
    leave as is: a string for ``str``, an integer for ``schema_version``; ``occurred_at`` a number (an
    integer is read as the float validation makes of it), finite; the subject the payload's. The object
    is read as JSON, as pydantic-core reads it. Anything else raises or gives None, and the validator
    decides (a watch event laid out otherwise than muster's encoder writes it, too)."""
    rec = _WATCH_DECODER.decode(value)
    p = rec.payload
    subject = f"{p.kind}/{p.namespace}/{p.name}" if p.namespace else f"{p.kind}/{p.name}"
    if rec.subject != subject or rec.schema_version != SCHEMA_VERSION or not math.isfinite(rec.occurred_at):
        return None
    return built(Envelope, {
        "id": rec.id, "type": rec.type, "subject": rec.subject, "source": rec.source, "occurred_at": rec.occurred_at,
        "causation_id": rec.causation_id, "correlation_id": rec.correlation_id, "schema_version": rec.schema_version,
        "trace": rec.trace,
        "payload": built(ObjectChanged, {"type": p.type, "change": p.change, "kind": p.kind,
                                         "api_version": p.api_version, "namespace": p.namespace, "name": p.name,
                                         "object": p.object}),
    })


_VALIDATE_READ = ENVELOPE_READ.validator.validate_json


def decode_to_fold(value: bytes | None, headers: Headers | None = None) -> tuple[Envelope | Control, str | None]:
    """For a reader that folds envelopes and keeps them as they came (the history store's
    projector): the envelope as the fold reads it (``EnvelopeRead``: a watch event without the parts
    of its object nobody reads) and its payload's JSON text as written (``payload_text``).

    ``decode``'s answer, and None for the text (serialise the payload from the envelope), for any
    record ``decode`` might see otherwise: a control message, bad input, an older schema version, a
    layout other than muster's encoder writes, or a backslash (an escape: half a surrogate pair, a
    key spelled otherwise; see ``payload_text``). One difference is left: a float field written as
    an integer too large for a double (no encoder of muster's writes one) is read as infinity
    here, where ``decode`` refuses it."""
    if value is not None and control_kind(headers) is None:
        text = payload_text(value)  # what it says holds for a valid record: the fold's validates it
        if text is not None:
            try:
                env = _VALIDATE_READ(value)
            except Exception:  # noqa: BLE001 - bad input: ``decode`` says what is wrong
                env = None
            if env is not None and env.schema_version == SCHEMA_VERSION:
                return env, text
    return decode(value, headers), None


_PAYLOAD_KEY = b',"payload":{'
_VERSION_THEN_TRACE = b',"schema_version":%d,"trace":{' % SCHEMA_VERSION
_CLOSE = ord("}")
_NOT_IN_PAYLOAD = (b"Infinity", b"NaN", b'"trace"', b'"payload"')
"""Non-finite numbers (kept on the wire, which JSON and the store's JSON do not hold), and the names
of the keys whose duplicates could follow the payload (an object's: the record ends ``}}``)."""


def payload_text(value: bytes) -> str | None:
    """The JSON text of a valid envelope record's payload, cut out of it, when the record is laid
    out as muster's encoder writes one (``to_json``): no whitespace, ``trace`` then ``payload``
    last. None otherwise: then serialise the payload from the envelope.

    Why the cut is the payload: the first ``,"payload":{`` of a valid record is a key (a string
    cannot hold an unescaped quote). With exactly two ``{`` and one ``}`` before it, the record's
    and the trace's, it is the record's own key. What follows up to the record's closing brace is
    its value unless keys follow it. Any that did would end ``"}`` or a digit, refused, unless it
    is a duplicate ``trace`` or ``payload`` (an object); so a cut naming either (``_NOT_IN_PAYLOAD``,
    whatever the whitespace around it, and no record with a backslash, which could spell one
    otherwise) is refused. Also refused: a payload holding a non-finite number (the payload is
    written with null there).

    The schema version must be written as the integer ``decode`` takes without upcasting
    (``"schema_version":1`` just before the trace): pydantic would read "1", 1.0 or true as 1."""
    if _BACKSLASH in value:
        return None
    at = value.find(_PAYLOAD_KEY)
    if at < 1 or value[at - 1] != _CLOSE or value[-1] != _CLOSE or value[-2] != _CLOSE:
        return None
    trace = value.find(_VERSION_THEN_TRACE, 1, at) + len(_VERSION_THEN_TRACE) - 1
    if (trace < len(_VERSION_THEN_TRACE) or value.find(b"{", 1, trace) != -1
            or value.find(b"{", trace + 1, at) != -1 or value.find(b"}", 0, at - 1) != -1):
        return None
    cut = value[at + len(_PAYLOAD_KEY) - 1:-1]
    for marker in _NOT_IN_PAYLOAD:
        if marker in cut:
            return None
    try:
        return cut.decode()
    except UnicodeDecodeError:
        return None


def dead_letter(value: bytes | None, headers: Headers | None, *, topic: str, partition: int, offset: int,
                consumer: str, error: str) -> bytes:
    """The dead-letter record for a bad one: enough to find it, see it and fix what sent it."""
    try:
        text, encoding = (value or b"").decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(value or b"").decode(), "base64"
    return json.dumps({
        "topic": topic, "partition": partition, "offset": offset, "consumer": consumer, "error": error,
        "value": text, "value_encoding": encoding,
        "headers": {name: v.decode("utf-8", "replace") for name, v in headers or ()},
    }).encode()
