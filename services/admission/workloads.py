"""RayCluster / RayJob → the gang KubeRay's batch schedulers would ask for.

The pods are KubeRay's (``utils.CalculateDesiredReplicas``): head 1; per worker group
clamp(replicas, minReplicas, maxReplicas) × numOfHosts, 0 when the group is suspended; a K8sJobMode
RayJob adds its submitter pod outside the gang. Which of them form the gang's minimum and which are
elastic, and whether the submitter is charged, is the queue dialect's rule (``dialects.py``); a
PodGroup KubeRay made for the workload overrides the minimum with its ``minMember``. Unlike KubeRay,
minReplicas > maxReplicas is a rejection (KubeRay silently uses maxReplicas). Like KubeRay, a RayJob
that is suspended while ``shutdownAfterJobFinishes`` is not true is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from services.admission.dialects import GangRules
from services.admission.fields import (
    Invalid, boolean, integer, mapping, opt_list, opt_mapping, quantities, show, string,
)
from services.admission.pods import pod_set
from shared.kernel import kube
from shared.kernel import quantity as q
from shared.kernel.model import Gang, PodSet

MAX_REPLICAS_DEFAULT = 2**31 - 1
"""KubeRay's CRD default for ``maxReplicas`` (MaxInt32)."""

SUBMITTER_DEFAULT: q.Resources = {q.CPU: 500, q.MEMORY: 200 * 1024**2 * 1000}
"""KubeRay's default submitter requests: 500m CPU, 200Mi memory."""

SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "SidecarMode", "InteractiveMode")

TERMINAL_JOB_STATUS = ("SUCCEEDED", "FAILED")
TERMINAL_DEPLOYMENT_STATUS = ("Complete", "Failed")
RuntimeClasses = Mapping[str, Mapping[str, Any]]
"""RuntimeClass objects by name, as ingest keeps them (``overhead``, ``scheduling``)."""
NO_RUNTIME_CLASSES: RuntimeClasses = {}


@dataclass(frozen=True)
class RayShape:
    """What a Ray object says about its gang; queue and priority are resolved by the core."""

    gang: Gang
    cluster_name: str
    head_priority_class: str | None
    head_priority_field: str


def is_rayjob_cluster(obj: Mapping[str, Any]) -> bool:
    """A RayCluster KubeRay created for a RayJob: the RayJob is the workload, so admission skips it."""
    meta = obj.get("metadata")
    if not (type(meta) is dict or isinstance(meta, Mapping)):  # dict first: no ABC frame
        return False
    labels = meta.get("labels")
    if (type(labels) is dict or isinstance(labels, Mapping)) and labels.get(kube.RAY_ORIGIN_KIND) == "RayJob":
        return True
    owners = meta.get("ownerReferences")
    return isinstance(owners, list) and any(isinstance(o, Mapping) and o.get("kind") == "RayJob" for o in owners)


def spec_suspended(obj: Mapping[str, Any]) -> bool:
    """``spec.suspend: true`` right now (the core keeps the value seen at creation as the gate)."""
    spec = obj.get("spec")
    return isinstance(spec, Mapping) and spec.get("suspend") is True


def worker_counts(group: Mapping[str, Any], where: str, autoscaling: bool, rules: GangRules) -> tuple[int, int]:
    """(pods in the gang's minimum, pods KubeRay creates) for one worker group.

    KubeRay creates clamp(replicas, minReplicas, maxReplicas) × numOfHosts pods (the Ray autoscaler
    moves ``replicas``), none for a suspended group; the dialect says how many of them start together.
    """
    replicas = integer(group.get("replicas"), f"{where}.replicas", default=0)
    minimum = integer(group.get("minReplicas"), f"{where}.minReplicas", default=0)
    maximum = integer(group.get("maxReplicas"), f"{where}.maxReplicas", default=MAX_REPLICAS_DEFAULT)
    hosts = integer(group.get("numOfHosts"), f"{where}.numOfHosts", default=1, minimum=1)
    if minimum > maximum:
        raise Invalid(f"{where}.minReplicas: {minimum} is greater than maxReplicas {maximum}")
    if boolean(group.get("suspend"), f"{where}.suspend", default=False):
        return 0, 0
    desired = min(max(replicas, minimum), maximum) * hosts
    return rules.worker_minimum(desired, minimum, hosts, autoscaling), desired


def cluster_pod_sets(spec: Mapping[str, Any], prefix: str, rules: GangRules, *,
                     head_extra: q.Resources | None = None, namespace: str = "default",
                     runtime_classes: RuntimeClasses = NO_RUNTIME_CLASSES) -> list[PodSet]:
    """Head then worker groups in order, from a RayClusterSpec at path ``prefix`` (``spec`` or ``spec.rayClusterSpec``)."""
    head = mapping(spec.get("headGroupSpec"), f"{prefix}.headGroupSpec")
    autoscaling = boolean(spec.get("enableInTreeAutoscaling"), f"{prefix}.enableInTreeAutoscaling", default=False)
    autoscaler = kube.autoscaler_container(spec)
    if autoscaler is not None:  # KubeRay adds it to the head pod: the head asks for it too
        options = opt_mapping(spec.get("autoscalerOptions"), f"{prefix}.autoscalerOptions")
        res = opt_mapping(options.get("resources"), f"{prefix}.autoscalerOptions.resources")
        for part in ("requests", "limits"):
            quantities(res.get(part), f"{prefix}.autoscalerOptions.resources.{part}")
        try:
            head_extra = q.add(head_extra or {}, kube.container_requests(autoscaler, f"{prefix}.autoscalerOptions"))
        except q.QuantityError as exc:
            raise Invalid(str(exc)) from None
    sets = [pod_set("head", 1, head.get("template"), f"{prefix}.headGroupSpec.template", extra=head_extra,
                    namespace=namespace, runtime_classes=runtime_classes)]
    names = ["head"]
    for i, raw in enumerate(opt_list(spec.get("workerGroupSpecs"), f"{prefix}.workerGroupSpecs")):
        group = mapping(raw, f"{prefix}.workerGroupSpecs[{i}]")
        name = string(group.get("groupName"), f"{prefix}.workerGroupSpecs[{i}].groupName")
        if not name:
            raise Invalid(f"{prefix}.workerGroupSpecs[{i}].groupName: missing")
        if name in names or name == "submitter":
            raise Invalid(f"{prefix}.workerGroupSpecs[{i}].groupName: {show(name)} names another pod set of this workload")
        names.append(name)
        where = f"{prefix}.workerGroupSpecs[{name}]"
        minimum, desired = worker_counts(group, where, autoscaling, rules)
        sets.append(pod_set(name, minimum, group.get("template"), f"{where}.template", namespace=namespace,
                            runtime_classes=runtime_classes).model_copy(
            update={"elastic": desired - minimum}))
    return sets


def gang_of(sets: list[PodSet]) -> Gang:
    return Gang(min_member=sum(ps.count for ps in sets if ps.in_gang), pod_sets=tuple(sets))


def with_minimum(gang: Gang, min_member: int) -> Gang:
    """The gang with ``min_member`` pods in its minimum (a PodGroup's ``minMember`` KubeRay wrote):
    taken from the pod sets in order (head first), every pod beyond it elastic. Never more than the
    workload has pods: a stale PodGroup cannot ask for pods KubeRay will not create."""
    left = min_member
    sets = []
    same = True
    for ps in gang.pod_sets:
        if not ps.in_gang:
            sets.append(ps)
            continue
        take = min(left, ps.desired)
        left -= take
        if take == ps.count and ps.desired - take == ps.elastic:
            sets.append(ps)  # what ``model_copy`` would make of it: equal, so kept
        else:
            same = False
            sets.append(ps.model_copy(update={"count": take, "elastic": ps.desired - take}))
    if same and gang.min_member == sum(ps.count for ps in sets if ps.in_gang):
        return gang  # ``gang_of(sets)`` would equal it: every PodGroup event of a Ray workload asks again
    return gang_of(sets)


def _head_priority(spec: Mapping[str, Any], prefix: str) -> tuple[str | None, str]:
    """``priorityClassName`` of the head pod template (already shape-checked by ``cluster_pod_sets``)."""
    where = f"{prefix}.headGroupSpec.template.spec.priorityClassName"
    raw = spec["headGroupSpec"]["template"]["spec"].get("priorityClassName")
    return (string(raw, where) or None), where


def parse_ray_cluster(name: str, obj: Mapping[str, Any], rules: GangRules,
                      runtime_classes: RuntimeClasses = NO_RUNTIME_CLASSES) -> RayShape:
    """The gang of a RayCluster, its pods counted as the API server will admit them (``runtime_classes``)."""
    spec = mapping(obj.get("spec"), "spec")
    sets = cluster_pod_sets(spec, "spec", rules, namespace=namespace_of(obj), runtime_classes=runtime_classes)
    cls, field = _head_priority(spec, "spec")
    return RayShape(gang=gang_of(sets), cluster_name=ray_cluster_name("RayCluster", name), head_priority_class=cls,
                    head_priority_field=field)


def parse_ray_job(name: str, obj: Mapping[str, Any], rules: GangRules,
                  runtime_classes: RuntimeClasses = NO_RUNTIME_CLASSES) -> RayShape:
    """The gang of a RayJob, its pods counted as the API server will admit them (``runtime_classes``)."""
    spec = mapping(obj.get("spec"), "spec")
    selector = opt_mapping(spec.get("clusterSelector"), "spec.clusterSelector")
    if selector:
        raise Invalid("spec.clusterSelector: a RayJob that runs on an existing RayCluster has no gang of its own; "
                      "muster admits that RayCluster instead")
    shutdown = boolean(spec.get("shutdownAfterJobFinishes"), "spec.shutdownAfterJobFinishes", default=False)
    if spec.get("suspend") is True and not shutdown:
        # KubeRay's own ValidateRayJobSpec refuses this (Kueue's limitation): the finished job would keep its
        # cluster, so nobody could ever take the quota back by suspending it.
        raise Invalid("spec.shutdownAfterJobFinishes: false is not allowed with spec.suspend: true (KubeRay: a RayJob "
                      "with shutdownAfterJobFinishes set to false is not allowed to be suspended)")
    mode = string(spec.get("submissionMode"), "spec.submissionMode", default="K8sJobMode") or "K8sJobMode"
    if mode not in SUBMISSION_MODES:
        raise Invalid(f"spec.submissionMode: {show(mode)} is not one of {', '.join(SUBMISSION_MODES)}")
    cluster = mapping(spec.get("rayClusterSpec"), "spec.rayClusterSpec")
    sets = cluster_pod_sets(cluster, "spec.rayClusterSpec", rules,
                            head_extra=SUBMITTER_DEFAULT if mode == "SidecarMode" else None, namespace=namespace_of(obj),
                            runtime_classes=runtime_classes)
    if mode == "K8sJobMode":
        sets.append(submitter_pod_set(spec, namespace_of(obj), runtime_classes).model_copy(update={"charged": rules.charge_submitter}))
    cls, field = _head_priority(cluster, "spec.rayClusterSpec")
    return RayShape(gang=gang_of(sets), cluster_name=ray_cluster_name("RayJob", name),
                    head_priority_class=cls, head_priority_field=field)


def ray_cluster_name(kind: str, name: str) -> str:
    """The RayCluster whose pods form a RayCluster's or RayJob's gang: the part of a ``RayShape`` its
    parser reads from the workload's name (everything else comes from its ``spec``)."""
    return name if kind == "RayCluster" else kube.rayjob_cluster_name(name)


def submitter_pod_set(spec: Mapping[str, Any], namespace: str = "default",
                      runtime_classes: RuntimeClasses = NO_RUNTIME_CLASSES) -> PodSet:
    """The K8sJobMode submitter: placed with the gang, not counted in minMember."""
    template = spec.get("submitterPodTemplate")
    if template is None:
        return PodSet(name="submitter", count=1, in_gang=False, resources=dict(SUBMITTER_DEFAULT))
    return pod_set("submitter", 1, template, "spec.submitterPodTemplate", in_gang=False, namespace=namespace,
                   runtime_classes=runtime_classes)


def namespace_of(obj: Mapping[str, Any]) -> str:
    """Where the workload's claims live: its own namespace (``default`` when unset, as kubectl applies it)."""
    namespace = kube.meta(obj).get("namespace")
    return namespace if isinstance(namespace, str) and namespace else "default"


def rayjob_outcome(obj: Mapping[str, Any]) -> tuple[Literal["Succeeded", "Failed"], str] | None:
    """(outcome, reason) once the RayJob's status says it is over, else None."""
    status = obj.get("status")
    if not (type(status) is dict or isinstance(status, Mapping)):  # dict first: no ABC frame
        return None
    job, deployment = status.get("jobStatus"), status.get("jobDeploymentStatus")
    if job not in TERMINAL_JOB_STATUS and deployment not in TERMINAL_DEPLOYMENT_STATUS:
        return None
    outcome: Literal["Succeeded", "Failed"] = "Failed" if job == "FAILED" or deployment == "Failed" else "Succeeded"
    parts = [f"{k} {v}" for k, v in (("jobStatus", job), ("jobDeploymentStatus", deployment)) if isinstance(v, str) and v]
    reason = "RayJob finished: " + ", ".join(parts)
    message = status.get("message")
    if isinstance(message, str) and message:
        reason += f": {message}"
    return outcome, reason
