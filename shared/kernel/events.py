"""The event contract: one envelope, every payload, past-tense names, one schema version.

Lifecycle of a workload as the events tell it::

    ObjectChanged(RayCluster Added)            reconciler.ingest -> admission
    ObjectsListed                              reconciler.ingest -> admission, placement (after a list)
    WorkloadSubmitted | WorkloadRejected       admission -> queue | reconciler
    WorkloadWarned                             admission -> reconciler (a queue key it does not read)
    Enqueued, BackedOff*                       queue -> reconciler (status)
    Dequeued | ReclaimRequested                queue -> placement (quota reserved)
    GangPlaced | PlacementFailed               placement -> queue, reconciler
    PodAssigned*                               placement -> reconciler (bind pod -> node)
    GangRunning                                placement -> queue (every gang pod Running)
    PreemptionRequested                        placement -> queue, reconciler (victim)
    GangDisrupted, GangEvicted                 placement -> reconciler (and queue: evicted when stale)
    PodsMoved                                  placement -> reconciler (pods evicted to be placed again)
    WorkloadFinished | WorkloadDeleted         admission -> queue
    WorkloadWithdrawn                          queue -> placement (drop reservations)
    KubeEffect*                                reconciler -> Kubernetes (the cluster adapter)

A ``PolicyApplied`` is a fact for the log, read by no service: the policy (and the muster code) a
service decides with, written when it starts with a policy its log does not show yet (the embedded
runtime: once, first), so a log names the policy that reproduces it (``shared.audit.replay``).

Timers are events too: a core emits ``TimerSet``; the clock answers with ``TimerFired`` into the
same service's inbox at that event time (the clock rule: ``shared.runtime.clock``). Bump
``SCHEMA_VERSION`` on an incompatible change and add an upcaster in ``upcast``.

Envelopes are made (``wrap``) and written (``to_json``) by ``shared.kernel.fastmodel``, which holds
what reaches into pydantic's internals; this module holds the contract alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from shared.kernel.fastmodel import built, writer
from shared.kernel.model import Frozen, QueueSpec, WorkloadSpec, gpu_memory_held
from shared.kernel.validation import TEXT_CHARS, bounded

SCHEMA_VERSION = 1
FIRST_SCHEMA_VERSION = 1
"""No envelope was ever written with a version below this: one that says so is not muster's."""


# --------------------------------------------------------------------------- ingest
class ObjectChanged(Frozen):
    """A Kubernetes watch event, the object included (as sent, but for ``metadata.managedFields``)."""

    type: Literal["ObjectChanged"] = "ObjectChanged"
    change: Literal["Added", "Modified", "Deleted"]
    kind: str
    api_version: str = ""
    namespace: str = ""
    name: str
    object: dict[str, Any]

    @property
    def subject(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}" if self.namespace else f"{self.kind}/{self.name}"


class ObjectsListed(Frozen):
    """After each list (or relist) of one watched resource: the keys (``namespace/name``, ``/name``
    for a cluster-scoped object) of every object of it that exists at ``resource_version``, in
    parts small enough for the broker; ``last`` closes the listing. A core that holds an object of
    that resource the listing lacks treats it as deleted (``shared.kernel.listing``): the deletion happened
    while no watch was open, as client-go's ``DeltaFIFO.Replace`` reports ``DeletedFinalStateUnknown``."""

    type: Literal["ObjectsListed"] = "ObjectsListed"
    kind: str
    api_version: str
    resource_version: str
    part: int
    keys: tuple[str, ...]
    last: bool

    @property
    def subject(self) -> str:
        return f"listing/{self.kind}.{self.api_version}"


# --------------------------------------------------------------------------- admission
class QueueDefined(Frozen):
    type: Literal["QueueDefined"] = "QueueDefined"
    queue: QueueSpec

    @property
    def subject(self) -> str:
        return f"queue/{self.queue.name}"


class QueueRemoved(Frozen):
    type: Literal["QueueRemoved"] = "QueueRemoved"
    name: str

    @property
    def subject(self) -> str:
        return f"queue/{self.name}"


class QueueRejected(Frozen):
    """A queue object that cannot be used as written (bad quantities, missing parent, min > parent)."""

    type: Literal["QueueRejected"] = "QueueRejected"
    name: str
    kind: str
    reason: str
    object_namespace: str = ""
    object_name: str = ""
    """The object that defines the queue when it is not named like it (an ElasticQuotaTree node)."""

    @property
    def subject(self) -> str:
        return f"queue/{self.name}"


class _WorkloadEvent(Frozen):
    key: str

    @property
    def subject(self) -> str:
        return self.key


class WorkloadSubmitted(Frozen):
    type: Literal["WorkloadSubmitted"] = "WorkloadSubmitted"
    workload: WorkloadSpec

    @property
    def subject(self) -> str:
        return self.workload.key


class WorkloadUpdated(Frozen):
    """The user changed the workload (priority, replicas): applied while it waits; for a quota holder
    only a shrink applies at once (``shared.kernel.model.shrunk``), the rest at its next admission."""

    type: Literal["WorkloadUpdated"] = "WorkloadUpdated"
    workload: WorkloadSpec

    @property
    def subject(self) -> str:
        return self.workload.key


class WorkloadRejected(_WorkloadEvent):
    type: Literal["WorkloadRejected"] = "WorkloadRejected"
    kind: str
    reason: str


class WorkloadWarned(_WorkloadEvent):
    """Something on the workload's object muster reads nothing from, though its user likely meant it to
    count (``cause``): a label or annotation key spelled nearly as a queue key muster reads, or a peer's
    queue key muster does not read. The workload goes on as read; the reconciler writes a Warning Event
    on the object, so its owner sees why it is where it is."""

    type: Literal["WorkloadWarned"] = "WorkloadWarned"
    kind: str
    cause: Literal["QueueLabelIgnored"]
    """The Kubernetes Event's reason."""
    reason: str


class WorkloadFinished(_WorkloadEvent):
    type: Literal["WorkloadFinished"] = "WorkloadFinished"
    outcome: Literal["Succeeded", "Failed"]
    reason: str


class WorkloadDeleted(_WorkloadEvent):
    type: Literal["WorkloadDeleted"] = "WorkloadDeleted"
    reason: str = "deleted by its owner"


# --------------------------------------------------------------------------- queue
class Enqueued(_WorkloadEvent):
    type: Literal["Enqueued"] = "Enqueued"
    queue: str
    reason: str


class BackedOff(_WorkloadEvent):
    """The workload's attempt failed; it retries at ``requeue_at`` or earlier when capacity frees."""

    type: Literal["BackedOff"] = "BackedOff"
    queue: str
    requeue_at: float
    attempts: int
    reason: str


class Dequeued(_WorkloadEvent):
    """Quota is reserved for the workload; placement may now place its gang."""

    type: Literal["Dequeued"] = "Dequeued"
    queue: str
    workload: WorkloadSpec
    reason: str
    gpu_memory: int = 0
    """The memory per GPU device (MiB) its ``gpu-memory`` pods are charged at while it holds this
    reservation: the least any node stated when it was reserved (``CapacityChanged.gpu_memory``)."""


class ElasticVictim(Frozen):
    """``count`` elastic pods of one pod set of an admitted workload, named as victims (newest go first)."""

    key: str
    pod_set: str
    count: int


class OfferedVictim(Frozen):
    """A running workload a reclaim may take, with the quota it holds as the queue charges it."""

    key: str
    queue: str
    demand: dict[str, int]


class GivingQueue(Frozen):
    """One queue a reclaim may take from, and the quota rules any set taken from it keeps: it gives a
    victim only while its usage is above ``above`` on some resource (its fair share, or what it is
    entitled to for a starved requester), and keeps at least ``floor`` of every resource a victim frees
    (its guarantee)."""

    name: str
    usage: dict[str, int]
    above: dict[str, int] | None
    """None: it gives whatever its usage (the reclaimer's own queue, preempting for its quota)."""
    floor: dict[str, int]
    levels: tuple[str, ...]
    """Its chain of queues, itself first: the levels whose quota its victims give back."""


class LevelNeed(Frozen):
    """``amount`` of ``resource`` the victims must give back to the quota of level ``level``."""

    level: str
    resource: str
    amount: int


class ReclaimOffer(Frozen):
    """What a reclaim may take besides its named victims, in the queue's order, and the quota rules any
    set of them keeps (``shared.kernel.victims.offer_allows``): where the named ones free room on nodes
    the gang cannot use, placement takes the fewest offered victims that make it fit (Volcano's reclaim
    walks node by node; KAI simulates the placement with the victims gone)."""

    victims: tuple[OfferedVictim, ...]
    queues: tuple[GivingQueue, ...]
    needs: tuple[LevelNeed, ...] = ()


class ReclaimRequested(_WorkloadEvent):
    """Quota reserved by taking back over-share resources from other queues' ``victims``; elastic pods
    of holders (``elastic_victims``) are taken before any whole gang."""

    type: Literal["ReclaimRequested"] = "ReclaimRequested"
    queue: str
    workload: WorkloadSpec
    victims: tuple[str, ...]
    reason: str
    elastic_victims: tuple[ElasticVictim, ...] = ()
    gpu_memory: int = 0
    """As ``Dequeued.gpu_memory``."""
    offer: ReclaimOffer | None = None
    """Whole workloads placement may take instead, with the rules they keep (None: only ``victims``)."""


class ElasticGranted(_WorkloadEvent):
    """Quota is reserved for ``count`` more elastic pods of a pod set of an admitted workload:
    placement places them one by one (each alone, as far as nodes allow)."""

    type: Literal["ElasticGranted"] = "ElasticGranted"
    queue: str
    pod_set: str
    count: int
    admission: int
    """Which admission of the workload the grant belongs to (the queue's reservation number): a
    release of an earlier admission's pods never touches a later one's quota."""
    reason: str


class ElasticWaiting(_WorkloadEvent):
    """``count`` elastic pods of a pod set its owner wants wait, and why (the quota of a queue in its
    chain, the cluster's free capacity, or no node for the last grant): told when the reason changes,
    so nothing waits without saying why."""

    type: Literal["ElasticWaiting"] = "ElasticWaiting"
    queue: str
    pod_set: str
    count: int
    reason: str


class WorkloadWithdrawn(_WorkloadEvent):
    """The workload left the system (finished, deleted): placement drops what it held for it."""

    type: Literal["WorkloadWithdrawn"] = "WorkloadWithdrawn"
    reason: str


class ElasticReleased(_WorkloadEvent):
    """``count`` elastic pods of a pod set no longer hold quota: placement found no node for them
    (``refused``: the queue grants the workload no more until capacity is released), they went away,
    the owner wants fewer, or placement evicts them (``evicted``, as ``namespace/name``) for a
    workload that needs the room."""

    type: Literal["ElasticReleased"] = "ElasticReleased"
    pod_set: str
    count: int
    admission: int
    reason: str
    refused: bool = False
    evicted: tuple[str, ...] = ()
    promoted: tuple[str, ...] = ()
    """Elastic pods (``namespace/name``) that took the place of a gang pod that went away: they are the
    gang's now (the gang stays whole, as Volcano counts only how many of a job's pods run)."""


# --------------------------------------------------------------------------- placement
class GpuAssignment(Frozen):
    devices: tuple[int, ...]
    fraction: float
    group: str = ""
    memory: int = 0
    """MiB of one device the pod asked for with KAI's ``gpu-memory`` (``fraction`` is that memory's
    share of this device); 0 for ``gpu-fraction`` and whole GPUs."""


class SlotAssignment(Frozen):
    pod_set: str
    index: int
    node: str
    gpu: GpuAssignment | None = None


class GangPlaced(_WorkloadEvent):
    type: Literal["GangPlaced"] = "GangPlaced"
    queue: str
    kind: str
    gate: Literal["suspend", "pods"]
    slots: tuple[SlotAssignment, ...]
    reason: str

    @property
    def gpu_memory_held(self) -> dict[str, int]:
        """Per pod set, the GPU (thousandths) its ``gpu-memory`` pods hold on the devices they got: what
        the queue charges for them from now (``shared.kernel.model.gpu_memory_held``)."""
        return gpu_memory_held((s.pod_set, round(s.gpu.fraction * 1000), s.gpu.memory)
                               for s in self.slots if s.gpu is not None)


class PlacementFailed(_WorkloadEvent):
    type: Literal["PlacementFailed"] = "PlacementFailed"
    queue: str
    reason: str
    capacity_short: bool = True
    room_key: str = ""
    """Set when nodes lack room and no victim is eligible: the gang waits until a ``CapacityChanged``
    names room for this key (its shape), instead of retrying on a timer."""


class PodAssigned(_WorkloadEvent):
    """Bind this existing pod to this node (its slot in the gang's placement)."""

    type: Literal["PodAssigned"] = "PodAssigned"
    pod_namespace: str
    pod: str
    pod_set: str
    node: str
    gpu: GpuAssignment | None = None
    elastic: bool = False
    """An elastic pod (beyond the gang's minimum): the first to go when others need the room."""
    claims: tuple[str, ...] = ()
    """Claims of the pod (names in its namespace) to mark with the node before it is bound: its unbound
    ``WaitForFirstConsumer`` claims, so that their volumes are provisioned there (VolumeBinding's PreBind)."""


class GangRunning(_WorkloadEvent):
    type: Literal["GangRunning"] = "GangRunning"
    reason: str


class GangDisrupted(_WorkloadEvent):
    """A running gang lost a member (its node went away, or the pod was deleted): it is not whole
    until the replacement is bound and Running, when GangRunning comes again."""

    type: Literal["GangDisrupted"] = "GangDisrupted"
    reason: str


class GangEvicted(_WorkloadEvent):
    """A running gang stayed below its minimum past its queue's staleness grace period (KAI's stale gang
    eviction): the reconciler evicts its pods (or re-suspends it), the queue requeues it. No one
    preempted it; its quota and nodes go back to whoever waits."""

    type: Literal["GangEvicted"] = "GangEvicted"
    kind: str
    gate: Literal["suspend", "pods"]
    pods: tuple[str, ...]
    reason: str


class PodsMoved(_WorkloadEvent):
    """Running pods of ``key`` that placement moves so that ``preemptor`` fits (KAI's consolidation): their
    slots were placed again elsewhere in the statement that placed the preemptor, so the reconciler
    evicts them (``pods``, as ``namespace/name``), their owner makes them again and each new pod is bound
    where its slot now is. The workload keeps its quota and its phase; nothing is requeued."""

    type: Literal["PodsMoved"] = "PodsMoved"
    kind: str
    preemptor: str
    pods: tuple[str, ...]
    reason: str


class PreemptionRequested(_WorkloadEvent):
    """``key`` is the victim. The reconciler evicts its pods (or re-suspends it); the queue requeues it."""

    type: Literal["PreemptionRequested"] = "PreemptionRequested"
    kind: str
    gate: Literal["suspend", "pods"]
    preemptor: str
    preemptor_priority: int = 0
    reclaim: bool = False
    """True when another queue takes back its share (reclaim), False for in-queue priority preemption."""
    pods: tuple[str, ...]
    reason: str


class CapacityChanged(Frozen):
    """Schedulable totals changed (a node joined, left, or pods of other schedulers came or went)."""

    type: Literal["CapacityChanged"] = "CapacityChanged"
    total: dict[str, int]
    nodes: int
    released: bool
    """True when capacity became available (wake workloads that back off)."""
    room: dict[str, int] | None = None
    """On a release: per room key of the gangs waiting for room, how many the free nodes now hold
    (placed one after another). None: every waiting gang may try (nodes joined or changed)."""
    gpu_memory: int = 0
    """The least memory per GPU device (MiB) a schedulable node with GPUs states (``nvidia.com/gpu.memory``):
    what a ``gpu-memory`` pod is charged at before it has a device, the largest share it can take (KAI's
    ``MinNodeGPUMemory``); 0 when no node states one."""

    @property
    def subject(self) -> str:
        return "cluster"


# --------------------------------------------------------------------------- reconciler
class KubeEffect(Frozen):
    """One change to make in Kubernetes. Applying the same effect twice must change nothing."""

    type: Literal["KubeEffect"] = "KubeEffect"
    op: Literal["suspend", "unsuspend", "bind", "annotate", "evict", "event", "status"]
    kind: str
    namespace: str
    name: str
    api_version: str = ""
    """Which API group the kind is in, when that is not clear from the kind (``Queue`` is Volcano's and KAI's)."""
    node: str = ""
    annotations: dict[str, str] = {}
    status: dict[str, Any] = {}
    """``status``: the fields of the object's status muster writes, as a JSON merge patch of the
    status subresource (only these keys; ``None`` removes one)."""
    reason: str = ""
    message: str = ""
    event_type: Literal["Normal", "Warning"] = "Normal"
    claims: tuple[str, ...] = ()
    """``bind``: claims (names in the pod's namespace) annotated ``volume.kubernetes.io/selected-node: <node>``
    first, each before the pod's binding, as kube-scheduler's VolumeBinding PreBind does; the pod is not
    bound when one is gone or was given another node."""

    @property
    def subject(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


_EFFECT_OPS = frozenset(get_args(KubeEffect.model_fields["op"].annotation))
_EVENT_TYPES = frozenset(get_args(KubeEffect.model_fields["event_type"].annotation))


def kube_effect(op: str, kind: str, namespace: str, name: str, *, api_version: str = "", node: str = "",
                annotations: dict[str, str] | None = None, status: dict[str, Any] | None = None, reason: str = "",
                message: str = "", event_type: str = "Normal", claims: tuple[str, ...] = ()) -> KubeEffect:
    """``KubeEffect(...)`` of these fields, built as validation would leave them, without running it:
    the reconciler makes one for most envelopes it reads, and validating one was a large part of its cost.

    Only values of exactly the types validation leaves as they are take the short way (each text a
    ``str``, the literals among theirs, the mappings ``dict`` with ``str`` keys, annotation values
    ``str``); the mappings are copied, as validation copies them. Anything else is validated, so it
    is refused (or coerced) exactly as before."""
    annotations = {} if annotations is None else annotations
    status = {} if status is None else status
    if (type(message) is str and len(message) > TEXT_CHARS) or (type(reason) is str and len(reason) > TEXT_CHARS) \
            or any(type(v) is str and len(v) > TEXT_CHARS for v in annotations.values()):  # written text is bounded
        message = bounded(message) if type(message) is str else message
        reason = bounded(reason) if type(reason) is str else reason
        annotations = {k: bounded(v) if type(v) is str else v for k, v in annotations.items()}
    if (type(op) is str and op in _EFFECT_OPS and type(event_type) is str and event_type in _EVENT_TYPES and type(annotations) is dict and type(status) is dict
            and type(kind) is str and type(namespace) is str and type(name) is str and type(api_version) is str
            and type(node) is str and type(reason) is str and type(message) is str
            and type(claims) is tuple and all(type(c) is str for c in claims)
            and (not annotations or all(type(k) is str and type(v) is str for k, v in annotations.items()))
            and (not status or all(type(k) is str for k in status))):
        return built(KubeEffect, {
            "type": "KubeEffect", "op": op, "kind": kind, "namespace": namespace, "name": name,
            "api_version": api_version, "node": node, "annotations": dict(annotations), "status": dict(status),
            "reason": reason, "message": message, "event_type": event_type, "claims": claims,
        })
    # Anything else is validated: an op or event type outside its Literal is refused here (why they are str).
    return KubeEffect(op=op, kind=kind, namespace=namespace, name=name, api_version=api_version,  # type: ignore[arg-type]
                      node=node, annotations=annotations, status=status, reason=reason, message=message,
                      event_type=event_type, claims=claims)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- clock
class TimerSet(Frozen):
    type: Literal["TimerSet"] = "TimerSet"
    key: str
    at: float

    @property
    def subject(self) -> str:
        return f"timer/{self.key}"


class TimerFired(Frozen):
    """A timer answered. ``occurred_at`` is when it fired, which may be later than ``at`` (a busy
    clock, or a service whose time had passed ``at`` when it handled it: ``shared.runtime.service``)."""

    type: Literal["TimerFired"] = "TimerFired"
    key: str
    at: float | None = None
    """The instant it was set for (its ``TimerSet``'s ``at``, or the time it was set if later): what a
    core keys its timers by. None in logs written before it was recorded, where it is ``occurred_at``."""

    def due(self, fired_at: float) -> float:
        """The instant this timer was set for, in logs of either kind."""
        return fired_at if self.at is None else self.at

    @property
    def subject(self) -> str:
        return f"timer/{self.key}"


# --------------------------------------------------------------------------- the policy
class PolicyApplied(Frozen):
    """From here on ``services`` decide with ``policy``: what ``muster replay`` re-derives their decisions
    with (``shared.audit.replay``) and what tells an altered log from other code or another policy."""

    type: Literal["PolicyApplied"] = "PolicyApplied"
    services: tuple[str, ...]
    """The services taking it: one on Kafka (each writes its own), all four in the embedded runtime."""
    policy: dict[str, Any]
    """``Policy.model_dump(mode="json")``: every key, defaults included."""
    policy_digest: str
    """``shared.kernel.policy.policy_digest`` of ``policy``: equal policies, equal digests."""
    code_digest: str
    """``shared.runtime.build.code_digest`` of the muster that decided."""
    muster_version: str
    after: str | None = None
    """The id of the last inbox envelope the service had handled before it took this policy (its
    restart rebuilt its state from them under this policy); None: none, or not a service's own."""

    @property
    def subject(self) -> str:
        return "policy/" + ",".join(self.services)


Payload = Annotated[
    Union[
        ObjectChanged, QueueDefined, QueueRemoved, QueueRejected, WorkloadSubmitted, WorkloadUpdated,
        WorkloadRejected, WorkloadFinished, WorkloadDeleted, Enqueued, BackedOff, Dequeued,
        ReclaimRequested, WorkloadWithdrawn, GangPlaced, PlacementFailed, PodAssigned, GangRunning,
        GangDisrupted, GangEvicted, PreemptionRequested, CapacityChanged, KubeEffect, TimerSet, TimerFired,
        ElasticGranted, ElasticReleased, ElasticWaiting, ObjectsListed, PolicyApplied, WorkloadWarned, PodsMoved,
    ],
    Field(discriminator="type"),
]

PAYLOAD_TYPES: dict[str, type[BaseModel]] = {
    cls.model_fields["type"].default: cls
    for cls in (
        ObjectChanged, QueueDefined, QueueRemoved, QueueRejected, WorkloadSubmitted, WorkloadUpdated,
        WorkloadRejected, WorkloadFinished, WorkloadDeleted, Enqueued, BackedOff, Dequeued,
        ReclaimRequested, WorkloadWithdrawn, GangPlaced, PlacementFailed, PodAssigned, GangRunning,
        GangDisrupted, GangEvicted, PreemptionRequested, CapacityChanged, KubeEffect, TimerSet, TimerFired,
        ElasticGranted, ElasticReleased, ElasticWaiting, ObjectsListed, PolicyApplied, WorkloadWarned, PodsMoved,
    )
}


class Envelope(BaseModel):
    """Every message on every inbox. ``occurred_at`` is event time in seconds; it is the only 'now'."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")
    """Non-finite numbers stay what they were across the wire (``Infinity``, which Python's ``json``
    reads back): only a YAML manifest can hold one, and admission must see it to reject it."""

    id: str
    type: str
    subject: str
    source: str
    occurred_at: float
    causation_id: str | None = None
    correlation_id: str
    schema_version: int = SCHEMA_VERSION
    trace: dict[str, str] = {}
    """W3C trace context (``traceparent``), filled by the tracing adapter."""
    payload: Payload

    @model_validator(mode="after")
    def _agrees_with_payload(self) -> "Envelope":
        """A message whose header says one type and whose body is another would be routed wrongly."""
        if self.type != self.payload.type:
            raise ValueError(f"envelope type {self.type!r} does not match its payload ({self.payload.type!r})")
        if self.subject != self.payload.subject:
            raise ValueError(f"envelope subject {self.subject!r} does not match its payload ({self.payload.subject!r})")
        return self


_ENVELOPE = TypeAdapter(Envelope)
_VERSION = TypeAdapter(int)


def derive_id(*parts: object) -> str:
    """Deterministic id: same inputs, same id, on every run and every runtime."""
    return _hashed("\x1f".join(map(str, parts)))


def _hashed(text: str) -> str:
    """The id of ``derive_id``'s joined parts (``wrap`` joins its three without the generic join)."""
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def wrap(payload: Any, *, source: str, cause: Envelope | None, index: int, at: float | None = None) -> Envelope:
    """Envelope a core's output: id from (source, cause id, index), time and correlation inherited."""
    if cause is None:
        if at is None:
            raise ValueError("an event with no cause needs an explicit time")
        event_id = derive_id(source, at, index, payload.type, payload.subject)
        return built(Envelope, {
            "id": event_id, "type": payload.type, "subject": payload.subject, "source": source, "occurred_at": at,
            "causation_id": None, "correlation_id": event_id, "schema_version": SCHEMA_VERSION, "trace": {},
            "payload": payload,
        })
    return built(Envelope, {
        "id": _hashed(f"{source}\x1f{cause.id}\x1f{index}"),  # derive_id(source, cause.id, index)
        "type": payload.type,
        "subject": payload.subject,
        "source": source,
        "occurred_at": cause.occurred_at if at is None else at,
        "causation_id": cause.id,
        "correlation_id": cause.correlation_id,
        "schema_version": SCHEMA_VERSION,
        "trace": dict(cause.trace),
        "payload": payload,
    })


def upcast(raw: dict[str, Any]) -> dict[str, Any]:
    """Bring an older envelope up to ``SCHEMA_VERSION`` (none exist yet: version 1 is the first)."""
    version = raw.get("schema_version", SCHEMA_VERSION)
    if type(version) is not int:  # the usual case skips the validator: every consumer upcasts every record
        version = _VERSION.validate_python(version, strict=True)
    if version > SCHEMA_VERSION:
        raise ValueError(f"event schema version {version} is newer than this muster ({SCHEMA_VERSION})")
    if version < FIRST_SCHEMA_VERSION:
        raise ValueError(f"event schema version {version} is unknown (versions start at {FIRST_SCHEMA_VERSION})")
    return raw


to_json: Callable[[Envelope], bytes] = writer(Envelope, "payload")
"""The envelope's JSON: every envelope on the bus and in a log, every decision a replay compares.
The bytes of ``Envelope``'s own serializer (``model_dump_json``), written by a serializer of its
field schemas with the payload's class chosen beforehand, for much less of its time
(``shared.kernel.fastmodel.writer``; the writer itself, not a call to it: one frame less a record)."""


def from_json(data: bytes | str) -> Envelope:
    """Validate a serialised envelope; raises ``pydantic.ValidationError`` on bad input."""
    import json

    raw = json.loads(data)
    if not isinstance(raw, dict):
        raise ValueError("an envelope must be a JSON object")
    return _ENVELOPE.validate_python(upcast(raw))


def json_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schema for the envelope and each payload, for consumers outside Python."""
    out = {"Envelope": Envelope.model_json_schema()}
    for name, cls in PAYLOAD_TYPES.items():
        out[name] = cls.model_json_schema()
    return out
