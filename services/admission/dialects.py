"""Where Volcano, KAI Scheduler, kube-queue's ElasticQuotaTree and the implicit default queue differ, as data.

A workload's rules come from the dialect of the queue it lands in. Each dialect states them here once;
admission writes them on the QueueSpec (``queue_fields``) and uses them for the WorkloadSpec
(``non_preemptible_from``); the queue and placement cores read the values and never test a name.
docs/design.md ("Dialect rules") cites the peer source of every value.

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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.model import QueueDialect, QueueSpec


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

    def preempts(self, gate: str) -> bool:
        """Whether a workload with this gate may evict lower priorities of its own queue."""
        return gate == "pods" or self.suspended_preempt

    def queue_fields(self) -> dict[str, Any]:
        """The QueueSpec fields this dialect fills."""
        return {"kind": self.kind, "limit_word": self.limit_word, "guarantee_word": self.guarantee_word,
                "guarantee_caps_non_preemptible": self.guarantee_caps_non_preemptible,
                "reclaim_below_guarantee": self.reclaim_below_guarantee}


DIALECTS: dict[QueueDialect, Dialect] = {
    "volcano": Dialect(kind="Queue", limit_word="capability", guarantee_word="guarantee", non_preemptible_from=None,
                       guarantee_caps_non_preemptible=False, reclaim_below_guarantee=False, suspended_preempt=True),
    "kai": Dialect(kind="Queue", limit_word="limit", guarantee_word="quota", non_preemptible_from=100,
                   guarantee_caps_non_preemptible=True, reclaim_below_guarantee=True, suspended_preempt=True),
    "elasticquotatree": Dialect(kind="ElasticQuotaTree", limit_word="max", guarantee_word="min",
                                non_preemptible_from=None, guarantee_caps_non_preemptible=False,
                                reclaim_below_guarantee=False, suspended_preempt=False),
    "builtin": Dialect(kind="Queue", limit_word="limit", guarantee_word="guarantee", non_preemptible_from=None,
                       guarantee_caps_non_preemptible=False, reclaim_below_guarantee=False, suspended_preempt=False),
}
"""``builtin`` is the implicit default queue: kube-queue / Kueue, preemptible by priority, no priority cap."""


def dialect_of(spec: QueueSpec | None) -> Dialect:
    """The rules of a queue (the default queue's when it is not defined yet)."""
    return DIALECTS[spec.dialect if spec is not None else "builtin"]


def queue_fields(dialect: QueueDialect) -> dict[str, Any]:
    """``QueueSpec(..., **queue_fields("kai"))``: the rule values a parsed queue carries."""
    return {"dialect": dialect, **DIALECTS[dialect].queue_fields()}
