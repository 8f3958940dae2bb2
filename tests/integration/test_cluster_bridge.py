"""The stack pointed at a cluster: ``muster run cluster`` between a real broker and an API server.

The API server is the emulator in tests/kubeapi.py (real HTTP, kubernetes-asyncio on the other
end); the services run as the deployment runs them (arrival order, wall clock). The test plays
the user and KubeRay: it creates a queue, a node and a suspended RayCluster, waits for muster to
admit it (unsuspend + annotations), creates the pods KubeRay would, and waits for muster to bind
every one of them.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import contextmanager
from typing import Any, Iterator

import pytest

from shared.audit.kafka import KafkaLog
from shared.audit.logfile import envelopes as envelopes_of
from shared.audit.replay import verify
from shared.audit.timeorder import backwards
from shared.kernel import kube as k
from shared.kernel.events import KubeEffect, wrap
from shared.kernel.policy import Policy
from shared.kernel.topology import SERVICES
from shared.kubernetes.app import cluster_app
from shared.kubernetes.cluster import KubeTarget
from shared.runtime.bus import codec
from shared.runtime.bus.app import ensure_topics, service_app
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.driver import EventLoopThread, gather_all
from tests.builders import node, pod, ray_cluster, worker_group
from tests.conftest import eventually
from tests.integration.test_bus_service import envelopes, read_until, send
from tests.kubeapi import KubeApiEmulator

QUEUE = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "research"},
         "spec": {"weight": 1, "capability": {"cpu": "8", "memory": "16Gi"}}}


@contextmanager
def stack(config: BusConfig, url: str | KubeTarget, services: tuple[str, ...] = SERVICES, *,
          cluster: bool = True) -> Iterator[dict[str, Any]]:
    """The services (and, unless ``cluster`` is False, the cluster bridge to ``url``: the emulator's, or
    a real cluster's ``KubeTarget``) as apps in this process."""
    bus = EventLoopThread()
    try:
        bus.run(ensure_topics(config))
        apps = {name: service_app(name, config, Policy()) for name in services}
        if cluster:
            apps["cluster"] = cluster_app(config, url if isinstance(url, KubeTarget) else KubeTarget(url=url))
        bus.run(gather_all(app.start() for app in apps.values()), timeout=90)
        try:
            yield apps
        finally:
            stop_apps(bus, apps)
    finally:
        bus.close()


def stop_apps(bus: EventLoopThread, apps: dict[str, Any], timeout: float = 90.0) -> None:
    """Stop every app; one still stopping after ``timeout`` fails the test naming it and what the loop's
    tasks were waiting on (a stop once hung past 60 s in a full run and never alone: the next one says where)."""
    async def stop() -> None:
        stopping = {name: asyncio.ensure_future(app.stop()) for name, app in apps.items()}
        done, pending = await asyncio.wait(stopping.values(), timeout=timeout)
        if pending:
            stuck = [name for name, task in stopping.items() if task in pending]
            waits = sorted({"; ".join(f"{frame.f_code.co_name} ({frame.f_code.co_filename.rsplit('/', 1)[-1]}:"
                                      f"{frame.f_lineno})" for frame in task.get_stack(limit=4))
                            for task in asyncio.all_tasks() if not task.done()} - {""})
            pytest.fail(f"apps still stopping after {timeout:.0f}s: {', '.join(stuck)}; tasks waiting in: "
                        + " | ".join(waits))
        for task in done:
            task.result()

    bus.run(stop(), timeout=timeout + 30)


def ray_pod(cluster: str, name: str, node_type: str, group: str, cpu: str) -> dict:
    """A pod as KubeRay creates it for a RayCluster (what the test plays KubeRay with): ``labelPod``'s
    labels, the cluster's name among them, never the workload's kind."""
    return pod(name, "team-a", requests={"cpu": cpu, "memory": "1Gi"}, labels={
        k.RAY_CLUSTER: cluster, k.RAY_NODE_TYPE: node_type, k.RAY_GROUP: group})


def changes(records: list[Any]) -> list[Any]:
    """The watch events among ``records`` (each list's ``ObjectsListed`` left aside)."""
    return [e for e in envelopes(records) if e.type == "ObjectChanged"]


@pytest.fixture
def kube() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator() as emulator:
        yield emulator


def test_a_suspended_ray_cluster_is_admitted_and_its_pods_bound_on_the_cluster(
        kafka_bootstrap: str, topic_prefix: str, kube: KubeApiEmulator) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    kube.create(node("n1", cpu="16", memory="64Gi"))
    kube.create(QUEUE)
    with stack(config, kube.url) as apps:
        rc = ray_cluster("rc", "team-a", suspend=True, head={"cpu": "1", "memory": "1Gi"},
                         workers=[worker_group("worker", 2, {"cpu": "2", "memory": "1Gi"})],
                         labels={"ray.io/scheduler-name": "volcano", "volcano.sh/queue-name": "research"})
        kube.create(rc)

        def admitted() -> dict | None:
            live = kube.get("RayCluster", "ray.io/v1", "team-a", "rc")
            return live if live and live["spec"].get("suspend") is False else None

        eventually(admitted, "the RayCluster to be unsuspended")

        def status() -> str:
            live = kube.get("RayCluster", "ray.io/v1", "team-a", "rc") or {}
            return live.get("metadata", {}).get("annotations", {}).get("muster.dev/status", "")

        # the unsuspend and the status annotation are separate requests: the status may come a moment later
        eventually(lambda: status().startswith("Admitted"), "the Admitted status")
        live = kube.get("RayCluster", "ray.io/v1", "team-a", "rc")
        assert live["metadata"]["annotations"]["muster.dev/queue"] == "research"

        # KubeRay's part: the pods of the unsuspended cluster appear, unbound.
        pods = [ray_pod("rc", "rc-head-x1", "head", "headgroup", "1"),
                ray_pod("rc", "rc-worker-worker-y1", "worker", "worker", "2"),
                ray_pod("rc", "rc-worker-worker-y2", "worker", "worker", "2")]
        for p in pods:
            kube.create(p)

        def bound() -> list[str] | None:
            nodes = [(kube.get("Pod", "v1", "team-a", p["metadata"]["name"]) or {}).get("spec", {}).get("nodeName")
                     for p in pods]
            return nodes if all(nodes) else None

        assert eventually(bound, "every pod to be bound") == ["n1", "n1", "n1"]
        scheduled = eventually(lambda: [e for e in kube.items("Event") if e["reason"] == "Scheduled"], "event")
        assert scheduled[0]["involvedObject"]["name"] == "rc"
        bridge = apps["cluster"].muster_bridge
        assert bridge.dead_letters == 0 and bridge.outcomes["applied"] >= 5  # unsuspend, annotations, 3 binds
    # a deployment's log (arrival order, wall clock, timers racing inputs) runs forwards in time and verifies
    log = list(envelopes_of(KafkaLog(f"kafka://{kafka_bootstrap}", policy=Policy(), prefix=topic_prefix)))
    assert backwards(log) == []
    assert verify(KafkaLog(f"kafka://{kafka_bootstrap}", policy=Policy(), prefix=topic_prefix), Policy()).different == 0


def test_restarting_the_bridge_sends_nothing_new_for_unchanged_objects(
        kafka_bootstrap: str, topic_prefix: str, kube: KubeApiEmulator) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    kube.create(node("n1"))
    kube.create(QUEUE)
    log = config.topics.log
    with stack(config, kube.url, services=()):
        first = changes(read_until(config, log, lambda rs: len(changes(rs)) >= 2))
    with stack(config, kube.url, services=()):
        kube.create(node("n2"))
        again = changes(read_until(config, log, lambda rs: len(changes(rs)) >= 5))
    ids = [e.id for e in again]
    assert ids[:2] == [e.id for e in first]
    # the restart listed n1 and the queue again under the ids they had; n2 is new
    assert sorted(e.payload.name for e in again[2:]) == ["n1", "n2", "research"]
    assert len(set(ids)) == 3


def test_a_refused_effect_is_dead_lettered_and_the_next_is_applied(
        kafka_bootstrap: str, topic_prefix: str, kube: KubeApiEmulator) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    kube.create(ray_cluster("rc", "team-a", suspend=True))
    topics = config.topics
    with stack(config, kube.url, services=()) as apps:
        bridge = apps["cluster"].muster_bridge
        eventually(lambda: bridge.observed >= 1, "the watch to start")

        def effect(op: str, index: int) -> bytes:
            payload = KubeEffect(op=op, kind="RayCluster", namespace="team-a", name="rc")  # type: ignore[arg-type]
            return codec.encode(wrap(payload, source="reconciler", cause=None, index=index, at=time.time()))

        kube.fail(403, "Forbidden", method="PATCH")
        send(config, topics.effects, effect("unsuspend", 1), b"{not json", effect("unsuspend", 2))
        eventually(lambda: (kube.get("RayCluster", "ray.io/v1", "team-a", "rc") or {}).get("spec", {})
                   .get("suspend") is False, "the second unsuspend")
        letters = read_until(config, topics.deadletter, lambda rs: len(rs) >= 2)
    errors = [json.loads(r.value)["error"] for r in letters]
    assert "403 Forbidden" in errors[0] and "unsuspend" in errors[0]
    assert errors[1].startswith("not a valid envelope")
    assert bridge.dead_letters == 2



def test_a_traced_effect_is_an_apply_span_under_the_hop_that_decided_it(
        kafka_bootstrap: str, topic_prefix: str, kube: KubeApiEmulator) -> None:
    from shared.observability.tracing.context import TRACEPARENT, SpanRef, traceparent
    from shared.observability.tracing.live import HopTracer
    from tests.unit.bus.test_worker_tracing import RecordingSink

    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    kube.create(ray_cluster("rc", "team-a", suspend=True))
    decided_by = SpanRef("a" * 32, "b" * 16)
    with stack(config, kube.url, services=()) as apps:
        bridge, sink = apps["cluster"].muster_bridge, RecordingSink()
        bridge.tracer = HopTracer("cluster", sink, topic=config.topics.effects, group=f"{topic_prefix}cluster")  # type: ignore[arg-type]
        eventually(lambda: bridge.observed >= 1, "the watch to start")
        effect = wrap(KubeEffect(op="unsuspend", kind="RayCluster", namespace="team-a", name="rc"),
                      source="reconciler", cause=None, index=1, at=time.time())
        effect = effect.model_copy(update={"trace": {TRACEPARENT: traceparent(decided_by)}})
        send(config, config.topics.effects, codec.encode(effect))
        [span] = eventually(lambda: sink.spans, "the apply span")
    assert (span.name, span.trace_id, span.parent_id, span.service) == (
        "apply unsuspend", decided_by.trace_id, decided_by.span_id, "muster-cluster")
    assert span.attributes["muster.effect.outcome"] and span.attributes["k8s.object.name"] == "rc"
    assert span.attributes["messaging.destination.name"] == config.topics.effects
    assert span.start <= span.end


def test_watch_events_muster_cannot_hold_are_refused_at_ingest_and_later_ones_flow(
        kafka_bootstrap: str, topic_prefix: str, kube: KubeApiEmulator) -> None:
    """Half a surrogate pair (text JSON cannot encode) in a label and a node selector larger than the
    broker takes: ingest publishes each as its identity and why it was refused (admission rejects it),
    arbitrary annotations are dropped, nothing is dead-lettered, and the link goes on and stays ready.
    (What still cannot be sent after ingest is dead-lettered: tests/unit/bus/test_cluster_link.py.)"""
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    topics = config.topics
    kube.create(node("n1"))
    with stack(config, kube.url, services=()) as apps:
        bridge = apps["cluster"].muster_bridge
        eventually(lambda: bridge.observed >= 1, "the watch to start")
        odd = ray_cluster("odd", "team-a", annotations={"note": "\ud800"})
        odd["metadata"]["labels"] = {"note": "\ud800"}
        huge = ray_cluster("huge", "team-a", annotations={"blob": "x" * 600_000})
        huge["spec"]["headGroupSpec"]["template"]["spec"]["nodeSelector"] = {"blob": "x" * 600_000}
        kube.create(odd)
        kube.create(huge)
        kube.create(node("n2"))
        log = changes(read_until(config, topics.log, lambda rs: len(changes(rs)) >= 4))
        assert bridge.not_ready() is None and bridge.unsent == 0 and bridge.dead_letters == 0
    assert sorted(e.subject for e in log) == ["Node/n1", "Node/n2", "RayCluster/team-a/huge", "RayCluster/team-a/odd"]
    refused = {e.subject: e.payload.object["metadata"]["annotations"][k.REFUSED] for e in log
               if e.subject.startswith("RayCluster/")}
    assert "surrogate" in refused["RayCluster/team-a/odd"]
    assert refused["RayCluster/team-a/huge"]
    assert all(len(codec.encode(e)) < 10_000 for e in log)  # identity and the reason, not the object


def test_a_pod_deleted_seen_by_the_watching_process_lets_the_bind_waiting_for_its_node_go(
        kafka_bootstrap: str, topic_prefix: str) -> None:
    """The watch runs in a process of its own (``shared.kubernetes.cluster_watch``), the applier in the app's:
    a bind to a node an evicted pod still holds waits for that pod's deletion, which only the watching
    process sees; it reaches the applier as a line to the parent (without it the bind would wait
    ``victim_wait``, set here beyond the test's patience)."""
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    with KubeApiEmulator(graceful=True) as kube:  # an eviction marks the pod terminating; the test deletes it
        kube.create(node("n1"))
        kube.create(pod("victim", "team-a", node_name="n1"))
        kube.create(pod("b", "team-a"))
        with stack(config, kube.url, services=()) as apps:
            bridge = apps["cluster"].muster_bridge
            eventually(lambda: bridge.applier is not None and bridge.listed.is_set(), "the link to list")
            bridge.applier.victim_wait = 3600.0

            def effect(op: str, name: str, index: int, node_name: str = "") -> bytes:
                payload = KubeEffect(op=op, kind="Pod", namespace="team-a", name=name, node=node_name)  # type: ignore[arg-type]
                return codec.encode(wrap(payload, source="reconciler", cause=None, index=index, at=time.time()))

            send(config, config.topics.effects, effect("evict", "victim", 1), effect("bind", "b", 2, "n1"))
            eventually(lambda: (kube.get("Pod", "v1", "team-a", "victim") or {}).get("metadata", {})
                       .get("deletionTimestamp"), "the victim to be terminating")
            assert bridge.applier.leaving == {"n1": {("team-a", "victim")}}  # the bind waits for it
            kube.delete("Pod", "v1", "team-a", "victim")  # the kubelet's part
            eventually(lambda: (kube.get("Pod", "v1", "team-a", "b") or {}).get("spec", {}).get("nodeName"),
                       "the bind behind the eviction")
            assert bridge.applier.leaving == {} and bridge.dead_letters == 0


def test_a_watching_process_that_dies_is_started_again_and_the_link_is_not_ready_meanwhile(
        kafka_bootstrap: str, topic_prefix: str, kube: KubeApiEmulator) -> None:
    import os
    import signal

    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    kube.create(node("n1"))
    with stack(config, kube.url, services=()) as apps:
        bridge, watcher = apps["cluster"].muster_bridge, apps["cluster"].muster_watcher
        eventually(lambda: bridge.observed >= 1 and bridge.not_ready() is None, "the watch to start")
        first = watcher.pid
        os.kill(first, signal.SIGKILL)
        assert "watching" in eventually(bridge.not_ready, "the link to say so")  # down, then starting again
        eventually(lambda: watcher.pid not in (None, first) and bridge.not_ready() is None, "a new watching process")
        kube.create(node("n2"))
        log = changes(read_until(config, config.topics.log, lambda rs: "Node/n2" in {e.subject for e in changes(rs)}))
    assert {e.subject for e in log} == {"Node/n1", "Node/n2"}
    assert bridge.observed >= 3  # n1 twice (each process lists it), n2
