"""Tampering with an exported log of a simulated run: every kind of edit is caught by ``muster replay
--verify`` before any decision is replayed, exit 7, the first line that shows it named and the edit
said in words (``shared.audit.integrity``). Each of these passed verify before the log was chained."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from shared.audit.integrity import TAMPERED
from shared.history.integrity import GENESIS, Signer, envelope_line, link, public_pem
from tests.builders.audit import chained, scenario_run
from tests.builders.cli import clean_exit, flat, invoke

NAME = "kai-priority-preemption"
SIGNER = Signer.generate()


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chained(scenario_run(NAME), tmp_path_factory.mktemp("tamper") / "log.jsonl", signer=SIGNER, every=40)


@pytest.fixture(scope="module")
def public(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("key") / "pub.pem"
    path.write_text(public_pem(SIGNER.public))
    return path


def _lines(log: Path) -> list[bytes]:
    return log.read_bytes().splitlines(keepends=True)


def _envelope(line: bytes) -> dict:
    return json.loads(line)["envelope"]


def _is_envelope(line: bytes) -> bool:
    return line.startswith(b'{"chain":')


def _end(lines: list[bytes]) -> list[bytes]:
    """The end line made again to count what is left (what a careful forger does)."""
    count = sum(1 for line in lines[1:-1] if _is_envelope(line))
    return [*lines[:-1], b'{"muster_log_end":{"events":%d}}\n' % count]


def _write(lines: list[bytes], out: Path) -> Path:
    out.write_bytes(b"".join(lines))
    return out


def _tampered(path: Path, *text: str, key: Path | None = None) -> str:
    args = ["replay", path, "--verify", "-q"] + (["--public-key", key] if key else [])
    result = invoke(*args)
    clean_exit(result, TAMPERED)
    out = flat(result.stdout)
    assert "TAMPERED" in out and "verifying" not in out, out  # caught before any decision is replayed
    for t in text:
        assert t in out, out
    return out


def _rechained(lines: list[bytes], start: int) -> list[bytes]:
    """Every envelope line from ``start`` on given the links its (edited) bytes make: what a forger
    without the key can do."""
    out = list(lines)
    prev = GENESIS
    for i, line in enumerate(out):
        if not _is_envelope(line):
            continue
        m = re.match(rb'\{"chain":"[0-9a-f]{64}","at":\[(\d+),(\d+)\],"envelope":', line)
        assert m is not None
        raw = line[m.end():-2]
        if i >= start:
            out[i] = envelope_line(int(m[1]), int(m[2]), link(prev, raw), raw)
        prev = bytes.fromhex(json.loads(out[i])["chain"])
    return out


def test_the_untouched_log_verifies_with_its_key(log: Path, public: Path) -> None:
    result = invoke("replay", log, "--verify", "-q", "--public-key", public)
    clean_exit(result, 0)
    out = flat(result.stdout)
    assert "chain OK" in out and "checked against the given public key" in out and "76 identical" in out


def test_without_a_key_it_says_authenticity_was_not_checked(log: Path) -> None:
    result = invoke("replay", log, "--verify", "-q")
    clean_exit(result, 0)
    assert "authenticity not checked" in flat(result.stdout)


def test_a_workload_removed_with_the_end_count_fixed(log: Path, tmp_path: Path) -> None:
    lines = _lines(log)
    subject = b"default/build-cluster"
    kept = [line for line in lines if not (_is_envelope(line) and subject in line)]
    assert len(kept) < len(lines)
    first = next(i for i, line in enumerate(lines) if _is_envelope(line) and subject in line)
    _tampered(_write(_end(kept), tmp_path / "bad.jsonl"), f"line {first + 1}:", "a line was deleted")


def test_two_decisions_of_different_services_swapped(log: Path, tmp_path: Path) -> None:
    lines = _lines(log)
    envs = [i for i, line in enumerate(lines) if _is_envelope(line)]
    i, j = next((a, b) for a, b in zip(envs, envs[1:]) if b == a + 1 and _envelope(lines[a])["source"] in
                ("queue", "placement", "admission", "reconciler") and _envelope(lines[b])["source"] not in
                (_envelope(lines[a])["source"], "ingest"))
    lines[i], lines[j] = lines[j], lines[i]
    _tampered(_write(lines, tmp_path / "bad.jsonl"), f"line {i + 1}:", "reordered")


@pytest.mark.parametrize("edit", ["label", "timestamp"])
def test_an_input_label_or_timestamp_changed(log: Path, tmp_path: Path, edit: str) -> None:
    lines = _lines(log)
    i = next(i for i, line in enumerate(lines) if _is_envelope(line) and b'"source":"ingest"' in line
             and (b'"labels":{"' in line if edit == "label" else True))
    if edit == "label":
        lines[i] = lines[i].replace(b'"labels":{"', b'"labels":{"forged":"yes","', 1)
    else:
        lines[i] = re.sub(rb'"occurred_at":([0-9.]+)', lambda m: b'"occurred_at":%s1' % m[1], lines[i], count=1)
    _tampered(_write(lines, tmp_path / "bad.jsonl"), f"line {i + 1}:", "this line was edited or inserted")


def test_the_tail_cut_at_a_quiet_point_with_a_new_end_line(log: Path, tmp_path: Path) -> None:
    lines = _lines(log)
    cut = [line for line in lines[: len(lines) * 2 // 3]]
    _tampered(_write(_end([*cut, lines[-1]]), tmp_path / "bad.jsonl"), "final checkpoint", "was cut short")


def test_the_tail_cut_but_its_checkpoints_kept(log: Path, tmp_path: Path) -> None:
    lines = _lines(log)
    keep = len(lines) // 2
    rest = [line for line in lines[keep:-1] if line.startswith(b'{"muster_signed"')]
    out = _tampered(_write(_end([*lines[:keep], *rest, lines[-1]]), tmp_path / "bad.jsonl"),
                    "which the log no longer reaches")
    assert "was cut short" in out


@pytest.mark.parametrize("field, value", [("origin", "kafka"), ("muster_version", "9.9.9"),
                                          ("policy", {"queueing": "StrictFIFO"})])
def test_a_header_field_edited(log: Path, tmp_path: Path, field: str, value: object) -> None:
    lines = _lines(log)
    header = json.loads(lines[0])
    header[field] = {**header["policy"], **value} if isinstance(value, dict) else value
    from shared.audit.header import LogHeader

    lines[0] = LogHeader.model_validate(header).line()
    _tampered(_write(lines, tmp_path / "bad.jsonl"), "line 1:", f"header field {field} differ", "the header was edited")


def test_a_watch_line_duplicated(log: Path, tmp_path: Path) -> None:
    lines = _lines(log)
    i = next(i for i, line in enumerate(lines) if _is_envelope(line) and b'"type":"ObjectChanged"' in line)
    lines.insert(i + 5, lines[i])
    _tampered(_write(_end(lines), tmp_path / "bad.jsonl"), f"line {i + 6}:", "again", "duplicated or inserted")


def test_an_inserted_line(log: Path, tmp_path: Path) -> None:
    lines = _lines(log)
    i = next(i for i, line in enumerate(lines) if _is_envelope(line) and b'"source":"ingest"' in line)
    forged = lines[i].replace(b'"occurred_at":', b'"occurred_at":1', 1)
    m = json.loads(forged)
    at = m["at"]
    # the forger gives it the next place and moves every later one up by one
    out = list(lines[: i + 1])
    out.append(forged.replace(b'"at":[%d,%d]' % tuple(at), b'"at":[%d,%d]' % (at[0], at[1] + 1), 1))
    for line in lines[i + 1:]:
        if _is_envelope(line):
            p, o = json.loads(line)["at"]
            line = line.replace(b'"at":[%d,%d]' % (p, o), b'"at":[%d,%d]' % (p, o + 1), 1)
        out.append(line)
    _tampered(_write(_end(out), tmp_path / "bad.jsonl"), f"line {i + 2}:", "edited or inserted")


def test_a_plain_envelope_line_inserted(log: Path, tmp_path: Path) -> None:
    lines = _lines(log)
    i = next(i for i, line in enumerate(lines) if _is_envelope(line))
    lines.insert(i + 3, json.dumps(_envelope(lines[i])).encode() + b"\n")
    _tampered(_write(_end(lines), tmp_path / "bad.jsonl"), f"line {i + 4}:", "not a chained envelope line")


def test_the_rest_re_chained_without_the_key(log: Path, tmp_path: Path) -> None:
    lines = _lines(log)
    i = next(i for i, line in enumerate(lines) if _is_envelope(line) and b'"reason":"' in line)
    lines[i] = lines[i].replace(b'"reason":"', b'"reason":"forged ', 1)
    out = _tampered(_write(_rechained(lines, i), tmp_path / "bad.jsonl"), "rewritten and re-chained")
    start, end = map(int, re.search(r"between line (\d+) and line (\d+)", out).groups())  # type: ignore[union-attr]
    assert start <= i + 1 <= end  # the first checkpoint after the edit names the stretch it is in


def test_the_checkpoints_re_made_too_need_the_key(log: Path, tmp_path: Path) -> None:
    """A forger who also rewrites the checkpoints' links breaks their signatures."""
    lines = _lines(log)
    i = next(i for i, line in enumerate(lines) if _is_envelope(line) and b'"reason":"' in line)
    lines[i] = lines[i].replace(b'"reason":"', b'"reason":"forged ', 1)
    lines = _rechained(lines, i)
    links = {tuple(json.loads(line)["at"]): json.loads(line)["chain"] for line in lines if _is_envelope(line)}
    for n, line in enumerate(lines):
        if line.startswith(b'{"muster_signed":{"kind":"checkpoint"'):
            record = json.loads(line)["muster_signed"]
            record["chain"] = links[(record["partition"], record["offset"])]
            lines[n] = b'{"muster_signed":' + json.dumps(record, separators=(",", ":")).encode() + b"}\n"
    _tampered(_write(lines, tmp_path / "bad.jsonl"), "its signature does not verify")


def test_a_history_re_signed_with_another_key_fails_with_the_public_key(log: Path, public: Path,
                                                                       tmp_path: Path) -> None:
    forged = chained(scenario_run(NAME), tmp_path / "forged.jsonl", signer=Signer.generate(), every=40)
    clean_exit(invoke("replay", forged, "--verify", "-q"), 0)  # consistent in itself...
    _tampered(forged, "the log was re-signed by someone else", key=public)  # ...but not the signer's


def test_a_witness_catches_a_history_re_signed_with_the_stolen_key(log: Path, tmp_path: Path) -> None:
    witness = tmp_path / "witness.jsonl"
    result = invoke("log", "checkpoints", "--log", log)
    clean_exit(result, 0)
    witness.write_text(result.stdout)
    clean_exit(invoke("replay", log, "--verify", "-q", "--witness", witness), 0)
    other = scenario_run("kai-priority-preemption")
    stolen = chained(other, tmp_path / "stolen.jsonl", signer=SIGNER, every=41)  # the same key, other checkpoints
    lines = _lines(stolen)
    i = next(i for i, line in enumerate(lines) if _is_envelope(line) and b'"reason":"' in line)
    lines[i] = lines[i].replace(b'"reason":"', b'"reason":"forged ', 1)
    rewritten = _write(_rechained(lines, i), tmp_path / "rewritten.jsonl")
    result = invoke("replay", rewritten, "--verify", "-q", "--witness", witness)
    clean_exit(result, TAMPERED)
    assert "disagrees with the witnessed checkpoint" in flat(result.stdout) or "re-chained" in flat(result.stdout)


@pytest.mark.parametrize("where", ["header", "key", "envelope", "link", "place", "checkpoint", "end"])
def test_one_byte_of_any_line(log: Path, tmp_path: Path, where: str) -> None:
    lines = _lines(log)
    pick = {"header": 0, "end": len(lines) - 1,
            "key": next(i for i, l in enumerate(lines) if b'"kind":"key"' in l),
            "checkpoint": next(i for i, l in enumerate(lines) if b'"kind":"checkpoint"' in l),
            "envelope": next(i for i, l in enumerate(lines) if _is_envelope(l)) + 7,
            "link": next(i for i, l in enumerate(lines) if _is_envelope(l)) + 9,
            "place": next(i for i, l in enumerate(lines) if _is_envelope(l)) + 12}[where]
    line = bytearray(lines[pick])
    at = {"link": 20, "place": line.find(b'"at":[') + 8}.get(where, len(line) // 2)
    line[at] ^= 0x01
    lines[pick] = bytes(line)
    result = invoke("replay", _write(lines, tmp_path / "bad.jsonl"), "--verify", "-q")
    assert result.exit_code != 0, result.output
    assert f"line {pick + 1}" in flat(result.output) or where == "end", result.output


def test_an_unchained_log_with_a_public_key_cannot_be_called_authentic(tmp_path: Path, public: Path) -> None:
    from tests.builders.audit import exported

    plain = exported(scenario_run(NAME), tmp_path / "plain.jsonl")
    result = invoke("replay", plain, "--verify", "-q", "--public-key", public)
    clean_exit(result, TAMPERED)
    assert "carries no hash chain" in flat(result.stdout)
    result = invoke("replay", plain, "--verify", "-q")
    clean_exit(result, 0)
    assert "carries no hash chain" in flat(result.stdout)


def test_import_keeps_the_chain_and_export_gives_the_same_file(log: Path, tmp_path: Path, public: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    clean_exit(invoke("log", "import", log, "--store", url), 0)
    again = tmp_path / "again.jsonl"
    clean_exit(invoke("log", "export", "--store", url, "--out", again), 0)
    assert again.read_bytes() == log.read_bytes()
    result = invoke("replay", url, "--verify", "-q", "--public-key", public)
    clean_exit(result, 0)
    assert "checked against the given public key" in flat(result.stdout)


def test_import_refuses_a_broken_chain_naming_the_line(log: Path, tmp_path: Path) -> None:
    lines = _lines(log)
    i = next(i for i, line in enumerate(lines) if _is_envelope(line) and b'"reason":"' in line)
    lines[i] = lines[i].replace(b'"reason":"', b'"reason":"forged ', 1)
    result = invoke("log", "import", _write(lines, tmp_path / "bad.jsonl"), "--store", f"sqlite:///{tmp_path / 'h.db'}")
    clean_exit(result, TAMPERED)
    assert f"line {i + 1}:" in flat(result.stderr)


def test_a_simulated_run_is_signed_with_a_key_of_its_own(tmp_path: Path) -> None:
    """The README's walk-through: simulate into a store, print the run's key, verify the export with it."""
    url = f"sqlite:///{tmp_path / 'run.db'}"
    scenario = Path(__file__).parents[2] / "examples" / "volcano-gang-queue.yaml"
    clean_exit(invoke("simulate", scenario, "-q", "--store", url), 0)
    key = invoke("log", "key", "--store", url)
    clean_exit(key, 0)
    assert key.stdout.startswith("-----BEGIN PUBLIC KEY-----")
    pub = tmp_path / "run.pub"
    pub.write_text(key.stdout)
    out = tmp_path / "run.jsonl.gz"
    clean_exit(invoke("log", "export", "--store", url, "--out", out), 0)
    result = invoke("replay", out, "--verify", "-q", "--public-key", pub)
    clean_exit(result, 0)
    assert "chain OK" in flat(result.stdout) and "checked against the given public key" in flat(result.stdout)
    witness = invoke("log", "checkpoints", "--store", url, "--since", "2000-01-01T00:00:00Z")
    clean_exit(witness, 0)
    assert any('"kind":"checkpoint"' in line for line in witness.stdout.splitlines())
    later = invoke("log", "checkpoints", "--store", url, "--since", "2999-01-01T00:00:00Z")
    assert '"kind":"checkpoint"' not in later.stdout
