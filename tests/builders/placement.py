"""Builders for the placement core's tests: Node/Pod watch events, decisions, and a driver.

``PlacementDriver`` feeds envelopes to a ``PlacementCore`` at a virtual ``now`` and fires the
timers it sets the way the embedded runtime does (``settle``: when nothing else is left at that
instant). Pods of a RayCluster carry the labels KubeRay writes (``ray_pod``).
"""

from __future__ import annotations

from typing import Any, TypeVar

from services.placement import PlacementCore
from shared.kernel import gpumemory, kube
from shared.kernel.events import (
    Dequeued, GangPlaced, ObjectChanged, ReclaimRequested, TimerFired, TimerSet, WorkloadUpdated, WorkloadWithdrawn,
)
from shared.kernel.model import MatchExpression, PodSet, Toleration, WorkloadSpec
from shared.kernel.policy import Policy
from tests.builders import envelope, gang, node, pod, pod_set, workload

T = TypeVar("T")


def node_changed(obj: dict, change: str = "Added") -> ObjectChanged:
    return ObjectChanged(change=change, kind="Node", api_version="v1", name=obj["metadata"]["name"], object=obj)


def pod_changed(obj: dict, change: str = "Added") -> ObjectChanged:
    meta = obj["metadata"]
    return ObjectChanged(change=change, kind="Pod", api_version="v1", namespace=meta.get("namespace", "default"),
                         name=meta["name"], object=obj)


def ray_pod(cluster: str, pod_set: str = "head", index: int = 0, *, namespace: str = "default",
            requests: dict | None = None, node_name: str | None = None, phase: str = "Pending",
            gpu_fraction: str | None = None, name: str | None = None, gpu_memory: str | None = None,
            **kw: Any) -> dict:
    """A pod as KubeRay creates it for ``cluster``: head, a worker of group ``pod_set``, or ``submitter``;
    ``gpu_fraction`` / ``gpu_memory``: KAI's GPU sharing annotations its template carried."""
    labels = {kube.RAY_CLUSTER: cluster}
    if pod_set == "head":
        labels.update({kube.RAY_NODE_TYPE: "head", kube.RAY_GROUP: "headgroup"})
    elif pod_set == "submitter":
        labels[kube.SUBMITTER_LABEL] = "submitter"
    else:
        labels.update({kube.RAY_NODE_TYPE: "worker", kube.RAY_GROUP: pod_set})
    annotations = {**({kube.GPU_FRACTION: gpu_fraction} if gpu_fraction else {}),
                   **({gpumemory.ANNOTATION: gpu_memory} if gpu_memory else {})} or None
    default = f"{cluster}-head-{index}" if pod_set == "head" else f"{cluster}-{pod_set}-worker-{index}"
    return pod(name or default, namespace, requests=requests or {"cpu": "1"}, node_name=node_name, labels=labels,
               annotations=annotations, phase=phase, **kw)


def bound(obj: dict, node_name: str, phase: str = "Pending") -> dict:
    """The same pod after the binder put it on ``node_name`` (and the kubelet moved it to ``phase``)."""
    out = {**obj, "spec": {**obj["spec"], "nodeName": node_name}, "status": {"phase": phase}}
    return out


def with_phase(obj: dict, phase: str) -> dict:
    return {**obj, "status": {"phase": phase}}


def expr(key: str, operator: str, *values: str) -> MatchExpression:
    """One required-node-affinity expression: ``expr("zone", "In", "a", "b")``."""
    return MatchExpression(key=key, operator=operator, values=values)


def constrained(ps: PodSet, *, node_selector: dict | None = None, tolerations: list[dict] | None = None,
                affinity: list[list[MatchExpression]] | None = None) -> PodSet:
    """The pod set with constraints: ``affinity`` is OR over terms, AND within one (see ``expr``)."""
    update: dict[str, Any] = {}
    if node_selector is not None:
        update["node_selector"] = dict(node_selector)
    if tolerations is not None:
        update["tolerations"] = tuple(Toleration(**t) for t in tolerations)
    if affinity is not None:
        update["affinity"] = tuple(tuple(term) for term in affinity)
    return PodSet.model_validate({**ps.model_dump(), **update})


def of_type(out: list[Any], cls: type[T]) -> list[T]:
    return [p for p in out if isinstance(p, cls)]


def one(out: list[Any], cls: type[T]) -> T:
    found = of_type(out, cls)
    assert len(found) == 1, f"expected exactly one {cls.__name__} in {[type(p).__name__ for p in out]}"
    return found[0]


class PlacementDriver:
    """A ``PlacementCore`` with a virtual clock; timers fire on ``settle`` (quiescence) or ``advance``."""

    def __init__(self, policy: Policy | None = None, *nodes: dict) -> None:
        self.core = PlacementCore(policy or Policy())
        self.now = 0.0
        self._timers: list[TimerSet] = []
        for n in nodes:
            self.feed(node_changed(n))

    def feed(self, payload: Any) -> list[Any]:
        out = self.core.handle(envelope(payload, at=self.now))
        self._timers.extend(of_type(out, TimerSet))
        return out

    def settle(self) -> list[Any]:
        """Fire every timer due at ``now`` (the runtime does it once every inbox is drained)."""
        out: list[Any] = []
        while True:
            due = [t for t in self._timers if t.at <= self.now]
            if not due:
                return out
            self._timers = [t for t in self._timers if t.at > self.now]
            for timer in due:
                out += self.feed(TimerFired(key=timer.key))

    def advance(self, to: float) -> list[Any]:
        out = self.settle()
        self.now = to
        return out

    # ------------------------------------------------------------------ shorthands
    def add_node(self, name: str, **kw: Any) -> list[Any]:
        return self.feed(node_changed(node(name, **kw)))

    def pod(self, obj: dict, change: str = "Added") -> list[Any]:
        return self.feed(pod_changed(obj, change))

    def dequeue(self, spec: WorkloadSpec, queue: str | None = None) -> list[Any]:
        return self.feed(Dequeued(key=spec.key, queue=queue or spec.queue, workload=spec, reason="test"))

    def reclaim(self, spec: WorkloadSpec, victims: tuple[str, ...], queue: str | None = None) -> list[Any]:
        return self.feed(ReclaimRequested(key=spec.key, queue=queue or spec.queue, workload=spec, victims=victims,
                                          reason="test"))

    def withdraw(self, key: str) -> list[Any]:
        return self.feed(WorkloadWithdrawn(key=key, reason="test"))

    def update(self, spec: WorkloadSpec) -> list[Any]:
        """The user edited the workload (admission's WorkloadUpdated)."""
        return self.feed(WorkloadUpdated(workload=spec))

    def run(self, spec: WorkloadSpec, out: list[Any], phase: str = "Running") -> list[Any]:
        """Create the pods of a placed gang on their slots' nodes in ``phase`` (KubeRay + binder + kubelet)."""

        placed = one(out, GangPlaced)
        result: list[Any] = []
        for slot in placed.slots:
            ps = next(p for p in spec.gang.pod_sets if p.name == slot.pod_set)
            requests = {k: str(v) + "m" for k, v in ps.resources.items()}
            obj = ray_pod(spec.name, slot.pod_set, slot.index, namespace=spec.namespace, requests=requests,
                          gpu_fraction=str(ps.gpu_share / 1000) if ps.gpu_share else None,
                          gpu_memory=str(ps.gpu_memory) if ps.gpu_memory else None)
            result += self.pod(obj)
            result += self.pod(bound(obj, slot.node, phase), "Modified")
        return result


def fits(d: PlacementDriver, cpu: str, key: str = "ns/probe") -> bool:
    """Would a one-pod gang of ``cpu`` be placed now? Probes without leaving anything reserved."""
    out = d.dequeue(workload(key, gang_=gang(pod_set("head", 1, cpu=cpu))))
    if any(isinstance(p, GangPlaced) for p in out):
        d.withdraw(key)
        return True
    return False
