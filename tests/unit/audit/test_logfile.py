"""shared/audit/logfile.py: the exported file's layout, and every way a file can be wrong."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from shared.audit.errors import CannotReproduce, NotAnEnvelope, SourceError, TruncatedLog
from shared.audit.export import export, occurred_at
from shared.audit.header import CHAINED, FORMAT, LogHeader
from shared.audit.logfile import LogFile, decode, envelopes, open_log
from shared.kernel.events import SCHEMA_VERSION, to_json
from tests.builders.audit import exported, lines_of, rewritten, scenario_run

NAME = "volcano-gang-queue"


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return exported(scenario_run(NAME), tmp_path / "log.jsonl")


def _read_all(path: Path) -> list:
    return list(envelopes(LogFile(path)))


def test_the_file_is_a_header_one_envelope_a_line_and_an_end_line(log: Path) -> None:
    run = scenario_run(NAME)
    raw = log.read_bytes().splitlines()
    header = json.loads(raw[0])
    assert header["muster_log"] == FORMAT and header["schema_version"] == SCHEMA_VERSION
    assert header["policy"] == run.policy.model_dump(mode="json")
    assert (header["scenario"], header["until"], header["origin"]) == (NAME, run.scenario.until, "simulate")
    assert raw[1:-1] == [to_json(e) for e in run.runtime.log]
    assert json.loads(raw[-1]) == {"muster_log_end": {"events": len(run.runtime.log)}}
    assert [e.id for e in _read_all(log)] == [e.id for e in run.runtime.log]


def test_a_gz_name_is_compressed_and_reads_the_same(log: Path, tmp_path: Path) -> None:
    packed = tmp_path / "log.jsonl.gz"
    assert export(LogFile(log), packed) == len(lines_of(log))
    assert gzip.decompress(packed.read_bytes()) == log.read_bytes()
    assert [e.id for e in _read_all(packed)] == [e.id for e in _read_all(log)]


def test_the_same_history_exports_to_the_same_bytes(log: Path, tmp_path: Path) -> None:
    again = exported(scenario_run(NAME), tmp_path / "again.jsonl")
    assert again.read_bytes() == log.read_bytes()


def test_an_export_window_keeps_the_times_asked_for_and_says_so(log: Path, tmp_path: Path) -> None:
    window = tmp_path / "window.jsonl"
    export(LogFile(log), window, since=10.0, until=120.0)
    source = LogFile(window)
    assert (source.header.since, source.header.before) == (10.0, 120.0)
    times = [occurred_at(r.raw) for r in source.records()]
    assert times and all(10.0 <= t <= 120.0 for t in times)
    assert len(times) == sum(1 for e in scenario_run(NAME).runtime.log if 10.0 <= e.occurred_at <= 120.0)


# --------------------------------------------------------------------------- bad files
def test_a_last_line_cut_short_is_truncated(log: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.jsonl"
    data = log.read_bytes()
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(TruncatedLog, match="without a newline"):
        _read_all(cut)


def test_a_file_cut_at_a_line_boundary_has_no_end_line(log: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"".join(log.read_bytes().splitlines(keepends=True)[:40]))
    with pytest.raises(TruncatedLog, match="no end line after line 40"):
        _read_all(cut)


def test_missing_lines_disagree_with_the_end_line(log: Path, tmp_path: Path) -> None:
    raw = log.read_bytes().splitlines(keepends=True)
    short = tmp_path / "short.jsonl"
    short.write_bytes(b"".join(raw[:10] + raw[11:]))
    with pytest.raises(TruncatedLog, match="lines are missing"):
        _read_all(short)


def test_a_compressed_stream_that_ends_early_is_truncated(log: Path, tmp_path: Path) -> None:
    packed = gzip.compress(log.read_bytes())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(packed[:len(packed) * 2 // 3])
    with pytest.raises(TruncatedLog, match="compressed stream ends early"):
        _read_all(cut)


def test_an_empty_file_is_truncated(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(TruncatedLog, match="empty"):
        LogFile(tmp_path / "empty.jsonl")


def test_a_line_that_is_not_an_envelope_is_named(log: Path, tmp_path: Path) -> None:
    lines = lines_of(log)
    lines[6] = b'{"hello": "world"}\n'
    with pytest.raises(NotAnEnvelope, match="line 8: not a valid envelope"):
        _read_all(rewritten(log, lines, tmp_path / "bad.jsonl"))
    lines[6] = b"not json at all\n"
    with pytest.raises(NotAnEnvelope, match="line 8"):
        _read_all(rewritten(log, lines, tmp_path / "bad2.jsonl"))


def test_a_file_without_a_header_is_not_a_muster_log(log: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare.jsonl"
    bare.write_bytes(b"".join(log.read_bytes().splitlines(keepends=True)[1:]))
    with pytest.raises(NotAnEnvelope, match="not a muster log"):
        LogFile(bare)


def test_a_newer_schema_version_cannot_be_reproduced(log: Path, tmp_path: Path) -> None:
    raw = log.read_bytes().splitlines(keepends=True)
    newer = tmp_path / "newer.jsonl"
    header = json.loads(raw[0])
    newer.write_bytes(json.dumps({**header, "schema_version": SCHEMA_VERSION + 1}).encode() + b"\n" + b"".join(raw[1:]))
    with pytest.raises(CannotReproduce, match="newer than this muster"):
        LogFile(newer)
    lines = lines_of(log)
    lines[3] = lines[3].replace(b'"schema_version":1', b'"schema_version":%d' % (SCHEMA_VERSION + 1))
    with pytest.raises(CannotReproduce, match="line 5: event schema version"):
        _read_all(rewritten(log, lines, tmp_path / "newer-line.jsonl"))


def test_a_newer_layout_cannot_be_reproduced(log: Path, tmp_path: Path) -> None:
    raw = log.read_bytes().splitlines(keepends=True)
    newer = tmp_path / "layout.jsonl"
    newer.write_bytes(json.dumps({**json.loads(raw[0]), "muster_log": CHAINED + 1}).encode() + b"\n" + b"".join(raw[1:]))
    with pytest.raises(CannotReproduce, match="layout"):
        LogFile(newer)


def test_lines_after_the_end_line_are_refused(log: Path, tmp_path: Path) -> None:
    more = tmp_path / "more.jsonl"
    more.write_bytes(log.read_bytes() + lines_of(log)[0])
    with pytest.raises(NotAnEnvelope, match="after the end line"):
        _read_all(more)


def test_a_missing_file_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="cannot read the log"):
        open_log(str(tmp_path / "nope.jsonl"))


def test_decoding_names_where(log: Path) -> None:
    record = next(LogFile(log).records())
    assert decode(record).id == record.raw[7:31].decode()


def test_the_header_records_this_musters_versions() -> None:
    header = LogHeader.made_now(None, origin="kafka")
    assert header.policy is None and header.schema_version == SCHEMA_VERSION
    assert LogHeader.parse(header.line(), "x") == header


# --------------------------------------------------------------------------- versions, windows, line counts
@pytest.mark.parametrize("field, value, text", [
    ("schema_version", 0, "event schema version 0 is unknown"),
    ("schema_version", -1, "event schema version -1 is unknown"),
    ("muster_log", 0, "log layout 0 is unknown"),
    ("muster_log", -3, "log layout -3 is unknown"),
])
def test_a_version_before_the_first_cannot_be_reproduced(log: Path, tmp_path: Path, field: str, value: int,
                                                         text: str) -> None:
    raw = log.read_bytes().splitlines(keepends=True)
    old = tmp_path / "old.jsonl"
    old.write_bytes(json.dumps({**json.loads(raw[0]), field: value}).encode() + b"\n" + b"".join(raw[1:]))
    with pytest.raises(CannotReproduce, match=text):
        LogFile(old)


@pytest.mark.parametrize("field", ["schema_version", "muster_log"])
def test_a_version_that_is_not_an_integer_is_a_bad_header(log: Path, tmp_path: Path, field: str) -> None:
    raw = log.read_bytes().splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(json.dumps({**json.loads(raw[0]), field: True}).encode() + b"\n" + b"".join(raw[1:]))
    with pytest.raises(NotAnEnvelope, match=f"a bad log header: {field}"):
        LogFile(bad)


def test_a_newer_schema_says_plainly_which_is_newer(log: Path, tmp_path: Path) -> None:
    raw = log.read_bytes().splitlines(keepends=True)
    newer = tmp_path / "newer.jsonl"
    newer.write_bytes(json.dumps({**json.loads(raw[0]), "schema_version": 7}).encode() + b"\n" + b"".join(raw[1:]))
    with pytest.raises(CannotReproduce) as refused:
        LogFile(newer)
    assert str(refused.value) == (f"{newer}: line 1: the log's event schema version 7 is newer than this muster's "
                                  f"({SCHEMA_VERSION})")


def test_an_envelope_of_a_version_before_the_first_cannot_be_reproduced(log: Path, tmp_path: Path) -> None:
    lines = lines_of(log)
    lines[3] = lines[3].replace(b'"schema_version":1', b'"schema_version":0')
    with pytest.raises(CannotReproduce, match="line 5: event schema version 0 is unknown"):
        _read_all(rewritten(log, lines, tmp_path / "old-line.jsonl"))


@pytest.mark.parametrize("keep", [1, 2, 5, 17])
def test_a_compressed_stream_that_ends_early_names_the_whole_lines_before_the_break(log: Path, tmp_path: Path,
                                                                                   keep: int) -> None:
    data = log.read_bytes()
    whole = b"".join(data.splitlines(keepends=True)[:keep])
    packed = gzip.compress(data, mtime=0)
    cut = tmp_path / "cut.jsonl.gz"
    # the shortest cut of the stream that still gives every byte of the first ``keep`` lines
    size = next(n for n in range(len(packed)) if _inflated(packed[:n]).startswith(whole))
    cut.write_bytes(packed[:size])
    lines = _inflated(packed[:size]).count(b"\n")
    assert lines >= keep
    with pytest.raises(TruncatedLog, match=f"compressed stream ends early, after line {lines}:"):
        _read_all(cut)


def _inflated(prefix: bytes) -> bytes:
    import zlib

    return zlib.decompressobj(wbits=31).decompress(prefix)


def test_an_export_window_that_cuts_nothing_is_not_a_window(log: Path, tmp_path: Path) -> None:
    times = [e.occurred_at for e in scenario_run(NAME).runtime.log]
    for since, until in ((0.0, None), (None, max(times)), (min(times), max(times) + 1)):
        out = tmp_path / "all.jsonl"
        export(LogFile(log), out, since=since, until=until)
        assert not LogFile(out).header.windowed
        assert out.read_bytes() == log.read_bytes()
    cut_start = tmp_path / "since.jsonl"
    export(LogFile(log), cut_start, since=10.0, until=max(times) + 1)
    assert (LogFile(cut_start).header.since, LogFile(cut_start).header.before) == (10.0, None)
    cut_end = tmp_path / "until.jsonl.gz"
    export(LogFile(log), cut_end, since=0.0, until=10.0)
    assert (LogFile(cut_end).header.since, LogFile(cut_end).header.before) == (None, 10.0)
    assert [occurred_at(r.raw) for r in LogFile(cut_end).records()] == [t for t in times if t <= 10.0]
