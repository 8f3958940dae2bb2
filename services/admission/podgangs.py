"""Plain pod gangs (coscheduling style): which pods belong to group G, and how many it needs.

A pod joins gang ``namespace/G`` through label ``scheduling.x-k8s.io/pod-group: G`` or
``pod-group.scheduling.sigs.k8s.io/name: G``. Only pods for a scheduler muster answers to
(``Policy.answers_to`` of their ``spec.schedulerName``; unset is ``default-scheduler``) are members; before submission only unbound, unfinished members
count toward min-available. The minimum comes from a ``scheduling.x-k8s.io`` PodGroup named G
(``spec.minMember``), else the ``pod-group.scheduling.sigs.k8s.io/min-available`` label.
The gang's pods need not be alike (an MPI launcher and its workers, a Spark driver and executors):
the first min-available waiting pods are grouped by shape into pod sets ``pods``, ``pods-2``, ...
(``gang_pod_sets``); placement matches each pod to the pod set of its shape.
KubeRay's own pods (``ray.io/*`` labels) are never plain gang members: their RayCluster is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from services.admission.fields import Invalid, integer, show
from services.admission.pods import pod_set
from shared import kube
from shared.model import PodSet, WorkloadSpec

COSCHEDULING_GROUPS = ("scheduling.x-k8s.io", "scheduling.sigs.k8s.io")
FINISHED_PHASES = ("Succeeded", "Failed")


@dataclass
class PodGang:
    """One pod group's members and lifecycle (a new incarnation starts after all pods are gone)."""

    key: str
    namespace: str
    group: str
    members: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    ready_at: float | None = None
    template: tuple[str, Mapping[str, Any]] | None = None
    """(name, pod) whose labels give queue and priority; frozen once submitted."""
    chosen: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    """The (name, pod)s whose shapes make up the gang: the first min-available waiting ones; frozen
    once submitted."""
    spec: WorkloadSpec | None = None
    rejected: str | None = None
    finished: bool = False

    @property
    def submitted(self) -> bool:
        return self.spec is not None

    def waiting(self) -> list[tuple[str, Mapping[str, Any]]]:
        """Members that count toward min-available: not bound, not finished."""
        return [(n, p) for n, p in self.members.items() if not _bound(p) and _phase(p) not in FINISHED_PHASES]

    def all_finished(self) -> bool:
        return bool(self.members) and all(_phase(p) in FINISHED_PHASES for p in self.members.values())

    def outcome(self) -> tuple[str, str]:
        failed = sum(1 for p in self.members.values() if _phase(p) == "Failed")
        total = len(self.members)
        return ("Failed" if failed else "Succeeded"), f"all {total} pods finished: {total - failed} Succeeded, {failed} Failed"


def shape(ps: PodSet) -> tuple:
    """What makes two pods interchangeable for placement: requests, GPU share and node constraints."""
    return (tuple(sorted(ps.resources.items())), ps.gpu_share, ps.constraint_key)


def gang_pod_sets(chosen: tuple[tuple[str, Mapping[str, Any]], ...], minimum: int) -> tuple[PodSet, ...]:
    """Pod sets ``pods``, ``pods-2``, ... of the chosen pods grouped by shape, in the order first seen.

    Before this, the gang took the first pod's shape for all its pods, so a larger pod bound to a
    smaller pod's reservation over-committed its node and was under-charged to its queue. If the
    minimum later exceeds the chosen pods (a PodGroup's minMember raised), the first shape counts
    the difference. Raises ``Invalid`` naming the pod.
    """
    groups: list[list[Any]] = []  # [PodSet, count]
    for pod_name, pod in chosen[:minimum]:
        try:
            ps = pod_set("pods", 1, pod, "")
        except Invalid as exc:
            raise Invalid(f"pod {pod_name}: {exc.reason}") from None
        for group in groups:
            if shape(group[0]) == shape(ps):
                group[1] += 1
                break
        else:
            groups.append([ps, 1])
    if groups:
        groups[0][1] += max(0, minimum - len(chosen))
    return tuple(ps.model_copy(update={"name": "pods" if i == 0 else f"pods-{i + 1}", "count": count})
                 for i, (ps, count) in enumerate(groups))


def _phase(pod: Mapping[str, Any]) -> str:
    status = pod.get("status")
    return status.get("phase", "") if isinstance(status, Mapping) else ""


def _bound(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec")
    return isinstance(spec, Mapping) and bool(spec.get("nodeName"))


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """Labels, tolerating a malformed metadata (the shape is reported later, when the pod is parsed)."""
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def group_of(pod: Mapping[str, Any]) -> str | None:
    """G for a plain gang member, None for KubeRay pods and pods without a group label."""
    labels = _labels(pod)
    if labels.get(kube.RAY_NODE_TYPE) or labels.get(kube.RAY_CLUSTER):
        return None
    group = labels.get(kube.POD_GROUP_X) or labels.get(kube.POD_GROUP_NAME)
    return group if isinstance(group, str) and group else None


def scheduler_of(pod: Mapping[str, Any]) -> str | None:
    """The pod's ``spec.schedulerName`` (None when unset or not a string)."""
    spec = pod.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) else None


def is_coscheduling_podgroup(api_version: str, obj: Mapping[str, Any]) -> bool:
    """A coscheduling PodGroup a user wrote (not Volcano's, not one KubeRay made for a RayCluster)."""
    if api_version.split("/", 1)[0] not in COSCHEDULING_GROUPS:
        return False
    meta = obj.get("metadata")
    owners = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    return not (isinstance(owners, list) and any(isinstance(o, Mapping) and o.get("kind") in ("RayCluster", "RayJob")
                                                  for o in owners))


class PodGangBook:
    """Pod groups by key, their members, and the PodGroup objects that give their minimum."""

    def __init__(self, answers_to: Callable[[str | None], bool]) -> None:
        self.answers_to = answers_to
        """``Policy.answers_to``: whether a pod's scheduler is one muster schedules for."""
        self.gangs: dict[str, PodGang] = {}
        self.podgroups: dict[str, Mapping[str, Any]] = {}
        self._pod_gang: dict[str, str] = {}

    def observe_pod(self, change: str, namespace: str, name: str, pod: Mapping[str, Any]) -> list[PodGang]:
        """Record a pod change; returns the gangs it touched (the one it left and/or joined)."""
        pod_key = f"{namespace}/{name}"
        touched: list[PodGang] = []
        old = self._pod_gang.get(pod_key)
        group = None if change == "Deleted" or not self.answers_to(scheduler_of(pod)) else group_of(pod)
        new = f"{namespace}/{group}" if group else None
        if old is not None and old != new:
            gang = self.gangs.get(old)
            if gang is not None and gang.members.pop(name, None) is not None:
                touched.append(gang)
            del self._pod_gang[pod_key]
        if new is not None and group is not None:
            gang = self.gangs.get(new)
            if gang is None:
                gang = self.gangs[new] = PodGang(key=new, namespace=namespace, group=group)
            gang.members[name] = pod
            self._pod_gang[pod_key] = new
            touched.append(gang)
        return touched

    def observe_podgroup(self, change: str, key: str, obj: Mapping[str, Any]) -> PodGang | None:
        if change == "Deleted":
            self.podgroups.pop(key, None)
        else:
            self.podgroups[key] = obj
        return self.gangs.get(key)

    def forget(self, gang: PodGang) -> None:
        """All pods of the gang are gone: the next pod with this group starts a new gang."""
        self.gangs.pop(gang.key, None)

    def min_available(self, gang: PodGang) -> int | None:
        """The gang's minimum, or None while nothing says it yet; raises ``Invalid`` for bad values."""
        podgroup = self.podgroups.get(gang.key)
        if podgroup is not None:
            spec = podgroup.get("spec")
            where = f"PodGroup {gang.key} spec.minMember"
            if not isinstance(spec, Mapping) or spec.get("minMember") is None:
                raise Invalid(f"{where}: missing")
            return integer(spec.get("minMember"), where, default=1, minimum=1)
        for name, pod in gang.members.items():
            raw = _labels(pod).get(kube.POD_GROUP_MIN)
            if raw is None:
                continue
            where = f"pod {name} metadata.labels.{kube.POD_GROUP_MIN}"
            if isinstance(raw, str) and raw.strip().isdigit():
                raw = int(raw.strip())
            if not isinstance(raw, int) or isinstance(raw, bool):
                raise Invalid(f"{where}: {show(raw)} is not an integer")
            return integer(raw, where, default=1, minimum=1)
        return None
