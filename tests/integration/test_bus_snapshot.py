"""A service restarts from its latest snapshot and replays only the tail (issue 14 §2), on Tansu.

- a snapshot is written with the inbox offset it reflects; a restart loads it, replays only the
  records after it (counted, not timed), checks that the replay reproduced the outputs recorded
  at the latest checkpoint — the digest it reaches is that of every output admission wrote to the
  log before it stopped, read back from the log — and decides the next event exactly as a service
  that never stopped; it takes its inbox without joining the group (no member while it reads) and
  resumes at the offset it committed without one;
- a snapshot of another format, a corrupted one, or one whose tail replay does not reproduce the
  recorded outputs is not used: the service replays its whole inbox and says so (log, counter).
"""

from __future__ import annotations

import asyncio
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
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from services.admission.core import AdmissionCore
from shared.kernel.events import Envelope
from shared.kernel.policy import Policy
from shared.runtime.bus import codec
from shared.runtime.bus.app import ensure_topics, service_app
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.snapshot import GENESIS, KIND, SnapshotKeeper, snapshot_topic
from shared.runtime.bus.worker import chain
from shared.runtime.service import Service
from tests.builders import ray_cluster
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


async def _append(config: BusConfig, value: bytes, kind: str) -> None:
    producer = AIOKafkaProducer(**config.aiokafka())
    await producer.start()
    try:
        await producer.send_and_wait(snapshot_topic(config.prefix, "admission"), value, key=b"admission",
                                     partition=0, headers=[(KIND, kind.encode())])
    finally:
        await producer.stop()


def _bad_version(manifest: dict[str, Any]) -> dict[str, Any]:
    return {**manifest, "format": manifest["format"] + 1}


def _bad_checksum(manifest: dict[str, Any]) -> dict[str, Any]:
    return {**manifest, "sha256": "0" * 64}


@pytest.mark.parametrize("spoil", [_bad_version, _bad_checksum, "wrong outputs"])
def test_an_unusable_snapshot_falls_back_to_a_full_replay(kafka_bootstrap: str, topic_prefix: str, spoil: Any,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    inputs = _history(config)
    records = read_until(config, snapshot_topic(config.prefix, "admission"),
                         lambda rs: any(dict(r.headers).get(KIND) == b"checkpoint" and
                                        json.loads(r.value)["offset"] == FIRST + LATER for r in rs))
    manifests = [(r.offset, json.loads(r.value)) for r in records if dict(r.headers).get(KIND) == b"manifest"]
    at, manifest = manifests[-1]
    if spoil == "wrong outputs":  # the snapshot loads, but its tail replay must reproduce this digest
        body = {"offset": FIRST + LATER, "digest": "ab" * 16, "manifest": at}
        asyncio.run(_append(config, json.dumps(body).encode(), "checkpoint"))
    else:
        asyncio.run(_append(config, json.dumps(spoil(manifest)).encode(), "manifest"))
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
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CHILD, "run", "admission", "--metrics-port", "0"],
                            env={**os.environ, **config.env(), "MUSTER_SNAPSHOT_FORK": "1"}, stdout=out,
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
