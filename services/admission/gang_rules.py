"""What each queue dialect counts as a Ray workload's gang, and what it charges: rules as data.

Admission reads the rules of the dialect of the queue a workload lands in and fills the values on
its pod sets (``PodSet.count`` = the minimum that starts together, ``PodSet.elastic`` = the pods
beyond it, ``PodSet.charged``); the queue and placement cores only read those values and never ask
which dialect a workload came from.

- Volcano (KubeRay's volcano batch scheduler, ``volcano_scheduler.go`` ``calculatePodGroupParams``):
  minMember = head + Σ desired workers, or head + Σ minReplicas when in-tree autoscaling is on;
  workers above that are elastic. The submitter is in the PodGroup's minResources: charged.
- KAI (the podgrouper's Ray plugin, ``ray_grouper.go`` ``calcJobNumOfPodsAndSubGroups``): a worker
  group's minimum is minReplicas × numOfHosts when minReplicas is set, else its desired replicas;
  workers above it are elastic, autoscaling or not.
- ElasticQuotaTree (ACK kube-queue, "Automate RayJobs in ACK clusters"): a RayJob's demand is head +
  Σ replicas × pod request; the whole cluster is admitted at once (no elastic part) and the
  submitter pod is not charged to the quota.
- The implicit default queue behaves as KubeRay's own arithmetic (Volcano's rule above).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shared.model import QueueDialect

RayMinimum = Literal["desired", "min-when-autoscaling", "min-replicas"]


@dataclass(frozen=True)
class GangRules:
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

RULES: dict[str, GangRules] = {
    "volcano": KUBERAY,
    "kai": GangRules(ray_minimum="min-replicas", charge_submitter=True),
    "elasticquotatree": GangRules(ray_minimum="desired", charge_submitter=False),
    "builtin": KUBERAY,
}


def rules_for(dialect: QueueDialect | None) -> GangRules:
    """The rules of a queue's dialect; a queue not defined (yet) follows KubeRay's own arithmetic."""
    return RULES.get(dialect or "builtin", KUBERAY)
