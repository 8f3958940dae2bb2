"""The driver's side of a round on a real broker: a service that does not answer its ``Release``
is sent it again, and the round completes on the answer to the repeat; one that never answers is
named, with how far it got in its inbox."""

from __future__ import annotations

import asyncio
import re

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from shared.kernel.events import ObjectChanged, wrap
from shared.runtime.bus import codec
from shared.runtime.bus.app import ensure_topics
from shared.runtime.bus.codec import Finished, Release
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.driver import AioProducer, DriverError, RoundKeeper
from shared.runtime.bus.worker import Record


def test_a_silent_service_is_sent_its_release_again(kafka_bootstrap: str, topic_prefix: str) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    topics = config.topics
    env = wrap(ObjectChanged(change="Added", kind="Node", name="n1", object={"kind": "Node"}),
               source="ingest", cause=None, index=0, at=1.0)

    async def deaf_then_answering_service() -> list[Release]:
        """Reads the placement inbox; ignores the first release, answers the second."""
        tp = TopicPartition(topics.inbox("placement"), 0)
        consumer = AIOKafkaConsumer(**config.aiokafka(), fetch_max_wait_ms=5, enable_auto_commit=False)
        producer = AioProducer(config)
        await consumer.start()
        await producer.start()
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        releases: list[Release] = []
        try:
            while len(releases) < 2:
                for message in (await consumer.getmany(tp, timeout_ms=200)).get(tp, ()):
                    item = codec.decode(message.value, message.headers)
                    if isinstance(item, Release):
                        releases.append(item)
            body, headers = codec.encode_control(Finished(releases[1].round, "placement", -1))
            await producer.send_all([Record(topics.control, b"placement", body, headers)])
            return releases
        finally:
            await consumer.stop()
            await producer.stop()

    async def scenario() -> tuple[list[Release], dict, int]:
        await ensure_topics(config)
        keeper = RoundKeeper(config, round_timeout=30, nudge=0.5)
        await keeper.start()
        try:
            service = asyncio.create_task(deaf_then_answering_service())
            outputs = await keeper.handle([("placement", env)])
            return await service, outputs, keeper.nudged
        finally:
            await keeper.stop()

    releases, outputs, nudged = asyncio.run(scenario())
    assert releases == [Release(1, (env.id,)), Release(1, (env.id,))]
    assert outputs == {} and nudged >= 1


def test_a_service_that_never_answers_is_named_with_how_far_it_got(kafka_bootstrap: str, topic_prefix: str) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    env = wrap(ObjectChanged(change="Added", kind="Node", name="n1", object={"kind": "Node"}),
               source="ingest", cause=None, index=0, at=1.0)

    async def scenario() -> None:
        await ensure_topics(config)
        keeper = RoundKeeper(config, round_timeout=1.5, nudge=0.5)
        await keeper.start()
        try:
            await keeper.handle([("placement", env)])
        finally:
            await keeper.stop()

    with pytest.raises(DriverError) as failed:
        asyncio.run(scenario())
    message = str(failed.value)
    assert message.startswith("round 1: no answer from placement within 1.5s")
    # the envelope and each release (sent, then sent again) are in the inbox; nobody consumed any
    assert re.search(r"release sent [23] times; placement inbox: [34] records, committed up to 0$", message), message
