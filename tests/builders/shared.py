"""Builders for tests of ``shared/``: one sample per payload type, watch-event envelopes, fake cores,
a recording ``SimCluster`` and scenario files.

Everything here is deterministic: envelopes take explicit times, sources and indexes, so ids are
stable and tests can compare them literally.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from services.reconciler.ingest import observe
from shared.kernel import kube
from shared.kernel.dedupe import Tombstones
from shared.kernel.events import (
    BackedOff, CapacityChanged, Dequeued, ElasticGranted, ElasticReleased, ElasticVictim, ElasticWaiting, Enqueued, Envelope,
    GangPlaced, GangDisrupted, GangEvicted, GangRunning, GpuAssignment, ObjectsListed,
    KubeEffect, PlacementFailed, PodAssigned, PodsMoved, PreemptionRequested, QueueDefined, QueueRejected,
    QueueRemoved, ReclaimRequested, SlotAssignment, TimerFired, TimerSet, WorkloadDeleted, WorkloadFinished,
    WorkloadRejected, WorkloadSubmitted, WorkloadUpdated, WorkloadWarned, WorkloadWithdrawn, wrap,
)
from shared.kernel.policy import Policy
from shared.runtime.build import policy_applied
from shared.sim.cluster import SimCluster
from tests.builders import gang, pod, pod_set, queue_spec, workload

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "tests" / "scenarios"
VOLCANO = SCENARIOS / "volcano-gang-queue.yaml"


# --------------------------------------------------------------------------- payloads
def sample_payloads() -> dict[str, Any]:
    """One valid instance of every payload type, keyed by its ``type`` (tests compare the key set
    with ``PAYLOAD_TYPES``, so a new payload type must get a sample here)."""
    spec = workload("team-a/rc", queue="q1", gang_=gang(pod_set("head", 1, cpu="1", memory="2Gi"),
                                                         pod_set("worker", 2, cpu="1", memory="1Gi")))
    gpu = GpuAssignment(devices=(0,), fraction=0.5, group="g1")
    samples = [
        observe("Added", pod("p1", "team-a", labels={"ray.io/cluster": "rc", "ray.io/node-type": "head"})),
        QueueDefined(queue=queue_spec("q1", limit={"cpu": "4"})),
        QueueRemoved(name="q1"),
        QueueRejected(name="q2", kind="Queue", reason="parent q9 does not exist"),
        WorkloadSubmitted(workload=spec),
        WorkloadUpdated(workload=spec),
        WorkloadRejected(key="team-a/bad", kind="RayJob", reason="minReplicas 3 > maxReplicas 2"),
        WorkloadWarned(key="team-a/rc", kind="RayCluster", cause="QueueLabelIgnored",
                       reason="label volcano.sh/queue is not read; did you mean label volcano.sh/queue-name?"),
        WorkloadFinished(key="team-a/rc", outcome="Succeeded", reason="job finished"),
        WorkloadDeleted(key="team-a/rc"),
        Enqueued(key="team-a/rc", queue="q1", reason="waiting in queue q1"),
        BackedOff(key="team-a/rc", queue="q1", requeue_at=3.5, attempts=2, reason="does not fit"),
        Dequeued(key="team-a/rc", queue="q1", workload=spec, reason="quota reserved"),
        ReclaimRequested(key="team-a/rc", queue="q1", workload=spec, victims=("team-b/x",), reason="reclaim",
                         elastic_victims=(ElasticVictim(key="team-b/y", pod_set="worker", count=2),)),
        ElasticGranted(key="team-a/rc", queue="q1", pod_set="worker", count=2, admission=3,
                       reason="quota reserved in queue q1 for 2 elastic pod(s) of worker"),
        ElasticReleased(key="team-a/rc", pod_set="worker", count=1, admission=3, reason="preempted by team-c/z",
                        evicted=("team-a/rc-worker-worker-x",)),
        ElasticWaiting(key="team-a/rc", queue="q1", pod_set="worker", count=1,
                       reason="1 elastic pod(s) of worker wait: queue q1 limit cpu 4: used 4, requested 1"),
        WorkloadWithdrawn(key="team-a/rc", reason="deleted"),
        GangPlaced(key="team-a/rc", queue="q1", kind="RayCluster", gate="pods",
                   slots=(SlotAssignment(pod_set="head", index=0, node="n1", gpu=gpu),
                          SlotAssignment(pod_set="worker", index=0, node="n2")), reason="placed"),
        PlacementFailed(key="team-a/rc", queue="q1", reason="0/1 nodes are available"),
        PodAssigned(key="team-a/rc", pod_namespace="team-a", pod="rc-head-abcde", pod_set="head", node="n1", gpu=gpu),
        GangRunning(key="team-a/rc", reason="all pods Running"),
        GangDisrupted(key="team-a/rc", reason="2/3 gang pods Running: pod rc-head-x lost its node"),
        GangEvicted(key="team-a/rc", kind="RayCluster", gate="pods", pods=("rc-head-x",),
                    reason="stale gang evicted: 2 pods are active, minMember is 3, for 60s"),
        PodsMoved(key="team-b/y", kind="RayCluster", preemptor="team-a/rc", pods=("team-b/y-worker-aaaaa",),
                  reason="pod team-b/y-worker-aaaaa was preempted and rescheduled due to bin packing (resource "
                         "consolidation) procedure, to make room for team-a/rc"),
        PreemptionRequested(key="team-b/x", kind="RayCluster", gate="suspend", preemptor="team-a/rc",
                            pods=("x-head-aaaaa",), reason="preempted by team-a/rc (priority 100)"),
        CapacityChanged(total={"cpu": 16000}, nodes=1, released=True),
        KubeEffect(op="annotate", kind="RayCluster", namespace="team-a", name="rc", annotations={"a": "b"}),
        TimerSet(key="cycle", at=7.0),
        TimerFired(key="cycle", at=7.0),
        policy_applied(Policy(), ("queue",)),
        ObjectsListed(kind="Pod", api_version="v1", resource_version="4711", part=0,
                      keys=("team-a/rc-head-abcde", "team-a/rc-worker-fghij"), last=True),
    ]
    return {p.type: p for p in samples}


def at(payload: Any, t: float, *, source: str = "test", index: int = 0) -> Envelope:
    """An envelope with no cause at event time ``t`` (id stable for the same arguments)."""
    return wrap(payload, source=source, cause=None, index=index, at=t)


def tombstones(*deletions: tuple[str, str, float], seconds: float = 600.0) -> Tombstones[str, str]:
    """Tombstones of ``(key, uid, deleted at)`` deletions, buried in that order (a core's own, such as
    admission's, which keeps each deleted object's uid)."""
    graves: Tombstones[str, str] = Tombstones(seconds)
    for key, uid, when in deletions:
        graves.bury(key, uid, when)
    return graves


class Clock:
    """Hands out envelopes with increasing indexes so every one has its own id."""

    def __init__(self, source: str = "test") -> None:
        self.source = source
        self.n = 0

    def __call__(self, payload: Any, t: float, *, source: str | None = None) -> Envelope:
        self.n += 1
        return wrap(payload, source=source or self.source, cause=None, index=self.n, at=t)


def ray_pod(name: str, cluster: str, *, namespace: str = "default", node: str | None = None,
            node_type: str = "worker", group: str = "worker", submitter: bool = False) -> dict:
    """A pod as KubeRay creates it for ``cluster`` (labels only; the projection needs no more).
    With ``submitter=True`` it is the RayJob submitter pod of the job named ``cluster``."""
    labels = {kube.RAY_CLUSTER: cluster, kube.RAY_NODE_TYPE: node_type, kube.RAY_GROUP: group}
    if submitter:
        labels = {kube.OWNER_JOB: cluster, kube.SUBMITTER_LABEL: "submitter"}  # as ingest stamps it
    return pod(name, namespace, labels=labels, node_name=node)


def watch(change: str, obj: dict, t: float, clock: Clock) -> Envelope:
    """A watch event as the runtime's ingest publishes it (source ``ingest``)."""
    return clock(observe(change, obj), t, source="ingest")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- runtime doubles
Trace = list[tuple[Any, ...]]


class FakeCore:
    """A core that records what it handles into a shared trace and answers with ``react(env)``."""

    def __init__(self, service: str, trace: Trace, react: Callable[[Envelope], Iterable[Any]] | None = None) -> None:
        self.service = service
        self.trace = trace
        self.react = react or (lambda env: ())
        self.handled: list[Envelope] = []

    def handle(self, env: Envelope) -> list[Any]:
        self.handled.append(env)
        self.trace.append((self.service, env.type, env.occurred_at, _label(env.payload)))
        return list(self.react(env))


def _label(payload: Any) -> str:
    for attr in ("key", "name", "reason"):
        value = getattr(payload, attr, None)
        if isinstance(value, str):
            return value
    return ""


def fake_cores(trace: Trace, **reactions: Callable[[Envelope], Iterable[Any]]) -> dict[str, FakeCore]:
    """The four services as ``FakeCore``s; ``queue=lambda env: [...]`` gives one a behaviour."""
    return {name: FakeCore(name, trace, reactions.get(name))
            for name in ("admission", "queue", "placement", "reconciler")}


class RecordingCluster(SimCluster):
    """A real ``SimCluster`` that also writes its timer firings and effects into the trace."""

    def __init__(self, trace: Trace, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.trace = trace

    def fire(self, key: str, now: float) -> None:
        self.trace.append(("cluster-timer", key, now))
        super().fire(key, now)

    def perform(self, effect: KubeEffect, now: float) -> None:
        self.trace.append(("cluster-effect", effect.op, now, effect.name))
        super().perform(effect, now)


# --------------------------------------------------------------------------- scenario files
def volcano_scenario() -> dict[str, Any]:
    """The volcano-gang-queue scenario as a mutable mapping."""
    return yaml.safe_load(VOLCANO.read_text())


def write_scenario(directory: Path, data: dict[str, Any] | str, name: str = "scenario.yaml") -> Path:
    path = directory / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(copy.deepcopy(data), sort_keys=False))
    return path


def minimal_scenario(**overrides: Any) -> dict[str, Any]:
    """One node, one RayCluster of 2 pods at 1s, run to 10s."""
    data: dict[str, Any] = {
        "name": "mini",
        "cluster": {"nodes": [{"name": "n1", "capacity": {"cpu": "8", "memory": "16Gi", "pods": "110"}}]},
        "steps": [{"at": "1s", "apply": yaml.safe_dump(ray_cluster_manifest())}],
        "until": "10s",
    }
    data.update(overrides)
    return data


def ray_cluster_manifest(name: str = "rc", head_cpu: Any = "1") -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                {"name": "ray-head", "image": "rayproject/ray:2.34.0",
                 "resources": {"requests": {"cpu": head_cpu, "memory": "1Gi"}}}]}}},
            "workerGroupSpecs": [{"groupName": "worker", "replicas": 1, "minReplicas": 1, "maxReplicas": 1,
                                  "rayStartParams": {}, "template": {"spec": {"containers": [
                                      {"name": "ray-worker", "image": "rayproject/ray:2.34.0",
                                       "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}}],
        },
    }
