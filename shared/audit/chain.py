"""The chain of causes of an envelope, back to the watch event (or timer) that started it.

Found by reading the log again up to where the replay stopped: a replay keeps only what it still
owes, not every envelope it has seen, so the chain of a divergence costs a second read of the log
(only when there is one). Envelopes are decoded only for the links of the chain.
"""

from __future__ import annotations

from shared.audit.logfile import LogSource, Record, decode
from shared.kernel.events import Envelope

ID_SPAN = slice(len(b'{"id":"'), len(b'{"id":"') + 24)
"""Where muster's encoder writes an envelope's id: first, 24 characters."""
_CAUSE_KEY = b',"causation_id":'


def _cause_of(raw: bytes) -> str | None:
    """The causation id as muster's encoder lays it out (``"causation_id":"..."`` or ``null``)."""
    at = raw.find(_CAUSE_KEY)
    if at < 0:
        return None
    start = at + len(_CAUSE_KEY)
    if raw[start:start + 1] != b'"':
        return None
    end = raw.find(b'"', start + 1)
    return raw[start + 1:end].decode("ascii", "replace") if end > 0 else None


def causes(source: LogSource, first: str, stop: str | None = None, limit: int = 64) -> list[tuple[str, Envelope]]:
    """``first`` and its causes, nearest first, each with where it is in the log; read up to
    ``stop`` (a record's ``where``) at most. An id the log does not hold ends the chain."""
    parents: dict[str, tuple[str | None, str]] = {}
    for where, raw in source.records():
        parents[raw[ID_SPAN].decode("ascii", "replace")] = (_cause_of(raw), where)
        if where == stop:
            break
    wanted: list[str] = []
    current: str | None = first
    while current is not None and current in parents and current not in wanted and len(wanted) < limit:
        wanted.append(current)
        current = parents[current][0]
    places = {parents[i][1]: i for i in wanted}
    found: dict[str, tuple[str, Envelope]] = {}
    for record in source.records():
        if record.where in places:
            found[places[record.where]] = (record.where, decode(Record(record.where, record.raw)))
            if len(found) == len(places):
                break
    return [found[i] for i in wanted if i in found]


def recorded_before(source: LogSource, event_id: str, stop: str) -> bool:
    """Whether an envelope with id ``event_id`` is in ``source`` before the record at ``stop``.

    A replay keeps no set of every id it has read (it would grow with the log): a divergence that
    may be a second copy of a decision reads the log again to tell (only then)."""
    wanted = event_id.encode("ascii", "replace")
    for where, raw in source.records():
        if where == stop:
            return False
        if raw[ID_SPAN] == wanted:
            return True
    return False
