"""Pods as placement sees them: where they are bound, whether they still count, what they hold.

Every pod bound to a node (``spec.nodeName``) counts against that node until it is deleted or
finishes (Succeeded/Failed), whoever scheduled it. Only pods whose ``spec.schedulerName`` muster
answers to (``Policy.answers_to``) are ever bound by it; the others are left to their scheduler. Parsing never raises: a pod whose requests
cannot be read counts as one pod with no resources.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from pydantic import ValidationError

from services.placement.gpu import GpuCharge
from services.placement.nodes import Demand
from services.placement.workloads import Slot
from shared.kernel import gpumemory, kube, podconstraints
from shared.kernel import quantity as q
from shared.kernel.listing import Held
from shared.kernel.model import HostPort, MatchExpression, PodSet, PreferredTerm, Toleration, Volumes
from shared.kernel.treekey import tree_key

FINISHED = ("Succeeded", "Failed")
GPU_DEVICES = kube.GPU_DEVICES
"""Annotation the reconciler writes when it binds a pod (see services/reconciler)."""


@dataclass(slots=True)
class PodFacts:
    """The fields of one Pod watch event that placement uses. Never changed: each event makes new
    facts (slotted and not frozen, so making them is cheap: one per pod watch event)."""

    key: str
    namespace: str
    name: str
    node_name: str
    phase: str
    live: bool
    """Not deleted and not finished."""
    workload: str | None
    kind: str | None
    """Kind of the workload object the pod comes from (``kube.workload_kind_of_pod``)."""
    pod_set: str
    requests: dict[str, int]
    """Per pod, milli-units, ``pods: 1000`` included."""
    gpu_share: int
    gpu_devices: tuple[int, ...] | None
    gpu_memory: int = 0
    """MiB of one device (KAI's ``gpu-memory``), 0 when none or unreadable (a pod muster binds was
    checked by admission; another scheduler's is charged as best it can be)."""
    scheduler_name: str | None = None
    """``spec.schedulerName`` (None when unset: the API server's default-scheduler)."""
    text_only: bool = False
    """What these facts were read from (labels, annotations, containers, scheduler, namespace) is text alone, so a
    later version equal to it (``==``) gives the same facts but for node, phase and liveness."""
    host_ports: tuple[HostPort, ...] = ()
    """Host ports it binds (``host_ports``): held on its node while it counts there."""

    @property
    def bound(self) -> bool:
        return bool(self.node_name)


_mapping = kube.mapping

_REQUESTS_MEMO = 4096
"""How many distinct requests ``_requests`` remembers (then it starts afresh): a cluster's pods come
from a few templates, and every watch event of a pod carries the same containers again."""
_requests_memo: dict[bytes | str, dict[str, int]] = {}


def _requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """``kube.effective_requests`` of a pod spec, {} when unreadable. Remembered by the ``tree_key`` of the
    containers' ``resources`` (with, where the pod has them, its init containers, pod-level requests
    and overhead), all it reads (a container's name only names it in an error, and an error gives {}); ``repr``'s test, not ``==``: ``1``, ``1.0`` and ``true`` are equal but do not parse
    alike. Parsing the quantities of every pod event again was a visible part of a replay's time."""
    containers = spec.get("containers")
    if type(containers) is not list or any(type(c) is not dict for c in containers):
        return _parse_requests(spec)  # not the usual shape: no memo
    if any(k in spec for k in _BESIDES):  # init containers, pod-level requests, overhead: rare, read whole
        key = tree_key([[c.get("resources") for c in containers], [spec.get(k) for k in _BESIDES]])
    else:
        key = tree_key([c.get("resources") for c in containers])
    requests = _requests_memo.get(key)
    if requests is None:
        requests = _parse_requests(spec)
        if len(_requests_memo) >= _REQUESTS_MEMO:
            _requests_memo.clear()
        _requests_memo[key] = requests
    return requests


_BESIDES = ("initContainers", "resources", "overhead")
"""What else of a pod spec its requests depend on (``kube.effective_requests``)."""


def _parse_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    try:
        return kube.effective_requests(spec)
    except (AttributeError, TypeError, ValueError, ArithmeticError):  # QuantityError, or .inf/.nan/1e1000000
        return {}


def pod_key(obj: Mapping[str, Any], name: str, namespace: str) -> str:
    """``namespace/name`` of a pod watch event (the object's own, else the event's): its record's key."""
    meta = obj.get("metadata")
    if type(meta) is not dict:
        meta = _mapping(meta)
    return f"{meta.get('namespace') or namespace or 'default'}/{meta.get('name') or name}"


def pod_facts(change: str, obj: Mapping[str, Any], name: str, namespace: str,
              answers_to: Callable[[str], bool] | None = None,
              before: tuple[PodFacts, Mapping[str, Any]] | None = None) -> PodFacts:
    """The facts of one pod watch event. A pod of no KubeRay or pod-group workload whose
    ``spec.schedulerName`` muster answers to (``answers_to``) is a gang of one: workload
    ``namespace/<pod name>`` of kind ``Pod``.

    ``before``: the facts of this pod's previous version and that version. When what those facts
    were read from (labels, annotations, containers, scheduler, namespace) was all text and is equal now, only
    the node, phase and liveness are read again: most watch events of a pod are its binding and its
    phase changing, and reading the rest again was a large part of placement's time in a replay. All
    text, because ``==`` takes ``1``, ``1.0`` and ``true`` as one, which parse and format apart; an
    equal value of a text-only one is the same text (key order aside, which nothing here reads)."""
    meta, spec, status = obj.get("metadata"), obj.get("spec"), obj.get("status")
    if type(meta) is not dict:
        meta = _mapping(meta)
    if type(spec) is not dict:
        spec = _mapping(spec)
    phase = str((status.get("phase") if type(status) is dict else _mapping(status).get("phase")) or "Pending")
    own_namespace, own_name = meta.get("namespace"), meta.get("name")
    namespace = own_namespace if type(own_namespace) is str and own_namespace else str(
        own_namespace or namespace or "default")
    name = own_name if type(own_name) is str and own_name else str(own_name or name)
    labels, annotations, containers = meta.get("labels"), meta.get("annotations"), spec.get("containers")
    scheduler = spec.get("schedulerName")
    if before is not None and before[0].text_only:
        facts, old = before
        old_meta, old_spec = old.get("metadata"), old.get("spec")
        if type(old_meta) is not dict:
            old_meta = _mapping(old_meta)
        if type(old_spec) is not dict:
            old_spec = _mapping(old_spec)
        if facts.namespace == namespace and facts.name == name and labels == old_meta.get("labels") \
                and annotations == old_meta.get("annotations") and containers == old_spec.get("containers") \
                and scheduler == old_spec.get("schedulerName") and own_namespace == old_meta.get("namespace"):
            node_name = spec.get("nodeName")
            return PodFacts(facts.key, namespace, name, node_name if type(node_name) is str else str(node_name or ""),
                            phase, change != "Deleted" and phase not in FINISHED, facts.workload, facts.kind,
                            facts.pod_set, facts.requests, facts.gpu_share, facts.gpu_devices, facts.gpu_memory,
                            facts.scheduler_name, True, facts.host_ports)
    requests = _requests(spec)
    text_only = all(map(_text_only, (labels, annotations, containers, scheduler, own_namespace)))
    annotations = _mapping(annotations)
    try:
        share = kube.gpu_share(annotations, "metadata")
    except q.QuantityError:
        share = 0
    try:
        memory = 0 if share else gpumemory.request(annotations, "metadata")
    except q.QuantityError:
        memory = 0
    devices = None
    raw_devices = annotations.get(GPU_DEVICES)
    if isinstance(raw_devices, str) and raw_devices:
        try:
            devices = tuple(int(d) for d in raw_devices.split(","))
        except ValueError:
            devices = None
    try:
        workload = kube.workload_key_of_pod(obj)
        kind = kube.workload_kind_of_pod(obj)
        pod_set = kube.pod_set_of_pod(obj)
    except AttributeError:
        workload, kind, pod_set = None, None, "pods"
    if workload is None and answers_to is not None and answers_to(str(spec.get("schedulerName") or "")):
        workload, kind = f"{namespace}/{name}", "Pod"
    return PodFacts(f"{namespace}/{name}", namespace, name, str(spec.get("nodeName") or ""), phase,
                    change != "Deleted" and phase not in FINISHED, workload, kind, pod_set,
                    {**requests, q.PODS: 1000}, share, devices, memory,
                    scheduler if isinstance(scheduler, str) else None, text_only, host_ports(spec))


def host_ports(spec: Mapping[str, Any]) -> tuple[HostPort, ...]:
    """The host ports a pod binds, as admission reads them (``services.admission.pods.host_ports``), entries
    it cannot read left out: a pod muster binds was checked there, another scheduler's counts as it can.
    Ingest keeps a container's ``ports`` only where they bind one, so most pods are done at the first test."""
    found: dict[HostPort, None] = {}
    for field in ("initContainers", "containers"):
        listed = spec.get(field)
        if type(listed) is not list:
            continue
        for container in listed:
            if type(container) is not dict or "ports" not in container:
                continue
            if field == "initContainers" and container.get("restartPolicy") != "Always":
                continue
            for port in container["ports"] if type(container["ports"]) is list else ():
                number = port.get("hostPort") if type(port) is dict else None
                if type(number) is not int or not 1 <= number <= 65535:
                    continue
                protocol, ip = port.get("protocol") or "TCP", port.get("hostIP") or "0.0.0.0"
                if type(protocol) is str and type(ip) is str:
                    found[HostPort(port=number, protocol=protocol, ip=ip)] = None
    return tuple(found)


def _text_only(value: Any) -> bool:
    """JSON of text alone (strings, maps and lists of them, or nothing): ``==`` on it is exact."""
    kind = type(value)
    if kind is str or value is None:
        return True
    if kind is dict:
        values = value.values()
    elif kind is list:
        values = value
    else:
        return False
    if _TEXT.issuperset(map(type, values)):  # text leaves alone (labels, annotations): checked in C
        return True
    return all(map(_text_only, values))


_TEXT = frozenset({str, type(None)})


def _tolerations(spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
    fields = ("key", "operator", "value", "effect")
    return tuple(Toleration(**{k: v for k, v in t.items() if k in fields}) for t in spec.get("tolerations") or [])


def _affinity(spec: Mapping[str, Any]) -> tuple[tuple[MatchExpression, ...], ...]:
    node_affinity = _mapping(_mapping(spec.get("affinity")).get("nodeAffinity"))
    required = _mapping(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    return tuple(
        tuple(MatchExpression(key=e["key"], operator=e["operator"], values=tuple(e.get("values") or ()))
              for e in term.get("matchExpressions") or [])
        for term in required.get("nodeSelectorTerms") or [])


def _preferred(spec: Mapping[str, Any]) -> tuple[PreferredTerm, ...]:
    node_affinity = _mapping(_mapping(spec.get("affinity")).get("nodeAffinity"))
    return tuple(
        PreferredTerm(weight=term["weight"], expressions=tuple(
            MatchExpression(key=e["key"], operator=e["operator"], values=tuple(e.get("values") or ()))
            for e in _mapping(term.get("preference")).get("matchExpressions") or []))
        for term in node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or [])


def _volumes(spec: Mapping[str, Any], namespace: str) -> Volumes:
    claims: dict[str, None] = {}
    ephemeral: list[str] = []
    for volume in spec.get("volumes") or []:
        if volume.get("persistentVolumeClaim") is not None:
            claims[f"{namespace}/{volume['persistentVolumeClaim']['claimName']}"] = None
        elif volume.get("ephemeral") is not None:
            template = _mapping(_mapping(volume["ephemeral"]).get("volumeClaimTemplate"))
            ephemeral.append(_mapping(template.get("spec")).get("storageClassName") or "")
    return Volumes(claims=tuple(claims), ephemeral=tuple(ephemeral)) if claims or ephemeral else _NO_VOLUMES


_NO_VOLUMES = Volumes()


def pod_set_of(obj: Mapping[str, Any], name: str, facts: PodFacts) -> PodSet | None:
    """A one-pod PodSet from the pod's own spec and task (to match a pod gang's pod to its pod set by
    task and shape); None if unreadable."""
    spec = _mapping(obj.get("spec"))
    try:
        resources = {k: v for k, v in facts.requests.items() if k != q.PODS}
        task = kube.annotations(obj).get(kube.VOLCANO_TASK)
        return PodSet(name=name, count=1, resources=resources, gpu_share=facts.gpu_share, gpu_memory=facts.gpu_memory,
                      node_selector=dict(spec.get("nodeSelector") or {}), tolerations=_tolerations(spec),
                      affinity=_affinity(spec), task=task if isinstance(task, str) else "",
                      pod_affinity=podconstraints.pod_affinity(spec, "spec"), spread=podconstraints.spread(spec, "spec"),
                      host_ports=facts.host_ports, preferred=_preferred(spec),
                      volumes=_volumes(spec, facts.namespace))
    except (ValidationError, KeyError, TypeError, AttributeError, podconstraints.ConstraintError):
        return None


@dataclass
class PodRecord:
    facts: PodFacts
    held: Held
    """The object these facts were read from, as the watch book holds it (``shared.kernel.listing.Held``):
    one reference for both, so a snapshot writes it once and no watch event copies it."""
    node: int | None = None
    """Row the pod is charged to, None while it does not count."""
    demand: Demand | None = None
    devices: GpuCharge = ()
    foreign: bool = False
    """Charged while not belonging to an admitted workload: it lowers CapacityChanged.total."""
    slot: Slot | None = None
    """The slot of its (admitted) workload it was assigned to, if any."""
    evicted: bool = False
    """Its workload was preempted: it no longer counts and fills nothing, whatever it reports."""

    @property
    def key(self) -> str:
        return self.facts.key

    @property
    def obj(self) -> Mapping[str, Any]:
        return self.held.obj
