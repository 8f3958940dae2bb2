"""Fluent-ish builders for test fixtures, shared by every test package.

Kubernetes objects are plain dicts exactly as the API server returns them; domain objects are the
models from ``shared.kernel.model``. Keep builders here (or in a module of this package named for the
area) so no test writes a RayCluster by hand twice.
"""

from __future__ import annotations

import itertools
from typing import Any

from services.admission.dialects import queue_fields
from shared.kernel.events import Envelope, wrap
from shared.kernel.kube import overcommit_allowed
from shared.kernel.model import Gang, PodSet, QueueSpec, WorkloadSpec
from shared.kernel.quantity import parse_resources

_seq = itertools.count()


def container(name: str = "ray", requests: dict | None = None, limits: dict | None = None) -> dict:
    """A container; without ``limits``, an extended resource requested (``nvidia.com/gpu``) is limited to
    its request, as the API server requires of every pod (``kube.requirements_problem``)."""
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = dict(requests)
    if limits is None and requests:
        limits = {k: v for k, v in requests.items() if not overcommit_allowed(str(k))} or None
    if limits is not None:
        resources["limits"] = dict(limits)
    return {"name": name, "image": "rayproject/ray:2.50.1", "resources": resources}


def pod_template(requests: dict | None = None, limits: dict | None = None, *, annotations: dict | None = None,
                 name: str = "ray", **spec: Any) -> dict:
    tpl: dict[str, Any] = {"spec": {"containers": [container(name, requests, limits)], **spec}}
    if annotations:
        tpl["metadata"] = {"annotations": dict(annotations)}
    return tpl


def worker_group(group: str = "worker", replicas: int = 1, requests: dict | None = None, *,
                 min_replicas: int | None = None, max_replicas: int | None = None, num_of_hosts: int | None = None,
                 annotations: dict | None = None, limits: dict | None = None, **spec: Any) -> dict:
    g: dict[str, Any] = {"groupName": group, "replicas": replicas,
                         "template": pod_template(requests if requests is not None else {"cpu": "1", "memory": "1Gi"},
                                                  limits, annotations=annotations, **spec)}
    if min_replicas is not None:
        g["minReplicas"] = min_replicas
    if max_replicas is not None:
        g["maxReplicas"] = max_replicas
    if num_of_hosts is not None:
        g["numOfHosts"] = num_of_hosts
    return g


def ray_cluster_spec(head: dict | None = None, workers: list[dict] | None = None, **extra: Any) -> dict:
    spec: dict[str, Any] = {
        "headGroupSpec": {"rayStartParams": {}, "template": pod_template(head or {"cpu": "1", "memory": "2Gi"})},
        "workerGroupSpecs": list(workers if workers is not None else [worker_group()]),
    }
    spec.update(extra)
    return spec


def ray_cluster(name: str = "rc", namespace: str = "default", *, labels: dict | None = None,
                annotations: dict | None = None, suspend: bool | None = None, **spec_kwargs: Any) -> dict:
    spec = ray_cluster_spec(**spec_kwargs)
    if suspend is not None:
        spec["suspend"] = suspend
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {}),
                         "annotations": dict(annotations or {})},
            "spec": spec}


def ray_job(name: str = "rj", namespace: str = "default", *, labels: dict | None = None, annotations: dict | None = None,
            suspend: bool = True, submission_mode: str | None = None, shutdown: bool = True,
            **cluster_kwargs: Any) -> dict:
    spec: dict[str, Any] = {"entrypoint": "python main.py", "shutdownAfterJobFinishes": shutdown,
                            "suspend": suspend, "rayClusterSpec": ray_cluster_spec(**cluster_kwargs)}
    if submission_mode:
        spec["submissionMode"] = submission_mode
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {}),
                         "annotations": dict(annotations or {})},
            "spec": spec}


def node(name: str, cpu: str = "16", memory: str = "64Gi", gpu: str | None = None, *, pods: str = "110",
         labels: dict | None = None, taints: list[dict] | None = None, unschedulable: bool = False) -> dict:
    cap: dict[str, str] = {"cpu": cpu, "memory": memory, "pods": pods}
    if gpu is not None:
        cap["nvidia.com/gpu"] = gpu
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = list(taints)
    if unschedulable:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": spec, "status": {"capacity": dict(cap), "allocatable": dict(cap)}}


def pod(name: str, namespace: str = "default", *, requests: dict | None = None, node_name: str | None = None,
        labels: dict | None = None, annotations: dict | None = None, phase: str = "Pending",
        scheduler: str = "muster") -> dict:
    spec: dict[str, Any] = {"schedulerName": scheduler,
                            "containers": [container("main", requests or {"cpu": "1", "memory": "1Gi"})]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {}),
                         "annotations": dict(annotations or {})},
            "spec": spec, "status": {"phase": phase}}


# --------------------------------------------------------------------------- domain objects
def pod_set(name: str = "head", count: int = 1, *, in_gang: bool = True, gpu_share: int = 0, gpu_memory: int = 0,
            elastic: int = 0, task: str = "", node_selector: dict | None = None, **resources: str) -> PodSet:
    """``pod_set("worker", 2, cpu="1", memory="1Gi")``; resource names with dots via ``**{"nvidia.com/gpu": "1"}``;
    ``gpu_memory``: MiB of one GPU (KAI's ``gpu-memory``); ``elastic`` pods beyond ``count``, a Volcano
    ``task``, a ``node_selector``."""
    return PodSet(name=name, count=count, in_gang=in_gang, gpu_share=gpu_share, gpu_memory=gpu_memory,
                  elastic=elastic, task=task, node_selector=dict(node_selector or {}),
                  resources=parse_resources(resources or {"cpu": "1"}))


def gang(*pod_sets: PodSet) -> Gang:
    sets = pod_sets or (pod_set("head"),)
    return Gang(min_member=sum(p.count for p in sets if p.in_gang), pod_sets=tuple(sets))


def pod_group(*pod_sets: PodSet, tasks: dict[str, int] | None = None) -> Gang:
    """A pod group's gang as admission makes it: ``count`` pods of each set are the first tried, any
    other pods of the group (``elastic``) may stand in, each task keeping its ``tasks`` minimum."""
    return gang(*pod_sets).model_copy(update={"interchangeable": True,
                                              "task_minimums": tuple(sorted((tasks or {}).items()))})


def workload(key: str = "default/w", *, queue: str = "default", priority: int = 0, preemptible: bool | None = None,
             kind: str = "RayCluster", gate: str = "pods", submitted_at: float = 0.0, gang_: Gang | None = None,
             pinned_pod_sets: tuple[str, ...] = ()) -> WorkloadSpec:
    ns, name = key.split("/")
    return WorkloadSpec(key=key, kind=kind, namespace=ns, name=name, queue=queue, priority=priority,
                        preemptible=(priority < 100) if preemptible is None else preemptible, gate=gate,
                        gang=gang_ or gang(), submitted_at=submitted_at, cluster_name=name,
                        pinned_pod_sets=pinned_pod_sets)


def queue_spec(name: str, *, parent: str | None = None, guarantee: dict | None = None, limit: dict | None = None,
               weight: int = 1000, priority: int = 0, reclaimable: bool = True, dialect: str = "volcano",
               enqueue_gate: bool = False, **kw: Any) -> QueueSpec:
    """A queue of ``dialect``'s rules, without Volcano's enqueue gate unless ``enqueue_gate``: the rules' tests
    run as Volcano's own action tests do (reclaim_test.go, preempt_test.go set their jobs Inqueue), on small
    full clusters the overcommit plugin would keep every waiting job out of."""
    fields = {**queue_fields(dialect), "gates_enqueue": enqueue_gate}
    return QueueSpec(name=name, parent=parent, **fields, guarantee=parse_resources(guarantee or {}),
                     limit=parse_resources(limit or {}), weight=weight, priority=priority, reclaimable=reclaimable, **kw)


def envelope(payload: Any, at: float = 0.0, source: str = "test") -> Envelope:
    """Wrap a payload as if it arrived on an inbox at event time ``at`` (unique id per call)."""
    return wrap(payload, source=source, cause=None, index=next(_seq), at=at)
