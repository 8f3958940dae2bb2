"""``muster log archive --until T --out FILE [--prune]``: the log before T as a verified, chained, signed
archive; pruned from the store, the archive and what remains verify as one chain and one history, and
the writer goes on from the checkpoint the cut fell on."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.audit.integrity import TAMPERED
from shared.history.integrity import Signer, public_pem
from tests.builders.audit import chained_store, scenario_run
from tests.builders.cli import clean_exit, flat, invoke, one_line_error

NAME = "kai-priority-preemption"
SIGNER = Signer.generate()


@pytest.fixture
def store(tmp_path: Path) -> str:
    return chained_store(scenario_run(NAME), f"sqlite:///{tmp_path / 'h.db'}", signer=SIGNER, every=40)


@pytest.fixture
def public(tmp_path: Path) -> Path:
    path = tmp_path / "pub.pem"
    path.write_text(public_pem(SIGNER.public))
    return path


def _archived(store: str, tmp_path: Path, until: str = "40") -> tuple[Path, Path]:
    archive, live = tmp_path / "archive.jsonl.gz", tmp_path / "live.jsonl"
    result = invoke("log", "archive", "--store", store, "--until", until, "--out", archive, "--prune")
    clean_exit(result, 0)
    assert "verified" in result.stdout and "pruned from the store" in result.stdout
    clean_exit(invoke("log", "export", "--store", store, "--out", live), 0)
    return archive, live


def test_archive_and_prune_then_both_verify_as_one(store: str, tmp_path: Path, public: Path) -> None:
    archive, live = _archived(store, tmp_path)
    result = invoke("replay", live, "--verify", "-q", "--archive", archive, "--public-key", public)
    clean_exit(result, 0)
    out = flat(result.stdout)
    assert "archive OK" in out and "chain OK" in out
    assert "76 decisions re-derived: 76 identical" in out  # the whole history's, as before the prune


def test_the_pruned_log_alone_names_its_archive(store: str, tmp_path: Path) -> None:
    _, live = _archived(store, tmp_path)
    result = invoke("replay", live, "--verify", "-q")
    clean_exit(result, TAMPERED)
    assert "or archived (`muster log archive`): pass the archive with --archive FILE" in flat(result.stdout)


def test_an_edited_archive_is_named(store: str, tmp_path: Path) -> None:
    import gzip

    archive, live = _archived(store, tmp_path)
    lines = gzip.decompress(archive.read_bytes()).splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if line.startswith(b'{"chain"') and b'"reason":"' in line)
    lines[i] = lines[i].replace(b'"reason":"', b'"reason":"forged ', 1)
    archive.write_bytes(gzip.compress(b"".join(lines)))
    result = invoke("replay", live, "--verify", "-q", "--archive", archive)
    clean_exit(result, TAMPERED)
    assert f"line {i + 1}:" in flat(result.stdout) and "archive.jsonl.gz" in flat(result.stdout)


@pytest.mark.parametrize("history, text", [
    ("fair-share-two-teams", "not one chain"),  # another history's archive
    (NAME, "is not the archive's own"),  # the same history, archived from a store signed by another key
])
def test_another_archive_is_not_the_same_chain(store: str, tmp_path: Path, history: str, text: str) -> None:
    _, live = _archived(store, tmp_path)
    other_store = chained_store(scenario_run(history), f"sqlite:///{tmp_path / 'other.db'}", every=40)
    other = tmp_path / "other.jsonl"
    clean_exit(invoke("log", "archive", "--store", other_store, "--until", "40", "--out", other), 0)
    result = invoke("replay", live, "--verify", "-q", "--archive", other)
    clean_exit(result, TAMPERED)
    assert text in flat(result.stdout)


def test_the_writer_goes_on_after_everything_was_pruned(store: str, tmp_path: Path, public: Path) -> None:
    """A projector restarted on a store whose every envelope was archived chains on from the last
    checkpoint: the next archive and the live log still make one chain with the first."""
    from shared.history.writer import ProjectionWriter
    from shared.kernel.events import ObjectChanged, wrap

    first = tmp_path / "first.jsonl"
    clean_exit(invoke("log", "archive", "--store", store, "--until", "1e9", "--out", first, "--prune"), 0)
    late = [wrap(ObjectChanged(change="Added", kind="ConfigMap", namespace="ns", name=f"late-{i}", object={}),
                 source="ingest", cause=None, index=i, at=400.0 + i) for i in range(3)]
    with ProjectionWriter(store, signer=SIGNER, checkpoint_every=2) as writer:
        writer.write(late)
        writer.seal()
    live = tmp_path / "live.jsonl"
    clean_exit(invoke("log", "export", "--store", store, "--out", live), 0)
    assert b'"at":[0,141]' in live.read_bytes()  # the chain's next offset, not 0
    from shared.audit.integrity import check
    from shared.audit.logfile import LogFile

    ends = check(LogFile(first), [SIGNER.public], sealed=False).ends
    verdict = check(LogFile(live), [SIGNER.public], after=ends)
    assert verdict.envelopes == 3 and verdict.authentic


def test_nothing_a_checkpoint_covers_before_t_is_one_line(store: str, tmp_path: Path) -> None:
    one_line_error(invoke("log", "archive", "--store", store, "--until", "0", "--out", tmp_path / "a.jsonl"), 2,
                   "no signed checkpoint covers envelopes at or before 0")
    assert not (tmp_path / "a.jsonl").exists()


def test_a_second_archive_goes_on_from_the_first(store: str, tmp_path: Path, public: Path) -> None:
    first, _ = _archived(store, tmp_path, until="40")
    second = tmp_path / "second.jsonl"
    clean_exit(invoke("log", "archive", "--store", store, "--until", "200", "--out", second, "--prune"), 0)
    from shared.audit.integrity import check
    from shared.audit.logfile import LogFile

    ends = check(LogFile(first), [SIGNER.public], sealed=False).ends
    ends = check(LogFile(second), [SIGNER.public], sealed=False, after=ends).ends
    live = tmp_path / "live2.jsonl"
    clean_exit(invoke("log", "export", "--store", store, "--out", live), 0)
    assert check(LogFile(live), [SIGNER.public], after=ends).authentic
