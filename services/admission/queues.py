"""Volcano Queue, KAI Queue (v2) and ElasticQuotaTree → one tree of ``QueueSpec``; the book of defined queues.

Parsing is per dialect (``volcano_queue``, ``kai_queue``, ``elastic_quota_tree``); ``QueueBook``
owns what is defined, by which object, and turns object changes into QueueDefined / QueueRemoved /
QueueRejected. An invalid change keeps the previous definition (like a refusing webhook would).
"""

from __future__ import annotations

from collections.abc import Mapping
import re
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal
from typing import Any, Literal

from services.admission.dialects import queue_fields
from services.admission.fields import (Invalid, boolean, integer, number, mapping, not_refused, opt_list, opt_mapping,
                                      quantities, show, string)
from shared.kernel import kube
from shared.kernel import quantity as q
from shared.kernel.events import QueueDefined, QueueRejected, QueueRemoved
from shared.kernel.model import UNLIMITED, QueueSource, QueueSpec, QueueState
from shared.kernel.validation import one_of

VOLCANO_GROUP = "scheduling.volcano.sh"
KAI_GROUP = "scheduling.run.ai"
QUEUE_STATES: tuple[QueueState, ...] = ("Open", "Closed", "Closing")
WEIGHT_UNIT = 1000
"""``QueueSpec.weight`` is in thousandths: Volcano ``weight: 1`` and KAI ``overQuotaWeight: 1`` are 1000."""

KAI_RESOURCES: tuple[tuple[str, str, Decimal], ...] = (
    # (KAI key, canonical resource, milli-units per KAI unit)
    ("cpu", q.CPU, Decimal(1)),                   # millicores
    ("memory", q.MEMORY, Decimal(10**6 * 1000)),  # MB = 10**6 bytes
    ("gpu", q.GPU, Decimal(1000)),                # devices (fractions allowed)
)

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}

QueuePayload = QueueDefined | QueueRemoved | QueueRejected


def api_group(api_version: str) -> str:
    return api_version.split("/", 1)[0] if "/" in api_version else ""


def resources(value: object, where: str) -> q.Resources:
    """A Kubernetes ``{name: quantity}`` map; zero amounts are kept (a zero limit is a limit)."""
    return quantities(value, where)


def go_duration(value: object, where: str) -> float:
    """Seconds from a Go duration (``"5m"``, ``"1h30m"``, ``"30s"``) or a plain number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise Invalid(f"{where}: {show(value)} is not a duration")
    if isinstance(value, (int, float)):
        try:
            seconds = float(number(value, where))
        except Invalid:
            raise Invalid(f"{where}: {show(value)} is not a duration (e.g. 30s, 5m, 1h30m)") from None
    else:
        text, pos, seconds = value.strip(), 0, 0.0
        for match in _DURATION_PART.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _DURATION_UNIT[match.group(2)]
            pos = match.end()
        if not text or (pos != len(text) and text != "0"):
            raise Invalid(f"{where}: {show(value)} is not a duration (e.g. 30s, 5m, 1h30m)")
    if seconds < 0:
        raise Invalid(f"{where}: {show(value)} is negative")
    return seconds


# --------------------------------------------------------------------------- Volcano
def volcano_queue(name: str, obj: Mapping[str, Any], defined: Mapping[str, QueueSpec]) -> QueueSpec:
    """``scheduling.volcano.sh`` Queue: guarantee.resource, deserved, capability, weight, reclaimable, state, parent.

    ``deserved`` is cut to ``capability`` as Volcano's capacity plugin does each session (it is also
    raised to the guarantee there: ``QueueSpec.entitled_of`` does that part)."""
    spec = opt_mapping(obj.get("spec"), "spec")
    status = opt_mapping(obj.get("status"), "status")
    guarantee = resources(opt_mapping(spec.get("guarantee"), "spec.guarantee").get("resource"), "spec.guarantee.resource")
    capability = resources(spec.get("capability"), "spec.capability")
    deserved = {r: min(v, capability.get(r, v)) for r, v in resources(spec.get("deserved"), "spec.deserved").items()}
    # Volcano keeps a queue's state in status alone (its QueueSpec has no state; its CRD prunes a
    # spec.state), written by its queue controller when `vcctl queue operate` closes or opens it.
    state = string(status.get("state"), "status.state", default="Open") or "Open"
    if not one_of(state, QUEUE_STATES):
        raise Invalid(f"status.state: {show(state)} is not one of {', '.join(QUEUE_STATES)}")
    parent = string(spec.get("parent"), "spec.parent") or None
    if parent == "root" and "root" not in defined and name != "root":
        parent = None
    return QueueSpec(
        name=name, parent=_known_parent(name, parent, "spec.parent", defined), **queue_fields("volcano"),
        guarantee=guarantee, limit=capability, deserved=deserved,
        weight=integer(spec.get("weight"), "spec.weight", default=1, minimum=1) * WEIGHT_UNIT,
        priority=integer(spec.get("priority"), "spec.priority", default=0, minimum=None),
        reclaimable=boolean(spec.get("reclaimable"), "spec.reclaimable", default=True),
        state=state,
    )


def _known_parent(name: str, parent: str | None, where: str, defined: Mapping[str, QueueSpec]) -> str | None:
    """Volcano and KAI parents must already be defined when the child arrives, and not descend from it.

    The cycle check walks the defined parents as the queue core's tree does (an ancestor whose parent is
    gone ends the walk), so both refuse the same definitions and their views of the tree stay the same.
    """
    if parent is None:
        return None
    if parent == name:
        raise Invalid(f"{where}: {show(parent)} is the queue itself")
    if parent not in defined:
        raise Invalid(f"{where}: parent queue {show(parent)} does not exist")
    if name not in defined:  # the walk only meets ``name`` among defined queues: a new queue makes no cycle
        return parent
    path: list[str] = []
    seen: set[str] = set()  # a set beside the path: a 10,000-deep chain is walked in linear time
    current: str | None = parent
    while current is not None and current in defined and current not in seen:
        if current == name:
            raise Invalid(f"{where}: {show(parent)} would make a cycle ({' -> '.join([name, *path, name])})")
        path.append(current)
        seen.add(current)
        current = defined[current].parent
    return parent


# --------------------------------------------------------------------------- KAI
def kai_amount(value: object, where: str, factor: Decimal) -> int:
    """A KAI number in its unit → milli-units; ``-1`` is ``UNLIMITED``."""
    value = number(value, where)
    if value == -1:
        return UNLIMITED
    if value < 0:
        raise Invalid(f"{where}: {show(value)} is negative (use -1 for unlimited)")
    return int((Decimal(repr(value)) * factor).to_integral_value(rounding=ROUND_CEILING))


def kai_weight(value: object, where: str) -> int:
    """``overQuotaWeight`` (fractions allowed) in thousandths, rounded half up: 0.4 → 400, 1.6 → 1600."""
    value = number(value, where)
    if value < 0:
        raise Invalid(f"{where}: {show(value)} is negative")
    return int((Decimal(repr(value)) * WEIGHT_UNIT).to_integral_value(rounding=ROUND_HALF_UP))


def kai_queue(name: str, obj: Mapping[str, Any], defined: Mapping[str, QueueSpec]) -> QueueSpec:
    """``scheduling.run.ai/v2`` Queue: per-resource quota / limit / overQuotaWeight, parentQueue, priority."""
    spec = opt_mapping(obj.get("spec"), "spec")
    res = opt_mapping(spec.get("resources"), "spec.resources")
    guarantee: q.Resources = {}
    limit: q.Resources = {}
    weights: dict[str, int] = {}
    for key, resource, factor in KAI_RESOURCES:
        where = f"spec.resources.{key}"
        entry = opt_mapping(res.get(key), where)
        if entry.get("quota") is not None:
            guarantee[resource] = kai_amount(entry["quota"], f"{where}.quota", factor)
        if entry.get("limit") is not None:
            limit[resource] = kai_amount(entry["limit"], f"{where}.limit", factor)
        if entry.get("overQuotaWeight") is not None:
            weights[key] = kai_weight(entry["overQuotaWeight"], f"{where}.overQuotaWeight")
    runtimes = [go_duration(spec[f], f"spec.{f}") for f in ("preemptMinRuntime", "reclaimMinRuntime") if spec.get(f) is not None]
    parent = string(spec.get("parentQueue"), "spec.parentQueue") or None
    return QueueSpec(
        name=name, parent=_known_parent(name, parent, "spec.parentQueue", defined), **queue_fields("kai"),
        guarantee=guarantee, limit=limit, weight=weights.get("gpu", weights.get("cpu", WEIGHT_UNIT)),
        priority=integer(spec.get("priority"), "spec.priority", default=0, minimum=None),
        min_runtime=max(runtimes) if runtimes else None,
    )


# --------------------------------------------------------------------------- ElasticQuotaTree
def elastic_quota_tree(obj: Mapping[str, Any]) -> list[QueueSpec]:
    """Every node of ``spec.root`` is a queue, parents before children; the min/max rules are checked.

    Walked with a stack, not recursion: a tree of any depth is checked (or refused) with a reason, in
    the order a depth-first reading meets its nodes (a node's children total is checked once its
    whole subtree has been, before its next sibling)."""
    spec = mapping(obj.get("spec"), "spec")
    out: list[QueueSpec] = []
    names: set[str] = set()
    root = mapping(spec.get("root"), "spec.root")
    # ("node", raw, where, parent, siblings) or ("total", spec, where, children)
    stack: list[_NodeFrame | _TotalFrame] = [("node", root, "spec.root", None, [])]
    while stack:
        frame = stack.pop()
        if frame[0] == "total":
            _, total_of, total_where, total_children = frame
            _check_children_total(total_of, total_where, total_children)
            continue
        _, node, where, parent, siblings = frame
        me = _eqt_node(node, where, parent, names)
        out.append(me)
        names.add(me.name)
        siblings.append(me)
        children: list[QueueSpec] = []
        stack.append(("total", me, where, children))
        raws = opt_list(node.get("children"), f"{where}.children")
        for i in reversed(range(len(raws))):
            stack.append(("node", mapping(raws[i], f"{where}.children[{i}]"), _child_where(where, raws[i], i), me, children))
    return out


_NodeFrame = tuple[Literal["node"], Mapping[str, Any], str, QueueSpec | None, list[QueueSpec]]
_TotalFrame = tuple[Literal["total"], QueueSpec, str, list[QueueSpec]]


def _eqt_node(node: Mapping[str, Any], where: str, parent: QueueSpec | None, names: set[str]) -> QueueSpec:
    name = string(node.get("name"), f"{where}.name")
    if not name:
        raise Invalid(f"{where}.name: missing")
    if name in names:
        raise Invalid(f"{where}.name: {show(name)} appears twice in the tree", subject=name)
    try:
        minimum = resources(node.get("min"), f"{where}.min")
        maximum = resources(node.get("max"), f"{where}.max")
        namespaces = tuple(string(ns, f"{where}.namespaces[{i}]")
                           for i, ns in enumerate(opt_list(node.get("namespaces"), f"{where}.namespaces")))
    except Invalid as exc:
        raise Invalid(exc.reason, subject=name) from None
    for r, lo in minimum.items():
        if r in maximum and lo > maximum[r]:
            raise Invalid(f"{where}.min.{r}: {q.human(r, lo)} is greater than max {q.human(r, maximum[r])}", subject=name)
        if parent is not None and lo > parent.guarantee.get(r, 0):
            raise Invalid(f"{where}.min.{r}: {q.human(r, lo)} is greater than parent {parent.name} min "
                          f"{q.human(r, parent.guarantee.get(r, 0))}", subject=name)
    return QueueSpec(name=name, parent=parent.name if parent else None, **queue_fields("elasticquotatree"),
                     guarantee=minimum, limit=maximum, namespaces=namespaces)


def _check_children_total(me: QueueSpec, where: str, children: list[QueueSpec]) -> None:
    total: q.Resources = {}
    for child in children:
        total = q.add(total, child.guarantee)
    for r, amount in total.items():
        if amount > me.guarantee.get(r, 0):
            raise Invalid(f"{where}.children: total min {r} {q.human(r, amount)} is greater than {me.name} min "
                          f"{q.human(r, me.guarantee.get(r, 0))}", subject=me.name)


def _child_where(where: str, raw: object, i: int) -> str:
    name = raw.get("name") if isinstance(raw, Mapping) else None
    return f"{where}.children[{name if isinstance(name, str) and name else i}]"


# --------------------------------------------------------------------------- the book
@dataclass
class _Source:
    """One queue object: what it defines now, and its last rejection (kept to retry and to dedupe)."""

    kind: str
    name: str
    obj: Mapping[str, Any]
    api_version: str
    names: tuple[str, ...] = ()
    rejected: str | None = None
    rejected_names: dict[str, None] = field(default_factory=dict)
    """The queues its rejections named (a node of an ElasticQuotaTree, or the object's own name), the
    latest last: each carries the rejection for readers (the result view, the reconciler) until its
    QueueRemoved, which the object's deletion sends for every one no object defines."""
    seq: int = 0
    """When the book first met the object (since it was last deleted): retries go in that order."""


class QueueBook:
    """The queues admission knows, which object owns each, and the events that keep the queue core in step."""

    def __init__(self) -> None:
        self.specs: dict[str, QueueSpec] = {}
        self._owner: dict[str, str] = {}
        self._sources: dict[str, _Source] = {}
        self._rejected: dict[str, int] = {}
        """Sources whose last change was rejected (sid -> ``_Source.seq``): all ``_retry_rejected`` walks."""
        self._seq = 0

    @staticmethod
    def source_id(kind: str, api_version: str, namespace: str, name: str) -> str | None:
        """Identity of a queue object, or None for kinds/groups admission does not read."""
        group = api_group(api_version)
        if kind == "Queue" and group in (VOLCANO_GROUP, KAI_GROUP):
            return f"{group}/Queue/{name}"
        if kind == "ElasticQuotaTree":
            return f"ElasticQuotaTree/{namespace}/{name}"
        return None

    def exists(self, name: str) -> bool:
        return name in self.specs

    def is_leaf(self, name: str) -> bool:
        return all(spec.parent != name for spec in self.specs.values())

    def apply(self, sid: str, kind: str, api_version: str, name: str, obj: Mapping[str, Any]) -> list[QueuePayload]:
        """An object was added or modified: define its queues, or reject it keeping what was defined."""
        source = self._sources.get(sid)
        if source is None:
            self._seq += 1
            source = _Source(kind=kind, name=name, obj=obj, api_version=api_version, seq=self._seq)
        source.obj, source.api_version = obj, api_version
        self._sources[sid] = source
        out = self._try(sid, source)
        if not out or isinstance(out[-1], QueueRejected):
            return out
        return out + self._retry_rejected()

    def delete(self, sid: str) -> list[QueuePayload]:
        source = self._sources.pop(sid, None)
        self._rejected.pop(sid, None)
        if source is None:
            return []
        out: list[QueuePayload] = []
        for qname in reversed(source.names):
            self.specs.pop(qname, None)
            self._owner.pop(qname, None)
            out.append(QueueRemoved(name=qname))
        out += self._retry_rejected() if out else []
        for refused in reversed(source.rejected_names):  # its rejections go with it (no other object defines them)
            if refused not in source.names and refused not in self.specs:
                out.append(QueueRemoved(name=refused))
        return out

    def _parse(self, source: _Source) -> list[QueueSpec]:
        not_refused(source.obj)
        if source.kind == "ElasticQuotaTree":
            return elastic_quota_tree(source.obj)
        if api_group(source.api_version) == KAI_GROUP:
            return [kai_queue(source.name, source.obj, self.specs)]
        return [volcano_queue(source.name, source.obj, self.specs)]

    def _try(self, sid: str, source: _Source) -> list[QueuePayload]:
        try:
            specs = self._parse(source)
            for spec in specs:
                owner = self._owner.get(spec.name)
                if owner is not None and owner != sid:
                    raise Invalid(f"queue {spec.name} is already defined by {owner}", subject=spec.name)
        except Invalid as exc:
            self._rejected[sid] = source.seq
            if source.rejected == exc.reason:
                return []
            source.rejected = exc.reason
            name = exc.subject or source.name
            source.rejected_names.pop(name, None)
            source.rejected_names[name] = None
            if name == source.name:
                return [QueueRejected(name=name, kind=source.kind, reason=exc.reason)]
            meta = kube.meta(source.obj)
            return [QueueRejected(name=name, kind=source.kind, reason=exc.reason,
                                  object_namespace=str(meta.get("namespace") or ""), object_name=source.name)]
        source.rejected = None
        self._rejected.pop(sid, None)
        return self._define(sid, source, specs)

    def _define(self, sid: str, source: _Source, specs: list[QueueSpec]) -> list[QueuePayload]:
        out: list[QueuePayload] = []
        keep = [s.name for s in specs]
        for qname in reversed(source.names):
            if qname not in keep:
                self.specs.pop(qname, None)
                self._owner.pop(qname, None)
                out.append(QueueRemoved(name=qname))
        meta = source.obj.get("metadata")
        namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
        origin = QueueSource(kind=source.kind, api_version=source.api_version, name=source.name,
                             namespace=namespace if isinstance(namespace, str) else "")
        specs = [spec.model_copy(update={"source": origin}) for spec in specs]
        for spec in specs:
            if self.specs.get(spec.name) != spec:
                self.specs[spec.name] = spec
                out.append(QueueDefined(queue=spec))
            self._owner[spec.name] = sid
        source.names = tuple(keep)
        return out

    def _retry_rejected(self) -> list[QueuePayload]:
        """Something was defined or removed: objects rejected earlier (e.g. parent missing) may now pass.

        Only the rejected ones are tried, in the order the book met them (as a walk of every source
        skipping the accepted ones would): a definition costs the rejected objects, not every queue."""
        out: list[QueuePayload] = []
        progress = True
        while progress:
            progress = False
            for sid in sorted(self._rejected, key=self._rejected.__getitem__):
                source = self._sources[sid]
                if source.rejected is None:
                    continue
                emitted = self._try(sid, source)
                out.extend(emitted)
                if emitted and not isinstance(emitted[-1], QueueRejected):
                    progress = True
        return out
