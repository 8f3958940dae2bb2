"""shared/runtime/bus/snapshotkey.py and how a keeper uses it: only records signed with the services'
key are read, whatever else a writer of the snapshot topic puts there."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from shared.kernel.policy import Policy
from shared.runtime.bus.config import BusConfig, BusConfigError
from shared.runtime.bus.snapshot import KIND, SnapshotError, SnapshotKeeper
from shared.runtime.bus.snapshotkey import MAC_HEADER, MIN_KEY_BYTES, SnapshotKeyError, read_key, run_key

KEY = b"k" * MIN_KEY_BYTES


def _keeper(service: str = "admission", key: bytes = KEY, prefix: str = "muster.") -> SnapshotKeeper:
    return SnapshotKeeper(BusConfig("127.0.0.1:1", prefix=prefix), service, Policy(), key=key)


def _record(value: bytes, headers: list[tuple[str, bytes]]) -> Any:
    return SimpleNamespace(value=value, headers=headers, offset=9)


BODY = b'{"offset": 12, "digest": "00", "manifest": 3}'


def test_a_signed_record_opens_and_chunks_carry_no_mac():
    keeper = _keeper()
    for kind in ("manifest", "checkpoint"):
        assert keeper._opened(_record(BODY, keeper._headers(kind, BODY)), kind) == BODY
    assert [name for name, _ in keeper._headers("chunk", b"state")] == [KIND]  # the signed manifest holds its hash


def _tampered(keeper: SnapshotKeeper) -> dict[str, Any]:
    signed = keeper._headers("manifest", BODY)
    return {
        "an edited value": _record(BODY.replace(b"12", b"13"), signed),
        "no MAC": _record(BODY, [(KIND, b"manifest")]),
        "another key's MAC": _record(BODY, _keeper(key=b"x" * MIN_KEY_BYTES)._headers("manifest", BODY)),
        "a checkpoint's MAC on a manifest": _record(BODY, keeper._headers("checkpoint", BODY)),
        "another service's record": _record(BODY, _keeper("queue")._headers("manifest", BODY)),
        "another prefix's record": _record(BODY, _keeper(prefix="other.")._headers("manifest", BODY)),
        "a MAC cut short": _record(BODY, [(KIND, b"manifest"), (MAC_HEADER, dict(signed)[MAC_HEADER][:16])]),
    }


@pytest.mark.parametrize("case", list(_tampered(_keeper())))
def test_anything_not_signed_with_the_key_is_refused_before_it_is_read(case):
    keeper = _keeper()
    with pytest.raises(SnapshotError, match="is not signed") as raised:
        keeper._opened(_tampered(keeper)[case], "manifest")
    assert "\n" not in str(raised.value)


def test_a_keeper_signs_with_the_key_file_else_with_the_process_key(tmp_path: Path):
    path = tmp_path / "key"
    path.write_bytes(b"ab" * 32 + b"\n")  # as `openssl rand -hex 32 > key` writes it
    config = BusConfig("127.0.0.1:1", snapshot_key_file=str(path))
    assert SnapshotKeeper(config, "queue", Policy()).key == b"ab" * 32
    assert SnapshotKeeper(BusConfig("127.0.0.1:1"), "queue", Policy()).key == run_key() == run_key()
    assert len(run_key()) == MIN_KEY_BYTES


def test_the_key_file_is_taken_from_the_environment_checked_and_passed_on(tmp_path: Path):
    path = tmp_path / "key"
    path.write_bytes(KEY)
    config = BusConfig.from_env("k:9092", env={"MUSTER_SNAPSHOT_KEY_FILE": str(path)})
    assert config.snapshot_key_file == str(path)
    assert config.env()["MUSTER_SNAPSHOT_KEY_FILE"] == str(path)  # services started as processes sign alike
    assert BusConfig.from_env("k:9092", env={}).snapshot_key_file is None
    assert "MUSTER_SNAPSHOT_KEY_FILE" not in BusConfig.from_env("k:9092", env={}).env()


@pytest.mark.parametrize("content, said", [(None, "cannot read it"), (b"short\n", "5 bytes, a key needs at least 32")])
def test_a_key_file_that_cannot_serve_is_one_line(tmp_path: Path, content: bytes | None, said: str):
    path = tmp_path / "key"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SnapshotKeyError, match=said):
        read_key(path)
    with pytest.raises(BusConfigError, match=f"MUSTER_SNAPSHOT_KEY_FILE '{path}': .*{said}"):
        BusConfig.from_env("k:9092", env={"MUSTER_SNAPSHOT_KEY_FILE": str(path)})
