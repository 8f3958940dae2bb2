"""Durable topics and honest recovery on a real broker (Tansu unless another answers):

- muster creates its topics with their retention, replication and ``min.insync.replicas`` spelled
  out, and the broker reports them so;
- ``muster run`` refuses to start, in one line with exit code 2, on a topic it reads that would lose
  records (made with the broker's defaults), or that has lost some: an inbox emptied under a service's
  committed offset, a log emptied under the projector's stored offset.
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from shared.history.writer import ProjectionWriter
from shared.runtime.bus.app import _topic_configs, ensure_topics, ready_to_read, send_records
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.worker import Record
from tests.builders.cli import invoke, one_line_error


async def _described(config: BusConfig, names: list[str]) -> dict[str, dict[str, str]]:
    admin = AIOKafkaAdminClient(**config.aiokafka())
    await admin.start()
    try:
        return await _topic_configs(admin, names)
    finally:
        await admin.close()


async def _commit(config: BusConfig, group: str, topic: str, offset: int) -> None:
    consumer = AIOKafkaConsumer(**config.aiokafka(), group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.commit({tp: offset})
    finally:
        await consumer.stop()


def test_topics_are_created_with_their_durability_spelled_out(kafka_bootstrap: str, topic_prefix: str) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    topics = config.topics
    created = asyncio.run(ensure_topics(config))
    assert len(created) == 13  # the 12 of before and the log's signed checkpoints
    snapshots = topics.snapshots("queue")
    described = asyncio.run(_described(config, [topics.inbox("queue"), topics.log, topics.control, snapshots]))
    for name in (topics.inbox("queue"), topics.log):
        assert {k: described[name][k] for k in ("retention.ms", "retention.bytes", "cleanup.policy",
                                                "min.insync.replicas")} == {
            "retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete", "min.insync.replicas": "1"}
    assert described[topics.control]["retention.ms"] == "86400000"
    assert described[snapshots]["retention.ms"] == str(7 * 86400000)  # only the latest snapshot is read
    # a service on the inbox it made: nothing to refuse, and a second start creates nothing
    asyncio.run(ready_to_read(config, topics.inbox("queue"), "the queue service", group=f"{topic_prefix}queue",
                              replays=True))
    assert asyncio.run(ensure_topics(config, reads=[topics.inbox("queue")])) == []


def test_a_service_refuses_an_inbox_made_with_the_brokers_default_retention(
        kafka_bootstrap: str, topic_prefix: str) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)

    async def bare() -> None:  # as an older muster (or a hand) made it: no configuration given
        admin = AIOKafkaAdminClient(**config.aiokafka())
        await admin.start()
        try:
            await admin.create_topics([NewTopic(config.topics.inbox("queue"), 1, 1)])
        finally:
            await admin.close()

    asyncio.run(bare())
    result = invoke("run", "queue", "--kafka", kafka_bootstrap, "--topic-prefix", topic_prefix, "--metrics-port", "0")
    one_line_error(result, 2, f"not starting: topic {topic_prefix}queue would lose records the queue service needs")
    assert "retention.ms=-1,retention.bytes=-1" in result.stderr


def test_a_service_refuses_an_inbox_emptied_under_its_committed_offset(kafka_bootstrap: str, topic_prefix: str) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    asyncio.run(ensure_topics(config))
    # the group's offset survived, the records did not (a broker that lost its data, a topic made again)
    asyncio.run(_commit(config, f"{topic_prefix}placement", config.topics.inbox("placement"), 25))
    result = invoke("run", "placement", "--kafka", kafka_bootstrap, "--topic-prefix", topic_prefix,
                    "--metrics-port", "0")
    one_line_error(result, 2, f"not starting: {topic_prefix}placement ends at offset 0 but the placement service "
                              "has handled it up to offset 25: the topic was emptied or made again")


def test_the_projector_refuses_a_log_emptied_under_its_stored_offset(
        kafka_bootstrap: str, topic_prefix: str, pg_store: str) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    asyncio.run(ensure_topics(config))
    with ProjectionWriter(pg_store) as writer:  # the store has read the log up to offset 41
        writer.write([], consumed=[(config.topics.log, 0, 40)])
        assert writer.consumed_offsets(config.topics.log) == {0: 41}
    result = invoke("run", "projector", "--kafka", kafka_bootstrap, "--topic-prefix", topic_prefix,
                    "--store", pg_store, "--metrics-port", "0")
    one_line_error(result, 2, f"not starting: {topic_prefix}events ends at offset 0 but the projector has handled it "
                              "up to offset 41")


def test_a_service_resumes_on_an_inbox_read_to_its_end(kafka_bootstrap: str, topic_prefix: str) -> None:
    """The records up to the committed offset are there: no refusal, even where the broker's latest
    offset trails them (Tansu answers with the last batch's base offset: 1 for a batch of five)."""
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    inbox = config.topics.inbox("queue")
    asyncio.run(ensure_topics(config))

    async def write() -> None:
        producer = AIOKafkaProducer(**config.aiokafka())
        await producer.start()
        try:
            await send_records(producer, [Record(inbox, b"cluster", b"{}", []) for _ in range(5)])  # one batch
        finally:
            await producer.stop()

    asyncio.run(write())
    asyncio.run(_commit(config, f"{topic_prefix}queue", inbox, 5))
    asyncio.run(ready_to_read(config, inbox, "the queue service", group=f"{topic_prefix}queue", replays=True))
