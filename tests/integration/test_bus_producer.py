"""``shared.runtime.bus.app.send_records``: a call's records as one batch per partition, on a real broker.

Every muster producer sends through it (services, projector, cluster bridge), and the worker relies
on what it returns: each record's offset, in the order given, once the broker has them all.
"""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from shared.runtime.bus.app import ensure_topics, send_records
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.worker import Record


def _records(config: BusConfig, n: int) -> list[Record]:
    """``n`` records alternating between the log and an inbox, with keys, headers and sizes that vary."""
    topics = config.topics
    return [Record(topics.log if i % 2 == 0 else topics.inbox("queue"), f"k{i % 3}".encode(),
                   f"{i}:".encode() + b"x" * (i * 37 % 700), [("muster-type", b"T"), ("n", str(i).encode())])
            for i in range(n)]


async def _read(config: BusConfig, topic: str, count: int) -> list:
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(**config.aiokafka(), enable_auto_commit=False, fetch_max_wait_ms=5,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        records: list = []
        deadline = time.monotonic() + 30
        while len(records) < count:
            assert time.monotonic() < deadline, f"{topic}: {len(records)} of {count} records"
            records.extend((await consumer.getmany(tp, timeout_ms=200)).get(tp, ()))
        return records
    finally:
        await consumer.stop()


def _send_and_read(config: BusConfig, records: list[Record], **producer_options) -> tuple[list[int], dict]:
    async def go() -> tuple[list[int], dict]:
        await ensure_topics(config)
        producer = AIOKafkaProducer(**config.aiokafka(), enable_idempotence=False, **producer_options)
        await producer.start()
        try:
            offsets = await send_records(producer, records)
        finally:
            await producer.stop()
        by_topic = {topic: await _read(config, topic, sum(r.topic == topic for r in records))
                    for topic in {r.topic for r in records}}
        return offsets, by_topic

    return asyncio.run(go())


def _check(records: list[Record], offsets: list[int], by_topic: dict) -> None:
    for topic, read in by_topic.items():
        sent = [(r, o) for r, o in zip(records, offsets) if r.topic == topic]
        # in the order given, at the offsets reported, nothing lost, nothing added
        assert [m.offset for m in read] == [o for _, o in sent] == list(range(len(sent)))
        assert [(m.key, m.value, list(m.headers)) for m in read] == [(r.key, r.value, r.headers) for r, _ in sent]


def test_records_arrive_in_order_at_the_offsets_returned(kafka_bootstrap: str, topic_prefix: str) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    records = _records(config, 300)
    _check(records, *_send_and_read(config, records, max_batch_size=1_000_000))


def test_a_call_larger_than_one_batch_goes_out_in_several(kafka_bootstrap: str, topic_prefix: str) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    records = _records(config, 300)
    _check(records, *_send_and_read(config, records, max_batch_size=2_000))  # a few records per batch


def test_nothing_to_send_sends_nothing() -> None:
    assert asyncio.run(send_records(None, [])) == []  # type: ignore[arg-type]


def test_a_keyed_record_lands_in_the_partition_aiokafka_send_would_choose(kafka_bootstrap: str,
                                                                         topic_prefix: str) -> None:
    """Muster's topics have one partition; one made with more (by an operator, say) still keeps
    each key in one partition, the one any Kafka client's default partitioner picks."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    ours, theirs = f"{topic_prefix}wide", f"{topic_prefix}wide-send"
    keys = [f"Pod/ns/p{i}".encode() for i in range(40)]

    async def go() -> tuple[dict[bytes, int], dict[bytes, int]]:
        admin = AIOKafkaAdminClient(**config.aiokafka())
        await admin.start()
        try:
            await admin.create_topics([NewTopic(ours, 4, 1), NewTopic(theirs, 4, 1)])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(**config.aiokafka(), enable_idempotence=False)
        await producer.start()
        try:
            await send_records(producer, [Record(ours, k, b"v", []) for k in keys])
            sent = {k: (await (await producer.send(theirs, b"v", key=k))).partition for k in keys}
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(**config.aiokafka(), enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        try:
            tps = [TopicPartition(ours, p) for p in range(4)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            landed: dict[bytes, int] = {}
            deadline = time.monotonic() + 30
            while len(landed) < len(keys):
                assert time.monotonic() < deadline, f"{len(landed)} of {len(keys)} records"
                for tp, got in (await consumer.getmany(timeout_ms=200)).items():
                    landed.update({m.key: tp.partition for m in got})
        finally:
            await consumer.stop()
        return landed, sent

    landed, sent = asyncio.run(go())
    assert landed == sent
    assert len(set(landed.values())) > 1  # the keys did spread over the partitions
