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


class LabelSelector(Frozen):
    """A ``metav1.LabelSelector`` over pod labels: AND of ``matchLabels`` and ``matchExpressions``; an
    empty one matches every pod (a term or constraint with no selector at all holds ``None``: no pod)."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[MatchExpression, ...] = ()


class PodAffinityTerm(Frozen):
    """One ``PodAffinityTerm``: the pods it reads (selector, namespaces) and the topology they share."""

    selector: LabelSelector | None = None
    """None: the term has no ``labelSelector`` and matches no pod (``LabelSelectorAsSelector(nil)``)."""
    namespaces: tuple[str, ...] = ()
    """Namespaces whose pods it reads; empty, with ``all_namespaces`` False, is the pod's own namespace."""
    all_namespaces: bool = False
    """``namespaceSelector: {}``: pods of every namespace."""
    topology_key: str
    match_label_keys: tuple[str, ...] = ()
    """Keys whose value on the pod itself is added to the selector (``key In [value]``)."""
    mismatch_label_keys: tuple[str, ...] = ()
    """Keys whose value on the pod itself is excluded (``key NotIn [value]``)."""
    anti: bool = False
    """A ``podAntiAffinity`` term (else ``podAffinity``)."""
    weight: int = 0
    """A preferred term's weight (1..100); 0: a required term."""


class PodAffinity(Frozen):
    """``spec.affinity.podAffinity`` and ``podAntiAffinity`` of a pod: required terms filter nodes,
    preferred ones (a weight) score them (kube-scheduler's InterPodAffinity). One tuple of terms, each
    saying its kind, so that every term type appears once in the event schema."""

    terms: tuple[PodAffinityTerm, ...] = ()

    @property
    def required(self) -> tuple[PodAffinityTerm, ...]:
        return tuple(t for t in self.terms if not t.anti and not t.weight)

    @property
    def required_anti(self) -> tuple[PodAffinityTerm, ...]:
        return tuple(t for t in self.terms if t.anti and not t.weight)

    @property
    def preferred(self) -> tuple[PodAffinityTerm, ...]:
        return tuple(t for t in self.terms if not t.anti and t.weight)

    @property
    def preferred_anti(self) -> tuple[PodAffinityTerm, ...]:
        return tuple(t for t in self.terms if t.anti and t.weight)


NodeInclusionPolicy = Literal["Honor", "Ignore"]


class SpreadConstraint(Frozen):
    """One ``topologySpreadConstraints`` entry (kube-scheduler's PodTopologySpread)."""

    max_skew: int
    topology_key: str
    hard: bool = True
    """``whenUnsatisfiable: DoNotSchedule`` (a filter); False: ``ScheduleAnyway`` (a score)."""
    selector: LabelSelector | None = None
    match_label_keys: tuple[str, ...] = ()
    min_domains: int = 1
    node_affinity_policy: NodeInclusionPolicy = "Honor"
    node_taints_policy: NodeInclusionPolicy = "Ignore"


class HostPort(Frozen):
    """One ``containers[].ports[]`` entry with a ``hostPort``, defaulted as the API server and
    kube-scheduler's ``HostPortInfo.sanitize`` default it: protocol TCP, host IP 0.0.0.0 (every address)."""

    port: int
    protocol: str = "TCP"
    ip: str = "0.0.0.0"


class PreferredTerm(Frozen):
    """One ``preferredDuringSchedulingIgnoredDuringExecution`` entry: a node matching every expression
    (an empty term matches every node, as in Kubernetes) adds ``weight`` (1-100) to its preference."""

    weight: int
    expressions: tuple[MatchExpression, ...] = ()


class Volumes(Frozen):
    """The PersistentVolumeClaims a pod mounts, as placement resolves them against the claims, volumes
    and storage classes it watches (``services.placement.volumes``)."""

    claims: tuple[str, ...] = ()
    """``namespace/name`` of each claim named by ``volumes[].persistentVolumeClaim.claimName``, in volume order."""
    ephemeral: tuple[str, ...] = ()
    """The storage class of each generic ephemeral volume's claim template (``""`` when it names none):
    its claim is made with the pod, named after it, so only its class is known before."""

    def __bool__(self) -> bool:
        return bool(self.claims or self.ephemeral)


ConstraintKey = tuple[tuple[tuple[str, str], ...], tuple[Toleration, ...], tuple[tuple[MatchExpression, ...], ...],
                      Volumes]
"""``PodSet.constraint_key``: node selector (sorted items), tolerations, required affinity terms, volumes."""
Shape = tuple[tuple[tuple[str, int], ...], int, int, ConstraintKey, PodAffinity | None,
              tuple[SpreadConstraint, ...], tuple[HostPort, ...], tuple[PreferredTerm, ...]]
"""``PodSet.shape``: requests (sorted items), GPU share, GPU memory, constraint key, inter-pod constraints,
host ports, node preferences."""


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
    labels: dict[str, str] = {}
    """The template's labels (a plain pod's own): what other pods' affinity and spread selectors match.
    Placement adds what the pod's maker writes beside them (KubeRay's ``ray.io/cluster``, ...)."""
    namespace: str = ""
    """The pods' namespace, set by placement where it matches pods (``interpod.marked_spec``)."""
    pod_affinity: PodAffinity | None = None
    """Inter-pod affinity and anti-affinity; None when the template has none."""
    spread: tuple[SpreadConstraint, ...] = ()
    """Topology spread constraints."""
    host_ports: tuple[HostPort, ...] = ()
    """Host ports its containers (and restartable init containers) bind: no two pods holding one of them
    share a node (kube-scheduler's NodePorts)."""
    preferred: tuple[PreferredTerm, ...] = ()
    """Preferred node affinity: scores nodes, never rules one out (kube-scheduler's NodeAffinity score)."""
    volumes: Volumes = Volumes()
    """Claims its pods mount: nodes their volumes cannot reach are ruled out (kube-scheduler's VolumeBinding)."""

    @property
    def constraint_key(self) -> ConstraintKey:
        """Everything that restricts which nodes may host this pod set whatever they run (used to cache filters)."""
        return (tuple(sorted(self.node_selector.items())), self.tolerations, self.affinity, self.volumes)

    @property
    def shape(self) -> Shape:
        """What makes two pods interchangeable: requests, GPU share or memory, node constraints, the
        inter-pod ones (affinity, spread), which restrict nodes by where other pods run, host ports and
        node preferences."""
        return (tuple(sorted(self.resources.items())), self.gpu_share, self.gpu_memory, self.constraint_key,
                self.pod_affinity, self.spread, self.host_ports, self.preferred)

    @property
    def inter_pod(self) -> bool:
        """Whether where other pods run restricts or orders its nodes (affinity or spread of its own)."""
        return self.pod_affinity is not None or bool(self.spread)

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
    pinned_pod_sets: tuple[str, ...] = ()
    """Pod sets whose pods say ``volcano.sh/preemptable: "false"`` where the dialect reads it per pod
    (Volcano), when nothing else keeps the workload from being a victim: their pods are never evicted, so
    the gang is no victim as a whole (``preemptible`` is False), but the elastic pods of its other pod sets
    are (``elastic_preemptible``). Empty when no pod set is pinned alone."""
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

    def elastic_preemptible(self, pod_set: str) -> bool:
        """Whether an elastic pod of ``pod_set`` may be evicted on its own: a whole gang that may go gives
        its elastic pods too; one pinned only in some pod sets gives the others' (Volcano never evicts a
        task whose pod is not preemptable, and evicts any other task above the job's minimum)."""
        return self.preemptible or (bool(self.pinned_pod_sets) and pod_set not in self.pinned_pod_sets)


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
    reserves_guarantee: bool = False
    """Its guarantee is held for it: no other queue may be admitted into it, so none has to be evicted from
    it (Volcano's capacity plugin: every queue may use at most its parent's room less the guarantees of its
    siblings, its own added back). False: the guarantee is lent while unused and taken back by reclaim."""
    victim_queues_by_priority: bool = False
    """Reclaim for a workload of this queue takes its victims from the queue of the lowest ``priority``
    first, and only among queues of one priority from the one furthest above its share (Volcano: the
    victim queue order is the reverse of its queue order, which puts queue priority first). False: the
    queue furthest above its share gives first, whatever its priority."""
    gates_enqueue: bool = False
    """A waiting workload of this queue is considered (placed, or reclaiming or preempting) only once Volcano's
    enqueue action would move its PodGroup to Inqueue: its minimum within the queue's capability and room
    (capacity plugin) and within the overcommitted idle of the cluster (overcommit plugin,
    ``Policy.overcommit_factor``); until then it waits and evicts nobody (``services/queue/enqueue.py``).
    False: it may reclaim or preempt whatever its size."""

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
