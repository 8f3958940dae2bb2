"""Builders for the admission core's tests: the queue dialects, PriorityClasses, pod gangs, and a driver.

Kubernetes objects are plain dicts as the API server returns them (see ``tests.builders`` for
RayCluster / RayJob / Pod). ``AdmissionDriver`` wraps each object in an ``ObjectChanged`` envelope
at a given time and returns what the core emitted.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from services.admission import AdmissionCore
from shared.kernel.events import ObjectChanged, WorkloadRejected, WorkloadSubmitted
from shared.kernel.model import WorkloadSpec
from shared.kernel.policy import Policy
from tests.builders import envelope, pod

Change = Literal["Added", "Modified", "Deleted"]


def changed(obj: dict, change: Change = "Added") -> ObjectChanged:
    """The watch event for ``obj`` (kind, apiVersion, namespace and name read from it)."""
    meta = obj.get("metadata") or {}
    return ObjectChanged(change=change, kind=obj["kind"], api_version=obj.get("apiVersion", ""),
                         namespace=meta.get("namespace", ""), name=meta["name"], object=obj)


class AdmissionDriver:
    """Feeds watch events to one ``AdmissionCore``; the clock is whatever time each call names."""

    def __init__(self, policy: Policy | None = None, **policy_fields: Any) -> None:
        self.core = AdmissionCore(policy or Policy(**policy_fields))
        self.now = 0.0

    def send(self, obj: dict, change: Change = "Added", at: float | None = None) -> list[Any]:
        if at is not None:
            self.now = at
        return self.core.handle(envelope(changed(copy.deepcopy(obj), change), at=self.now))

    def add(self, *objs: dict, at: float | None = None) -> list[Any]:
        out: list[Any] = []
        for obj in objs:
            out += self.send(obj, "Added", at)
        return out

    def submitted(self, obj: dict, at: float | None = None) -> WorkloadSpec:
        """Add ``obj`` and return the spec it was submitted with (fails the test otherwise)."""
        out = self.send(obj, "Added", at)
        assert len(out) == 1 and isinstance(out[0], WorkloadSubmitted), out
        return out[0].workload

    def rejected(self, obj: dict, change: Change = "Added", at: float | None = None) -> str:
        """Send ``obj`` and return the rejection reason (fails the test otherwise)."""
        out = self.send(obj, change, at)
        assert len(out) == 1 and isinstance(out[0], WorkloadRejected), out
        return out[0].reason


# --------------------------------------------------------------------------- queue dialects
def volcano_queue(name: str, *, capability: dict | None = None, guarantee: dict | None = None,
                  weight: Any = None, reclaimable: Any = None, parent: str | None = None, state: str | None = None,
                  status_state: str | None = None, **spec: Any) -> dict:
    """Extra ``spec`` fields verbatim; ``spec_<field>=`` sets a field verbatim even if it has a keyword."""
    s: dict[str, Any] = {k.removeprefix("spec_"): v for k, v in spec.items()}
    if capability is not None:
        s["capability"] = dict(capability)
    if guarantee is not None:
        s["guarantee"] = {"resource": dict(guarantee)}
    if weight is not None:
        s["weight"] = weight
    if reclaimable is not None:
        s["reclaimable"] = reclaimable
    if parent is not None:
        s["parent"] = parent
    if state is not None:
        s["state"] = state
    obj: dict[str, Any] = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                           "metadata": {"name": name}, "spec": s}
    if status_state is not None:
        obj["status"] = {"state": status_state}
    return obj


def kai_resource(quota: Any = -1, limit: Any = -1, over_quota_weight: Any = 1) -> dict:
    out: dict[str, Any] = {}
    for key, value in (("quota", quota), ("limit", limit), ("overQuotaWeight", over_quota_weight)):
        if value is not None:
            out[key] = value
    return out


def kai_queue(name: str, *, parent: str | None = None, priority: Any = None, cpu: dict | None = None,
              memory: dict | None = None, gpu: dict | None = None, **spec: Any) -> dict:
    """KAI v2 Queue; each resource defaults to ``{quota: -1, limit: -1, overQuotaWeight: 1}``."""
    s: dict[str, Any] = {"resources": {"cpu": cpu if cpu is not None else kai_resource(),
                                       "gpu": gpu if gpu is not None else kai_resource(),
                                       "memory": memory if memory is not None else kai_resource()}}
    if parent is not None:
        s["parentQueue"] = parent
    if priority is not None:
        s["priority"] = priority
    s.update(spec)
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": s}


def eqt_node(name: str, *, min: dict | None = None, max: dict | None = None, namespaces: list | None = None,
             children: list | None = None) -> dict:
    node: dict[str, Any] = {"name": name}
    if max is not None:
        node["max"] = dict(max)
    if min is not None:
        node["min"] = dict(min)
    if namespaces is not None:
        node["namespaces"] = list(namespaces)
    if children is not None:
        node["children"] = list(children)
    return node


def elastic_quota_tree(root: dict, name: str = "elasticquotatree", namespace: str = "kube-system") -> dict:
    return {"apiVersion": "scheduling.sigs.k8s.io/v1beta1", "kind": "ElasticQuotaTree",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"root": root}}


def priority_class(name: str, value: Any, *, global_default: bool = False) -> dict:
    obj: dict[str, Any] = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                           "value": value, "preemptionPolicy": "PreemptLowerPriority"}
    if global_default:
        obj["globalDefault"] = True
    return obj


# --------------------------------------------------------------------------- pod gangs
def pod_group(name: str, min_member: Any, namespace: str = "default", **meta: Any) -> dict:
    """A coscheduling ``scheduling.x-k8s.io/v1alpha1`` PodGroup."""
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace, **meta}, "spec": {"minMember": min_member}}


def gang_pod(name: str, group: str, *, min_available: Any = None, style: Literal["x", "sigs"] = "x",
             labels: dict | None = None, **kw: Any) -> dict:
    """A pod of plain gang ``group``: ``style="x"`` uses ``scheduling.x-k8s.io/pod-group``, ``"sigs"`` the
    ``pod-group.scheduling.sigs.k8s.io/name`` label; ``min_available`` adds the min-available label."""
    lab = dict(labels or {})
    lab["scheduling.x-k8s.io/pod-group" if style == "x" else "pod-group.scheduling.sigs.k8s.io/name"] = group
    if min_available is not None:
        lab["pod-group.scheduling.sigs.k8s.io/min-available"] = min_available
    return pod(name, labels=lab, **kw)


def with_status(obj: dict, **status: Any) -> dict:
    out = copy.deepcopy(obj)
    out["status"] = {**out.get("status", {}), **status}
    return out
