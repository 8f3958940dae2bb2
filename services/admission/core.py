"""The admission core: watch events in, normalised workloads and queues out.

Where each decision is made:
- gang arithmetic (RayCluster / RayJob): ``workloads.py``; one pod template → PodSet: ``pods.py``
- each queue dialect's rules (what the gang counts and charges, who is preemptible, who preempts):
  ``dialects.py``
- queue objects (Volcano / KAI / ElasticQuotaTree) and the book of defined queues: ``queues.py``
- queue resolution: ``resolve.py``; priority classes, preemptibility: ``priority.py``
- plain pod gangs and single pods (membership, min-available): ``podgangs.py``
- PodGroups KubeRay made for a RayCluster / RayJob (their minMember and queue): here, ``_on_ray_group``
- lifecycle (Submitted / Updated / Rejected / Finished / Deleted, dedup) and composition: here.

Every input error is an ``Invalid`` turned into a Rejected event; nothing here raises on user input.
Should it raise all the same (a bug), ``shared.runtime.service.Service`` rejects the object and the runtime
sets the event aside (``shared.kernel.faults``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal, Union

from services.admission import fields
from services.admission.dialects import KUBERAY, GangRules, dialect_of
from services.admission.fields import Invalid
from services.admission.pods import RuntimeClassRefusal
from services.admission.podgangs import PodGang, PodGangBook, is_plain_podgroup, ray_owner
from services.admission.priority import WHOLE, PriorityBook, class_name, preemptible, ray_pod_metas, volcano_pins
from services.admission.queues import QueueBook
from services.admission.resolve import queue_for, queue_key_slips
from services.admission.workloads import (
    RayShape,
    is_rayjob_cluster,
    parse_ray_cluster,
    parse_ray_job,
    ray_cluster_name,
    rayjob_outcome,
    spec_suspended,
    with_minimum,
)
from shared.kernel.events import (
    Envelope,
    ObjectChanged,
    ObjectsListed,
    QueueDefined,
    QueueRejected,
    QueueRemoved,
    WorkloadDeleted,
    WorkloadFinished,
    WorkloadRejected,
    WorkloadSubmitted,
    WorkloadUpdated,
    WorkloadWarned,
)
from shared.kernel import kube
from shared.kernel import quantity as q
from shared.kernel.dedupe import Tombstones
from shared.kernel.fold import Folds
from shared.kernel.kube import REFUSED, watched_namespace
from shared.kernel.listing import WatchBook
from shared.kernel.model import Gang, WorkloadKind, WorkloadSpec
from shared.kernel.policy import Policy
from shared.kernel.reasons import close_names, did_you_mean
from shared.kernel.treekey import tree_key
from shared.kernel.validation import one_of

Output = Union[QueueDefined, QueueRemoved, QueueRejected, WorkloadSubmitted, WorkloadUpdated, WorkloadRejected,
               WorkloadFinished, WorkloadDeleted, WorkloadWarned]
Gate = Literal["suspend", "pods"]


RayKind = Literal["RayCluster", "RayJob"]
RAY_KINDS: tuple[RayKind, ...] = ("RayCluster", "RayJob")


@dataclass
class RayWorkload:
    """A RayCluster or RayJob as admission tracks it between watch events."""

    kind: RayKind
    key: str
    namespace: str
    name: str
    obj: Mapping[str, Any]
    first_seen: float
    """``submitted_at``: the time of the Added event, kept across updates and re-evaluations."""
    gate: Gate
    """Decided once, from ``spec.suspend`` at creation (the reconciler flips it later; that is no change)."""
    uid: str = ""
    spec: WorkloadSpec | None = None
    """The last spec the queue core was given (Submitted / Updated)."""
    rejected: str | None = None
    """The current rejection reason (dedupes repeats; cleared when the object becomes valid)."""
    warned: str = ""
    """The last ``WorkloadWarned`` reason told of it (a warning is told once, and again when it changes)."""
    finished: bool = False
    deleted: bool = False
    shapes: dict[GangRules, tuple[tuple[bytes | str, bytes | str], RayShape]] = field(default_factory=dict)
    """The last shape read per dialect's rules, with ``tree_key`` of the ``spec`` it was read from: most
    watch events of a Ray object change only its status, and reading the spec again (every pod
    template's quantities) was most of admission's time in a replay."""
    last: tuple[tuple[Any, ...], WorkloadSpec] | None = None
    """The last spec ``_ray_spec`` built and all it was built from (``_ray_inputs``)."""
    group_read: tuple[Mapping[str, Any], bytes | str | None] | None = None
    """The workload's PodGroup object as last read by ``_ray_inputs`` (held, so compared by identity:
    a new watch event of the group is a new object) and ``_read_parts`` of it."""


class AdmissionCore(Folds):
    """Validates and normalises what users write into WorkloadSpecs and QueueSpecs."""

    service = "admission"
    TOMBSTONE_SECONDS = 600.0
    """How long (event time) a deleted RayCluster / RayJob is remembered, by uid only, to drop a stale
    event of it (a watch's late Modified); then it is forgotten, so state follows live objects."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.queues = QueueBook()
        self.priorities = PriorityBook()
        self.pod_gangs = PodGangBook(policy.answers_to)
        self.workloads: dict[str, RayWorkload] = {}
        self.ray_groups: dict[str, Mapping[str, Any]] = {}
        """``Kind:namespace/name`` of a RayCluster / RayJob -> the PodGroup KubeRay made for it."""
        self.job_clusters: dict[str, str] = {}
        """``namespace/cluster`` of a RayJob's own RayCluster -> the RayJob's name."""
        self._claims: dict[str, str] = {}
        self._gone: Tombstones[str, str] = Tombstones(self.TOMBSTONE_SECONDS)
        """Tombstones: workload id -> the uid of the object deleted, oldest first (``TOMBSTONE_SECONDS``)."""
        self._definitions = 0
        """Counts events that may have changed a queue, PriorityClass or RuntimeClass (part of ``_ray_inputs``)."""
        self.runtime_classes: dict[str, Mapping[str, Any]] = {}
        """RuntimeClass objects by name: the overhead and scheduling the API server gives a template's pods."""
        self._runtime_key: bytes | str = NO_RUNTIME_KEY
        """``tree_key`` of ``runtime_classes``: part of what a shape is remembered by (``_shape``)."""
        self.refused_pods: dict[str, dict[str, str]] = {}
        """``Kind:namespace/name`` of a RayCluster / RayJob -> its pods ingest refused (name -> why): the
        workload is rejected naming one until that pod is deleted (``topology.admission_reads_pod``)."""
        self.book = WatchBook()
        """Every watched object admission was told of, to tell what a list lacks (``shared.kernel.listing``)."""

    # ------------------------------------------------------------------ entry point
    def handle(self, env: Envelope) -> list[Output]:
        handler = self.folds.get(env.type)
        return handler(self, env.payload, env.occurred_at) if handler is not None else []

    def _on_ObjectChanged(self, p: ObjectChanged, now: float) -> list[Output]:
        self.book.observe(p)
        return list(self._on_object(p, now))

    def _on_ObjectsListed(self, p: ObjectsListed, now: float) -> list[Output]:
        """Objects deleted while no watch was open."""
        out: list[Output] = []
        for gone in self.book.listed(p):
            out += self._on_object(gone, now)
        return out

    def _on_object(self, p: ObjectChanged, now: float) -> list[Output]:
        api_version = p.api_version or str(p.object.get("apiVersion") or "")
        namespace = watched_namespace(p.namespace, p.object)
        kind = p.kind
        if one_of(kind, RAY_KINDS):
            return self._on_ray(p, kind, namespace, now)
        if p.kind == "Pod":
            if kube.is_ray_pod(p.object):
                return self._on_ray_pod(p, namespace)
            out: list[Output] = []
            for gang in self.pod_gangs.observe_pod(p.change, namespace, p.name, p.object):
                out += self._evaluate_gang(gang, now)
            return out
        if p.kind == "PodGroup":
            owner = ray_owner(p.object)
            if owner is not None:
                return self._on_ray_group(p, namespace, owner)
            if not is_plain_podgroup(api_version, p.object):
                return []
            group_gang = self.pod_gangs.observe_podgroup(p.change, f"{namespace}/{p.name}", p.object)
            return self._evaluate_gang(group_gang, now) if group_gang is not None else []
        if p.kind == "PriorityClass":
            self._definitions += 1
            before = self.priorities.default()[1]
            changed = self.priorities.delete(p.name) if p.change == "Deleted" else self.priorities.apply(p.name, p.object)
            classes = {p.name, before, self.priorities.default()[1]}  # None: workloads with no class at all
            return self._reevaluate(now, lambda spec: spec.priority_class in classes) if changed else []
        if p.kind == "RuntimeClass":
            return self._on_runtime_class(p, now)
        sid = QueueBook.source_id(p.kind, api_version, namespace, p.name)
        if sid is None:
            return []
        if p.change == "Deleted":
            queue_out: list[Output] = list(self.queues.delete(sid))
        else:
            queue_out = list(self.queues.apply(sid, p.kind, api_version, p.name, p.object))
        if queue_out:
            self._definitions += 1  # the book's specs change only with a QueueDefined or QueueRemoved
        if any(not isinstance(e, QueueRejected) for e in queue_out):
            names = {e.queue.name if isinstance(e, QueueDefined) else e.name for e in queue_out
                     if isinstance(e, (QueueDefined, QueueRemoved))}
            spaces = {ns for e in queue_out if isinstance(e, QueueDefined) for ns in e.queue.namespaces}
            queue_out += self._reevaluate(now, lambda spec: spec.queue in names or spec.namespace in spaces)
        return queue_out

    def _on_runtime_class(self, p: ObjectChanged, now: float) -> list[Output]:
        """A RuntimeClass defined, changed or removed: the Ray workloads are read again, since their pods'
        overhead and node constraints come from it (the API server's RuntimeClass admission). Plain pods are
        not: the API server admitted them already, and a pod keeps what it was given."""
        if p.change == "Deleted":
            if self.runtime_classes.pop(p.name, None) is None:
                return []
        else:
            read: dict[str, Any] = {k: p.object[k] for k in ("overhead", "scheduling") if k in p.object}
            if self.runtime_classes.get(p.name) == read:
                return []
            self.runtime_classes[p.name] = read
        self._definitions += 1
        self._runtime_key = tree_key(sorted(self.runtime_classes.items()))
        return self._reevaluate(now, lambda spec: True, gangs=False)

    # ------------------------------------------------------------------ RayCluster / RayJob lifecycle
    def _on_ray(self, p: ObjectChanged, kind: RayKind, namespace: str, now: float) -> list[Output]:
        if p.kind == "RayCluster" and is_rayjob_cluster(p.object):
            job = kube.rayjob_of_cluster(p.object)
            if job and p.change != "Deleted":  # a PodGroup KubeRay makes for this cluster is the RayJob's
                self.job_clusters[f"{namespace}/{p.name}"] = job
            elif p.change == "Deleted":
                self.job_clusters.pop(f"{namespace}/{p.name}", None)
            return []
        key = f"{namespace}/{p.name}"
        wid = f"{p.kind}:{key}"
        w = self.workloads.get(wid)
        self._gone.expire(now)
        if p.change == "Deleted":
            return self._delete(w, now)
        uid = _uid(p.object)
        gone = self._gone.get(wid)
        if w is None and gone is not None:
            if p.change == "Modified" or (uid and uid == gone):
                return []  # a stale event of the object that is gone
            self._gone.lift(wid)  # the same name created again: a new workload
        if w is None:
            w = RayWorkload(kind=kind, key=key, namespace=namespace, name=p.name, obj=p.object, first_seen=now,
                            gate="suspend" if spec_suspended(p.object) else "pods", uid=uid)
            self.workloads[wid] = w
        else:
            w.obj = p.object
        if w.finished:
            return []
        out = self._evaluate(w)
        if w.kind == "RayJob" and w.spec is not None:
            done = rayjob_outcome(w.obj)
            if done is not None:
                w.finished = True
                out.append(WorkloadFinished(key=w.key, outcome=done[0], reason=done[1]))
        return out

    def _on_ray_pod(self, p: ObjectChanged, namespace: str) -> list[Output]:
        """A KubeRay pod ingest refused (or the deletion of one): its RayCluster or RayJob is rejected
        with the pod's name and the bound it broke, and evaluated again once no refused pod is left."""
        if p.change == "Deleted" and not self.refused_pods:
            return []  # every KubeRay pod's deletion comes here (routing cannot tell a refused one): none is
        key, kind = kube.workload_key_of_pod(p.object), kube.workload_kind_of_pod(p.object)
        if key is None or kind is None:
            return []
        job = self.job_clusters.get(key) if kind == "RayCluster" else None
        if job is not None:
            kind, key = "RayJob", f"{namespace}/{job}"
        wid = f"{kind}:{key}"
        reason = kube.refused(p.object) if p.change != "Deleted" else None
        known = self.refused_pods.get(wid, {})
        if reason is not None:
            if known.get(p.name) == reason:
                return []
            self.refused_pods.setdefault(wid, {})[p.name] = reason
        else:
            if p.name not in known:
                return []
            del known[p.name]
            if not known:
                del self.refused_pods[wid]
        w = self.workloads.get(wid)
        if w is None or w.deleted or w.finished:
            return []
        return self._evaluate(w)

    def _delete(self, w: RayWorkload | None, now: float) -> list[Output]:
        """Deleted → WorkloadDeleted once, for anything the rest of the system heard about. The
        workload itself is dropped; a tombstone with its uid stays ``TOMBSTONE_SECONDS``."""
        if w is None or w.deleted:
            return []
        w.deleted = True
        w.obj = {}
        wid = f"{w.kind}:{w.key}"
        del self.workloads[wid]
        self._gone.bury(wid, w.uid, now)
        self._release(w.key, wid)
        self.refused_pods.pop(wid, None)
        if w.spec is None and w.rejected is None:
            return []
        return [WorkloadDeleted(key=w.key)]


    def _evaluate(self, w: RayWorkload, again: bool = False) -> list[Output]:
        """``again``: re-evaluation after queues, PriorityClasses or RuntimeClasses changed (see ``_reevaluate``).
        A submitted workload whose RuntimeClass the API server would now refuse (deleted, changed to
        conflict) keeps the spec it has, as its pods keep what the API server gave them."""
        try:
            spec = self._settled(lambda keep: self._ray_spec(w, keep=keep), w.spec if w.rejected is None else None,
                                 again)
        except RuntimeClassRefusal as exc:
            if again and w.spec is not None and w.rejected is None:
                return []
            return self._reject(w, w.kind, exc.reason) + self._warn(w, w.kind, w.obj)
        except Invalid as exc:
            return self._reject(w, w.kind, exc.reason) + self._warn(w, w.kind, w.obj)
        return (self._accept(w, spec) if spec is not None else []) + self._warn(w, w.kind, w.obj)

    @staticmethod
    def _settled(build: Callable[[WorkloadSpec | None], WorkloadSpec | None], keep: WorkloadSpec | None,
                 again: bool) -> WorkloadSpec | None:
        """The spec of a workload, by ``build(keep)`` (see ``_spec``), for a submitted one (``keep``) read leniently.

        After a definition changed (``again``) the lenient reading is the answer. After an event of the
        object itself it is only when it reads as before (a status or metadata change is no new check
        against today's queues and classes); a real edit is checked like a new workload.
        """
        if keep is None:
            return build(None)
        if again:
            return build(keep)
        try:
            read = build(keep)
            if read is keep or read == keep:  # most often the very spec kept (``_ray_spec``'s ``last``)
                return keep
        except Invalid:
            pass
        return build(None)

    def _ray_spec(self, w: RayWorkload, keep: WorkloadSpec | None = None) -> WorkloadSpec:
        """The gang as the queue's dialect counts it; a PodGroup KubeRay made for the workload (its
        ``--batch-scheduler`` is volcano or scheduler-plugins) gives the minimum and the queue."""
        wid = f"{w.kind}:{w.key}"
        self._claim(w.key, wid)
        inputs = self._ray_inputs(w, wid, keep)
        last = w.last
        if inputs is not None and last is not None and last[0][0] is inputs[0] and last[0][1:] == inputs[1:]:
            return last[1]
        spec = self._ray_spec_of(w, wid, keep)
        if keep is not None and spec == keep:
            spec = keep  # as ``_settled`` and ``_accept`` take an equal spec: kept (the next skip is ``read is keep``)
        if inputs is not None:
            w.last = (inputs, spec)
        return spec

    def _ray_inputs(self, w: RayWorkload, wid: str, keep: WorkloadSpec | None) -> tuple[Any, ...] | None:
        """All ``_ray_spec_of`` reads besides what a workload keeps (kind, name, gate, first seen):
        the same inputs, the same spec, so a watch event of a status change skips building it (None:
        do not skip). The kept spec by identity; queues and PriorityClasses by ``_definitions``; the
        object's and its PodGroup's spec and metadata by ``tree_key`` (which tells ``true`` from ``1``
        as ``repr`` does, where ``==`` does not), without their status, resourceVersion and muster's
        own annotations (``muster.dev/``, written on every status change), none of which a spec is read from."""
        obj = _read_parts(w.obj)
        group = self.ray_groups.get(wid)
        if group is None:
            read_group: bytes | str | None = b""
        elif w.group_read is not None and w.group_read[0] is group:
            read_group = w.group_read[1]  # the same object as at the last event: key it once
        else:
            read_group = _read_parts(group)
            w.group_read = (group, read_group)
        if obj is None or read_group is None:
            return None
        return (keep, self._definitions, obj, read_group, tuple(self.refused_pods.get(wid, {}).items()))

    def _ray_spec_of(self, w: RayWorkload, wid: str, keep: WorkloadSpec | None) -> WorkloadSpec:
        fields.not_refused(w.obj)
        refused = self.refused_pods.get(wid)
        if refused:
            pod, reason = min(refused.items())
            raise Invalid(f"pod {pod} refused at ingest: {reason}")
        shape = _shape(w, KUBERAY, self.runtime_classes, self._runtime_key)  # the spec is checked before anything is read
        labels, annotations = fields.labels(w.obj), fields.annotations(w.obj)
        group = _group_spec(self.ray_groups.get(wid))
        where = _where_group(self.ray_groups.get(wid), w.namespace)
        queue = queue_for(labels, annotations, w.namespace, self.queues, self.policy.default_queue,
                          group_queue=(fields.string(group.get("queue"), f"{where} spec.queue") or None))
        rules = dialect_of(self.queues.specs.get(queue[0])).gang
        if rules != KUBERAY:
            shape = _shape(w, rules, self.runtime_classes, self._runtime_key)
        gang, template_class, template_field = shape.gang, shape.head_priority_class, shape.head_priority_field
        if group.get("minMember") is not None:
            gang = with_minimum(gang, fields.integer(group.get("minMember"), f"{where} spec.minMember",
                                                     default=1, minimum=0))
        group_class = fields.string(group.get("priorityClassName"), f"{where} spec.priorityClassName") or None
        if group_class:
            template_class, template_field = group_class, f"{where} spec.priorityClassName"
        metas: list[tuple[str, str, object]] = list(ray_pod_metas(w.kind, w.obj))
        if wid in self.ray_groups:
            metas.append((WHOLE, f"{where} metadata", self.ray_groups[wid].get("metadata")))
        return self._spec(kind=w.kind, namespace=w.namespace, name=w.name, queue=queue, labels=labels,
                          template_class=template_class, template_field=template_field, gang=gang, gate=w.gate,
                          cluster_name=shape.cluster_name, submitted_at=w.first_seen,
                          pins=volcano_pins(metas), keep=keep)

    def _on_ray_group(self, p: ObjectChanged, namespace: str, owner: tuple[str, str]) -> list[Output]:
        """A PodGroup KubeRay made for a RayCluster or RayJob (Volcano's, or scheduler-plugins' for the
        RayJob's own cluster): the workload's gang definition. Its pods stay the Ray workload's; the
        group is never a gang of its own."""
        kind, name = owner
        job = self.job_clusters.get(f"{namespace}/{name}") if kind == "RayCluster" else None
        if job is not None:
            kind, name = "RayJob", job
        wid = f"{kind}:{namespace}/{name}"
        if p.change == "Deleted":
            if self.ray_groups.pop(wid, None) is None:
                return []
        else:
            if self.ray_groups.get(wid) == p.object:
                return []
            self.ray_groups[wid] = p.object
        w = self.workloads.get(wid)
        if w is None or w.deleted or w.finished:
            return []
        return self._evaluate(w)

    # ------------------------------------------------------------------ plain pod gangs
    def _evaluate_gang(self, gang: PodGang, now: float, again: bool = False) -> list[Output]:
        if not gang.members:
            self.pod_gangs.forget(gang)
            self._release(gang.key, gang.wid)
            return [WorkloadDeleted(key=gang.key)] if gang.submitted or gang.rejected is not None else []
        if gang.finished:
            return []
        if gang.submitted and gang.all_finished():
            gang.finished = True
            outcome, reason = gang.outcome()
            return [WorkloadFinished(key=gang.key, outcome=outcome, reason=reason)]
        try:
            spec = self._settled(lambda keep: self._gang_spec(gang, now, keep=keep),
                                 gang.spec if gang.rejected is None else None, again)
        except Invalid as exc:
            return self._reject(gang, gang.kind, exc.reason) + self._warn_gang(gang)
        return (self._accept(gang, spec) if spec is not None else []) + self._warn_gang(gang)

    def _gang_spec(self, gang: PodGang, now: float, keep: WorkloadSpec | None = None) -> WorkloadSpec | None:
        """The gang's spec once min-available pods wait (None before): its minimum by the shapes of the
        first pods, every further live pod elastic, labels of the first pod; held while it has fewer
        live pods than its minimum."""
        self._claim(gang.key, gang.wid)
        for pod_name, pod in gang.members.items():
            reason = kube.refused(pod)
            if reason is not None:
                raise Invalid(f"pod {pod_name} refused at ingest: {reason}")
        minimums = self.pod_gangs.min_available(gang)
        if minimums is None:
            return None
        minimum, tasks = minimums
        if not gang.submitted:
            if not gang.ready(minimum, tasks):
                return None
            if gang.ready_at is None:
                gang.ready_at = now
            gang.template = gang.waiting()[0]
        assert gang.template is not None and gang.ready_at is not None
        pod_gang = gang.gang(minimum, tasks)
        pod_name, pod = gang.template
        try:
            labels, annotations = fields.labels(pod), fields.annotations(pod)
            template_class = fields.string(pod["spec"].get("priorityClassName"), "spec.priorityClassName") or None
        except Invalid as exc:
            raise Invalid(f"pod {pod_name}: {exc.reason}") from None
        template_field = f"pod {pod_name} spec.priorityClassName"
        group = self.pod_gangs.group_spec(gang)
        where = f"PodGroup {gang.key} spec"
        group_class = fields.string(group.get("priorityClassName"), f"{where}.priorityClassName") or None
        if group_class:
            template_class, template_field = group_class, f"{where}.priorityClassName"
        queue = queue_for(labels, annotations, gang.namespace, self.queues, self.policy.default_queue,
                          group_queue=fields.string(group.get("queue"), f"{where}.queue") or None)
        metas: list[tuple[str, str, object]] = [(gang.pod_set_of(name, pod).name, f"pod {name} metadata",
                                                 pod.get("metadata")) for name, pod in gang.live()]
        if gang.kind == "PodGroup":
            metas.append((WHOLE, f"PodGroup {gang.key} metadata",
                          self.pod_gangs.podgroups.get(gang.key, {}).get("metadata")))
        return self._spec(kind=gang.kind, namespace=gang.namespace, name=gang.group, queue=queue, labels=labels,
                          template_class=template_class, template_field=template_field, gang=pod_gang, gate="pods",
                          cluster_name=gang.group, submitted_at=gang.ready_at, pins=volcano_pins(metas), keep=keep,
                          not_ready=gang.not_ready(minimum, tasks) if gang.submitted else "")

    # ------------------------------------------------------------------ shared: queue, priority, fit
    def _spec(self, *, kind: WorkloadKind, namespace: str, name: str, queue: tuple[str, str], labels: Mapping[str, str],
              template_class: str | None, template_field: str, gang: Gang, gate: Gate, cluster_name: str,
              submitted_at: float, pins: set[str] | None = None, keep: WorkloadSpec | None = None,
              not_ready: str = "") -> WorkloadSpec:
        """Queue, priority and preemptibility, common to every workload kind.

        Preemptibility follows the queue's dialect (``dialects.py``) and the user's opt-outs (``pins``: where
        ``volcano.sh/preemptable: "false"`` is written, ``priority.volcano_pins``; ``_pinned``). A gang larger than its queue's
        limits (or, non-preemptible, than a KAI queue's quota) is no bad input: queues change, so the queue
        core holds it with the numbers (``can never fit in queue Q as it is``), as every peer keeps it pending.

        ``keep``: the spec a submitted workload has while queues or PriorityClasses changed under it.
        Staying in its queue a removed queue leaves it waiting with the queue core's reason, and the class
        it still names that no longer resolves (deleted, made invalid) leaves it the priority it had, as
        Kubernetes leaves a pod's; moving to another queue it is checked like a new workload.
        """
        queue_name, source = queue
        moved = keep is None or queue_name != keep.queue
        known = queue_name == self.policy.default_queue or self.queues.exists(queue_name)
        if moved and not known and self.policy.unknown_queue == "reject":
            close = close_names(queue_name, [*self.queues.specs, self.policy.default_queue])
            raise Invalid(f"queue {queue_name} does not exist ({source}){did_you_mean(close)}")
        cls, cls_field = class_name(labels, template_class, template_field)
        try:
            priority, priority_class = self.priorities.resolve(cls, cls_field)
        except Invalid:
            if keep is None or cls != keep.priority_class:
                raise
            priority, priority_class = keep.priority, keep.priority_class
        dialect = dialect_of(self.queues.specs.get(queue_name))
        can_preempt = preemptible(priority, labels, dialect.non_preemptible_from)
        parts: tuple[str, ...] = ()
        if can_preempt and pins:
            whole, parts = _pinned(pins, gang) if dialect.preemptable_per_pod else (True, ())
            can_preempt = not whole and not parts
        if gang.desired_count > self.policy.max_gang_pods:
            raise Invalid(f"gang of {gang.desired_count} pods is larger than muster accepts "
                          f"(policy max_gang_pods {self.policy.max_gang_pods})")
        try:  # every pod it may ever have, elastic ones included, must sum within a 64-bit column
            q.check_total(_all_pods(gang), "gang")
        except q.QuantityError as exc:
            raise Invalid(str(exc)) from None
        return WorkloadSpec(key=f"{namespace}/{name}", kind=kind, namespace=namespace, name=name,
                            queue=queue_name, priority=priority, priority_class=priority_class, preemptible=can_preempt,
                            pinned_pod_sets=parts,
                            gate=gate, preempts=dialect.preempts(gate), gang=gang, submitted_at=submitted_at,
                            cluster_name=cluster_name, not_ready=not_ready)

    def _accept(self, entity: RayWorkload | PodGang, spec: WorkloadSpec) -> list[Output]:
        """Submitted the first time; Updated when the spec changed or a rejection was cleared."""
        if entity.spec is None:
            entity.spec, entity.rejected = spec, None
            return [WorkloadSubmitted(workload=spec)]
        if (spec is entity.spec or spec == entity.spec) and entity.rejected is None:  # ``is``: mostly kept
            return []
        entity.spec, entity.rejected = spec, None
        return [WorkloadUpdated(workload=spec)]

    @staticmethod
    def _reject(entity: RayWorkload | PodGang, kind: str, reason: str) -> list[Output]:
        if entity.rejected == reason:
            return []
        entity.rejected = reason
        return [WorkloadRejected(key=entity.key, kind=kind, reason=reason)]

    def _warn_gang(self, gang: PodGang) -> list[Output]:
        """A pod gang's queue keys are its first pod's (``template``), as its queue is."""
        return self._warn(gang, gang.kind, gang.template[1]) if gang.template is not None else []

    @staticmethod
    def _warn(entity: RayWorkload | PodGang, kind: str, obj: Mapping[str, Any]) -> list[Output]:
        """``WorkloadWarned`` when the object carries a key muster does not read but its user likely meant
        to name the queue with (``resolve.queue_key_slips``), naming where the workload went: told after
        its submission or rejection (what starts an incarnation for the reconciler), once per text."""
        if entity.spec is None and entity.rejected is None:
            return []
        slips = _slips(kube.labels(obj), kube.annotations(obj))
        if not slips:
            entity.warned = ""
            return []
        where = f"; it is in queue {entity.spec.queue}" if entity.rejected is None and entity.spec is not None else ""
        reason = "; ".join(slips) + where
        if reason == entity.warned:
            return []
        entity.warned = reason
        return [WorkloadWarned(key=entity.key, kind=kind, cause="QueueLabelIgnored", reason=reason)]

    def _reevaluate(self, now: float, touches: Callable[[WorkloadSpec], bool], gangs: bool = True) -> list[Output]:
        """Queues or PriorityClasses changed: every live workload they may touch is evaluated again, in
        arrival order (a change costs what it can affect, not a pass over every workload).
        ``touches`` picks the submitted ones: those in a changed queue or a namespace a changed queue
        lists (an ElasticQuotaTree leaf), or of a changed class or the default class before or after
        (no class at all is ``None``). Every rejected one is tried again.

        A rejected one may pass now (its queue or class was missing); a submitted one is resolved
        again and gets WorkloadUpdated when its queue, priority or preemptibility changed (an
        ElasticQuotaTree leaf listing its namespace, a ``globalDefault`` class that came after it).
        So the order of documents in one ``apply`` does not matter. The queue core applies such an
        update while the workload waits; a quota holder keeps what it was admitted with. ``gangs``: False
        when the change cannot touch plain pod gangs (a RuntimeClass: their pods are admitted already).
        """
        out: list[Output] = []
        for w in list(self.workloads.values()):
            if (w.rejected is not None or (w.spec is not None and touches(w.spec))) and not w.deleted and not w.finished:
                out += self._evaluate(w, again=True)
        for gang in list(self.pod_gangs.gangs.values()) if gangs else ():
            if (gang.rejected is not None or (gang.spec is not None and touches(gang.spec))) and not gang.finished:
                out += self._evaluate_gang(gang, now, again=True)
        return out

    def _claim(self, key: str, wid: str) -> None:
        """One workload per ``namespace/name``: a second kind under the same key is rejected."""
        holder = self._claims.setdefault(key, wid)
        if holder != wid:
            kind, _, _ = holder.partition(":")
            raise Invalid(f"workload {key} is already taken by {kind} {key}")

    def _release(self, key: str, wid: str) -> None:
        if self._claims.get(key) == wid:
            del self._claims[key]




def _pinned(pins: set[str], gang: Gang) -> tuple[bool, tuple[str, ...]]:
    """(the whole workload is pinned, the pod sets pinned alone), where the dialect reads the opt-out per
    pod: whole when the workload itself is pinned or every pod set is. A pod set without pods yet pins too:
    a holder keeps the preemptibility it was admitted with, and the pods a scale-up brings must stay."""
    names = [ps.name for ps in gang.pod_sets]
    parts = tuple(name for name in names if name in pins)
    if WHOLE in pins or not parts or len(parts) == len(names):
        return True, ()
    return False, parts


def _all_pods(gang: Gang) -> dict[str, int]:
    total: dict[str, int] = {}
    for ps in gang.pod_sets:
        total = q.add(total, ps.resources, ps.count + ps.elastic)
    return total


_OWN_ANNOTATIONS = "muster.dev/"


def _read_parts(obj: Mapping[str, Any]) -> bytes | str | None:
    """``tree_key`` (``repr``'s test, faster) of the parts of an object a spec is read from (see
    ``_ray_inputs``); None when its metadata or annotations are not of the shape to tell (then
    nothing is skipped)."""
    meta = obj.get("metadata")
    if type(meta) is not dict:
        return None
    annotations = meta.get("annotations")
    read: dict[str, str] = {}
    if annotations is not None:
        if type(annotations) is not dict:
            return None
        for name, value in annotations.items():
            if type(value) is not str or type(name) is not str:
                return None  # refused by ``fields.annotations``: not skipped
            if not name.startswith(_OWN_ANNOTATIONS) or name == REFUSED:  # a refusal is read (``fields.not_refused``)
                read[name] = value
    return tree_key((obj.get("spec"), meta.get("name"), meta.get("labels"), read))


SLIPS_MEMO = 1024
"""How many distinct (label keys, annotation keys) sets ``_slips`` remembers (then it starts afresh): the
objects of a cluster carry a few sets of keys, and each status event of one would judge them again."""
_slips_memo: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[str, ...]] = {}


def _slips(labels: Mapping[Any, Any], annotations: Mapping[Any, Any]) -> tuple[str, ...]:
    """``queue_key_slips`` of these keys (text keys only: a malformed object is refused elsewhere), remembered."""
    memo_key = (tuple(sorted(k for k in labels if isinstance(k, str))),
                tuple(sorted(k for k in annotations if isinstance(k, str))))
    slips = _slips_memo.get(memo_key)
    if slips is None:
        slips = tuple(queue_key_slips(*memo_key))
        if len(_slips_memo) >= SLIPS_MEMO:
            _slips_memo.clear()
        _slips_memo[memo_key] = slips
    return slips


SHAPES_MEMO = 1024
"""How many distinct (kind, rules, spec) shapes ``_shape`` remembers across workloads (then it starts
afresh): a cluster's Ray workloads come from a few templates, and parsing each new one's pod
templates, quantities and pod sets was most of a RayJob's first event in a replay."""
_shapes_memo: dict[tuple[str, GangRules, bytes | str, bytes | str], RayShape] = {}


NO_RUNTIME_KEY = tree_key([])
"""``tree_key`` of no RuntimeClasses (the sorted items of an empty book)."""


def _shape(w: RayWorkload, rules: GangRules, runtime_classes: Mapping[str, Mapping[str, Any]] | None = None,
           runtime_key: bytes | str = NO_RUNTIME_KEY) -> RayShape:
    """``parse_ray_cluster`` / ``parse_ray_job`` of ``w``'s object, read again only when its ``spec``
    (all they read, with the name, which a workload keeps) changed. ``tree_key`` is the key, not ``==``:
    it tells ``true`` from ``1`` and ``1.0`` as ``repr`` does, which the parsers read differently (``==`` does not).

    A spec read before, by any workload of the kind, under the same rules gives the shape read then
    (``_shapes_memo``), with this workload's own cluster name (``ray_cluster_name``, the one part a
    parser takes from the name). Only shapes read without error are remembered: a spec that is
    refused is parsed again, as before, so its reason is the parser's. The RuntimeClasses are part of
    the key (``runtime_key``, their ``tree_key``): a template's pods count their class's overhead."""
    text = tree_key(w.obj.get("spec"))
    last = w.shapes.get(rules)
    if last is not None and last[0] == (text, runtime_key):
        return last[1]
    memo_key = (w.kind, rules, text, runtime_key)
    shape = _shapes_memo.get(memo_key)
    if shape is None:
        shape = (parse_ray_cluster if w.kind == "RayCluster" else parse_ray_job)(w.name, w.obj, rules,
                                                                                    runtime_classes or {})
        if len(_shapes_memo) >= SHAPES_MEMO:
            _shapes_memo.clear()
        _shapes_memo[memo_key] = shape
    else:
        cluster_name = ray_cluster_name(w.kind, w.name)
        if shape.cluster_name != cluster_name:
            shape = replace(shape, cluster_name=cluster_name)
    w.shapes[rules] = ((text, runtime_key), shape)
    return shape


def _group_spec(group: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A KubeRay-made PodGroup's spec (empty when there is none)."""
    spec = group.get("spec") if group is not None else None
    return spec if type(spec) is dict or (spec is not None and isinstance(spec, Mapping)) else {}


def _where_group(group: Mapping[str, Any] | None, namespace: str) -> str:
    meta = group.get("metadata") if group is not None else None
    name = meta.get("name") if type(meta) is dict or (meta is not None and isinstance(meta, Mapping)) else None
    return f"PodGroup {namespace}/{name}"


def _uid(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    uid = meta.get("uid") if type(meta) is dict or isinstance(meta, Mapping) else None  # dict first: no ABC frame
    return uid if isinstance(uid, str) else ""
