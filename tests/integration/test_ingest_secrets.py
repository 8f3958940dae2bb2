"""What muster keeps of a workload: a secret in every place a manifest can hold one never reaches a
topic or the history store.

The cluster link watches the API emulator (real HTTP) and publishes into real Kafka; the four services
and the projector run on it and the projector writes the real Postgres store. The test then reads every
record of every topic, and every row of every table, as bytes and text, and looks for the secret."""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from sqlalchemy import text

from shared import kube as k
from shared.bus.config import BusConfig
from shared.bus.driver import EventLoopThread, gather_all, wait_for_projector
from shared.bus.projector import projector_app
from shared.store.engine import connect
from shared.store.models import TABLE_NAMES
from tests.builders.secrets import SECRET, secret_node, secret_pod, secret_rayjob
from tests.integration.test_bus_service import envelopes
from tests.integration.test_cluster_bridge import QUEUE, eventually, stack
from tests.kubeapi import KubeApiEmulator


@pytest.fixture
def kube() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator() as emulator:
        yield emulator


def every_record(config: BusConfig, topic: str) -> list[Any]:
    """All records of ``topic`` up to its end now."""
    async def go() -> list[Any]:
        tp = TopicPartition(topic, 0)
        consumer = AIOKafkaConsumer(**config.aiokafka(), fetch_max_wait_ms=5, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.end_offsets([tp]))[tp]
            records: list[Any] = []
            while await consumer.position(tp) < end:
                batch = await consumer.getmany(tp, timeout_ms=500)
                records.extend(batch.get(tp, []))
            return records
        finally:
            await consumer.stop()

    return asyncio.run(go())


def _bytes(record: Any) -> bytes:
    return b"".join([record.key or b"", record.value or b"", *(v or b"" for _, v in record.headers or ())])


def test_no_secret_of_a_manifest_reaches_kafka_or_the_store(
        kafka_bootstrap: str, topic_prefix: str, kube: KubeApiEmulator, pg_store: str) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    queue = {**QUEUE, "metadata": {"name": "research", "annotations": {
        "kubectl.kubernetes.io/last-applied-configuration": SECRET}}}
    kube.create(secret_node("n1"))
    kube.create(queue)
    with stack(config, kube.url):
        projector = projector_app(config, pg_store, within=0.05)
        loop = EventLoopThread()  # the projector beside the stack, as ``muster run projector`` runs it
        try:
            loop.run(projector.start(), timeout=90)
            kube.create(secret_rayjob("job", "team-a", queue="research"))
            kube.create(secret_pod("job-head-x1", **{k.RAY_ORIGIN_KIND: "RayJob", k.RAY_ORIGIN_NAME: "job",
                                                    k.RAY_NODE_TYPE: "head", k.RAY_GROUP: "headgroup"}))

            def decided() -> bool:
                log = envelopes(every_record(config, config.topics.log))
                return any(e.type == "WorkloadSubmitted" for e in log) and \
                    any(e.type == "ObjectChanged" and e.payload.kind == "Pod" for e in log)

            eventually(decided, "admission to submit the RayJob and the pod to be published")
            end = len(every_record(config, config.topics.log))
            asyncio.run(wait_for_projector(config, pg_store, end, timeout=60))
        finally:
            loop.run(gather_all([projector.stop()]), timeout=60)
            loop.close()

    published = 0
    for topic in config.topics.partitions():
        for record in every_record(config, topic):
            assert SECRET.encode() not in _bytes(record), f"{topic} offset {record.offset} holds the secret"
            published += 1
    log = envelopes(every_record(config, config.topics.log))
    job = next(e.payload.object for e in log if e.type == "ObjectChanged" and e.payload.kind == "RayJob")
    pod = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert pod["containers"][0]["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}  # what scheduling reads
    assert published > 10

    engine = connect(pg_store)
    rows = 0
    try:
        with engine.connect() as conn:
            for table in sorted(TABLE_NAMES):
                for (row,) in conn.execute(text(f"SELECT CAST(t AS text) FROM {table} AS t")):
                    assert SECRET not in row, f"table {table} holds the secret"
                    rows += 1
            stored = conn.execute(text("SELECT count(*) FROM event_log")).scalar()
    finally:
        engine.dispose()
    assert stored >= end and rows > stored  # the projector wrote at least what was logged when it was waited for
