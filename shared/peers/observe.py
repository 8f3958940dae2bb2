"""What a run looks like at one instant, read from the API server alike whoever scheduled it.

A ``Snapshot`` is what the comparison holds two runs to: per workload the scenario applied (a
RayCluster, a RayJob, a batch Job, a Pod) whether it exists, which of its pods are bound (their
UIDs, so that a pod evicted and made again shows) and how many wait unbound; per queue the requests
of the bound pods in it. It is read with one ``kubectl get`` of pods and their owners, never from
either scheduler's own account of itself, so muster's run and the peer's are seen the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from shared.kernel.quantity import Resources, add, format_quantity, parse_resources
from shared.parts.peers import Peer
from shared.sim.scenario import Scenario

WORKLOAD_KINDS = ("RayCluster", "RayJob", "Job", "Pod")
"""The kinds of the objects a scenario applies that are workloads (what the table has a row of)."""


@dataclass(frozen=True)
class Workload:
    exists: bool
    bound: frozenset[str] = frozenset()
    """UIDs of its pods bound to a node and not being deleted."""
    waiting: int = 0
    """Its pods not bound (and not being deleted)."""
    queue: str = ""
    sets: tuple[tuple[str, int, int], ...] = ()
    """Per pod set of a Ray workload (``head``, each worker group): its pods bound, its pods; () for others."""


@dataclass(frozen=True)
class Snapshot:
    workloads: dict[str, Workload]
    usage: dict[str, dict[str, int]] = field(default_factory=dict)
    """Queue -> resource -> milli-units requested by its bound pods."""

    def fingerprint(self) -> tuple[Any, ...]:
        """What must stay still for the cluster to count as settled."""
        return (tuple(sorted((k, w.exists, tuple(sorted(w.bound)), w.waiting) for k, w in self.workloads.items())),)


def workload_keys(scenario: Scenario) -> list[str]:
    """``namespace/name`` of every workload the scenario applies, in the order it applies them."""
    keys: list[str] = []
    for docs in scenario.documents:
        for doc in docs:
            if doc.get("kind") in WORKLOAD_KINDS:
                meta = doc.get("metadata") or {}
                key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
                if key not in keys:
                    keys.append(key)
    return keys


READ = "pods,rayclusters.ray.io,rayjobs.ray.io,jobs.batch"


def read(kubectl: Callable[..., str], peer: Peer) -> list[dict[str, Any]]:
    """Every object a snapshot reads, in one request list."""
    listed = json.loads(kubectl("get", f"{READ},{peer.podgroups}", "--all-namespaces", "-o", "json"))
    return list(listed.get("items") or [])


def snapshot(items: Iterable[Mapping[str, Any]], keys: list[str], peer: Peer) -> Snapshot:
    """The snapshot of the listed objects for the workloads ``keys`` (see the module docstring)."""
    objects: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    pods: list[Mapping[str, Any]] = []
    for item in items:
        meta = item.get("metadata") or {}
        ident = (str(item.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name")))
        objects[ident] = item
        if item.get("kind") == "Pod":
            pods.append(item)
    wanted = set(keys)

    def owner(kind: str, namespace: str, name: str) -> str | None:
        """The scenario workload an object belongs to, through its owners."""
        for _ in range(5):
            if kind in WORKLOAD_KINDS and f"{namespace}/{name}" in wanted:
                return f"{namespace}/{name}"
            obj = objects.get((kind, namespace, name))
            refs = (obj or {}).get("metadata", {}).get("ownerReferences") or []
            ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
            if ref is None:
                return None
            kind, name = str(ref.get("kind")), str(ref.get("name"))
        return None

    def queue_of(key: str, pod: Mapping[str, Any] | None) -> str:
        namespace, name = key.split("/", 1)
        group = ((pod or {}).get("metadata", {}).get("annotations") or {}).get(peer.group_annotation)
        podgroup = objects.get(("PodGroup", namespace, group)) if group else None
        if podgroup is not None and (podgroup.get("spec") or {}).get("queue"):
            return str(podgroup["spec"]["queue"])
        for kind in WORKLOAD_KINDS:
            workload = objects.get((kind, namespace, name))
            if workload is not None:
                labels = workload.get("metadata", {}).get("labels") or {}
                return str(labels.get(peer.queue_label) or peer.default_queue)
        return peer.default_queue

    bound: dict[str, set[str]] = {k: set() for k in keys}
    sets: dict[str, dict[str, list[int]]] = {k: {} for k in keys}
    waiting = dict.fromkeys(keys, 0)
    first_pod: dict[str, Mapping[str, Any]] = {}
    usage: dict[str, Resources] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        key = owner("Pod", str(meta.get("namespace") or ""), str(meta.get("name")))
        if key is None or meta.get("deletionTimestamp"):
            continue
        first_pod.setdefault(key, pod)
        placed = bool((pod.get("spec") or {}).get("nodeName"))
        pod_set = pod_set_of(pod)
        if pod_set:
            counts = sets[key].setdefault(pod_set, [0, 0])
            counts[0] += placed
            counts[1] += 1
        if placed:
            bound[key].add(str(meta.get("uid")))
            queue = queue_of(key, pod)
            usage[queue] = add(usage.get(queue, {}), requests(pod))
        else:
            waiting[key] += 1
    workloads = {}
    for key in keys:
        namespace, name = key.split("/", 1)
        exists = any((kind, namespace, name) in objects for kind in WORKLOAD_KINDS)
        workloads[key] = Workload(exists, frozenset(bound[key]), waiting[key], queue_of(key, first_pod.get(key)),
                                  tuple((name, b, n) for name, (b, n) in sorted(sets[key].items(), key=lambda kv: (kv[0] != "head", kv[0]))))
    return Snapshot(workloads, {q: dict(r) for q, r in usage.items() if any(r.values())})


def pod_set_of(pod: Mapping[str, Any]) -> str:
    """``head`` or the worker group's name for a pod KubeRay made (its labels), "" for any other."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if labels.get("ray.io/node-type") == "head":
        return "head"
    return str(labels.get("ray.io/group") or "") if labels.get("ray.io/node-type") == "worker" else ""


def requests(pod: Mapping[str, Any]) -> Resources:
    """The sum of a pod's containers' requests (the same sum for both runs: a comparison, not a scheduler)."""
    total: Resources = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        total = add(total, parse_resources((container.get("resources") or {}).get("requests") or {}))
    return total


def usage_text(usage: Mapping[str, int]) -> str:
    """``cpu 3, memory 4Gi`` (resources in name order, none when empty)."""
    parts = [f"{name} {format_quantity(name, milli)}" for name, milli in sorted(usage.items()) if milli]
    return ", ".join(parts) or "none"
