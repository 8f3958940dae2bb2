"""The reconciler's decisions: which Kubernetes changes follow from the other cores' events.

Pure and idempotent. Every effect is remembered per (object, field) with the value last emitted;
an effect that would write the same value again is dropped (a copy of an envelope, same id, never
reaches the core: ``shared.runtime.service.Service`` drops it). The adapter that applies the effects
(real API client or ``shared.sim``) is idempotent too, so at-least-once delivery never doubles a change.

Objects are addressed as the user wrote them: the workload by its kind/namespace/name, pods as
``Pod``. ``Enqueued``/``BackedOff`` do not carry the workload's kind (see ``_Workload.kind``): until
another event names it, the effects carry ``kind=""``, meaning "the workload object of that
namespace/name" (the cluster adapter resolves RayJob first, then RayCluster).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from shared.kernel import gpumemory, kube
from shared.kernel.events import (
    BackedOff, ElasticReleased, ElasticWaiting, Enqueued, Envelope, GangDisrupted, GangEvicted, GangPlaced, GangRunning,
    GpuAssignment, KubeEffect, ObjectChanged, PodAssigned, PodsMoved, PreemptionRequested, QueueRejected, QueueRemoved, TimerFired,
    TimerSet, WorkloadDeleted, WorkloadRejected, WorkloadSubmitted, WorkloadUpdated, WorkloadWarned, kube_effect,
)
from services.reconciler.status import STATUS_TIMER, StatusBook, effect_object, pod_group_object, queue_object
from shared.kernel.dedupe import Tombstones
from shared.kernel.fold import Folds
from shared.kernel.policy import Policy

ENQUEUED_AT = "muster.dev/enqueued-at"
DEQUEUED_AT = "muster.dev/dequeued-at"
QUEUE = "muster.dev/queue"
STATUS = "muster.dev/status"
GPU_GROUP = "muster.dev/gpu-group"
GPU_DEVICES = kube.GPU_DEVICES
GPU_FRACTION = kube.GPU_FRACTION
GPU_PORTION = "muster.dev/gpu-portion"
"""On a bound ``gpu-memory`` pod: the share of its device it got, as KAI's binder gives it (``GPU_PORTION``)."""
RECEIVED_TYPE = "received-resource-type"
"""KAI's binder annotation saying how a pod got its GPU (``Fraction`` for a shared device)."""
ELASTIC = "muster.dev/elastic"
"""On a bound pod beyond its gang's minimum: it runs while quota and nodes allow, and goes first."""

_NO_ANNOTATIONS = frozenset({"PodGroup"})
"""Kinds whose workload object muster does not annotate (a plain pod gang may have no object)."""
_REBORN = frozenset({"WorkloadSubmitted", "WorkloadRejected"})
"""Admission's events that start an incarnation of a key: after a deletion, the only ones it takes."""


def seconds(t: float) -> str:
    """Event time as annotation text: ``12`` for whole seconds, ``12.5`` otherwise (exact, no exponent)."""
    return str(int(t)) if float(t).is_integer() else repr(float(t))


def _status(word: str, reason: str) -> str:
    return f"{word}: {reason}" if reason else word


def _rejection_object(kind: str, namespace: str, name: str) -> str:
    """What the reconciler calls the object defining a queue when it tells of its rejection."""
    return f"{kind}/{namespace}/{name}"


def gpu_annotations(gpu: GpuAssignment | None) -> dict[str, str]:
    """What a bound pod is told about its GPU devices (KAI style ``gpu-fraction`` plus muster's own; a
    whole-GPU pod only muster's, since KAI refuses a ``gpu-fraction`` of 1 or more).

    A ``gpu-memory`` pod is told what KAI's binder tells it (``pkg/binder/binding/binder.go``, the
    ``received-resource-type: Fraction`` annotation; ``pkg/binder/plugins/gpusharing/gpu_sharing.go``,
    its devices and its portion, two decimals, which KAI puts in the pod's ``GPU_PORTION``) and never a
    ``gpu-fraction``: KAI writes none on it, and a pod carrying both is one KAI refuses."""
    if gpu is None:
        return {}
    devices = ",".join(str(d) for d in gpu.devices)
    if gpu.memory:
        share = round(gpu.fraction * gpumemory.FULL)
        return {RECEIVED_TYPE: "Fraction", GPU_PORTION: gpumemory.portion(share), GPU_DEVICES: devices,
                GPU_GROUP: gpu.group}
    out = {GPU_FRACTION: seconds(gpu.fraction), GPU_DEVICES: devices} if gpu.fraction < 1 else {
        GPU_DEVICES: devices}
    if gpu.group:
        out[GPU_GROUP] = gpu.group
    return out


@dataclass
class _Workload:
    """What the reconciler knows about one workload key."""

    namespace: str
    name: str
    kind: str = ""
    """Learnt from GangPlaced, PreemptionRequested, GangEvicted, WorkloadRejected (or WorkloadSubmitted if routed here)."""
    phase: str = ""
    """``queued``, ``placed`` or ``preempted`` (or evicted): tells a requeue after preemption from a new incarnation."""
    pods: dict[str, None] = field(default_factory=dict)
    """Object ids of its pods the reconciler had effects on (and has not heard are gone), to forget
    them with the workload."""

    @property
    def object_id(self) -> str:
        """Memory key independent of kind, so effects sent before the kind was known still count."""
        return f"workload:{self.namespace}/{self.name}"


class ReconcilerCore(Folds):
    """Folds decisions into Kubernetes effects; see docs/design/reconciler.md."""

    service = "reconciler"
    TOMBSTONE_SECONDS = 600.0
    """How long (event time) a deleted workload's key is remembered, to drop what the queue and placement
    decided about it before they heard of the deletion (admission's tombstones last as long); then
    it is forgotten, so what the reconciler keeps follows live objects."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._workloads: dict[str, _Workload] = {}
        self._applied: dict[str, dict[str, Any]] = {}
        """object id -> field -> last value emitted for it."""
        self._gone: Tombstones[str, None] = Tombstones(self.TOMBSTONE_SECONDS)
        """Tombstones: deleted workload keys, oldest first (``TOMBSTONE_SECONDS``)."""
        self._refused: dict[str, str] = {}
        """Queue name -> the object its rejection was written on, until the queue is removed."""
        self._pod_owner: dict[str, _Workload] = {}
        """Pod object id -> the workload whose ``pods`` hold it, until the pod or the workload goes."""
        self.status = StatusBook(policy)

    def handle(self, env: Envelope) -> Sequence[KubeEffect | TimerSet]:
        """Effects for one inbox event. Status of queue objects and PodGroups (``status.StatusBook``) is
        written when its timer fires."""
        if isinstance(env.payload, TimerFired):
            return self._flush_status() if env.payload.key == STATUS_TIMER else []
        if isinstance(env.payload, ObjectChanged):  # a pod deleted (``topology``): nothing is written on it again
            self._pod_gone(f"Pod/{env.payload.namespace}/{env.payload.name}")
            return []
        if self._gone and self._late(env):
            return []
        handler = self.folds.get(env.type)
        out: list[KubeEffect] = handler(self, env.payload, env.occurred_at) if handler else []  # a new list
        timers = self.status.observe(env)
        return [*out, *timers] if timers else out

    def _late(self, env: Envelope) -> bool:
        """An event about a deleted workload that is no new incarnation of it: the queue or placement
        decided it before the deletion reached them (the inbox has several writers). Like an update
        kube-scheduler's cache refuses for a pod it no longer holds, it is dropped whole: it would
        write on an object that is gone and bring back the state dropped with it."""
        p = env.payload
        key: str | None = getattr(p, "key", None)
        if key is None:
            workload = getattr(p, "workload", None)
            key = workload.key if workload is not None else None
        if key is None or key not in self._gone:
            return False
        if env.type in _REBORN:
            self._gone.lift(key)
            return False
        return True

    def _flush_status(self) -> list[KubeEffect | TimerSet]:
        """Status effects whose content differs from what was last written to that object."""
        out: list[KubeEffect | TimerSet] = []
        for effect in self.status.flush():
            if self._remember(effect_object(effect), "status", effect.status):
                out.append(effect)
        return out

    # ------------------------------------------------------------------ event handlers
    def _on_Enqueued(self, p: Enqueued, now: float) -> list[KubeEffect]:
        wl = self._workload(p.key)
        wl.phase = "queued"
        return self._queued(wl, p.queue, p.reason, now) + self._event(wl, "Normal", "Queued", p.reason)

    def _on_BackedOff(self, p: BackedOff, now: float) -> list[KubeEffect]:
        wl = self._workload(p.key)
        wl.phase = "queued"
        out = self._queued(wl, p.queue, p.reason, now)
        return out + self._event(wl, "Warning", "Unschedulable", p.reason)

    def _on_GangPlaced(self, p: GangPlaced, now: float) -> list[KubeEffect]:
        wl = self._workload(p.key, p.kind)
        wl.phase = "placed"
        out = self._suspend(wl, False) if p.gate == "suspend" else []
        out += self._annotate(wl, {DEQUEUED_AT: seconds(now), QUEUE: p.queue,
                                   STATUS: _status("Admitted", p.reason)})
        message = p.reason or f"all {len(p.slots)} pods placed"
        return out + self._event(wl, "Normal", "Scheduled", message)

    def _on_PodAssigned(self, p: PodAssigned, now: float) -> list[KubeEffect]:
        """Bind the pod; its delayed claims ride on the one effect, so the link writes the node on them before
        the binding and never binds without them (kube-scheduler's PreBind runs before its Bind)."""
        wl = self._workload(p.key)
        pod_id = self._pod_id(wl, p.pod_namespace, p.pod)
        annotations = gpu_annotations(p.gpu)
        if p.elastic:
            annotations[ELASTIC] = "true"
        if not self._remember(pod_id, "placement", ("bind", p.node, tuple(sorted(annotations.items())), p.claims)):
            return []
        return [kube_effect(op="bind", kind="Pod", namespace=p.pod_namespace or wl.namespace, name=p.pod,
                           node=p.node, annotations=annotations, claims=p.claims)]

    def _on_GangRunning(self, p: GangRunning, now: float) -> list[KubeEffect]:
        return self._annotate(self._workload(p.key), {STATUS: _status("Running", p.reason)})

    def _on_GangDisrupted(self, p: GangDisrupted, now: float) -> list[KubeEffect]:
        wl = self._workload(p.key)
        return self._annotate(wl, {STATUS: _status("Admitted", p.reason)}) + self._event(wl, "Warning", "GangDisrupted", p.reason)

    def _on_PreemptionRequested(self, p: PreemptionRequested, now: float) -> list[KubeEffect]:
        return self._evicted(p, "Preempted")

    def _on_GangEvicted(self, p: GangEvicted, now: float) -> list[KubeEffect]:
        """A stale gang: evicted as a preempted one is, the Event named as KAI names it (``StaleJob``)."""
        return self._evicted(p, "StaleJob")

    def _evicted(self, p: PreemptionRequested | GangEvicted, event: str) -> list[KubeEffect]:
        """Its pods evicted (a suspend-gated workload suspended again), its status and an Event say why."""
        wl = self._workload(p.key, p.kind)
        wl.phase = "preempted"
        out = self._suspend(wl, True) if p.gate == "suspend" else self._evict_all(wl, p.pods)
        out += self._annotate(wl, {STATUS: _status("Preempted", p.reason)})
        return out + self._event(wl, "Warning", event, p.reason)

    def _on_PodsMoved(self, p: PodsMoved, now: float) -> list[KubeEffect]:
        """Pods moved so that another workload fits: evict them (their owner makes them again, and placement
        binds each new pod where the move planned it); the workload runs on, so its status stays, and a
        Normal ``Evict`` Event says why, as KAI records an eviction by its consolidation action."""
        wl = self._workload(p.key, p.kind)
        return self._evict_all(wl, p.pods) + self._event(wl, "Normal", "Evict", p.reason)

    def _on_ElasticReleased(self, p: ElasticReleased, now: float) -> list[KubeEffect]:
        """Elastic pods evicted for a workload that needed the room: evict them (the gang keeps running;
        a controller's replacement waits for quota again) and say so on the workload. Elastic pods
        that took a gang pod's place lose their elastic mark."""
        wl = self._workload(p.key)
        out: list[KubeEffect] = []
        for pod in p.promoted:  # it took a gang pod's place: no longer among the first to go
            namespace, _, name = pod.rpartition("/")
            if self._remember(self._pod_id(wl, namespace, name), f"annotation:{ELASTIC}", "false"):
                out.append(kube_effect(op="annotate", kind="Pod", namespace=namespace or wl.namespace, name=name,
                                      annotations={ELASTIC: "false"}))
        if not p.evicted:
            return out
        message = f"{len(p.evicted)} elastic pod(s) of {p.pod_set} evicted: {p.reason}"
        return out + self._evict_all(wl, p.evicted) + self._event(wl, "Warning", "Preempted", message)

    def _on_ElasticWaiting(self, p: ElasticWaiting, now: float) -> list[KubeEffect]:
        """Elastic pods the owner wants wait: an Event on the workload says why (its gang runs on)."""
        return self._event(self._workload(p.key), "Normal", "ElasticPodsWaiting", p.reason)

    def _on_WorkloadRejected(self, p: WorkloadRejected, now: float) -> list[KubeEffect]:
        other = self._other_kind(p.key, p.kind)
        if other is not None:
            # A second object of another kind claimed the same name: it is the one refused, not ours.
            status = _status("Rejected", p.reason)
            out = [kube_effect(op="annotate", kind=p.kind, namespace=other.namespace, name=other.name,
                              annotations={STATUS: status})]
            return out + [kube_effect(op="event", kind=p.kind, namespace=other.namespace, name=other.name,
                                     reason="Rejected", message=p.reason, event_type="Warning")]
        wl = self._workload(p.key, p.kind)
        out = self._annotate(wl, {STATUS: _status("Rejected", p.reason)})
        return out + self._event(wl, "Warning", "Rejected", p.reason)

    def _on_WorkloadWarned(self, p: WorkloadWarned, now: float) -> list[KubeEffect]:
        """Admission read nothing from a key its owner likely meant to name the queue with: a Warning
        Event on the object says which and where the workload went (its status stays the queue's word)."""
        other = self._other_kind(p.key, p.kind)
        if other is not None:  # the object of another kind that was refused its name: told as it is, unremembered
            return [kube_effect(op="event", kind=p.kind, namespace=other.namespace, name=other.name, reason=p.cause,
                                message=p.reason, event_type="Warning")]
        return self._event(self._workload(p.key, p.kind), "Warning", p.cause, p.reason)

    def _other_kind(self, key: str, kind: str) -> _Workload | None:
        """The object of ``kind`` under ``key`` when the workload known there is of another kind (admission
        refuses a second kind its name): addressed on its own, outside what is remembered of the first."""
        known = self._workloads.get(key)
        if known is not None and known.kind and known.kind != kind:
            return _Workload(namespace=known.namespace, name=known.name, kind=kind)
        return None

    def _on_QueueRejected(self, p: QueueRejected, now: float) -> list[KubeEffect]:
        """Status annotation and a Warning event on the object that defines the queue (the queue itself,
        or the ElasticQuotaTree one of whose nodes is wrong)."""
        namespace, name = p.object_namespace, p.object_name or p.name
        object_id = self._refused[p.name] = _rejection_object(p.kind, namespace, name)
        out: list[KubeEffect] = []
        status = _status("Rejected", p.reason)
        if self._remember(object_id, f"annotation:{STATUS}", status):
            out.append(kube_effect(op="annotate", kind=p.kind, namespace=namespace, name=name,
                                  annotations={STATUS: status}))
        if self._remember(object_id, "event", ("Warning", "Rejected", p.reason)):
            out.append(kube_effect(op="event", kind=p.kind, namespace=namespace, name=name, reason="Rejected",
                                  message=p.reason, event_type="Warning"))
        return out

    def _on_WorkloadSubmitted(self, p: WorkloadSubmitted | WorkloadUpdated, now: float) -> list[KubeEffect]:
        """A submission starts a new incarnation of the object: forget what was written on the old one."""
        wl = self._workload(p.workload.key, p.workload.kind)
        if p.type == "WorkloadSubmitted":
            self._forget(wl)
            wl.phase = ""
        return []

    _on_WorkloadUpdated = _on_WorkloadSubmitted

    def _on_WorkloadDeleted(self, p: WorkloadDeleted, now: float) -> list[KubeEffect]:
        """The object is gone: nothing is left to write on it, so nothing is kept for it."""
        wl = self._workloads.pop(p.key, None)
        if wl is not None:
            self._forget(wl)
        self._gone.expire(now)
        self._gone.bury(p.key, None, now)
        return []

    def _on_QueueRemoved(self, p: QueueRemoved, now: float) -> list[KubeEffect]:
        """The last queue an object defined is gone, so is the object: forget what was written on it
        (its status, a rejection), so that one made again under that name is written in full. So too
        for a refused object that defined nothing (admission removes its rejected queue)."""
        refused = self._refused.pop(p.name, None)
        specs = self.status.view.queues
        spec = specs.get(p.name)
        source = spec.source if spec is not None else None
        if source is not None and not any(s.source == source for name, s in specs.items() if name != p.name):
            self._applied.pop(queue_object(source), None)
            self._applied.pop(_rejection_object(source.kind, source.namespace, source.name), None)
        if refused is not None and spec is None and refused not in self._refused.values():
            self._applied.pop(refused, None)
        return []

    # ------------------------------------------------------------------ effects
    def _queued(self, wl: _Workload, queue: str, reason: str, now: float) -> list[KubeEffect]:
        values = {QUEUE: queue, STATUS: _status("Queued", reason)}
        if f"annotation:{ENQUEUED_AT}" not in self._applied.get(wl.object_id, {}):
            values = {ENQUEUED_AT: seconds(now), **values}
        return self._annotate(wl, values)

    def _annotate(self, wl: _Workload, values: dict[str, str]) -> list[KubeEffect]:
        if wl.kind in _NO_ANNOTATIONS:
            return []
        changed = {k: v for k, v in values.items() if self._remember(wl.object_id, f"annotation:{k}", v)}
        if not changed:
            return []
        return [kube_effect(op="annotate", kind=wl.kind, namespace=wl.namespace, name=wl.name, annotations=changed)]

    def _suspend(self, wl: _Workload, value: bool) -> list[KubeEffect]:
        if not self._remember(wl.object_id, "spec.suspend", value):
            return []
        return [kube_effect(op="suspend" if value else "unsuspend", kind=wl.kind, namespace=wl.namespace,
                           name=wl.name)]

    def _evict_all(self, wl: _Workload, pods: tuple[str, ...]) -> list[KubeEffect]:
        out = []
        for pod in pods:
            namespace, _, name = pod.rpartition("/")
            namespace = namespace or wl.namespace
            if self._remember(self._pod_id(wl, namespace, name), "placement", ("evict",)):
                out.append(kube_effect(op="evict", kind="Pod", namespace=namespace, name=name))
        return out

    def _event(self, wl: _Workload, event_type: Literal["Normal", "Warning"], reason: str,
               message: str) -> list[KubeEffect]:
        """Consecutive identical events on one object are one event (Kubernetes would count them)."""
        if not self._remember(wl.object_id, "event", (event_type, reason, message)):
            return []
        return [kube_effect(op="event", kind=wl.kind, namespace=wl.namespace, name=wl.name, reason=reason,
                           message=message, event_type=event_type)]

    # ------------------------------------------------------------------ memory
    def _workload(self, key: str, kind: str = "") -> _Workload:
        wl = self._workloads.get(key)
        if wl is None:
            namespace, _, name = key.rpartition("/")
            wl = self._workloads[key] = _Workload(namespace=namespace or "default", name=name)
        if kind:
            wl.kind = kind
        return wl

    def _pod_id(self, wl: _Workload, namespace: str, pod: str) -> str:
        pod_id = f"Pod/{namespace or wl.namespace}/{pod}"
        owner = self._pod_owner.get(pod_id)
        if owner is not wl:
            if owner is not None:  # another workload's before: one owner forgets it
                owner.pods.pop(pod_id, None)
            wl.pods[pod_id] = None
            self._pod_owner[pod_id] = wl
        return pod_id

    def _pod_gone(self, pod_id: str) -> None:
        """The pod is deleted: what was written on it goes, so a long-lived workload whose pods come and
        go (lost nodes, autoscaling, evictions) keeps its live pods only. A pod of that name made again
        is a new pod, bound in full."""
        self._applied.pop(pod_id, None)
        owner = self._pod_owner.pop(pod_id, None)
        if owner is not None:
            owner.pods.pop(pod_id, None)

    def _remember(self, object_id: str, field_: str, value: Any) -> bool:
        """Record ``value`` as the last one emitted for (object, field); False if it already was."""
        memory = self._applied.setdefault(object_id, {})
        if field_ in memory and memory[field_] == value:
            return False
        memory[field_] = value
        return True

    def _forget(self, wl: _Workload) -> None:
        """A new incarnation of the object: nothing we wrote on the old one is on it."""
        self._applied.pop(wl.object_id, None)
        self._applied.pop(pod_group_object(f"{wl.namespace}/{wl.name}"), None)
        for pod_id in wl.pods:
            self._applied.pop(pod_id, None)
            self._pod_owner.pop(pod_id, None)
        wl.pods.clear()
