"""Domain types shared by the services: the normalised workload, its gang, and the queue tree node.

Admission produces these from the dialects users write (KubeRay, Volcano, KAI, ElasticQuotaTree);
queue and placement consume them. They are plain frozen data with no behaviour beyond arithmetic.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from shared import quantity as q

UNLIMITED = -1
"""In a queue's ``limit`` or ``guarantee``: no bound on that resource (KAI's ``-1``)."""


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Toleration(Frozen):
    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: str = ""


class MatchExpression(Frozen):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()


class PodSet(Frozen):
    """Pods of one shape: the head, one worker group, a RayJob's submitter, or a plain pod gang."""

    name: str
    count: int
    in_gang: bool = True
    """False for pods that are placed with the gang but do not count toward minMember (submitter)."""
    resources: dict[str, int] = {}
    """Per pod, milli-units (see ``shared.quantity``), sum over regular containers."""
    gpu_share: int = 0
    """Fraction of one GPU device in thousandths (``gpu-fraction: "0.5"`` is 500); 0 = none."""
    node_selector: dict[str, str] = {}
    tolerations: tuple[Toleration, ...] = ()
    affinity: tuple[tuple[MatchExpression, ...], ...] = ()
    """Required node affinity: OR over terms, AND within a term."""

    @property
    def constraint_key(self) -> tuple:
        """Everything that restricts which nodes may host this pod set (used to cache filters)."""
        return (tuple(sorted(self.node_selector.items())), self.tolerations, self.affinity)


class Gang(Frozen):
    min_member: int
    pod_sets: tuple[PodSet, ...]

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
        """What the gang charges against queue quota: resources plus fractional GPUs as GPU."""
        demand = dict(self.resources)
        if self.gpu_share_total:
            demand[q.GPU] = demand.get(q.GPU, 0) + self.gpu_share_total
        return demand

    @property
    def pod_count(self) -> int:
        return sum(ps.count for ps in self.pod_sets)


def shrunk(admitted: Gang, edited: Gang) -> Gang | None:
    """What an admitted gang becomes after an edit: each pod set keeps its admitted shape and count
    unless the edit asks for fewer pods of it (a pod set the edit no longer has counts 0); None when
    the edit shrinks nothing (it grows, reshapes or leaves the gang alone: what was admitted stays).

    Queue (quota), placement (slots) and the history all apply this one rule, so they stay in step.
    """
    wanted = {ps.name: ps.count for ps in edited.pod_sets}
    sets = tuple(ps.model_copy(update={"count": wanted.get(ps.name, 0)}) if wanted.get(ps.name, 0) < ps.count else ps
                 for ps in admitted.pod_sets)
    if sets == admitted.pod_sets:
        return None
    members = sum(ps.count for ps in sets if ps.in_gang)
    return Gang(min_member=min(admitted.min_member, members), pod_sets=sets)


WorkloadKind = Literal["RayCluster", "RayJob", "PodGroup"]


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


QueueDialect = Literal["volcano", "kai", "elasticquotatree", "builtin"]


class QueueSpec(Frozen):
    """One node of the normalised queue tree: amounts in milli-units, ``weight`` in thousandths."""

    name: str
    parent: str | None = None
    dialect: QueueDialect = "builtin"
    guarantee: dict[str, int] = {}
    """Per resource, milli-units; missing = 0, ``UNLIMITED`` = everything it can get."""
    limit: dict[str, int] = {}
    """Per resource, milli-units; missing or ``UNLIMITED`` = no limit."""
    weight: int = 1000
    """Share of the surplus among siblings of one queue priority, in thousandths (weight 1 = 1000), so
    KAI's fractional ``overQuotaWeight`` (0.4 → 400) stays exact; Volcano's integer ``weight`` × 1000."""
    priority: int = 0
    reclaimable: bool = True
    state: Literal["Open", "Closed", "Closing"] = "Open"
    namespaces: tuple[str, ...] = ()
    min_runtime: float | None = None
    """Seconds a workload of this queue runs before it may be preempted or reclaimed (None: policy)."""

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

    def limit_of(self, resource: str) -> int | None:
        value = self.limit.get(resource)
        return None if value is None or value == UNLIMITED else value

    def guarantee_of(self, resource: str) -> int | None:
        """None means unlimited."""
        value = self.guarantee.get(resource, 0)
        return None if value == UNLIMITED else value
