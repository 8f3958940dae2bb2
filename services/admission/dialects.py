"""Where Volcano, KAI Scheduler, kube-queue's ElasticQuotaTree and the implicit default queue differ, as data.

A workload's rules come from the dialect of the queue it lands in. Each dialect states them here once,
in one row of ``DIALECTS``: admission writes them on the QueueSpec (``queue_fields``), uses them for
the WorkloadSpec (``non_preemptible_from``, ``preempts``) and counts the gang by them (``gang``:
``PodSet.count`` / ``elastic`` / ``charged``); the queue and placement cores read the values and never
test a name. docs/design/dialects.md cites the peer source of every value.

Preemption and reclaim:

- ``non_preemptible_from``: the priority from which a workload is non-preemptible. KAI only
  (``PriorityBuildNumber`` 100); the others have no priority cap: any PriorityClass value is
  preemptible by a higher priority unless the workload opts out.
- ``guarantee_caps_non_preemptible``: KAI schedules non-preemptible jobs only within quota.
- ``suspended_preempt``: whether a suspend-gated workload (one a queue controller unsuspends) evicts
  lower priorities of its queue. Volcano's and KAI's preempt actions do; kube-queue and Kueue
  (``withinClusterQueue: Never`` by default) only reorder, so it overtakes but evicts nothing. A
  pod-gated workload is placed by the scheduler itself, which preempts lower priorities in every
  dialect (capacity scheduling, kube-scheduler's PreemptLowerPriority).
- ``reclaim_below_guarantee``: KAI reclaims a whole job from a queue over its share even when the queue
  ends below its quota; Volcano's capacity plugin never takes a victim's queue below ``guarantee``, and
  an ElasticQuotaTree ``min`` is guaranteed (ACK: reclaimed only from quotas whose usage exceeds their min).
- ``evicts_stale_gangs``: KAI's ``stalegangeviction`` action evicts a job that stayed below its minimum
  (a pod set with fewer active pods than its ``minAvailable``) for its staleness grace period (60 s by
  default, ``--default-staleness-grace-period``); Volcano's scheduler never evicts a job for that (its
  vcjob controller only turns the job Pending), kube-queue and coscheduling neither, and Kueue only
  with ``waitForPodsReady`` (off by default), so the others keep the gang's place until it is whole.
- ``consolidates``: KAI's ``consolidation`` action (run after allocate, before reclaim and preempt) moves
  running preemptible pods (evicts them and places them again in the same statement) so that a pending
  job fits, committing only when every moved pod is placed again (``allPodsReallocated``); Volcano,
  kube-queue and Kueue have no such action (a job waits for room, or preempts), so only KAI queues move
  fractional pods, and only pods of KAI queues are moved.
- ``preemptable_per_pod``: Volcano reads ``volcano.sh/preemptable`` per pod (``api/pod_info.go``
  ``GetPodPreemptable`` into ``TaskInfo.Preemptable``; preempt and reclaim skip such a task): a pinned
  pod set keeps its pods and, since the gang plugin never takes a job below ``minAvailable`` unless the
  whole job goes (``plugins/gang/gang.go`` ``preemptableFn``), the whole gang, but the elastic pods of
  the other pod sets stay victims (``WorkloadSpec.pinned_pod_sets``). The other dialects read the
  annotation as an opt-out of the whole workload, its elastic pods included.
- ``reserves_guarantee``: Volcano's capacity plugin holds a queue's ``guarantee`` for it: each queue
  may use at most ``realCapability`` = min(capability, its parent's room − Σ its siblings' and its own
  guarantees + its own) (``capacity.go`` ``buildQueueAttrs`` / ``checkHierarchicalQueue``, read by
  ``queueAllocatable`` and ``jobEnqueueable``), so no other queue is admitted into it; ``deserved``
  stays what reclaim restores up to. KAI, kube-queue and the default queue lend an unused guarantee
  and reclaim it when its owner asks.
- ``victim_queues_by_priority``: Volcano's reclaim takes victims from the queue of the lowest
  ``spec.priority`` first (``Session.BuildVictimsPriorityQueue`` orders victims of two queues by
  ``VictimQueueOrderFn``, which falls back to the reverse of ``QueueOrderFn``: the proportion and
  capacity plugins order queues by priority, then share). The other dialects keep muster's order: the
  queue furthest above its share gives first, whatever its priority.
- ``gates_enqueue``: Volcano's enqueue action moves a PodGroup to Inqueue only when every plugin's
  ``JobEnqueueable`` permits (``actions/enqueue/enqueue.go``): the overcommit plugin's (minimum + what
  Inqueue and Running jobs hold within ``overcommit-factor`` × the cluster, ``plugins/overcommit/overcommit.go``)
  and the capacity plugin's (minimum + the queue's allocated and inqueue within ``realCapability``,
  ``plugins/capacity/capacity.go`` ``jobEnqueueable``); allocate, reclaim and preempt skip a Pending job
  (``if job.IsPending() { continue }``). The other dialects have no such gate.

What a Ray workload's gang counts and what it charges (``gang``):

- Volcano (KubeRay's volcano batch scheduler, ``volcano_scheduler.go`` ``calculatePodGroupParams``):
  minMember = head + Σ desired workers, or head + Σ minReplicas when in-tree autoscaling is on;
  workers above that are elastic. The submitter is in the PodGroup's minResources: charged.
- KAI (the podgrouper's Ray plugin, ``ray_grouper.go`` ``calcJobNumOfPodsAndSubGroups``): a worker
  group's minimum is minReplicas × numOfHosts when minReplicas is set, else its desired replicas;
  workers above it are elastic, autoscaling or not.
- ElasticQuotaTree (ACK kube-queue, "Automate RayJobs in ACK clusters"): a RayJob's demand is head +
  Σ replicas × pod request; the whole cluster is admitted at once (no elastic part) and the
  submitter pod is not charged to the quota.
- The implicit default queue counts as KubeRay itself does (Volcano's rule above).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from shared.kernel.model import QueueDialect, QueueSpec

RayMinimum = Literal["desired", "min-when-autoscaling", "min-replicas"]


@dataclass(frozen=True)
class GangRules:
    """How a dialect counts a Ray workload's gang: the part of it admission reads before the queue is known
    is KubeRay's (``KUBERAY``), so these values are grouped to compare them at once."""

    ray_minimum: RayMinimum
    """A worker group's part of the gang: its desired pods (``desired``), minReplicas when in-tree
    autoscaling is on (``min-when-autoscaling``), or minReplicas whenever it is set (``min-replicas``)."""
    charge_submitter: bool
    """Whether a RayJob's submitter pod counts against queue quota."""

    def worker_minimum(self, desired: int, min_replicas: int, hosts: int, autoscaling: bool) -> int:
        """Pods of one worker group in the gang's minimum (never more than it desires)."""
        if self.ray_minimum == "min-when-autoscaling" and autoscaling:
            return min(desired, min_replicas * hosts)
        if self.ray_minimum == "min-replicas" and min_replicas > 0:
            return min(desired, min_replicas * hosts)
        return desired


KUBERAY = GangRules(ray_minimum="min-when-autoscaling", charge_submitter=True)
"""KubeRay's own arithmetic (its volcano batch scheduler's)."""


@dataclass(frozen=True)
class Dialect:
    kind: str
    """The object that defines such a queue."""
    limit_word: str
    guarantee_word: str
    non_preemptible_from: int | None
    guarantee_caps_non_preemptible: bool
    reclaim_below_guarantee: bool
    suspended_preempt: bool
    evicts_stale_gangs: bool
    consolidates: bool
    preemptable_per_pod: bool
    reserves_guarantee: bool
    victim_queues_by_priority: bool
    gates_enqueue: bool
    gang: GangRules

    def preempts(self, gate: str) -> bool:
        """Whether a workload with this gate may evict lower priorities of its own queue."""
        return gate == "pods" or self.suspended_preempt

    def queue_fields(self) -> dict[str, Any]:
        """The QueueSpec fields this dialect fills."""
        return {"kind": self.kind, "limit_word": self.limit_word, "guarantee_word": self.guarantee_word,
                "guarantee_caps_non_preemptible": self.guarantee_caps_non_preemptible,
                "reclaim_below_guarantee": self.reclaim_below_guarantee, "evicts_stale_gangs": self.evicts_stale_gangs,
                "reserves_guarantee": self.reserves_guarantee, "victim_queues_by_priority": self.victim_queues_by_priority,
                "consolidates": self.consolidates, "gates_enqueue": self.gates_enqueue}


DIALECTS: dict[QueueDialect, Dialect] = {
    "volcano": Dialect(kind="Queue", limit_word="capability", guarantee_word="guarantee", non_preemptible_from=None,
                       guarantee_caps_non_preemptible=False, reclaim_below_guarantee=False, suspended_preempt=True,
                       evicts_stale_gangs=False, preemptable_per_pod=True, reserves_guarantee=True,
                       victim_queues_by_priority=True, consolidates=False, gates_enqueue=True,
                       gang=KUBERAY),
    "kai": Dialect(kind="Queue", limit_word="limit", guarantee_word="quota", non_preemptible_from=100,
                   guarantee_caps_non_preemptible=True, reclaim_below_guarantee=True, suspended_preempt=True,
                   evicts_stale_gangs=True, preemptable_per_pod=False, reserves_guarantee=False,
                   victim_queues_by_priority=False, consolidates=True, gates_enqueue=False,
                   gang=GangRules(ray_minimum="min-replicas", charge_submitter=True)),
    "elasticquotatree": Dialect(kind="ElasticQuotaTree", limit_word="max", guarantee_word="min",
                                non_preemptible_from=None, guarantee_caps_non_preemptible=False,
                                reclaim_below_guarantee=False, suspended_preempt=False, evicts_stale_gangs=False,
                                preemptable_per_pod=False, reserves_guarantee=False, victim_queues_by_priority=False,
                                consolidates=False, gates_enqueue=False, gang=GangRules(ray_minimum="desired", charge_submitter=False)),
    "builtin": Dialect(kind="Queue", limit_word="limit", guarantee_word="guarantee", non_preemptible_from=None,
                       guarantee_caps_non_preemptible=False, reclaim_below_guarantee=False, suspended_preempt=False,
                       evicts_stale_gangs=False, preemptable_per_pod=False, reserves_guarantee=False,
                       victim_queues_by_priority=False, consolidates=False, gates_enqueue=False,
                       gang=KUBERAY),
}
"""``builtin`` is the implicit default queue: kube-queue / Kueue, preemptible by priority, no priority cap,
KubeRay's gang arithmetic."""


def dialect_of(spec: QueueSpec | None) -> Dialect:
    """The rules of a queue (the default queue's when it is not defined yet)."""
    return DIALECTS[spec.dialect if spec is not None else "builtin"]


def queue_fields(dialect: QueueDialect) -> dict[str, Any]:
    """``QueueSpec(..., **queue_fields("kai"))``: the rule values a parsed queue carries."""
    return {"dialect": dialect, **DIALECTS[dialect].queue_fields()}
