"""What muster keeps of a workload: a secret in every place a manifest can hold one never reaches a
topic or the history store.

The cluster link watches the session's real cluster and publishes into real Kafka; the four services
and the projector run on it and the projector writes the real Postgres store. The user applies a node,
a queue and a RayJob with a secret in every place (``kubectl apply``: the last-applied annotation
holds the whole manifest), and real KubeRay copies them further: into the RayCluster, its pods'
commands (``ray start --redis-password=...``), the submitter. The test then reads every record of
every topic, and every row of every table, as bytes and text, and looks for the secret."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from sqlalchemy import text

from shared.history.engine import connect
from shared.history.models import TABLE_NAMES
from shared.kubernetes.cluster import KubeTarget
from shared.parts.devcluster import DevCluster
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.driver import EventLoopThread, gather_all, wait_for_projector
from shared.runtime.bus.projector import projector_app
from tests.builders.secrets import SECRET, secret_node, secret_rayjob
from tests.integration.test_bus_service import envelopes
from tests.integration.test_cluster_bridge import QUEUE, stack
from shared.parts import kwok
from tests.realcluster.conftest import eventually, get


def applied(obj: dict[str, Any]) -> dict[str, Any]:
    """The manifest as a user writes it: what only the server sets (uid, resourceVersion, managedFields,
    status) left out, every pod naming muster as its scheduler."""
    obj = json.loads(json.dumps(obj))
    for field in ("uid", "resourceVersion", "managedFields"):
        obj["metadata"].pop(field, None)
    obj.pop("status", None)
    spec = obj.get("spec", {})
    cluster = spec.get("rayClusterSpec", {})
    for template in [spec.get("submitterPodTemplate"), cluster.get("headGroupSpec", {}).get("template"),
                     *(g.get("template") for g in cluster.get("workerGroupSpecs", []))]:
        if template:
            template["spec"]["schedulerName"] = "muster"
    return obj


def kwok_node(name: str) -> dict[str, Any]:
    """``secret_node``'s labels, annotation and provider ID on a node KWOK keeps Ready, with a GPU for the
    templates' ``gpu-fraction`` pods."""
    secret = secret_node(name)
    out = kwok.node(name, {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "2"})
    out["metadata"]["labels"] = {**out["metadata"].get("labels", {}), **secret["metadata"]["labels"]}
    out["metadata"]["annotations"] = {**out["metadata"].get("annotations", {}), **secret["metadata"]["annotations"]}
    out["spec"] = {**out.get("spec", {}), "providerID": secret["spec"]["providerID"]}
    return out


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
        clean_cluster: DevCluster, kafka_bootstrap: str, topic_prefix: str, pg_store: str) -> None:
    cluster = clean_cluster
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    queue = {**QUEUE, "metadata": {"name": "research", "annotations": {"team.example.com/token": SECRET}}}
    cluster.kubectl("create", "namespace", "team-a")

    def apply(obj: dict[str, Any]) -> None:  # client-side, as most users do: the last-applied annotation
        cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))

    apply(kwok_node("n1"))
    apply(queue)
    with stack(config, KubeTarget(kubeconfig=str(cluster.kubeconfig))):
        projector = projector_app(config, pg_store, within=0.05)
        loop = EventLoopThread()  # the projector beside the stack, as ``muster run projector`` runs it
        try:
            loop.run(projector.start(), timeout=90)
            apply(applied(secret_rayjob("job", "team-a", queue="research")))

            def decided() -> bool:  # the RayJob submitted, and the pods real KubeRay made bound by muster
                log = envelopes(every_record(config, config.topics.log))
                pods = [p for p in get(cluster, "pods", namespace="team-a")["items"]
                        if p["metadata"].get("labels", {}).get("ray.io/cluster", "").startswith("job-")]
                return any(e.type == "WorkloadSubmitted" for e in log) and \
                    any(e.type == "ObjectChanged" and e.payload.kind == "Pod" for e in log) and \
                    len(pods) == 3 and all(p["spec"].get("nodeName") for p in pods)

            eventually(decided, "admission to submit the RayJob and muster to bind its cluster's pods")
            watched = json.dumps([get(cluster, kind, namespace="team-a") for kind in ("pods", "rayclusters.ray.io")])
            assert watched.count(SECRET) > 10  # what the link watched holds it, in the places KubeRay copied it to
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
