"""PriorityClass registry (user classes + KAI's built-ins) and preemptibility.

Where the class name comes from: the object's label ``priorityClassName`` or
``ray.io/priority-class-name``, else the head (or pod) template's ``spec.priorityClassName``.
A user PriorityClass overrides a built-in of the same name. Workloads that name none get the
``globalDefault`` class (the lowest value if several claim it, as Kubernetes does), else 0.

Preemptibility: the queue's dialect may make a priority non-preemptible (KAI: 100 and above); the
label ``kai.scheduler/preemptibility`` overrides that; ``volcano.sh/preemptable: "false"`` (annotation,
else label, as Volcano reads it) pins what it is written on (``volcano_pins``): on the object or its
PodGroup, every pod; on a pod template or a pod, the pods of its pod set, which keeps the whole gang
from being a victim (the rest of its minimum cannot go without them) and, where the dialect reads it
per pod (Volcano), leaves the other pod sets' elastic pods preemptible; elsewhere it pins the whole
workload. Explicit opt-outs hold in every queue: a user who wrote "never evict" is never overruled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterable

from services.admission.fields import Invalid, integer, show

BUILTIN_CLASSES: dict[str, int] = {"train": 50, "build-preemptible": 75, "build": 100, "inference": 125}
"""KAI Scheduler's default PriorityClasses."""

CLASS_LABELS = ("priorityClassName", "ray.io/priority-class-name")
INT32 = (-2**31, 2**31 - 1)
"""A PriorityClass value is a Kubernetes int32 (the API server refuses others)."""
PREEMPTIBILITY_LABEL = "kai.scheduler/preemptibility"
PREEMPTIBILITY_VALUES = {"preemptible": True, "non-preemptible": False}
VOLCANO_PREEMPTABLE = "volcano.sh/preemptable"
GO_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
            "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}
"""What Go's ``strconv.ParseBool`` accepts: Volcano reads ``volcano.sh/preemptable`` with it."""


@dataclass(frozen=True)
class _UserClass:
    value: int | None
    global_default: bool
    error: str | None = None


def class_name(labels: Mapping[str, str], template_class: str | None, template_field: str) -> tuple[str | None, str]:
    """(class name or None, the field it came from) — labels first, then the pod template."""
    for label in CLASS_LABELS:
        if labels.get(label):
            return labels[label], f"metadata.labels.{label}"
    return template_class, template_field


def preemptible(priority: int, labels: Mapping[str, str], non_preemptible_from: int | None) -> bool:
    """By the queue's dialect (``non_preemptible_from``: KAI 100, others none), then the KAI label."""
    raw = labels.get(PREEMPTIBILITY_LABEL)
    if raw is None:
        return non_preemptible_from is None or priority < non_preemptible_from
    if raw not in PREEMPTIBILITY_VALUES:
        raise Invalid(f"metadata.labels.{PREEMPTIBILITY_LABEL}: {show(raw)} is not one of "
                      f"{', '.join(PREEMPTIBILITY_VALUES)}")
    return PREEMPTIBILITY_VALUES[raw]


WHOLE = ""
"""In ``volcano_pins``: the metadata of the workload itself (its object, its PodGroup), not of one pod set."""


def volcano_pins(metas: Iterable[tuple[str, str, object]]) -> set[str]:
    """The pod sets (``WHOLE`` for the workload itself) whose ``(pod set, where, metadata)`` says
    ``volcano.sh/preemptable: "false"`` (a metadata that is no mapping, as a user's object may have, says
    nothing).

    As Volcano's ``GetPodPreemptable``: the annotation wins over the label. Volcano reads a value
    ``strconv.ParseBool`` refuses as false; muster rejects it naming the field instead (a typo must not
    silently pin a gang).
    """
    pinned: set[str] = set()
    for pod_set, where, meta in metas:
        if not (type(meta) is dict or isinstance(meta, Mapping)):  # dict first: no ABC frame
            continue
        for part in ("annotations", "labels"):
            values = meta.get(part)
            if values is None:
                continue
            raw = values.get(VOLCANO_PREEMPTABLE) if type(values) is dict or isinstance(values, Mapping) else None
            if raw is None:
                continue
            if not isinstance(raw, str) or raw not in GO_BOOLS:
                raise Invalid(f"{where}.{part}.{VOLCANO_PREEMPTABLE}: {show(raw)} is not true or false")
            if not GO_BOOLS[raw]:
                pinned.add(pod_set)
            break
    return pinned


def ray_pod_metas(kind: str, obj: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """(pod set, where, metadata) of a RayCluster / RayJob (``WHOLE``) and of each pod template in it
    (head, workers by group name, submitter)."""
    out: list[tuple[str, str, Mapping[str, Any]]] = [(WHOLE, "metadata", _meta(obj))]
    spec = obj.get("spec")
    if type(spec) is not dict and not isinstance(spec, Mapping):
        return out
    prefix = "spec"
    cluster: object = spec
    if kind == "RayJob":
        prefix, cluster = "spec.rayClusterSpec", spec.get("rayClusterSpec")
        out.append(("submitter", "spec.submitterPodTemplate.metadata", _meta(spec.get("submitterPodTemplate"))))
    if type(cluster) is not dict and not isinstance(cluster, Mapping):
        return out
    head = cluster.get("headGroupSpec")
    if type(head) is dict or isinstance(head, Mapping):
        out.append(("head", f"{prefix}.headGroupSpec.template.metadata", _meta(head.get("template"))))
    groups = cluster.get("workerGroupSpecs")
    for i, group in enumerate(groups if isinstance(groups, list) else []):
        if type(group) is dict or isinstance(group, Mapping):
            name = group.get("groupName") or i
            out.append((str(name), f"{prefix}.workerGroupSpecs[{name}].template.metadata", _meta(group.get("template"))))
    return out


def _meta(obj: object) -> Mapping[str, Any]:
    if obj is None:
        return {}
    meta = obj.get("metadata") if type(obj) is dict or isinstance(obj, Mapping) else None
    return meta if type(meta) is dict or (meta is not None and isinstance(meta, Mapping)) else {}


class PriorityBook:
    """PriorityClass objects seen so far, in arrival order."""

    def __init__(self) -> None:
        self._classes: dict[str, _UserClass] = {}

    def apply(self, name: str, obj: Mapping[str, Any]) -> bool:
        """Record a PriorityClass; True when what workloads would resolve to may have changed."""
        try:
            if obj.get("value") is None:
                raise Invalid("value: missing")
            entry = _UserClass(value=integer(obj.get("value"), "value", default=0, minimum=INT32[0], maximum=INT32[1]),
                               global_default=obj.get("globalDefault") is True)
        except Invalid as exc:
            entry = _UserClass(value=None, global_default=False, error=exc.reason)
        changed = self._classes.get(name) != entry
        self._classes[name] = entry
        return changed

    def delete(self, name: str) -> bool:
        return self._classes.pop(name, None) is not None

    def problem(self, name: str) -> str | None:
        """Why the class ``name`` cannot be used (None when it can or was never seen): the what-if
        refuses an ``--apply`` PriorityClass with it, as every workload naming it would be."""
        entry = self._classes.get(name)
        return entry.error if entry is not None and entry.value is None else None

    def default(self) -> tuple[int, str | None]:
        best: tuple[int, str] | None = None
        for name, entry in self._classes.items():
            if entry.global_default and entry.value is not None and (best is None or entry.value < best[0]):
                best = (entry.value, name)
        return best if best is not None else (0, None)

    def resolve(self, name: str | None, where: str) -> tuple[int, str | None]:
        """(priority, class name) for a workload; raises ``Invalid`` naming ``where`` for unknown classes."""
        if name is None:
            return self.default()
        entry = self._classes.get(name)
        if entry is not None:
            if entry.value is None:
                raise Invalid(f"{where}: priority class {show(name)} is invalid: {entry.error}")
            return entry.value, name
        if name in BUILTIN_CLASSES:
            return BUILTIN_CLASSES[name], name
        raise Invalid(f"{where}: priority class {show(name)} does not exist")
