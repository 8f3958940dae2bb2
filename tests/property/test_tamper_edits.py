"""For random chained logs (and an archive of one with its pruned rest) and a random single edit of a
file — one byte changed, a line deleted, duplicated, moved, two lines swapped, a line inserted —
``muster replay --verify``'s chain check never passes the edited log (``shared.audit.integrity``; the decisions are checked after it and are not
needed here: the logs hold arbitrary bytes for envelopes)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.audit.errors import AuditError
from shared.audit.header import CHAINED, LogHeader
from shared.audit.integrity import chain_lines, check
from shared.audit.logfile import LogFile
from shared.history.integrity import Chainer, Signer, digest

SIGNER = Signer.generate()


def _chained(envelopes: list[bytes], every: int) -> tuple[LogHeader, list[tuple[bytes, int, int, str]], list[dict]]:
    header = LogHeader.made_now(None, origin="simulate", scenario="random", until=1.0).model_copy(
        update={"muster_log": CHAINED})
    chainer = Chainer(SIGNER, "test", every=every, seconds=1e9)
    header_record = SIGNER.header_record(header.for_store())
    chainer.header = digest(header_record)
    signed = [SIGNER.key_record(), header_record]
    rows = []
    for raw in envelopes:
        offset, value = chainer.add(0, raw)
        rows.append((raw, 0, offset, value.hex()))
        signed += chainer.due()
    signed += chainer.seal()
    return header, rows, signed


def _file(header: LogHeader, rows: list, signed: list, starts: dict[int, int] | None = None) -> bytes:
    body = [line + b"\n" for line in chain_lines(iter(rows), signed, starts)]
    return header.line() + b"".join(body) + b'{"muster_log_end":{"events":%d}}\n' % len(rows)


def chained_file(envelopes: list[bytes], every: int) -> bytes:
    """A chained log as the exporter writes one of a simulated run signed by ``SIGNER``."""
    return _file(*_chained(envelopes, every))


def archived_files(envelopes: list[bytes], every: int, pick: int) -> tuple[bytes, bytes] | None:
    """The archive up to a checkpoint (the ``pick``-th that leaves something after it) and the pruned
    log after it, as ``muster log archive --prune`` and an export of the store write them."""
    header, rows, signed = _chained(envelopes, every)
    cuts = sorted({r["offset"] for r in signed if r["kind"] == "checkpoint" and r["offset"] < len(rows) - 1})
    if not cuts:
        return None
    cut = cuts[pick % len(cuts)]
    kept = [r for r in signed if r["kind"] != "checkpoint" or r["offset"] <= cut]
    archive = _file(header.model_copy(update={"before": 0.5}), rows[:cut + 1], kept)
    return archive, _file(header, rows[cut + 1:], signed, {0: cut + 1})


def passes_archived(archive: bytes, live: bytes) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        first, rest = Path(tmp) / "archive.jsonl", Path(tmp) / "live.jsonl"
        first.write_bytes(archive)
        rest.write_bytes(live)
        try:
            ends = check(LogFile(first), sealed=False).ends
            log = LogFile(rest)
            check(log, after=ends)
            for source in (LogFile(first), log):
                for _ in source.records():
                    pass
        except AuditError:
            return False
    return True


def passes(data: bytes) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "log.jsonl"
        path.write_bytes(data)
        try:
            log = LogFile(path)
            check(log)
            for _ in log.records():
                pass
        except AuditError:
            return False
    return True


envelope = st.dictionaries(st.sampled_from(["id", "type", "subject", "occurred_at"]),
                           st.one_of(st.integers(0, 99), st.text("abc", max_size=4)), min_size=1).map(
    lambda d: __import__("json").dumps(d, separators=(",", ":")).encode())
logs = st.tuples(st.lists(envelope, min_size=1, max_size=12), st.integers(1, 5))


def _edit(draw: st.DrawFn, original: bytes) -> bytes:
    lines = original.splitlines(keepends=True)
    kind = draw(st.sampled_from(["byte", "delete", "duplicate", "move", "swap", "insert"]))
    i = draw(st.integers(0, len(lines) - 1))
    j = draw(st.integers(0, len(lines) - 1))
    if kind == "byte":
        data = bytearray(original)
        data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        return bytes(data)
    if kind == "delete":
        del lines[i]
    elif kind == "duplicate":
        lines.insert(j, lines[i])
    elif kind == "move":
        lines.insert(j, lines.pop(i))
    elif kind == "swap":
        lines[i], lines[j] = lines[j], lines[i]
    else:
        lines.insert(j, draw(st.sampled_from([b"{}\n", b'{"chain":"00","at":[0,0],"envelope":{}}\n',
                                              b'{"muster_signed":{}}\n', lines[i][:-1] + b" \n"])))
    return b"".join(lines)


@st.composite
def edited(draw: st.DrawFn) -> tuple[bytes, bytes]:
    envelopes, every = draw(logs)
    original = chained_file(envelopes, every)
    return original, _edit(draw, original)


@st.composite
def archived_edited(draw: st.DrawFn) -> tuple[bytes, bytes, bytes, bytes] | None:
    envelopes, every = draw(logs)
    files = archived_files(envelopes, every, draw(st.integers(0, 10)))
    if files is None:
        return None
    archive, live = files
    if draw(st.booleans()):
        return archive, live, _edit(draw, archive), live
    return archive, live, archive, _edit(draw, live)


def test_an_unedited_random_log_passes() -> None:
    assert passes(chained_file([b'{"id":1}', b'{"id":2}', b'{"id":3}'], 2))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edited())
def test_no_single_edit_passes(case: tuple[bytes, bytes]) -> None:
    original, data = case
    if data != original:
        assert not passes(data)


def test_an_archive_and_its_pruned_log_pass_as_one() -> None:
    files = archived_files([b'{"id":%d}' % i for i in range(7)], 2, 1)
    assert files is not None and passes_archived(*files)
    assert not passes(files[1])  # the pruned log alone is refused: its start looks cut off


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(archived_edited())
def test_no_single_edit_of_an_archive_or_its_log_passes(case: tuple[bytes, bytes, bytes, bytes] | None) -> None:
    if case is None:
        return
    archive, live, edited_archive, edited_live = case
    assert passes_archived(archive, live)
    if (edited_archive, edited_live) != (archive, live):
        assert not passes_archived(edited_archive, edited_live)
