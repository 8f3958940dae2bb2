"""The scheduling history as a fold over the event log: the ``muster simulate`` result view.

Pure and incremental (``apply(envelope)``), so the embedded runtime, the Postgres projector and a
replay of a stored log all build the same view from the same events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Iterable, Mapping, Union, get_args

from pydantic import ConfigDict, Field, TypeAdapter
from typing_extensions import TypedDict

from shared.kernel import kube
from shared.kernel import quantity as q
from shared.kernel.events import (
    BackedOff, Dequeued, ElasticGranted, ElasticReleased, ElasticWaiting, Enqueued, Envelope, GangDisrupted, GangEvicted,
    GangPlaced, GangRunning, ObjectChanged, Payload, PlacementFailed, PodAssigned, PreemptionRequested, QueueDefined,
    QueueRejected, QueueRemoved, ReclaimRequested, WorkloadDeleted, WorkloadFinished, WorkloadRejected,
    WorkloadSubmitted, WorkloadUpdated, WorkloadWarned, WorkloadWithdrawn,
)
from shared.kernel.fold import Folds
from shared.kernel.model import Gang, QueueSpec, as_placed, shrunk, still_held

# --------------------------------------------------------------------------- what the fold reads
_IGNORE_REST = ConfigDict(extra="ignore")


# pydantic reads a TypedDict's config from ``__pydantic_config__`` (its documented way), a key that
# mypy takes for a TypedDict field with a value [misc]; ``_or_as_is`` builds each field's type at
# import, which mypy cannot read [valid-type].
class _MetaRead(TypedDict, total=False):
    __pydantic_config__ = _IGNORE_REST  # type: ignore[misc]
    namespace: Any
    labels: Any
    annotations: Any


class _SpecRead(TypedDict, total=False):
    __pydantic_config__ = _IGNORE_REST  # type: ignore[misc]
    nodeName: Any


def _or_as_is(parts: Any) -> Any:
    """``parts`` where the value is an object, the value itself where it is not (users' objects
    may have any shape; the fold reads them through ``kube.mapping``)."""
    return Annotated[Union[parts, Any], Field(union_mode="left_to_right")]


class ObjectRead(TypedDict, total=False):
    """The parts of a watched object the fold reads: a pod's namespace, labels and annotations (its
    workload, its pod set) and ``spec.nodeName`` (bound or not). ``ResultProjection._on_ObjectChanged`` must
    read nothing else; ``tests/unit/shared/test_projection.py`` folds every scenario both ways to
    hold it."""

    __pydantic_config__ = _IGNORE_REST  # type: ignore[misc]
    metadata: _or_as_is(_MetaRead)  # type: ignore[valid-type]
    spec: _or_as_is(_SpecRead)  # type: ignore[valid-type]


class ObjectChangedRead(ObjectChanged):
    """``ObjectChanged`` with only ``ObjectRead`` of its object: what a reader that only folds
    (the history store's projector) needs to build, a fraction of a whole watch event's decoding."""

    object: ObjectRead  # type: ignore[assignment]  # narrows the field to what the fold reads, on purpose


class EnvelopeRead(Envelope):
    """An ``Envelope`` as the fold reads it: any payload, watch events as ``ObjectChangedRead``.
    It accepts exactly what ``Envelope`` accepts."""

    model_config = ConfigDict(cache_strings="keys")
    """Ids are never the same twice: caching every string (pydantic's default), not only keys,
    costs more than it saves (a twentieth of a decode)."""

    # A union of Payload's members computed at import (ObjectChanged's replaced), which mypy cannot read.
    payload: Annotated[
        Union[tuple(ObjectChangedRead if t is ObjectChanged else t for t in get_args(get_args(Payload)[0]))],  # type: ignore[valid-type]
        Field(discriminator="type")]


ENVELOPE_READ = TypeAdapter(EnvelopeRead)


PHASES = ("Rejected", "Queued", "Admitted", "Running", "Succeeded", "Failed", "Preempted", "Deleted")
NOT_LIVE = frozenset({None, "Deleted"})
"""Phases of a view that is no workload of its queue: not heard of yet (``None``), or deleted. Counted
in no queue (the reconciler's status book)."""


@dataclass
class PodView:
    name: str
    pod_set: str
    node: str | None = None
    gpu: dict[str, Any] | None = None
    bound: list[list[float | None]] = field(default_factory=list)
    gone: bool = False

    def bound_at(self, t: float) -> bool:
        # Each interval is [start, end]: start always a time, end None while the pod is still bound.
        return any(start is not None and start <= t and (end is None or end > t) for start, end in self.bound)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "pod_set": self.pod_set, "node": self.node, "gpu": self.gpu,
                "bound": [list(b) for b in self.bound]}


@dataclass
class WorkloadView:
    key: str
    kind: str
    queue: str | None = None
    priority: int = 0
    min_member: int = 0
    resources: dict[str, int] = field(default_factory=dict)
    demand: dict[str, int] = field(default_factory=dict)
    phase: str | None = None
    reason: str = ""
    transitions: list[dict[str, Any]] = field(default_factory=list)
    holds_quota: bool = False
    rejected: str = ""
    """Why admission last refused it (kept so a later withdrawal can restore the verdict)."""
    admitted: Gang | None = None
    """The gang quota was reserved for; an edit only ever shrinks it (``shared.kernel.model.shrunk``)."""
    elastic: dict[str, int] = field(default_factory=dict)
    """Elastic pods granted per pod set of the admitted gang, charged on top of it (``demand`` includes them)."""
    elastic_admission: int | None = None
    """The queue's number of the admission those grants belong to (a release of another is stale)."""
    gpu_memory: int = 0
    """MiB per GPU device its ``gpu-memory`` pods are charged at while it holds quota (``Dequeued.gpu_memory``)."""
    gpu_held: dict[str, int] = field(default_factory=dict)
    """Per pod set, the GPU its placed ``gpu-memory`` pods hold, charged instead (``GangPlaced.gpu_memory_held``)."""
    elastic_waiting: list[dict[str, Any]] = field(default_factory=list)
    """Why elastic pods its owner wants wait, as it changed: ``{"t", "reason"}``, "" once granted or over."""
    warnings: list[dict[str, Any]] = field(default_factory=list)
    """What admission warned of on its object (``WorkloadWarned``), as told: ``{"t", "reason"}``."""
    queue_state: str = ""          # pending | backoff | active | ""
    requeue_at: float | None = None
    order: int = 0

    def transition(self, t: float, phase: str, reason: str) -> None:
        """Record a change of phase, or of the reason the workload is in it."""
        if phase == self.phase and reason == self.reason:
            return
        self.phase, self.reason = phase, reason
        self.transitions.append({"t": round(t, 6), "phase": phase, "reason": reason})

    def elastic_wait(self, t: float, reason: str) -> None:
        if (self.elastic_waiting[-1]["reason"] if self.elastic_waiting else "") != reason:
            self.elastic_waiting.append({"t": round(t, 6), "reason": reason})

    def elastic_waiting_at(self, t: float) -> str:
        """Why its elastic pods waited at ``t`` ("" when none did)."""
        current = ""
        for tr in self.elastic_waiting:
            if tr["t"] <= t:
                current = tr["reason"]
        return current

    def warned_by(self, t: float) -> list[str]:
        """The warnings told of it at or before ``t``, oldest first (a Kubernetes Event stays said)."""
        return [w["reason"] for w in self.warnings if w["t"] <= t]

    def phase_at(self, t: float) -> tuple[str | None, str]:
        current: tuple[str | None, str] = (None, "")
        for tr in self.transitions:
            if tr["t"] <= t:
                current = (tr["phase"], tr["reason"])
        return current


def rolled_up(direct: Mapping[str, Mapping[str, int]], queues: Mapping[str, QueueSpec]) -> dict[str, dict[str, int]]:
    """Each queue's own sums added to it and to every ancestor (``parent`` links of ``queues``; a
    missing queue ends the climb, a parent cycle is climbed once): fresh dicts, the caller's to keep."""
    usage: dict[str, dict[str, int]] = {}
    for queue, own in direct.items():
        name: str | None = queue
        seen: list[str] = []
        amounts = own.items()
        while name is not None and name not in seen:
            seen.append(name)
            total = usage.get(name)
            if total is None:
                total = usage[name] = {}
            for resource, amount in amounts:
                total[resource] = total.get(resource, 0) + amount
            spec = queues.get(name)
            name = spec.parent if spec else None
    return usage


class QueueSums:
    """What the workloads of each queue add up to, kept as each workload changes.

    ``set`` says what one workload contributes now (amounts to one queue, or nothing); the sums move
    by the difference, so reading them costs the queues, not the workloads: the reconciler reads
    them every second of event time, with every workload it has seen still in view. A queue is in
    ``direct`` while some workload contributes to it, a name in its sums while one of those names it
    (an amount of 0 too): what summing every workload afresh gives, the same dicts (the order of
    their names aside; every writer sorts them). ``tests/property/test_queue_sums.py`` holds it.
    """

    __slots__ = ("direct", "_of", "_names", "_count")

    def __init__(self) -> None:
        self.direct: dict[str, dict[str, int]] = {}
        """Queue -> the sums of its own workloads (``rolled_up`` adds the queues below it)."""
        self._of: dict[str, tuple[str, dict[str, int]]] = {}
        """Workload key -> the queue and amounts it contributes (only those that contribute)."""
        self._names: dict[str, dict[str, int]] = {}
        """Queue -> name -> how many of its contributing workloads name it."""
        self._count: dict[str, int] = {}
        """Queue -> how many workloads contribute to it."""

    def set(self, key: str, queue: str | None, amounts: Mapping[str, int]) -> None:
        """``key`` contributes ``amounts`` to ``queue`` from now on (``None``: to no queue)."""
        old = self._of.get(key)
        if old is None:
            if queue is None:
                return
        elif old[0] == queue and old[1] == amounts:
            return
        else:
            self._take(key, old[0], old[1])
        if queue is None:
            return
        kept = dict(amounts)
        self._of[key] = (queue, kept)
        sums = self.direct.get(queue)
        if sums is None:
            sums, names = self.direct[queue], self._names[queue] = {}, {}
            self._count[queue] = 1
        else:
            names = self._names[queue]
            self._count[queue] += 1
        for name, amount in kept.items():
            sums[name] = sums.get(name, 0) + amount
            names[name] = names.get(name, 0) + 1

    def drop(self, key: str) -> None:
        """``key`` contributes nothing any more (a forgotten workload)."""
        old = self._of.get(key)
        if old is not None:
            self._take(key, old[0], old[1])

    def _take(self, key: str, queue: str, amounts: dict[str, int]) -> None:
        del self._of[key]
        left = self._count[queue] - 1
        if not left:
            del self.direct[queue], self._names[queue], self._count[queue]
            return
        self._count[queue] = left
        sums, names = self.direct[queue], self._names[queue]
        for name, amount in amounts.items():
            if names[name] == 1:
                del names[name], sums[name]
            else:
                names[name] -= 1
                sums[name] -= amount

    def rolled(self, queues: Mapping[str, QueueSpec]) -> dict[str, dict[str, int]]:
        """The sums of each queue and every queue below it (``rolled_up``)."""
        return rolled_up(self.direct, queues)


IN_QUEUE_STATES = frozenset({"pending", "backoff"})
"""Queue states of a workload waiting in its queue (a member of it, as Volcano and KAI count them)."""


class ResultProjection(Folds):
    """Folds envelopes into workloads, pods and queues as the result contract describes.

    Views change through ``apply`` (and ``hold``, for one loaded from elsewhere): the quota each
    holds (``held``) and who is in each queue are kept as they change, so the queries below cost
    the queues and their members, not every workload ever folded.
    """

    def __init__(self, scenario: str = "") -> None:
        self.scenario = scenario
        self.workloads: dict[str, WorkloadView] = {}
        self.pods: dict[str, dict[str, PodView]] = {}   # workload key -> pod name -> view
        self.queues: dict[str, QueueSpec] = {}
        self.rejected_queues: dict[str, str] = {}
        """Queue name -> why its last definition was refused (the queue keeps any earlier definition)."""
        self.events = 0
        self.decisions = 0
        self.now = 0.0
        self._created = 0
        self.held = QueueSums()
        """Quota each workload holds, by queue (``queue_usage`` rolls it up)."""
        self._in_queue: dict[str, str] = {}
        """Workload key -> its queue, while it holds quota there or waits in it."""
        self._queue_members: dict[str, dict[str, WorkloadView]] = {}
        """Queue -> the workloads ``_in_queue`` names it for: all that ``queue_views`` lists."""
        self._folded: WorkloadView | None = None
        """The workload the envelope being applied is about (``_workload`` names it)."""

    # ------------------------------------------------------------------ fold
    def apply(self, env: Envelope) -> None:
        self.events += 1
        at = env.occurred_at
        if at > self.now:
            self.now = at
        if env.source not in _NOT_DECISIONS and env.type != "PolicyApplied":  # a fact, not a decision
            self.decisions += 1
        self._folded = None
        handler = self.folds.get(env.type)  # the history store's projector folds every envelope here
        if handler is not None:
            handler(self, env.payload, at)
            folded = self.folded  # the handler's: read anew (mypy keeps the None set above otherwise)
            if folded is not None:
                self.hold(folded)

    @property
    def folded(self) -> WorkloadView | None:
        """The workload the last envelope applied was about, if its fold read or changed one (a pod's
        bookkeeping alone is not)."""
        return self._folded

    def hold(self, view: WorkloadView) -> None:
        """Take ``view`` as it is now into the quota held and the queues' members (``apply`` does this
        for the workload each envelope is about; a subclass that loads a view calls it)."""
        key, queue = view.key, view.queue
        self.held.set(key, queue if view.holds_quota else None, view.demand)
        listed = queue if view.holds_quota or view.queue_state in IN_QUEUE_STATES else None
        was = self._in_queue.get(key)
        if was == listed:
            if listed is not None:
                self._queue_members[listed][key] = view
            return
        if was is not None:
            self._unlist(key, was)
        if listed is not None:
            self._in_queue[key] = listed
            self._queue_members.setdefault(listed, {})[key] = view

    def forget(self, key: str) -> None:
        """Drop a workload's view and pods (a reader that keeps only live workloads)."""
        self.workloads.pop(key, None)
        self.pods.pop(key, None)
        self.held.drop(key)
        if self._folded is not None and self._folded.key == key:
            self._folded = None  # the last fold's pointer is not a reason to keep the view
        was = self._in_queue.get(key)
        if was is not None:
            self._unlist(key, was)

    def _unlist(self, key: str, was: str) -> None:
        """Take ``key`` out of queue ``was``'s members; a queue left with none is no longer listed."""
        members = self._queue_members[was]
        del members[key]
        if not members:
            del self._queue_members[was]
        del self._in_queue[key]

    def _workload(self, key: str, kind: str = "") -> WorkloadView:
        view = self.workloads.get(key)
        if view is None:
            view = self.workloads[key] = WorkloadView(key=key, kind=kind, order=self._created)
            self._created += 1  # not len(workloads): a reader may forget views (``StatusBook``)
        elif kind and not view.kind:
            view.kind = kind
        self._folded = view
        return view

    def _describe(self, view: WorkloadView, spec: Any) -> None:
        """What the workload is, and what it charges (its ``gpu-memory`` pods at ``view.gpu_memory``)."""
        view.kind = spec.kind
        view.queue = spec.queue
        view.priority = spec.priority
        view.min_member = spec.gang.min_member
        view.resources = spec.gang.resources
        view.demand = spec.gang.quota_demand_at(view.gpu_memory)

    @staticmethod
    def _recharge(view: WorkloadView) -> None:
        """``demand``: the admitted gang plus its granted elastic pods, one pod's demand each (the queue's sum)."""
        if view.admitted is None:
            return
        demand = view.admitted.quota_demand_at(view.gpu_memory, view.gpu_held)
        for ps in view.admitted.pod_sets:
            if view.elastic.get(ps.name):
                demand = q.add(demand, ps.pod_demand_at(view.gpu_memory), view.elastic[ps.name])
        view.demand = demand

    @staticmethod
    def _no_elastic(view: WorkloadView, t: float) -> None:
        """The admission ended: no elastic pod holds quota any more (nor waits for it)."""
        view.elastic, view.elastic_admission = {}, None
        view.elastic_wait(t, "")
    def _on_QueueDefined(self, p: QueueDefined, t: float) -> None:
        self.queues[p.queue.name] = p.queue
        self.rejected_queues.pop(p.queue.name, None)

    def _on_QueueRemoved(self, p: QueueRemoved, t: float) -> None:
        self.queues.pop(p.name, None)
        self.rejected_queues.pop(p.name, None)

    def _on_QueueRejected(self, p: QueueRejected, t: float) -> None:
        self.rejected_queues[p.name] = p.reason

    def _on_WorkloadSubmitted(self, p: WorkloadSubmitted, t: float) -> None:
        view = self._workload(p.workload.key)
        view.rejected = ""
        self._describe(view, p.workload)
        if p.workload.kind == "Pod":  # a gang of one: the pod is the workload's from the start
            self._pod(p.workload.key, p.workload.name, "pods")

    def _on_WorkloadUpdated(self, p: WorkloadUpdated, t: float) -> None:
        view = self._workload(p.workload.key)
        view.rejected = ""
        if not view.holds_quota:
            self._describe(view, p.workload)
            return
        smaller = shrunk(view.admitted, p.workload.gang) if view.admitted is not None else None
        if smaller is not None:  # quota follows what was admitted, shrunk by an edit asking for fewer pods
            if view.gpu_held and view.admitted is not None:
                view.gpu_held = still_held(view.gpu_held, view.admitted, smaller)
            view.admitted = smaller
            view.min_member, view.resources = smaller.min_member, smaller.resources
            self._recharge(view)

    def _on_WorkloadRejected(self, p: WorkloadRejected, t: float) -> None:
        view = self._workload(p.key, p.kind)
        if view.kind != p.kind and view.phase not in (None, "Rejected"):
            return  # another kind's object under the same name was refused; this workload is unaffected
        if view.holds_quota:
            # A refused edit: the workload keeps running on its last valid spec.
            view.transition(t, view.phase or "Admitted", f"edit refused, still running as admitted: {p.reason}")
            return
        view.transition(t, "Rejected", p.reason)
        view.queue_state = ""
        view.rejected = p.reason

    def _on_WorkloadWithdrawn(self, p: WorkloadWithdrawn, t: float) -> None:
        """The queue let go of it. After a rejection its queue may still have said 'waiting' in between
        (admission and the queue answer in their own order): the rejection is the last word."""
        view = self._workload(p.key)
        view.holds_quota, view.queue_state = False, ""
        self._no_elastic(view, t)
        if view.phase == "Queued" and view.rejected:
            view.transition(t, "Rejected", view.rejected)

    def _on_Enqueued(self, p: Enqueued, t: float) -> None:
        view = self._workload(p.key)
        view.queue = p.queue
        view.transition(t, "Queued", p.reason)
        view.queue_state, view.requeue_at = "pending", None

    def _on_BackedOff(self, p: BackedOff, t: float) -> None:
        view = self._workload(p.key)
        view.transition(t, "Queued", p.reason)
        view.queue_state, view.requeue_at = "backoff", p.requeue_at
        view.holds_quota = False
        self._no_elastic(view, t)

    def _on_Dequeued(self, p: Dequeued | ReclaimRequested, t: float) -> None:
        view = self._workload(p.key)
        view.gpu_memory, view.gpu_held = p.gpu_memory, {}
        self._describe(view, p.workload)
        view.admitted = p.workload.gang
        view.holds_quota, view.queue_state = True, "active"
        self._no_elastic(view, t)

    _on_ReclaimRequested = _on_Dequeued

    def _on_ElasticGranted(self, p: ElasticGranted, t: float) -> None:
        view = self._workload(p.key)
        if not view.holds_quota:
            return
        if view.elastic_admission != p.admission:
            view.elastic, view.elastic_admission = {}, p.admission
        view.elastic[p.pod_set] = view.elastic.get(p.pod_set, 0) + p.count
        view.elastic_wait(t, "")
        self._recharge(view)

    def _on_WorkloadWarned(self, p: WorkloadWarned, t: float) -> None:
        view = self._workload(p.key, p.kind)
        if not view.warnings or view.warnings[-1]["reason"] != p.reason:
            view.warnings.append({"t": round(t, 6), "reason": p.reason})

    def _on_ElasticWaiting(self, p: ElasticWaiting, t: float) -> None:
        self._workload(p.key).elastic_wait(t, p.reason)

    def _on_ElasticReleased(self, p: ElasticReleased, t: float) -> None:
        view = self._workload(p.key)
        if not view.holds_quota or view.elastic_admission != p.admission:
            return  # the queue ignores a release of another admission's grants too
        left = view.elastic.get(p.pod_set, 0) - p.count
        if left > 0:
            view.elastic[p.pod_set] = left
        else:
            view.elastic.pop(p.pod_set, None)
        self._recharge(view)

    def _on_PlacementFailed(self, p: PlacementFailed, t: float) -> None:
        view = self._workload(p.key)
        view.holds_quota = False
        self._no_elastic(view, t)

    def _on_GangPlaced(self, p: GangPlaced, t: float) -> None:
        view = self._workload(p.key)
        if view.admitted is not None and view.phase not in ("Admitted", "Running"):  # the first answer to a request
            placed = as_placed(view.admitted, (s.pod_set for s in p.slots))
            if placed is not view.admitted:  # other members of a pod group stood in: quota follows them
                view.admitted = placed
                self._recharge(view)
        view.holds_quota, view.queue_state = True, "active"
        view.transition(t, "Admitted", p.reason)
        held = p.gpu_memory_held
        if held:  # its gpu-memory pods are charged what they hold on their devices (the queue's rule)
            view.gpu_held = held
            self._recharge(view)

    def _on_GangRunning(self, p: GangRunning, t: float) -> None:
        self._workload(p.key).transition(t, "Running", p.reason)

    def _on_GangDisrupted(self, p: GangDisrupted, t: float) -> None:
        self._workload(p.key).transition(t, "Admitted", p.reason)

    def _on_PreemptionRequested(self, p: PreemptionRequested, t: float) -> None:
        self._evicted(p.key, p.reason, t)

    def _on_GangEvicted(self, p: GangEvicted, t: float) -> None:
        """A stale gang is evicted as a preempted one is: phase Preempted, saying why."""
        self._evicted(p.key, p.reason, t)

    def _evicted(self, key: str, reason: str, t: float) -> None:
        view = self._workload(key)
        view.holds_quota, view.queue_state = False, ""
        self._no_elastic(view, t)
        view.transition(t, "Preempted", reason)

    def _on_WorkloadFinished(self, p: WorkloadFinished, t: float) -> None:
        view = self._workload(p.key)
        view.holds_quota, view.queue_state = False, ""
        self._no_elastic(view, t)
        view.transition(t, p.outcome, p.reason)

    def _on_WorkloadDeleted(self, p: WorkloadDeleted, t: float) -> None:
        view = self._workload(p.key)
        view.holds_quota, view.queue_state = False, ""
        self._no_elastic(view, t)
        view.transition(t, "Deleted", p.reason)

    def _on_PodAssigned(self, p: PodAssigned, t: float) -> None:
        pod = self._pod(p.key, p.pod, p.pod_set)
        pod.pod_set = p.pod_set  # placement knows a plain pod gang's shape-based pod set; labels do not
        pod.node = p.node
        if p.gpu is not None:
            pod.gpu = {"devices": list(p.gpu.devices), "fraction": p.gpu.fraction}

    def _pod(self, key: str, name: str, pod_set: str) -> PodView:
        pods = self.pods.setdefault(key, {})
        view = pods.get(name)
        if view is None:
            view = pods[name] = PodView(name=name, pod_set=pod_set)
        return view

    def _pod_workload(self, p: Any) -> str | None:
        """The workload a pod's watch event belongs to (a subclass may know it already)."""
        return pod_workload_key(p)

    def _on_ObjectChanged(self, p: ObjectChanged, t: float) -> None:
        if p.kind != "Pod":
            return
        key = self._pod_workload(p)
        if key is None:
            return
        if kube.workload_kind_of_pod(p.object) is None:  # a plain pod is a workload only as a gang of one
            view = self.workloads.get(key)
            if view is None or view.kind != "Pod":
                return
        pod = self._pod(key, p.name, kube.pod_set_of_pod(p.object))
        node = kube.mapping(p.object.get("spec")).get("nodeName")
        open_interval = bool(pod.bound) and pod.bound[-1][1] is None
        if p.change == "Deleted":
            if open_interval:
                pod.bound[-1][1] = round(t, 6)
            pod.gone = True
            return
        if node and not open_interval:
            pod.node = node
            pod.bound.append([round(t, 6), None])

    # ------------------------------------------------------------------ queries
    def pods_of(self, key: str) -> list[PodView]:
        return list(self.pods.get(key, {}).values())

    def queue_usage(self) -> dict[str, dict[str, int]]:
        """Quota held per queue, rolled up to every ancestor (fresh dicts: the caller's to keep)."""
        return self.held.rolled(self.queues)

    def queue_views(self, only: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
        """The result's ``queues`` section (every queue known, or ``only`` these): usage rolled up,
        the workloads holding quota, the waiting ones with their positions, those backing off.
        Also what the reconciler writes into queue objects' status (``services.reconciler.status``)."""
        usage = self.queue_usage()
        names = sorted(set(self.queues) | set(usage) | set(self.rejected_queues)
                       | {v.queue for v in self.workloads.values() if v.queue}) if only is None else sorted(only)
        queues: dict[str, Any] = {}
        for name in names:
            members = sorted(self._queue_members.get(name, {}).values(), key=_by_order)
            backoff = [v for v in members if v.queue_state == "backoff" and (v.requeue_at or 0) > self.now]
            waiting = [v for v in members if v.queue_state in ("pending", "backoff") and v not in backoff]
            waiting.sort(key=lambda v: (-v.priority, v.order))
            queues[name] = {
                "usage": q.format_resources(usage.get(name, {})),
                "active": [v.key for v in members if v.holds_quota],
                "pending": [{"workload": v.key, "position": i + 1} for i, v in enumerate(waiting)],
                "backoff": [v.key for v in backoff],
            }
            if name in self.rejected_queues:
                queues[name]["rejected"] = self.rejected_queues[name]
        return queues

    def warnings(self) -> dict[str, list[tuple[float, str]]]:
        """Per workload warned of, every warning told (when, what): what the timeline shows beside its phases."""
        return {key: [(w["t"], w["reason"]) for w in view.warnings]
                for key, view in sorted(self.workloads.items()) if view.warnings}

    def elastic_waits(self) -> dict[str, tuple[float, str]]:
        """Per workload whose elastic pods wait at the end: since when, and why."""
        return {key: (view.elastic_waiting[-1]["t"], view.elastic_waiting[-1]["reason"])
                for key, view in sorted(self.workloads.items())
                if view.elastic_waiting and view.elastic_waiting[-1]["reason"]}

    def result(self, wall_seconds: float = 0.0) -> dict[str, Any]:
        """The ``--json`` document of the scenario/result contract."""
        workloads: dict[str, Any] = {}
        for key in sorted(self.workloads):
            view = self.workloads[key]
            workloads[key] = {
                "kind": view.kind,
                "queue": view.queue,
                "priority": view.priority,
                "gang": {"min_member": view.min_member, "resources": q.format_resources(view.resources)},
                "phase": view.phase,
                "transitions": list(view.transitions),
                "pods": [p.as_json() for p in self.pods_of(key)],
            }
        return {
            "scenario": self.scenario,
            "workloads": workloads,
            "queues": self.queue_views(),
            "stats": {"events": self.events, "decisions": self.decisions, "wall_seconds": round(wall_seconds, 3)},
        }


def _by_order(view: WorkloadView) -> int:
    return view.order


def pod_workload_key(p: Any) -> str:
    """The workload key a pod's watch event folds into: its KubeRay or pod-group workload, else the
    pod's own ``namespace/name`` (a gang of one, if admission made it one)."""
    key = kube.workload_key_of_pod(p.object)
    if key is not None:
        return key
    namespace = p.namespace or kube.meta(p.object).get("namespace") or "default"
    return f"{namespace}/{p.name}"


_NOT_DECISIONS = frozenset({"ingest", "clock", "runtime"})
"""Sources of envelopes that are not a service's decision: watch events, timers firing, the embedded
runtime's ``PolicyApplied`` (a service's own is told by its type)."""
