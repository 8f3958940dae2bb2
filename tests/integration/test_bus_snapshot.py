"""A service restarts from its latest snapshot and replays only the tail (issue 14 §2), on Tansu.

- a snapshot is written with the inbox offset it reflects; a restart loads it, replays only the
  records after it (counted, not timed), checks that the replay reproduced the outputs recorded
  at the latest checkpoint — the digest it reaches is that of every output admission wrote to the
  log before it stopped, read back from the log — and decides the next event exactly as a service
  that never stopped; it takes its inbox without joining the group (no member while it reads) and
  resumes at the offset it committed without one;
- a snapshot of another format, a corrupted one, or one whose tail replay does not reproduce the
  recorded outputs is not used: the service replays its whole inbox and says so (log, counter);
- so is a forged one (unsigned, or signed with another key) and a deeply nested one, which used to
  raise RecursionError past the fallback (the service crash-looped);
- an inbox whose first records were deleted (Kafka's DeleteRecords) is started from the snapshot
  after them; deleted past the snapshot, or with no usable snapshot, ``muster run`` refuses in one line.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from functools import reduce
from pathlib import Path
from typing import Any, Callable

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from services.admission.core import AdmissionCore
from shared.kernel.events import Envelope
from shared.kernel.policy import Policy
from shared.runtime.bus import codec
from shared.runtime import statecodec
from shared.runtime.bus.app import TopicUnfit, ensure_topics, ready_to_read, service_app
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.snapshot import GENESIS, KIND, SnapshotKeeper, snapshot_topic
from shared.runtime.bus.snapshotkey import MAC_HEADER, mac
from shared.runtime.bus.worker import chain
from shared.runtime.service import Service
from tests.builders import ray_cluster
from tests.builders.cli import invoke, one_line_error
from tests.integration.test_bus_service import READY_WAIT, envelopes, ingest, read_until, running, send

FIRST, LATER = 20, 5


def _wait(bus: Any, until: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    async def go() -> None:
        while not until():
            await asyncio.sleep(0.05)

    try:
        bus.run(asyncio.wait_for(go(), timeout), timeout=timeout + 5)
    except asyncio.TimeoutError:
        pytest.fail(f"still waiting for {what} after {timeout}s")


def _keeper(config: BusConfig) -> SnapshotKeeper:
    return SnapshotKeeper(config, "admission", Policy(), interval=3600.0)


def _history(config: BusConfig) -> list[Envelope]:
    """FIRST RayClusters created, a snapshot, LATER of them deleted and checkpointed, stopped: the
    inbox holds FIRST + LATER records and the snapshot reflects the first FIRST."""
    inbox = config.topics.inbox("admission")
    first = [ingest(ray_cluster(f"rc-{i}"), i) for i in range(FIRST)]
    later = [ingest(ray_cluster(f"rc-{i}"), 100 + i, change="Deleted") for i in range(LATER)]
    with running(config, lambda: service_app("admission", config, Policy(), snapshots=_keeper(config))) as (app, bus):
        reader = app.muster_reader
        send(config, inbox, *(codec.encode(e) for e in first))
        _wait(bus, lambda: reader.processed == FIRST, "the first records handled")
        bus.run(reader.snapshots.write_once(force=True))
        send(config, inbox, *(codec.encode(e) for e in later))
        total = FIRST + LATER
        _wait(bus, lambda: reader.processed == total and reader.snapshots.keeper._checked == total,
              "the later records handled and checkpointed")
        assert reader.snapshots.keeper.snapshot_offset == FIRST
    return first + later


def _members(config: BusConfig, group: str) -> list[Any]:
    """The members the broker lists for ``group`` (DescribeGroups)."""
    async def go() -> list[Any]:
        admin = AIOKafkaAdminClient(**config.aiokafka())
        await admin.start()
        try:
            (answer,) = await admin.describe_consumer_groups([group])
        finally:
            await admin.close()
        (described,) = answer.to_object()["groups"]
        return list(described["members"])

    return asyncio.run(go())


def _restart(config: BusConfig, then: Envelope) -> tuple[Any, list[Envelope], list[Envelope], bytes]:
    """Start admission again, hand it ``then``: the reader, what it logged for ``then``, what the log
    held before (its envelopes from admission), and the output digest it had when it was ready."""
    with running(config, lambda: service_app("admission", config, Policy(), snapshots=_keeper(config))) as (app, bus):
        bus.run(asyncio.wait_for(app.muster_reader.ready.wait(), READY_WAIT))
        # it took its inbox without a group join (a join cost seconds per start): the group has no
        # member while it reads, yet its committed offset is where this start resumed
        assert _members(config, app.muster_reader.group) == []
        assert app.muster_reader.resumed
        digest = app.muster_worker.digest
        send(config, config.topics.inbox("admission"), codec.encode(then))
        log = envelopes(read_until(config, config.topics.log, lambda rs: any(
            codec.decode(r.value, r.headers).causation_id == then.id for r in rs)))
        before = [e for e in log if e.source == "admission" and e.causation_id != then.id
                  and e.type != "PolicyApplied"]  # what it decided; the policy it decided with is no output
        return app.muster_reader, [e for e in log if e.causation_id == then.id], before, digest


def _expected(inputs: list[Envelope], then: Envelope) -> list[Envelope]:
    """What a service that never stopped logs for ``then``."""
    service = Service(AdmissionCore(Policy()))
    for env in inputs:
        service.handle(env)
    return service.handle(then)


@pytest.mark.parametrize("fork", ["1", "0"], ids=["forked capture", "in-process capture"])
def test_a_restart_loads_the_snapshot_and_replays_only_the_tail(kafka_bootstrap: str, topic_prefix: str, fork: str,
                                                                caplog: pytest.LogCaptureFixture,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUSTER_SNAPSHOT_FORK", fork)
    caplog.set_level(logging.INFO, logger="muster.bus")
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    inputs = _history(config)
    then = ingest(ray_cluster("rc-12"), 500, change="Deleted")
    with caplog.at_level(logging.INFO, logger="muster.bus"):
        reader, outputs, before, digest = _restart(config, then)
    snapshots = reader.snapshots
    assert snapshots.loaded_at == FIRST
    assert reader.worker.replayed == snapshots.tail == LATER  # the tail only, not all FIRST + LATER
    assert snapshots.keeper.fallbacks == 0
    assert "snapshot verified" in caplog.text
    said = "forked in" if fork == "1" else "captured while the inbox waited"
    assert said in caplog.text  # the snapshot the restart loaded was captured that way
    # the restarted service reproduced, output for output, what the log holds from before the stop
    assert len(before) >= FIRST + LATER
    assert digest == reduce(chain, (codec.encode(e) for e in before), GENESIS)
    assert [(e.id, e.payload) for e in outputs] == [(e.id, e.payload) for e in _expected(inputs, then)]
    assert [e.type for e in outputs] == ["WorkloadDeleted"]


async def _append(config: BusConfig, value: bytes, kind: str, *, key: bytes | None = None) -> int:
    """Write a record to admission's snapshot topic as someone with write access would: unsigned, or
    signed with ``key``; its offset."""
    topic = snapshot_topic(config.prefix, "admission")
    headers = [(KIND, kind.encode())]
    if key is not None:
        headers.append((MAC_HEADER, mac(key, kind, topic, value)))
    producer = AIOKafkaProducer(**config.aiokafka())
    await producer.start()
    try:
        sent = await producer.send_and_wait(topic, value, key=b"admission", partition=0, headers=headers)
    finally:
        await producer.stop()
    return int(sent.offset)


def _latest_manifest(config: BusConfig) -> tuple[int, dict[str, Any]]:
    """The offset and body of admission's latest manifest, once its last checkpoint is written."""
    records = read_until(config, snapshot_topic(config.prefix, "admission"),
                         lambda rs: any(dict(r.headers).get(KIND) == b"checkpoint" and
                                        json.loads(r.value)["offset"] == FIRST + LATER for r in rs))
    return [(r.offset, json.loads(r.value)) for r in records if dict(r.headers).get(KIND) == b"manifest"][-1]


def _nested(depth: int) -> bytes:
    inner = "[" * depth + "]" * depth
    return ('{"format":%d,"shapes":[],"root":["d",0,["service",%s]]}' % (statecodec.FORMAT, inner)).encode()


def _forge(config: BusConfig, blob: bytes, key: bytes | None) -> None:
    """A state of the forger's choosing under a manifest whose checksum matches it."""
    _, manifest = _latest_manifest(config)
    chunk = asyncio.run(_append(config, blob, "chunk"))
    body = {**manifest, "sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob), "chunks": [chunk]}
    asyncio.run(_append(config, json.dumps(body).encode(), "manifest", key=key))


@pytest.mark.parametrize("forgery, said", [
    ("unsigned", "is not signed (written by an older muster"),
    ("signed with another key", "is not signed with this service's key"),
    ("nested 100,000 deep, signed with the key", "nested too deeply"),
])
def test_a_forged_or_deeply_nested_snapshot_is_refused_and_the_service_replays_its_inbox(
        kafka_bootstrap: str, topic_prefix: str, forgery: str, said: str, caplog: pytest.LogCaptureFixture) -> None:
    """Whoever can write the snapshot topic cannot have the service load a state they chose: the
    forged manifest (its checksum right, its MAC not) is refused; a state that would once have raised
    RecursionError past the fallback (the service crash-looped) is refused as well. Either way the
    service starts by a full replay and says why, and decides as one that never stopped."""
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    inputs = _history(config)
    other = _keeper(config)
    state = _nested(100_000) if forgery.startswith("nested") else b'{"format":1,"shapes":[],"root":null}'
    _forge(config, state, {"unsigned": None, "signed with another key": os.urandom(32)}.get(forgery, other.key))
    then = ingest(ray_cluster("rc-12"), 500, change="Deleted")
    with caplog.at_level(logging.INFO, logger="muster.bus"):
        reader, outputs, _, _ = _restart(config, then)
    keeper = reader.snapshots.keeper
    assert keeper.fallbacks == 1 and said in (keeper.fallback_reason or "")
    assert reader.snapshots.loaded_at is None and reader.worker.replayed == FIRST + LATER
    (line,) = [r.getMessage() for r in caplog.records if "snapshot not used" in r.getMessage()]
    assert said in line and "\n" not in line
    assert [(e.id, e.payload) for e in outputs] == [(e.id, e.payload) for e in _expected(inputs, then)]


# --------------------------------------------------------------------------- an inbox whose first records are gone
def _delete_records(config: BusConfig, topic: str, before: int) -> None:
    """Kafka's DeleteRecords, as retention or an operator freeing space does: the partition starts at ``before``."""
    async def go() -> None:
        admin = AIOKafkaAdminClient(**config.aiokafka())
        await admin.start()
        try:
            tp = TopicPartition(topic, 0)
            answer = await admin.delete_records({tp: RecordsToDelete(before)})
            assert answer[tp] == before, answer
        finally:
            await admin.close()

    asyncio.run(go())


def test_a_service_whose_inbox_lost_its_first_records_starts_from_its_snapshot(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    """The records before the snapshot deleted: ``muster run``'s check lets the service start, and it
    loads the snapshot, folds the tail and decides as one that never stopped. Records deleted past
    the snapshot, or a snapshot that is not usable, and ``muster run`` refuses in one line."""
    key = tmp_path / "snapshot.key"
    key.write_text(os.urandom(32).hex() + "\n")
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix, snapshot_key_file=str(key))
    inputs = _history(config)  # a snapshot at FIRST, a checkpoint at FIRST + LATER
    inbox, group = config.topics.inbox("admission"), f"{topic_prefix}admission"
    _, manifest = _latest_manifest(config)
    assert manifest["offset"] == FIRST
    _delete_records(config, inbox, FIRST)

    # without a snapshot to start from (as `muster run` without a key file), the gap is refused
    with pytest.raises(TopicUnfit, match=f"records 0 to {FIRST - 1} were deleted .* and no usable snapshot covers "
                                         r"them \(snapshots are off: no MUSTER_SNAPSHOT_KEY_FILE\)"):
        asyncio.run(ready_to_read(config, inbox, "the admission service", group=group, replays=True))
    asyncio.run(ready_to_read(config, inbox, "the admission service", group=group, replays=True,
                              snapshots=_keeper(config)))  # the snapshot covers the gap: no refusal
    then = ingest(ray_cluster("rc-12"), 500, change="Deleted")
    reader, outputs, _, _ = _restart(config, then)
    assert reader.snapshots.loaded_at == FIRST and reader.snapshots.keeper.fallbacks == 0
    assert reader.worker.replayed == reader.snapshots.tail == LATER
    assert [(e.id, e.payload) for e in outputs] == [(e.id, e.payload) for e in _expected(inputs, then)]

    # the latest manifest forged (that of the snapshot at FIRST, unsigned: the restart may have written
    # a later one since): no usable snapshot covers the gap, said in one line
    asyncio.run(_append(config, json.dumps(manifest).encode(), "manifest"))
    cli = ("run", "admission", "--kafka", kafka_bootstrap, "--topic-prefix", topic_prefix, "--metrics-port", "0")
    result = invoke(*cli, env={"MUSTER_SNAPSHOT_KEY_FILE": str(key)})
    one_line_error(result, 2, f"not starting: {inbox} starts at offset {FIRST} but the admission service needs its "
                              f"records from offset 0: records 0 to {FIRST - 1} were deleted (retention or "
                              "delete-records) and no usable snapshot covers them (snapshot manifest at offset")
    assert "is not signed" in result.stderr

    # records deleted past the snapshot at FIRST, the latest again (signed): the tail it needs is gone
    asyncio.run(_append(config, json.dumps(manifest).encode(), "manifest", key=_keeper(config).key))
    _delete_records(config, inbox, FIRST + 2)
    result = invoke(*cli, env={"MUSTER_SNAPSHOT_KEY_FILE": str(key)})
    one_line_error(result, 2, f"not starting: {inbox} starts at offset {FIRST + 2} but the admission service needs "
                              f"its records from offset {FIRST}: records {FIRST} to {FIRST + 1} were deleted")


def _bad_version(manifest: dict[str, Any]) -> dict[str, Any]:
    return {**manifest, "format": manifest["format"] + 1}


def _bad_checksum(manifest: dict[str, Any]) -> dict[str, Any]:
    return {**manifest, "sha256": "0" * 64}


@pytest.mark.parametrize("spoil", [_bad_version, _bad_checksum, "wrong outputs"])
def test_an_unusable_snapshot_falls_back_to_a_full_replay(kafka_bootstrap: str, topic_prefix: str, spoil: Any,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    inputs = _history(config)
    at, manifest = _latest_manifest(config)
    key = _keeper(config).key  # signed as the service signs: these are the checks past the signature
    if spoil == "wrong outputs":  # the snapshot loads, but its tail replay must reproduce this digest
        body = {"offset": FIRST + LATER, "digest": "ab" * 16, "manifest": at}
        asyncio.run(_append(config, json.dumps(body).encode(), "checkpoint", key=key))
    else:
        asyncio.run(_append(config, json.dumps(spoil(manifest)).encode(), "manifest", key=key))
    then = ingest(ray_cluster("rc-12"), 500, change="Deleted")
    with caplog.at_level(logging.INFO, logger="muster.bus"):
        reader, outputs, _, _ = _restart(config, then)
    assert reader.snapshots.keeper.fallbacks == 1
    assert reader.snapshots.loaded_at is None
    assert reader.worker.replayed == FIRST + LATER  # the whole inbox
    assert "snapshot not used" in caplog.text
    assert [(e.id, e.payload) for e in outputs] == [(e.id, e.payload) for e in _expected(inputs, then)]


SLOW_CHILD = """
import time
import shared.runtime.bus.snapshot as snapshot
from shared.cli.main import main

def encoding_for_minutes(worker):  # what the forked child runs: it is still encoding when SIGTERM comes
    time.sleep(300)
    return b""

snapshot.capture = encoding_for_minutes
main()
"""


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``, zombies included (their /proc entry stays until reaped)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not hasattr(os, "fork") or not Path("/proc/self/stat").exists(), reason="forks; reads /proc")
def test_the_inbox_goes_on_while_a_child_encodes_and_sigterm_takes_the_child_along(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    """``muster run admission`` as operators run it: its snapshot's child encodes (here: for minutes),
    the inbox goes on meanwhile, and SIGTERM stops the service with its child killed and reaped."""
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    asyncio.run(ensure_topics(config))
    inbox = config.topics.inbox("admission")
    out = (tmp_path / "admission.log").open("wb")
    key = tmp_path / "snapshot.key"
    key.write_bytes(os.urandom(32).hex().encode())
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CHILD, "run", "admission", "--metrics-port", "0"],
                            env={**os.environ, **config.env(), "MUSTER_SNAPSHOT_FORK": "1",
                                 "MUSTER_SNAPSHOT_KEY_FILE": str(key)}, stdout=out,
                            stderr=subprocess.STDOUT, cwd=Path(__file__).parents[2])
    try:
        first = ingest(ray_cluster("rc-1"), 1)
        send(config, inbox, codec.encode(first))  # once it is handled a snapshot is due: the child forks
        deadline = time.monotonic() + 60
        while not (children := _children(proc.pid)):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "admission.log").read_text()
            time.sleep(0.05)
        (child,) = children
        later = ingest(ray_cluster("rc-2"), 2)
        send(config, inbox, codec.encode(later))  # handled while the child is still encoding
        read_until(config, config.topics.log, lambda rs: any(
            codec.decode(r.value, r.headers).causation_id == later.id for r in rs))
        assert _children(proc.pid) == [child]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, (tmp_path / "admission.log").read_text()
        assert not Path(f"/proc/{child}").exists()  # killed and reaped: no orphan encoding on, no zombie
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
