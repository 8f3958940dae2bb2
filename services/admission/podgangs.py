"""Plain pod gangs (coscheduling and Volcano style) and single pods: which pods belong to a gang, and
how many it needs.

A pod joins gang ``namespace/G`` through label ``scheduling.x-k8s.io/pod-group: G`` or
``pod-group.scheduling.sigs.k8s.io/name: G`` (coscheduling), or Volcano's annotation
``scheduling.k8s.io/group-name: G``. Only pods for a scheduler muster answers to (``Policy.answers_to``
of their ``spec.schedulerName``; unset is ``default-scheduler``, as the API server defaults it) are members; before submission only unbound, unfinished members count toward
the minimum. The minimum comes from a PodGroup named G (``scheduling.x-k8s.io`` or Volcano's
``scheduling.volcano.sh``: ``spec.minMember``, and Volcano's ``spec.minTaskMember`` per task, the
task named by the pod's ``volcano.sh/task-spec`` annotation), else the
``pod-group.scheduling.sigs.k8s.io/min-available`` label. A Volcano PodGroup's ``spec.queue`` and
``spec.priorityClassName`` choose the queue and the priority.

The gang is the minimum, not every pod: each task's minTaskMember pods, then the first waiting pods
up to minMember, grouped by task and shape into pod sets (``pods``, ``pods-2``, ... without a task;
the task's name, ``<task>-2``, ... with one), make the composition of the minimum tried first,
frozen at submission (what the queue reserves quota for). The gang is ``interchangeable``: any
minMember pods of the group that fit together satisfy it, each task at least its minTaskMember
(coscheduling's Permit and Volcano's gang plugin count pods, not particular ones), so placement
takes other members in place of first pods that find no node (``Gang.task_minimums``,
``services.placement.gang``). Every further live pod of the group is elastic: it runs alone when
quota and capacity allow (Volcano's tasks beyond minAvailable). A submitted gang whose valid pods fall below its minimum (its evicted
pods are not recreated: plain pods have no controller) is held, as Volcano's gang plugin holds a
job with fewer valid tasks than minAvailable, until pods come again.

A pod addressed to muster by name (``spec.schedulerName``) with no group is a gang of one of its own
(KAI's pod grouper and Volcano do the same): workload ``namespace/<pod name>`` of kind ``Pod``. A pod
that names no scheduler (``default-scheduler``) never is, even where muster answers to that name (the
simulator, standing in for kube-scheduler for KubeRay's pods): it is kube-scheduler's.
KubeRay's own pods (``ray.io/*`` labels) are never plain gang members: their RayCluster is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from services.admission.fields import Invalid, integer, opt_mapping, show
from services.admission.pods import pod_set
from shared.kernel import kube
from shared.kernel.model import Gang, PodSet, WorkloadSpec

POD_GROUP_APIS = ("scheduling.x-k8s.io", "scheduling.sigs.k8s.io", "scheduling.volcano.sh")
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
    shapes: list[tuple[str, PodSet]] = field(default_factory=list)
    """(task, pod set) per task and shape seen in this incarnation, first seen first (names never change)."""
    sets: dict[str, PodSet] = field(default_factory=dict)
    """Member name -> its pod set, read once: a pod's spec does not change, and what muster writes on it
    when it binds it (``gpu-fraction``, ``muster.dev/*``) must not make it another shape."""
    minimums: dict[str, int] | None = None
    """Pods per pod set in the gang's minimum, frozen at submission."""
    minimum: tuple[int, tuple[tuple[str, int], ...]] = (0, ())
    """The minimum the frozen counts were taken for (a changed minMember takes them again)."""
    spec: WorkloadSpec | None = None
    rejected: str | None = None
    warned: str = ""
    """The last ``WorkloadWarned`` reason told of it (a warning is told once, and again when it changes)."""
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

    def outcome(self) -> tuple[Literal["Succeeded", "Failed"], str]:
        failed = sum(1 for p in self.members.values() if _phase(p) == "Failed")
        total = len(self.members)
        return ("Failed" if failed else "Succeeded"), f"all {total} pods finished: {total - failed} Succeeded, {failed} Failed"

    def pod_set_of(self, pod_name: str, pod: Mapping[str, Any]) -> PodSet:
        """The pod set of this pod's task and shape, registered the first time it is seen; raises ``Invalid``."""
        known_set = self.sets.get(pod_name)
        if known_set is not None:
            return known_set
        self.sets[pod_name] = named = self._register(pod_name, pod)
        return named

    def _register(self, pod_name: str, pod: Mapping[str, Any]) -> PodSet:
        try:
            mine = pod_set("pods", 1, pod, "", namespace=self.namespace)
        except Invalid as exc:
            raise Invalid(f"pod {pod_name}: {exc.reason}") from None
        task = task_of(pod)
        same_task = [known for t, known in self.shapes if t == task]
        for known in same_task:
            if known.shape == mine.shape:
                return known
        base = task or "pods"
        named = mine.model_copy(update={"name": base if not same_task else f"{base}-{len(same_task) + 1}",
                                        "task": task})
        self.shapes.append((task, named))
        return named

    def ready(self, minimum: int, tasks: Mapping[str, int]) -> bool:
        """Enough waiting pods to submit: the minimum in all, and each task's own minimum."""
        waiting = self.waiting()
        return len(waiting) >= minimum and all(sum(1 for _, p in waiting if task_of(p) == task) >= n
                                               for task, n in tasks.items())

    def gang(self, minimum: int, tasks: Mapping[str, int]) -> Gang:
        """The gang: frozen minimum counts per pod set, every further live pod elastic.

        Before submission the minimum is taken from the waiting pods in the order they came: each
        task's minTaskMember pods first, then any up to minMember (their tasks and shapes are what has
        to start together); if the minimum later exceeds what was counted (a PodGroup's minMember
        raised), the first pod set counts the difference.
        """
        wanted = (minimum, tuple(sorted(tasks.items())))
        if self.minimums is None or self.minimum != wanted:
            counts: dict[str, int] = {}
            taken: dict[str, None] = {}
            waiting = self.waiting()
            for task, n in tasks.items():
                for name, pod in [(nm, p) for nm, p in waiting if task_of(p) == task][:n]:
                    taken[name] = None
            rest = max(minimum, sum(tasks.values())) - len(taken)
            for name, _ in waiting:
                if rest <= 0:
                    break
                if name not in taken:
                    taken[name] = None
                    rest -= 1
            for name, pod in waiting:
                if name in taken:
                    ps = self.pod_set_of(name, pod)
                    counts[ps.name] = counts.get(ps.name, 0) + 1
            if self.shapes:
                first = self.shapes[0][1].name
                counts[first] = counts.get(first, 0) + max(0, rest)
            self.minimums, self.minimum = counts, wanted
        live: dict[str, int] = {}
        for name, pod in self.live():
            ps = self.pod_set_of(name, pod)
            live[ps.name] = live.get(ps.name, 0) + 1
        sets = []
        for _, ps in self.shapes:
            count = self.minimums.get(ps.name, 0)
            elastic = max(0, live.get(ps.name, 0) - count)
            if count or elastic:
                sets.append(ps.model_copy(update={"count": count, "elastic": elastic}))
        return Gang(min_member=sum(ps.count for ps in sets), pod_sets=tuple(sets), interchangeable=self.kind == "PodGroup",
                    task_minimums=tuple(sorted((task, n) for task, n in tasks.items() if n > 0)))

    def not_ready(self, minimum: int, tasks: Mapping[str, int]) -> str:
        """Why a submitted gang cannot start now: fewer valid pods than its minimum, in all or of a task
        (Volcano's gang plugin: Succeeded pods are valid too); "" when it has them."""
        valid = [p for p in self.members.values() if _phase(p) != "Failed"]
        for task, n in tasks.items():
            have = sum(1 for p in valid if task_of(p) == task)
            if have < n:
                return (f"Not enough valid pods of each task for gang-scheduling: task {task} has {have}, "
                        f"minTaskMember {n} (pod group {self.group} waits for its pods)")
        if len(valid) >= minimum:
            return ""
        return (f"Not enough valid tasks for gang-scheduling, valid: {len(valid)}, min: {minimum} "
                f"(pod group {self.group} waits for its pods)")


def _phase(pod: Mapping[str, Any]) -> str:
    status = pod.get("status")
    return status.get("phase", "") if isinstance(status, Mapping) else ""


def _bound(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec")
    return isinstance(spec, Mapping) and bool(spec.get("nodeName"))


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """Labels, tolerating a malformed metadata (the shape is reported later, when the pod is parsed)."""
    meta = obj.get("metadata")
    labels = meta.get("labels") if type(meta) is dict or isinstance(meta, Mapping) else None  # dict first: no ABC frame
    return labels if type(labels) is dict or isinstance(labels, Mapping) else {}


def group_of(pod: Mapping[str, Any]) -> str | None:
    """G for a plain gang member, None for KubeRay pods and pods that name no group."""
    return None if kube.is_ray_pod(pod) else kube.pod_group_of(pod)


def task_of(pod: Mapping[str, Any]) -> str:
    """The pod's Volcano task (``volcano.sh/task-spec``), "" when it names none."""
    task = kube.annotations(pod).get(kube.VOLCANO_TASK)
    return task if isinstance(task, str) else ""


def scheduler_of(pod: Mapping[str, Any]) -> str:
    spec = pod.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) else ""


def is_plain_podgroup(api_version: str, obj: Mapping[str, Any]) -> bool:
    """A coscheduling or Volcano PodGroup for plain pods (not one KubeRay made for a RayCluster/RayJob)."""
    if api_version.split("/", 1)[0] not in POD_GROUP_APIS:
        return False
    return ray_owner(obj) is None


def ray_owner(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the RayCluster or RayJob that owns ``obj`` (a PodGroup KubeRay made), else None."""
    meta = obj.get("metadata")
    owners = meta.get("ownerReferences") if type(meta) is dict or isinstance(meta, Mapping) else None
    for owner in owners if isinstance(owners, list) else []:
        if (type(owner) is dict or isinstance(owner, Mapping)) and owner.get("kind") in RAY_OWNERS and isinstance(owner.get("name"), str):
            return owner["kind"], owner["name"]
    return None


class PodGangBook:
    """Pod groups and single pods by key, their members, and the PodGroup objects that give their minimum."""

    def __init__(self, answers_to: Callable[[str | None], bool]) -> None:
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
            return (f"{namespace}/{group}", "PodGroup") if self.answers_to(scheduler) else None
        if kube.is_ray_pod(pod) or (scheduler or kube.DEFAULT_SCHEDULER) == kube.DEFAULT_SCHEDULER \
                or not self.answers_to(scheduler):
            return None  # a gang of one names its scheduler: kube-scheduler's own pods are never one
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
                gang.sets.pop(name, None)
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

    def min_available(self, gang: PodGang) -> tuple[int, dict[str, int]] | None:
        """(the gang's minimum, each task's minimum), or None while nothing says it yet; raises
        ``Invalid`` for bad values."""
        if gang.kind == "Pod":
            return 1, {}
        podgroup = self.podgroups.get(gang.key)
        if podgroup is not None:
            spec = podgroup.get("spec")
            where = f"PodGroup {gang.key} spec"
            if not isinstance(spec, Mapping) or spec.get("minMember") is None:
                raise Invalid(f"{where}.minMember: missing")
            tasks = opt_mapping(spec.get("minTaskMember"), f"{where}.minTaskMember")
            return (integer(spec.get("minMember"), f"{where}.minMember", default=1, minimum=1),
                    {str(t): integer(n, f"{where}.minTaskMember.{t}", default=0) for t, n in tasks.items()})
        for name, pod in gang.members.items():
            raw = _labels(pod).get(kube.POD_GROUP_MIN)
            if raw is None:
                continue
            where = f"pod {name} metadata.labels.{kube.POD_GROUP_MIN}"
            if isinstance(raw, str) and raw.strip().isdigit():
                raw = int(raw.strip())
            if not isinstance(raw, int) or isinstance(raw, bool):
                raise Invalid(f"{where}: {show(raw)} is not an integer")
            return integer(raw, where, default=1, minimum=1), {}
        return None

    def group_spec(self, gang: PodGang) -> Mapping[str, Any]:
        """The spec of the PodGroup that defines the gang (queue, priorityClassName), empty without one."""
        spec = self.podgroups.get(gang.key, {}).get("spec")
        return spec if isinstance(spec, Mapping) else {}
