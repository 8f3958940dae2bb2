"""Scheduling metrics, named as Kueue names them where they mean the same thing.

The queue service exports them: it is the one service that sees every workload from its submission
(``WorkloadSubmitted``, ``Enqueued``) through its admission (``Dequeued``, placement's
``GangPlaced`` / ``PlacementFailed``) to its gang Running (``GangRunning``) and its preemptions
(``PreemptionRequested``), the way Kueue's scheduler and cache see a ClusterQueue's workloads.
Kueue's definitions: kubernetes-sigs/kueue ``pkg/metrics/metrics.go``.

Two parts, both adapters over the queue service (the core knows nothing of them):

- ``WaitFold`` watches each envelope the service handles and its outputs (``InboxWorker.watchers``)
  and keeps per workload only when its current wait began: histograms and counters. Waits are in
  event time, so they are exactly what the result document's transitions say (Queued -> Admitted).
- ``QueueStatusCollector`` reads the core's read-only ``status()`` at scrape time: pending
  workloads per queue and state, admitted and running, usage against guarantee and limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from shared.kernel.events import (
    Dequeued, Enqueued, Envelope, GangEvicted, GangPlaced, GangRunning, PlacementFailed, PreemptionRequested,
    ReclaimRequested, WorkloadDeleted, WorkloadFinished, WorkloadWithdrawn,
)
from shared.kernel.fold import Folds
from shared.kernel.model import UNLIMITED

WAIT_BUCKETS = (1.0, *(2.5 * 2 ** i for i in range(13)))
"""Kueue's ``generateExponentialBuckets(14)``: 1 s, then 2.5 s doubling up to about 5.7 hours."""

UNLIMITED_AS = -1.0
"""How an unlimited limit or guarantee is exported (as KAI writes it in a Queue)."""


@dataclass
class _Wait:
    queue: str
    since: float
    """When the current wait began: the first Enqueued of the submission or of the requeue."""
    admitted_at: float | None = None


class WaitFold(Folds):
    """Counters and histograms of the queue service, from what it handles and emits."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def histogram(name: str, text: str) -> Histogram:
            return Histogram(name, text, ["cluster_queue"], buckets=WAIT_BUCKETS, registry=registry)

        def counter(name: str, text: str, labels: list[str]) -> Counter:
            return Counter(name, text, labels, registry=registry)

        self.admission_wait = histogram(
            "muster_admission_wait_time_seconds",
            "Time from a workload's submission or requeue until it was admitted (its gang placed), per queue")
        self.quota_reserved_wait = histogram(
            "muster_quota_reserved_wait_time_seconds",
            "Time from a workload's submission or requeue until the queue reserved its quota, per queue")
        self.ready_wait = histogram(
            "muster_ready_wait_time_seconds",
            "Time from a workload's submission or requeue until its gang was Running, per queue")
        self.admitted_until_ready = histogram(
            "muster_admitted_until_ready_wait_time_seconds",
            "Time from a workload's admission until its gang was Running, per queue")
        self.admitted = counter("muster_admitted_workloads", "Workloads admitted (gang placed), per queue",
                                ["cluster_queue"])
        self.quota_reserved = counter("muster_quota_reserved_workloads", "Quota reservations, per queue",
                                      ["cluster_queue"])
        self.evicted = counter("muster_evicted_workloads", "Workloads evicted, per queue and reason",
                               ["cluster_queue", "reason"])
        self.preempted = counter(
            "muster_preempted_workloads",
            "Workloads preempted, per preempting queue and reason (InClusterQueue: a higher priority of the "
            "same queue; InCohortReclamation: another queue taking back its share)",
            ["preempting_cluster_queue", "reason"])
        self.attempts = counter("muster_placement_attempts", "Gangs handed to placement (quota reserved), per queue",
                                ["cluster_queue"])
        self.failures = counter("muster_placement_failures", "Placement attempts that found no room, per queue",
                                ["cluster_queue"])
        self._waits: dict[str, _Wait] = {}
        self._queues: dict[str, str] = {}
        """Workload key -> its queue, while it is followed (a preemptor's queue is a label)."""
        self.admitted_now: dict[str, str] = {}
        """Workloads admitted (gang placed) and not preempted or finished since -> their queue."""
        self.running_now: dict[str, str] = {}
        """Workloads whose gang ran and that were not preempted or finished since -> their queue."""

    def count(self, workloads: dict[str, str]) -> dict[str, int]:
        """Per queue, how many of ``workloads``."""
        counts: dict[str, int] = {}
        for queue in workloads.values():
            counts[queue] = counts.get(queue, 0) + 1
        return counts

    def __call__(self, cause: Envelope, outputs: list[Envelope]) -> None:
        self._see(cause)
        for out in outputs:
            self._see(out)

    def _see(self, env: Envelope) -> None:
        handler = self.folds.get(env.type)
        if handler is not None:
            handler(self, env.payload, env.occurred_at)

    def _on_Enqueued(self, p: Enqueued, t: float) -> None:
        self._queues[p.key] = p.queue
        wait = self._waits.get(p.key)
        if wait is None:
            self._waits[p.key] = _Wait(p.queue, t)
        else:
            wait.queue = p.queue

    def _on_Dequeued(self, p: Dequeued | ReclaimRequested, t: float) -> None:
        self._queues[p.key] = p.queue
        self.quota_reserved.labels(p.queue).inc()
        self.attempts.labels(p.queue).inc()
        wait = self._waits.get(p.key)
        if wait is not None:
            self.quota_reserved_wait.labels(p.queue).observe(t - wait.since)

    def _on_PlacementFailed(self, p: PlacementFailed, t: float) -> None:
        self.failures.labels(p.queue).inc()

    def _on_GangPlaced(self, p: GangPlaced, t: float) -> None:
        self.admitted_now[p.key] = p.queue
        wait = self._waits.get(p.key)
        if wait is None or wait.admitted_at is not None:
            return
        wait.admitted_at = t
        self.admitted.labels(p.queue).inc()
        self.admission_wait.labels(p.queue).observe(t - wait.since)

    def _on_GangRunning(self, p: GangRunning, t: float) -> None:
        queue = self._queues.get(p.key)
        if queue is not None:
            self.running_now[p.key] = queue
        wait = self._waits.pop(p.key, None)
        if wait is None:
            return
        self.ready_wait.labels(wait.queue).observe(t - wait.since)
        if wait.admitted_at is not None:
            self.admitted_until_ready.labels(wait.queue).observe(t - wait.admitted_at)

    def _on_PreemptionRequested(self, p: PreemptionRequested, t: float) -> None:
        self.preempted.labels(self._queues.get(p.preemptor, ""),
                              "InCohortReclamation" if p.reclaim else "InClusterQueue").inc()
        self._evicted(p.key, "Preempted")

    def _on_GangEvicted(self, p: GangEvicted, t: float) -> None:
        """A stale gang: Kueue's reason for evicting a workload whose pods stayed not ready past its
        ``waitForPodsReady`` (``recoveryTimeout``) timeout, the nearest it has to KAI's stale gang eviction."""
        self._evicted(p.key, "PodsReadyTimeout")

    def _evicted(self, key: str, reason: str) -> None:
        self.evicted.labels(self._queues.get(key, ""), reason).inc()
        self._waits.pop(key, None)  # the requeue starts a new wait (its Enqueued comes next)
        self.admitted_now.pop(key, None)
        self.running_now.pop(key, None)

    def _gone(self, p: WorkloadFinished | WorkloadDeleted | WorkloadWithdrawn, t: float) -> None:
        for followed in (self._waits, self._queues, self.admitted_now, self.running_now):
            followed.pop(p.key, None)

    _on_ReclaimRequested = _on_Dequeued
    _on_WorkloadFinished = _on_WorkloadDeleted = _on_WorkloadWithdrawn = _gone



def _amount(resource: str, milli: int) -> float:
    """A quota amount as exported: the resource's own unit (cores, bytes, GPUs); unlimited as -1."""
    if milli == UNLIMITED:
        return UNLIMITED_AS
    return milli / 1000


def _headroom(limit: int, guarantee: int | None) -> int:
    """Kueue's borrowing limit from a limit and a guarantee (milli-units): what may be borrowed above the
    guarantee (none when the guarantee reaches the limit); unlimited when the limit is."""
    if limit == UNLIMITED:
        return UNLIMITED
    if guarantee is None:
        return limit
    if guarantee == UNLIMITED:
        return 0
    return max(0, limit - guarantee)


class QueueStatusCollector(Collector):
    """Gauges read from the queue core's ``status()`` when Prometheus scrapes (nothing per event).

    ``status`` is called on the service's event loop (the server runs there): no race with the fold."""

    def __init__(self, status: Callable[[], dict[str, dict]], fold: WaitFold) -> None:
        self.status = status
        self.fold = fold

    def collect(self) -> Iterator[GaugeMetricFamily]:
        view = self.status()
        running, admitted_now = self.fold.count(self.fold.running_now), self.fold.count(self.fold.admitted_now)
        pending = GaugeMetricFamily(
            "muster_pending_workloads",
            "Workloads waiting, per queue and status: active (in line), backoff (waiting out a failed "
            "attempt), inadmissible (their queue takes none: missing, closed, or not a leaf)",
            labels=["cluster_queue", "status"])
        reserving = GaugeMetricFamily("muster_reserving_active_workloads",
                                      "Workloads holding quota (being placed, admitted or running), per queue",
                                      labels=["cluster_queue"])
        admitted = GaugeMetricFamily("muster_admitted_active_workloads",
                                     "Workloads admitted and not finished, per queue", labels=["cluster_queue"])
        run = GaugeMetricFamily("muster_running_workloads", "Workloads whose gang is Running, per queue",
                                labels=["cluster_queue"])
        usage = GaugeMetricFamily("muster_cluster_queue_resource_usage",
                                  "Quota a queue holds (rolled up from its leaves), per resource",
                                  labels=["cluster_queue", "resource"])
        guarantee = GaugeMetricFamily("muster_cluster_queue_nominal_quota",
                                      "A queue's guaranteed quota per resource (-1: unlimited)",
                                      labels=["cluster_queue", "resource"])
        limit = GaugeMetricFamily("muster_cluster_queue_resource_limit",
                                  "What a queue's usage may reach per resource: its capability, limit or max "
                                  "(-1: unlimited)", labels=["cluster_queue", "resource"])
        borrowing = GaugeMetricFamily("muster_cluster_queue_borrowing_limit",
                                      "How far above its nominal quota (guarantee) a queue may borrow per resource, "
                                      "as Kueue's borrowingLimit: its limit less its guarantee (-1: unlimited)",
                                      labels=["cluster_queue", "resource"])
        for name, queue in view.items():
            held = not queue["exists"] or queue["state"] not in (None, "Open")
            waiting = len(queue["pending"])
            pending.add_metric([name, "active"], 0 if held else waiting)
            pending.add_metric([name, "inadmissible"], waiting if held else 0)
            pending.add_metric([name, "backoff"], len(queue["backoff"]))
            reserving.add_metric([name], len(queue["active"]))
            admitted.add_metric([name], admitted_now.get(name, 0))
            run.add_metric([name], running.get(name, 0))
            for resource, amount in queue["usage"].items():
                usage.add_metric([name, resource], _amount(resource, amount))
            for resource, amount in queue["guarantee"].items():
                guarantee.add_metric([name, resource], _amount(resource, amount))
            for resource, amount in queue["limit"].items():
                limit.add_metric([name, resource], _amount(resource, amount))
                borrowing.add_metric([name, resource], _amount(resource, _headroom(amount, queue["guarantee"].get(resource))))
        yield from (pending, reserving, admitted, run, usage, guarantee, limit, borrowing)


def queue_metrics(core: Any, registry: CollectorRegistry) -> WaitFold:
    """Register the queue service's scheduling metrics for ``core``; the fold to watch its inbox with."""
    fold = WaitFold(registry)
    registry.register(QueueStatusCollector(core.status, fold))
    return fold
