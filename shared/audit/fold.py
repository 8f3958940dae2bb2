"""The result view (``shared.kernel.projection.ResultProjection``) plus what the audit commands read off a
log besides: who preempted whom and why, placement's last word on each workload, backoffs, when
each RayJob's run began and ended, and queue usage over time. The same fold ``muster simulate``
prints, extended, never re-deciding anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from shared.kernel import kube
from shared.kernel.events import (
    BackedOff, Dequeued, Envelope, ObjectChanged, PlacementFailed, PreemptionRequested, ReclaimRequested,
)
from shared.kernel.model import WorkloadSpec
from shared.kernel.projection import ResultProjection


@dataclass(frozen=True)
class Said:
    """A decision about a workload: when, which event, what it said."""

    t: float
    event_id: str
    reason: str


@dataclass(frozen=True)
class Preemption:
    t: float
    victim: str
    victim_queue: str | None
    preemptor: str
    preemptor_priority: int
    reclaim: bool
    reason: str
    event_id: str
    cause_id: str | None
    """The decision the preemption answers (the preemptor's Dequeued or ReclaimRequested)."""


@dataclass
class UsageSeries:
    """Queue usage over time, rolled up, sampled at most ``budget`` times (thinned evenly beyond)."""

    budget: int = 600
    times: list[float] = field(default_factory=list)
    usage: list[dict[str, dict[str, int]]] = field(default_factory=list)
    gap: float = 0.0

    def sample(self, t: float, usage: dict[str, dict[str, int]]) -> None:
        if self.times and t - self.times[-1] < self.gap:
            self.usage[-1] = usage  # the latest state of the stretch stands for it
            return
        self.times.append(t)
        self.usage.append(usage)
        if len(self.times) > self.budget:
            self.times, self.usage = self.times[::2], self.usage[::2]
            self.gap = max(self.gap * 2, (self.times[-1] - self.times[0]) / self.budget)


_CHANGES_USAGE = frozenset({
    "Dequeued", "ReclaimRequested", "GangPlaced", "PlacementFailed", "BackedOff", "PreemptionRequested", "GangEvicted",
    "WorkloadFinished", "WorkloadDeleted", "WorkloadWithdrawn", "WorkloadUpdated", "QueueDefined", "QueueRemoved",
})


class AuditFold(ResultProjection):
    """``ResultProjection`` and the facts above; ``apply`` envelopes in log order."""

    def __init__(self, scenario: str = "", *, series: bool = False) -> None:
        super().__init__(scenario)
        self.preemptions: list[Preemption] = []
        self.placement: dict[str, Said] = {}
        """Workload -> placement's last refusal (PlacementFailed): the node shortfall."""
        self.backoff: dict[str, tuple[Said, float, int]] = {}
        """Workload -> its last BackedOff, requeue_at and attempt."""
        self.admitted: dict[str, Said] = {}
        """Workload -> its last Dequeued/ReclaimRequested (quota reserved)."""
        self.job_started: dict[str, float] = {}
        self.job_runs: dict[str, float] = {}
        """RayJob -> how long its last run took, start to finish, as the RayJob's status showed."""
        self.specs: dict[str, WorkloadSpec] = {}
        """Workload -> its spec as last described (its gang, for the gang line)."""
        self.first_at: float | None = None
        self.series = UsageSeries() if series else None
        self._dirty = False
        self._env: Envelope | None = None

    def apply(self, env: Envelope) -> None:
        at = env.occurred_at
        if self.first_at is None:
            self.first_at = at
        if self.series is not None and self._dirty and at > self.now:
            self.series.sample(self.now, self.queue_usage())
            self._dirty = False
        self._env = env
        super().apply(env)
        if env.type in _CHANGES_USAGE:
            self._dirty = True

    def close(self) -> None:
        """The log ended: the last usage sample."""
        if self.series is not None:
            self.series.sample(self.now, self.queue_usage())
            self._dirty = False

    def _id(self) -> str:
        return self._env.id if self._env is not None else ""

    def _describe(self, view: Any, spec: Any) -> None:
        super()._describe(view, spec)
        self.specs[view.key] = spec

    def _on_PreemptionRequested(self, p: PreemptionRequested, t: float) -> None:
        view = self.workloads.get(p.key)
        super()._on_PreemptionRequested(p, t)
        cause = self._env.causation_id if self._env is not None else None
        self.preemptions.append(Preemption(t, p.key, view.queue if view else None, p.preemptor, p.preemptor_priority,
                                           p.reclaim, p.reason, self._id(), cause))

    def _on_PlacementFailed(self, p: PlacementFailed, t: float) -> None:
        super()._on_PlacementFailed(p, t)
        self.placement[p.key] = Said(t, self._id(), p.reason)

    def _on_BackedOff(self, p: BackedOff, t: float) -> None:
        super()._on_BackedOff(p, t)
        self.backoff[p.key] = (Said(t, self._id(), p.reason), p.requeue_at, p.attempts)

    def _on_Dequeued(self, p: Dequeued | ReclaimRequested, t: float) -> None:
        super()._on_Dequeued(p, t)
        self.admitted[p.key] = Said(t, self._id(), p.reason)

    _on_ReclaimRequested = _on_Dequeued

    def _on_ObjectChanged(self, p: ObjectChanged, t: float) -> None:
        super()._on_ObjectChanged(p, t)
        if p.kind != "RayJob":
            return
        status = kube.mapping(p.object.get("status"))
        key = f"{p.namespace}/{p.name}"
        state = status.get("jobDeploymentStatus")
        if state == "Running" and key not in self.job_started:
            self.job_started[key] = t
        elif state in ("Complete", "Failed") and key in self.job_started:
            self.job_runs[key] = round(t - self.job_started.pop(key), 6)
        elif state not in ("Running", "Complete", "Failed"):
            self.job_started.pop(key, None)  # suspended again (preempted): the next run starts over


def fold(envelopes: Iterable[Envelope], *, scenario: str = "", until: float | None = None,
         series: bool = False) -> AuditFold:
    """Fold ``envelopes`` (up to event time ``until``)."""
    history = AuditFold(scenario, series=series)
    for env in envelopes:
        if until is not None and env.occurred_at > until:
            break
        history.apply(env)
    history.close()
    return history
