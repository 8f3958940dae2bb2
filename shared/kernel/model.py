"""Domain types shared by the services: the normalised workload, its gang, and the queue tree node.

Admission produces these from the dialects users write (KubeRay, Volcano, KAI, ElasticQuotaTree);
queue and placement consume them. They are plain frozen data with no behaviour beyond arithmetic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict

from shared.kernel import gpumemory
from shared.kernel import quantity as q

UNLIMITED = -1
"""In a queue's ``limit`` or ``guarantee``: no bound on that resource (KAI's ``-1``)."""


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


TolerationOperator = Literal["Equal", "Exists"]
AffinityOperator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
QueueState = Literal["Open", "Closed", "Closing"]


class Toleration(Frozen):
    key: str = ""
    operator: TolerationOperator = "Equal"
    value: str = ""
    effect: str = ""


class MatchExpression(Frozen):
    key: str
    operator: AffinityOperator
    values: tuple[str, ...] = ()


ConstraintKey = tuple[tuple[tuple[str, str], ...], tuple[Toleration, ...], tuple[tuple[MatchExpression, ...], ...]]
"""``PodSet.constraint_key``: node selector (sorted items), tolerations, required affinity terms."""
Shape = tuple[tuple[tuple[str, int], ...], int, int, ConstraintKey]
"""``PodSet.shape``: requests (sorted items), GPU share, GPU memory, constraint key."""


class PodSet(Frozen):
    """Pods of one shape: the head, one worker group, a RayJob's submitter, or a plain pod gang."""

    name: str
    count: int
    """Pods of this set in the gang's minimum: placed all together with the rest of the gang, or not at all."""
    elastic: int = 0
    """Pods beyond ``count`` the owner wants too (Ray workers above minReplicas, pod-group pods beyond
    minMember): each runs alone when quota and capacity allow, and is the first to go when others need
    the room (Volcano's elastic tasks, KAI's min-available subgroups)."""
    in_gang: bool = True
    """False for pods that are placed with the gang but do not count toward minMember (submitter)."""
    charged: bool = True
    """Whether these pods count against queue quota (a kube-queue RayJob's submitter does not)."""
    resources: dict[str, int] = {}
    """Per pod, milli-units (see ``shared.kernel.quantity``), as kube-scheduler counts them (``kube.effective_requests``)."""
    gpu_share: int = 0
    """Fraction of one GPU device in thousandths (``gpu-fraction: "0.5"`` is 500); 0 = none."""
    gpu_memory: int = 0
    """MiB of one GPU device (KAI's ``gpu-memory``); 0 = none. Its share of a device depends on the
    device's memory, so it is worked out where a node is known (``shared.kernel.gpumemory.share``)."""
    node_selector: dict[str, str] = {}
    tolerations: tuple[Toleration, ...] = ()
    affinity: tuple[tuple[MatchExpression, ...], ...] = ()
    """Required node affinity: OR over terms, AND within a term."""
    task: str = ""
    """The Volcano task its pods name (``volcano.sh/task-spec``): pods of another task never fill its slots."""

    @property
    def constraint_key(self) -> ConstraintKey:
        """Everything that restricts which nodes may host this pod set (used to cache filters)."""
        return (tuple(sorted(self.node_selector.items())), self.tolerations, self.affinity)

    @property
    def shape(self) -> Shape:
        """What makes two pods interchangeable: requests, GPU share or memory, and node constraints."""
        return (tuple(sorted(self.resources.items())), self.gpu_share, self.gpu_memory, self.constraint_key)

    @property
    def desired(self) -> int:
        """Every pod of the set the owner wants: the gang's part and the elastic ones."""
        return self.count + self.elastic

    @property
    def pod_demand(self) -> dict[str, int]:
        """What one pod of the set charges against quota (a fractional GPU as GPU); nothing when not charged.
        A ``gpu_memory`` pod's share is not known here (``pod_demand_at``)."""
        return self.pod_demand_at(0)

    def pod_demand_at(self, device_memory: int) -> dict[str, int]:
        """``pod_demand`` with a ``gpu_memory`` pod charged its share of a device of ``device_memory``
        MiB (never more than one device: it holds one), nothing for it when that is unknown (0)."""
        if not self.charged:
            return {}
        demand = {k: v for k, v in self.resources.items() if v}
        share = self.gpu_share or min(gpumemory.share(self.gpu_memory, device_memory), gpumemory.FULL)
        if share:
            demand[q.GPU] = demand.get(q.GPU, 0) + share
        return demand


class Gang(Frozen):
    min_member: int
    pod_sets: tuple[PodSet, ...]
    interchangeable: bool = False
    """Whether any of its pods may make up the minimum (a pod group: coscheduling's Permit counts any
    ``minMember`` assigned pods, Volcano's gang plugin any ready tasks, each task at least its
    ``minTaskMember``). The pod sets' ``count`` is then the composition tried first (the pods that
    came first); placement may take other pods of the group in place of those that do not fit
    (``as_placed``). False: each pod set's ``count`` is its own minimum (a Ray workload's groups)."""
    task_minimums: tuple[tuple[str, int], ...] = ()
    """``(task, pods)`` an interchangeable gang takes of each Volcano task at least (``minTaskMember``)."""

    @property
    def resources(self) -> dict[str, int]:
        """What the whole gang needs, submitter included, fractional GPUs excluded."""
        total: dict[str, int] = {}
        for ps in self.pod_sets:
            total = q.add(total, ps.resources, ps.count)
        return {k: v for k, v in total.items() if v}

    @property
    def gpu_share_total(self) -> int:
        """Sum of fractional GPU shares in thousandths of a device."""
        return sum(ps.gpu_share * ps.count for ps in self.pod_sets)

    @property
    def quota_demand(self) -> dict[str, int]:
        """What the gang's minimum charges against queue quota: resources plus fractional GPUs as GPU,
        of the pod sets that are charged (elastic pods are charged one by one while they hold a node).
        Its ``gpu_memory`` pods charge nothing here: their share needs a device (``quota_demand_at``)."""
        return self.quota_demand_at(0)

    def quota_demand_at(self, device_memory: int, held: Mapping[str, int] | None = None) -> dict[str, int]:
        """``quota_demand`` with ``gpu_memory`` pods charged their share of a device of ``device_memory`` MiB;
        ``held``: per pod set, the GPU (thousandths) its gang pods hold on the devices placement gave
        them (``gpu_memory_held``), charged instead once known, as KAI charges an allocated pod its own
        device's share (``setAcceptedResources``)."""
        demand: dict[str, int] = {}
        for ps in self.pod_sets:
            if not ps.count:
                continue
            if held and ps.gpu_memory and ps.charged and ps.name in held:
                demand = q.add(demand, ps.pod_demand_at(0), ps.count)
                demand[q.GPU] = demand.get(q.GPU, 0) + held[ps.name]
            else:
                demand = q.add(demand, ps.pod_demand_at(device_memory), ps.count)
        return {k: v for k, v in demand.items() if v}

    @property
    def asks_gpu_memory(self) -> bool:
        """Some pod set asks for GPU memory: what the gang charges depends on the device memory it is charged at."""
        return any(ps.gpu_memory for ps in self.pod_sets)

    @property
    def pod_count(self) -> int:
        """Pods placed together at admission (the submitter included)."""
        return sum(ps.count for ps in self.pod_sets)

    @property
    def desired_count(self) -> int:
        """Every pod the owner wants: the gang's and the elastic ones."""
        return sum(ps.desired for ps in self.pod_sets)


def gpu_memory_held(slots: Iterable[tuple[str, int, int]]) -> dict[str, int]:
    """Per pod set, the GPU (thousandths of a device) its ``gpu-memory`` pods hold where they were placed,
    from (pod set, share, memory) per gang slot: what ``Gang.quota_demand_at`` charges for them."""
    held: dict[str, int] = {}
    for pod_set, share, memory in slots:
        if memory:
            held[pod_set] = held.get(pod_set, 0) + share
    return held


def still_held(held: Mapping[str, int], before: Gang, after: Gang) -> dict[str, int]:
    """``held`` for the pod sets an edit left as they were: one it shrank charges its estimate again
    (which of its pods placement let go is not known here, and the estimate is never less)."""
    counts = {ps.name: ps.count for ps in after.pod_sets}
    return {name: v for name, v in held.items()
            if any(ps.name == name and counts.get(name) == ps.count for ps in before.pod_sets)}


def as_placed(gang: Gang, placed: Iterable[str]) -> Gang:
    """The gang as placement placed it, from the pod sets of its gang slots (one name per slot): an
    interchangeable gang whose first pods did not all fit has other members in the minimum, each pod
    set keeping the pods its owner wants (``desired``), the rest of them elastic. The gang itself
    when nothing moved (and always for a gang that is not interchangeable).

    Queue (quota), placement (slots) and the history all apply this one rule, so they stay in step.
    """
    if not gang.interchangeable:
        return gang
    counts: dict[str, int] = {}
    for name in placed:
        counts[name] = counts.get(name, 0) + 1
    if all(counts.get(ps.name, 0) == ps.count for ps in gang.pod_sets):
        return gang
    sets = tuple(ps.model_copy(update={"count": counts.get(ps.name, 0),
                                       "elastic": max(0, ps.desired - counts.get(ps.name, 0))})
                 for ps in gang.pod_sets)
    return gang.model_copy(update={"pod_sets": sets})


def shrunk(admitted: Gang, edited: Gang) -> Gang | None:
    """What an admitted gang becomes after an edit: each pod set keeps its admitted shape and count
    unless the edit asks for fewer pods of it in all (gang and elastic; a pod set the edit no longer
    has counts 0); None when the edit shrinks nothing (it grows, reshapes or leaves the gang alone:
    what was admitted stays).

    Queue (quota), placement (slots) and the history all apply this one rule, so they stay in step.
    """
    wanted = {ps.name: ps.desired for ps in edited.pod_sets}
    sets = tuple(ps.model_copy(update={"count": wanted.get(ps.name, 0)}) if wanted.get(ps.name, 0) < ps.count else ps
                 for ps in admitted.pod_sets)
    if sets == admitted.pod_sets:
        return None
    members = sum(ps.count for ps in sets if ps.in_gang)
    return admitted.model_copy(update={"min_member": min(admitted.min_member, members), "pod_sets": sets})


def elastic_wanted(admitted: Gang, latest: Gang) -> dict[str, int]:
    """Per admitted pod set, the elastic pods the owner wants now: what the latest spec desires beyond
    the admitted count, for a pod set whose pods still have the admitted shape (a reshaped or new pod
    set waits for the next admission). Queue (grants) and placement (slots) apply this one rule.

    A pod set not edited since its admission is the admitted one itself, which passes the test
    whatever it holds, so its shape is not worked out twice: the queue asks on every change of a
    holder, most of them never edited."""
    latest_sets = {ps.name: ps for ps in latest.pod_sets}
    out: dict[str, int] = {}
    for ps in admitted.pod_sets:
        now = latest_sets.get(ps.name)
        if now is not None and (now is ps or (now.shape == ps.shape and now.charged == ps.charged
                                              and now.in_gang == ps.in_gang)):
            extra = now.desired - ps.count
            if extra > 0:
                out[ps.name] = extra
    return out


WorkloadKind = Literal["RayCluster", "RayJob", "PodGroup", "Pod"]


class WorkloadSpec(Frozen):
    """A workload as admission normalised it: who, where it queues, how much, how it is gated."""

    key: str
    """``namespace/name`` of the user's object."""
    kind: WorkloadKind
    namespace: str
    name: str
    queue: str
    priority: int = 0
    priority_class: str | None = None
    preemptible: bool = True
    """May be a victim of preemption or reclaim. Admission decides it by the queue's dialect (KAI: priority
    below 100 unless ``kai.scheduler/preemptibility`` says otherwise) and the opt-outs users write
    (``volcano.sh/preemptable: "false"`` on the object, a pod template, its PodGroup or a pod)."""
    gate: Literal["suspend", "pods"] = "pods"
    """``suspend``: held by ``spec.suspend`` (kube-queue/Kueue); ``pods``: pods wait unbound (Volcano/KAI)."""
    preempts: bool = True
    """May evict lower priorities of its own queue. Admission decides it by the queue's dialect: a
    suspend-gated workload of a kube-queue (ElasticQuotaTree) or default queue only overtakes, as
    kube-queue and Kueue (``withinClusterQueue: Never`` by default) do; Volcano and KAI preempt."""
    gang: Gang
    submitted_at: float = 0.0
    cluster_name: str = ""
    """Name of the RayCluster whose pods form the gang (a RayJob's generated cluster)."""
    not_ready: str = ""
    """Why the workload cannot start now although it was submitted (a pod group with fewer pods than
    its minimum: Volcano's "Not enough valid tasks"); "" when nothing but quota and nodes decide."""


QueueDialect = Literal["volcano", "kai", "elasticquotatree", "builtin"]


class QueueSource(Frozen):
    """The Kubernetes object that defines a queue (where the reconciler writes its status)."""

    kind: str
    api_version: str
    namespace: str = ""
    name: str


class QueueSpec(Frozen):
    """One node of the normalised queue tree: amounts in milli-units, ``weight`` in thousandths."""

    name: str
    parent: str | None = None
    dialect: QueueDialect = "builtin"
    guarantee: dict[str, int] = {}
    """Per resource, milli-units; missing = 0, ``UNLIMITED`` = everything it can get."""
    limit: dict[str, int] = {}
    """Per resource, milli-units; missing or ``UNLIMITED`` = no limit."""
    deserved: dict[str, int] = {}
    """Per resource, milli-units: what the queue may reclaim up to and above which it lends (Volcano's
    capacity plugin ``spec.deserved``); never below the guarantee. Missing = the guarantee."""
    weight: int = 1000
    """Share of the surplus among siblings of one queue priority, in thousandths (weight 1 = 1000), so
    KAI's fractional ``overQuotaWeight`` (0.4 → 400) stays exact; Volcano's integer ``weight`` × 1000."""
    priority: int = 0
    reclaimable: bool = True
    state: QueueState = "Open"
    namespaces: tuple[str, ...] = ()
    min_runtime: float | None = None
    """Seconds a workload of this queue runs before it may be preempted or reclaimed (None: policy)."""
    source: QueueSource | None = None
    """The object it was defined by (a Volcano or KAI Queue of its name, or an ElasticQuotaTree)."""

    # Rule values: admission fills them from the dialect (services/admission/dialects.py); the cores
    # read them and never test ``dialect``. The defaults are the implicit default queue's (kube-queue / Kueue).
    kind: str = "Queue"
    """The kind of object that defines such a queue (where a rejection of it is reported)."""
    limit_word: str = "limit"
    """What users of this dialect call the upper bound, for reasons they recognise (Volcano ``capability``)."""
    guarantee_word: str = "guarantee"
    """What they call the lower bound (KAI ``quota``, ElasticQuotaTree ``min``)."""
    guarantee_caps_non_preemptible: bool = False
    """Non-preemptible workloads run only within the guarantee (KAI: nobody could take them back)."""
    reclaim_below_guarantee: bool = False
    """Reclaim may take a whole job from this queue, while it is over its share, even when the queue ends
    below its guarantee (KAI). False: a victim never takes its queue below its guarantee (Volcano capacity,
    ElasticQuotaTree min)."""
    evicts_stale_gangs: bool = False
    """A running gang that stays below its minimum past the staleness grace period
    (``Policy.staleness_grace_period_for``) is evicted, so its quota and nodes go back (KAI's
    ``stalegangeviction`` action). False: it keeps its place until it is whole again (Volcano, kube-queue,
    Kueue without ``waitForPodsReady``)."""
    consolidates: bool = False
    """A workload of this queue that waits only because GPU fractions are spread over devices may have
    running fractional pods of such queues moved (evicted and placed again at once) so that it fits
    (KAI's ``consolidation`` action). False: it waits for room or preempts."""

    def limit_of(self, resource: str) -> int | None:
        value = self.limit.get(resource)
        return None if value is None or value == UNLIMITED else value

    def guarantee_of(self, resource: str) -> int | None:
        """None means unlimited."""
        value = self.guarantee.get(resource, 0)
        return None if value == UNLIMITED else value

    def entitled_of(self, resource: str) -> int | None:
        """What the queue is owed before weights share the rest, and may take back from queues above
        theirs: its deserved amount where it has one, else its guarantee (None means unlimited)."""
        guarantee = self.guarantee_of(resource)
        deserved = self.deserved.get(resource)
        if guarantee is None or deserved is None:
            return guarantee
        return None if deserved == UNLIMITED else max(deserved, guarantee)
