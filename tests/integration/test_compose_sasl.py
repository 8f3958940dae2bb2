"""docker-compose.sasl.yml's Kafka settings on a real Apache Kafka broker (the jars ``make tools`` fetched):
muster's client with the override's settings creates, writes and reads a topic; a client without them,
or with another password, is refused (docs/operations.md, Exposure).

The broker's environment is turned into ``server.properties`` as the apache/kafka image does
(``KAFKA_LISTENER_NAME_INTERNAL_PLAIN_SASL_JAAS_CONFIG`` -> ``listener.name.internal.plain.sasl.jaas.config``),
with compose's host names and ports replaced by free loopback ports.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from shared.parts.kafka import KafkaBroker
from shared.parts.process import free_port
from shared.runtime.bus.config import BusConfig

ROOT = Path(__file__).resolve().parents[2]
OVERRIDE = yaml.safe_load((ROOT / "docker-compose.sasl.yml").read_text())
PASSWORD = "s3cret-for-the-test"


def _broker_settings(internal: int, host: int, controller: int) -> dict[str, str]:
    env = {k: str(v) for k, v in OVERRIDE["services"]["kafka"]["environment"].items() if k.startswith("KAFKA_")}
    out = {name.removeprefix("KAFKA_").lower().replace("_", "."): value.replace("${MUSTER_KAFKA_PASSWORD}", PASSWORD)
           for name, value in env.items()}
    ports = {":9092": f"127.0.0.1:{internal}", ":9094": f"127.0.0.1:{host}", ":9093": f"127.0.0.1:{controller}"}
    for key in ("listeners", "advertised.listeners"):
        out[key] = re.sub(r"(kafka|localhost)?:(9092|9093|9094)", lambda m: ports[":" + m.group(2)], out[key])
    return out


class _SaslBroker(KafkaBroker):
    """The real broker, asked whether it serves with the SASL login (its only listeners ask for one)."""

    def __init__(self, root: Path) -> None:
        internal, host = free_port(), free_port()
        super().__init__(root, port=internal)
        self.host_port = host
        self.settings = _broker_settings(internal, host, self.controller_port)

    def _answers(self) -> bool:
        try:
            asyncio.run(_topics(_client(self.bootstrap, PASSWORD), timeout=3.0))
        except Exception:  # noqa: BLE001 - not up yet
            return False
        return True


def _client(bootstrap: str, password: str | None) -> BusConfig:
    env = {"MUSTER_KAFKA": bootstrap}
    if password is not None:  # the override's client settings, with the password it asks for
        env |= {k: str(v) for k, v in OVERRIDE["services"]["admission"]["environment"].items()}
        env["MUSTER_KAFKA_SASL_PASSWORD"] = password
    return BusConfig.from_env(env=env)


async def _topics(config: BusConfig, timeout: float = 10.0) -> set[str]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**config.aiokafka(), request_timeout_ms=int(timeout * 1000))
    try:
        await asyncio.wait_for(admin.start(), timeout)
        return set(await asyncio.wait_for(admin.list_topics(), timeout))
    finally:
        await admin.close()


async def _round_trip(config: BusConfig) -> bytes:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    producer = AIOKafkaProducer(**config.aiokafka())
    await producer.start()
    try:
        await producer.send_and_wait("muster.sasl-check", b"hello")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer("muster.sasl-check", auto_offset_reset="earliest", **config.aiokafka())
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), 30)
        return bytes(record.value)
    finally:
        await consumer.stop()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_SaslBroker]:
    from shared.parts.catalog import MissingPart
    from shared.parts.process import PartFailed

    try:
        started = _SaslBroker(tmp_path_factory.mktemp("kafka-sasl")).start()
    except (MissingPart, PartFailed) as exc:
        pytest.skip(f"no Kafka part: {exc}")
    try:
        yield started
    finally:
        started.stop()


def test_muster_logs_in_with_the_override_settings_on_both_listeners(broker: _SaslBroker) -> None:
    assert asyncio.run(_round_trip(_client(broker.bootstrap, PASSWORD))) == b"hello"
    assert "muster.sasl-check" in asyncio.run(_topics(_client(f"127.0.0.1:{broker.host_port}", PASSWORD)))


@pytest.mark.parametrize("password", [None, "wrong"], ids=["no login", "wrong password"])
def test_a_client_without_the_password_is_refused(broker: _SaslBroker, password: Any) -> None:
    with pytest.raises(Exception):  # noqa: B017 - aiokafka's errors differ by where the refusal lands
        asyncio.run(_topics(_client(broker.bootstrap, password), timeout=5.0))
