"""Plain pod gangs (coscheduling style) and single pods: which pods belong to a gang, and how many it needs.

A pod joins gang ``namespace/G`` through label ``scheduling.x-k8s.io/pod-group: G`` or
``pod-group.scheduling.sigs.k8s.io/name: G``. Only pods for our scheduler (``spec.schedulerName``
one muster answers to, or unset) are members; before submission only unbound, unfinished members
count toward min-available. The minimum comes from a ``scheduling.x-k8s.io`` PodGroup named G
(``spec.minMember``), else the ``pod-group.scheduling.sigs.k8s.io/min-available`` label.

The gang is the minimum, not every pod: the first min-available waiting pods, grouped by shape into
pod sets ``pods``, ``pods-2``, ... (first shape seen first), make the gang's minimum, frozen at
submission. Every further live pod of the group is elastic: it runs alone when quota and capacity
allow (Volcano's tasks beyond minAvailable). A submitted gang whose live pods fall below its
minimum (its evicted pods are not recreated: plain pods have no controller) is held, as Volcano's
gang plugin holds a job with fewer valid tasks than minAvailable, until pods come again.

A pod addressed to muster by name (``spec.schedulerName``) with no group is a gang of one of its own
(KAI's pod grouper and Volcano do the same): workload ``namespace/<pod name>`` of kind ``Pod``.
KubeRay's own pods (``ray.io/*`` labels) are never plain gang members: their RayCluster is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

from services.admission.fields import Invalid, integer, show
from services.admission.pods import pod_set
from shared import kube
from shared.model import Gang, PodSet, WorkloadSpec

COSCHEDULING_GROUPS = ("scheduling.x-k8s.io", "scheduling.sigs.k8s.io")
FINISHED_PHASES = ("Succeeded", "Failed")
RAY_OWNERS = ("RayCluster", "RayJob")

GangKind = Literal["PodGroup", "Pod"]


@dataclass
class PodGang:
    """One pod group's (or single pod's) members and lifecycle (a new incarnation starts after all pods are gone)."""

    key: str
    namespace: str
    group: str
    kind: GangKind = "PodGroup"
    members: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    ready_at: float | None = None
    template: tuple[str, Mapping[str, Any]] | None = None
    """(name, pod) whose labels give queue and priority; frozen once submitted."""
    shapes: list[PodSet] = field(default_factory=list)
    """One pod set per shape seen in this incarnation, first seen first (their names never change)."""
    minimums: dict[str, int] | None = None
    """Pods per pod set in the gang's minimum, frozen at submission."""
    minimum: int = 0
    """The minimum the frozen counts were taken for (a changed minMember takes them again)."""
    spec: WorkloadSpec | None = None
    rejected: str | None = None
    finished: bool = False

    @property
    def submitted(self) -> bool:
        return self.spec is not None

    @property
    def wid(self) -> str:
        """``Kind:namespace/name``: a single pod and a pod group may share a key (the claim refuses one)."""
        return f"{self.kind}:{self.key}"

    def live(self) -> list[tuple[str, Mapping[str, Any]]]:
        """Members that are not finished: the pods the gang may still run (Volcano's valid tasks)."""
        return [(n, p) for n, p in self.members.items() if _phase(p) not in FINISHED_PHASES]

    def waiting(self) -> list[tuple[str, Mapping[str, Any]]]:
        """Members that count toward min-available before submission: not bound, not finished."""
        return [(n, p) for n, p in self.live() if not _bound(p)]

    def all_finished(self) -> bool:
        return bool(self.members) and all(_phase(p) in FINISHED_PHASES for p in self.members.values())

    def outcome(self) -> tuple[str, str]:
        failed = sum(1 for p in self.members.values() if _phase(p) == "Failed")
        total = len(self.members)
        return ("Failed" if failed else "Succeeded"), f"all {total} pods finished: {total - failed} Succeeded, {failed} Failed"

    def pod_set_of(self, pod_name: str, pod: Mapping[str, Any]) -> PodSet:
        """The pod set of this pod's shape, registered the first time it is seen; raises ``Invalid``."""
        try:
            mine = pod_set("pods", 1, pod, "")
        except Invalid as exc:
            raise Invalid(f"pod {pod_name}: {exc.reason}") from None
        for known in self.shapes:
            if known.shape == mine.shape:
                return known
        named = mine.model_copy(update={"name": "pods" if not self.shapes else f"pods-{len(self.shapes) + 1}"})
        self.shapes.append(named)
        return named

    def gang(self, minimum: int) -> Gang:
        """The gang: frozen minimum counts per shape, every further live pod elastic.

        Before submission the minimum is taken from the first ``minimum`` waiting pods (their shapes
        are what has to start together); if the minimum later exceeds what was counted (a PodGroup's
        minMember raised), the first shape counts the difference.
        """
        if self.minimums is None or self.minimum != minimum:
            counts: dict[str, int] = {}
            for name, pod in self.waiting()[:minimum]:
                ps = self.pod_set_of(name, pod)
                counts[ps.name] = counts.get(ps.name, 0) + 1
            if self.shapes:
                first = self.shapes[0].name
                counts[first] = counts.get(first, 0) + max(0, minimum - sum(counts.values()))
            self.minimums, self.minimum = counts, minimum
        live: dict[str, int] = {}
        for name, pod in self.live():
            ps = self.pod_set_of(name, pod)
            live[ps.name] = live.get(ps.name, 0) + 1
        sets = []
        for ps in self.shapes:
            count = self.minimums.get(ps.name, 0)
            elastic = max(0, live.get(ps.name, 0) - count)
            if count or elastic:
                sets.append(ps.model_copy(update={"count": count, "elastic": elastic}))
        return Gang(min_member=sum(ps.count for ps in sets), pod_sets=tuple(sets))

    def not_ready(self, minimum: int) -> str:
        """Why a submitted gang cannot start now: fewer live pods than its minimum ("" when it has them)."""
        valid = sum(1 for p in self.members.values() if _phase(p) != "Failed")  # Volcano counts Succeeded too
        if valid >= minimum:
            return ""
        return (f"Not enough valid tasks for gang-scheduling, valid: {valid}, min: {minimum} "
                f"(pod group {self.group} waits for its pods)")


def shape(ps: PodSet) -> tuple:
    """What makes two pods interchangeable for placement: requests, GPU share and node constraints."""
    return ps.shape


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


def is_ray_pod(pod: Mapping[str, Any]) -> bool:
    """A pod KubeRay made (head, worker or a RayJob's submitter): its RayCluster or RayJob is the workload."""
    labels = _labels(pod)
    return bool(labels.get(kube.RAY_NODE_TYPE) or labels.get(kube.RAY_CLUSTER) or labels.get(kube.RAY_ORIGIN_KIND))


def group_of(pod: Mapping[str, Any]) -> str | None:
    """G for a plain gang member, None for KubeRay pods and pods without a group label."""
    if is_ray_pod(pod):
        return None
    labels = _labels(pod)
    group = labels.get(kube.POD_GROUP_X) or labels.get(kube.POD_GROUP_NAME)
    return group if isinstance(group, str) and group else None


def scheduler_of(pod: Mapping[str, Any]) -> str:
    spec = pod.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) else ""


def is_coscheduling_podgroup(api_version: str, obj: Mapping[str, Any]) -> bool:
    """A coscheduling PodGroup a user wrote (not Volcano's, not one KubeRay made for a RayCluster)."""
    if api_version.split("/", 1)[0] not in COSCHEDULING_GROUPS:
        return False
    return ray_owner(obj) is None


def ray_owner(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the RayCluster or RayJob that owns ``obj`` (a PodGroup KubeRay made), else None."""
    meta = obj.get("metadata")
    owners = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    for owner in owners if isinstance(owners, list) else []:
        if isinstance(owner, Mapping) and owner.get("kind") in RAY_OWNERS and isinstance(owner.get("name"), str):
            return owner["kind"], owner["name"]
    return None


class PodGangBook:
    """Pod groups and single pods by key, their members, and the PodGroup objects that give their minimum."""

    def __init__(self, answers_to: Callable[[str], bool]) -> None:
        self.answers_to = answers_to
        """``Policy.answers_to``: whether a scheduler name is one muster answers to."""
        self.gangs: dict[str, PodGang] = {}
        """By ``PodGang.wid``."""
        self.podgroups: dict[str, Mapping[str, Any]] = {}
        self._pod_gang: dict[str, str] = {}
        """Pod ``namespace/name`` -> the wid of the gang it is a member of."""

    def _membership(self, change: str, namespace: str, name: str, pod: Mapping[str, Any]) -> tuple[str, GangKind] | None:
        """(gang key, kind) the pod belongs to now, or None."""
        if change == "Deleted":
            return None
        scheduler = scheduler_of(pod)
        group = group_of(pod)
        if group is not None:
            return (f"{namespace}/{group}", "PodGroup") if not scheduler or self.answers_to(scheduler) else None
        if is_ray_pod(pod) or not self.answers_to(scheduler):
            return None
        key = f"{namespace}/{name}"
        if f"Pod:{key}" not in self.gangs and (_bound(pod) or _phase(pod) in FINISHED_PHASES):
            return None  # a single pod is a workload only when muster saw it wait for a node
        return key, "Pod"

    def observe_pod(self, change: str, namespace: str, name: str, pod: Mapping[str, Any]) -> list[PodGang]:
        """Record a pod change; returns the gangs it touched (the one it left and/or joined)."""
        pod_key = f"{namespace}/{name}"
        touched: list[PodGang] = []
        old = self._pod_gang.get(pod_key)
        membership = self._membership(change, namespace, name, pod)
        new = f"{membership[1]}:{membership[0]}" if membership else None
        if old is not None and old != new:
            gang = self.gangs.get(old)
            if gang is not None and gang.members.pop(name, None) is not None:
                touched.append(gang)
            del self._pod_gang[pod_key]
        if membership is not None and new is not None:
            key, kind = membership
            gang = self.gangs.get(new)
            if gang is None:
                gang = self.gangs[new] = PodGang(key=key, namespace=namespace, group=key.partition("/")[2], kind=kind)
            gang.members[name] = pod
            self._pod_gang[pod_key] = new
            touched.append(gang)
        return touched

    def observe_podgroup(self, change: str, key: str, obj: Mapping[str, Any]) -> PodGang | None:
        if change == "Deleted":
            self.podgroups.pop(key, None)
        else:
            self.podgroups[key] = obj
        return self.gangs.get(f"PodGroup:{key}")

    def forget(self, gang: PodGang) -> None:
        """All pods of the gang are gone: the next pod with this group starts a new gang."""
        if self.gangs.get(gang.wid) is gang:
            del self.gangs[gang.wid]

    def min_available(self, gang: PodGang) -> int | None:
        """The gang's minimum, or None while nothing says it yet; raises ``Invalid`` for bad values."""
        if gang.kind == "Pod":
            return 1
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
