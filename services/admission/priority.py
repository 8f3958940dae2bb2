"""PriorityClass registry (user classes + KAI's built-ins) and preemptibility.

Where the class name comes from: the object's label ``priorityClassName`` or
``ray.io/priority-class-name``, else the head (or pod) template's ``spec.priorityClassName``.
A user PriorityClass overrides a built-in of the same name. Workloads that name none get the
``globalDefault`` class (the lowest value if several claim it, as Kubernetes does), else 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from services.admission.fields import Invalid, integer, show

BUILTIN_CLASSES: dict[str, int] = {"train": 50, "build-preemptible": 75, "build": 100, "inference": 125}
"""KAI Scheduler's default PriorityClasses."""

NON_PREEMPTIBLE_FROM = 100
"""KAI: a workload of priority ≥ 100 is non-preemptible unless its label says otherwise."""

CLASS_LABELS = ("priorityClassName", "ray.io/priority-class-name")
INT32 = (-2**31, 2**31 - 1)
"""A PriorityClass value is a Kubernetes int32 (the API server refuses others)."""
PREEMPTIBILITY_LABEL = "kai.scheduler/preemptibility"
PREEMPTIBILITY_VALUES = {"preemptible": True, "non-preemptible": False}


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


def preemptible(priority: int, labels: Mapping[str, str]) -> bool:
    raw = labels.get(PREEMPTIBILITY_LABEL)
    if raw is None:
        return priority < NON_PREEMPTIBLE_FROM
    if raw not in PREEMPTIBILITY_VALUES:
        raise Invalid(f"metadata.labels.{PREEMPTIBILITY_LABEL}: {show(raw)} is not one of "
                      f"{', '.join(PREEMPTIBILITY_VALUES)}")
    return PREEMPTIBILITY_VALUES[raw]


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
