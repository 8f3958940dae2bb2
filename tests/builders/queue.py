"""Builders for the queue core's tests: payloads it consumes and a driver that plays the clock.

``QueueDriver`` feeds envelopes to a ``QueueCore`` and fires the timers it sets the way the
embedded runtime does: only when nothing else is left at that instant, earliest first.
"""

from __future__ import annotations

from typing import Any

from services.queue import QueueCore
from shared.kernel.events import (
    CapacityChanged, GangPlaced, GangRunning, PlacementFailed, PreemptionRequested, QueueDefined,
    QueueRemoved, TimerFired, TimerSet, WorkloadDeleted, WorkloadFinished, WorkloadSubmitted, WorkloadUpdated,
)
from shared.kernel.model import UNLIMITED, QueueSpec, WorkloadSpec
from shared.kernel.policy import Policy
from shared.kernel.quantity import parse_resources
from tests.builders import envelope, gang, pod_set, workload


def ray_gang(head_cpu: str = "1", head_memory: str = "2Gi", workers: int = 2, worker_cpu: str = "1",
             worker_memory: str = "1Gi", gpu: str | None = None, submitter: bool = False):
    """A RayCluster-shaped gang: head + ``workers`` workers (+ an out-of-gang submitter)."""
    worker_res = {"cpu": worker_cpu, "memory": worker_memory}
    if gpu is not None:
        worker_res["nvidia.com/gpu"] = gpu
    sets = [pod_set("head", 1, cpu=head_cpu, memory=head_memory)]
    if workers:
        sets.append(pod_set("worker", workers, **worker_res))
    if submitter:
        sets.append(pod_set("submitter", 1, in_gang=False, cpu="500m", memory="200Mi"))
    return gang(*sets)


def cpu_gang(cpu: str = "1", **more: str):
    """One pod asking for ``cpu`` (and anything else named): the simplest quota demand."""
    return gang(pod_set("head", 1, cpu=cpu, **more))


def job(key: str, queue: str = "default", *, cpu: str | None = None, at: float = 0.0, **kw: Any) -> WorkloadSpec:
    """``job("ns/a", "q", cpu="2", priority=5)``: a workload with a one-pod gang."""
    if cpu is not None:
        kw["gang_"] = cpu_gang(cpu)
    return workload(key, queue=queue, submitted_at=at, **kw)


def unlimited(spec: QueueSpec, *, guarantee: tuple[str, ...] = (), limit: tuple[str, ...] = ()) -> QueueSpec:
    """KAI's ``-1``: make the named resources' guarantee and/or limit ``UNLIMITED``."""
    return spec.model_copy(update={
        "guarantee": {**spec.guarantee, **{r: UNLIMITED for r in guarantee}},
        "limit": {**spec.limit, **{r: UNLIMITED for r in limit}},
    })


def defined(spec: QueueSpec) -> QueueDefined:
    return QueueDefined(queue=spec)


def removed(name: str) -> QueueRemoved:
    return QueueRemoved(name=name)


def submitted(spec: WorkloadSpec) -> WorkloadSubmitted:
    return WorkloadSubmitted(workload=spec)


def updated(spec: WorkloadSpec) -> WorkloadUpdated:
    return WorkloadUpdated(workload=spec)


def placed(key: str, queue: str = "default") -> GangPlaced:
    return GangPlaced(key=key, queue=queue, kind="RayCluster", gate="pods", slots=(), reason="placed")


def running(key: str) -> GangRunning:
    return GangRunning(key=key, reason="all pods running")


def failed(key: str, queue: str = "default", reason: str = "0/1 nodes are available: 1 Insufficient cpu") -> PlacementFailed:
    return PlacementFailed(key=key, queue=queue, reason=reason)


def preempted(victim: str, preemptor: str, reason: str = "", *, priority: int = 100,
              reclaim: bool = False) -> PreemptionRequested:
    return PreemptionRequested(key=victim, kind="RayCluster", gate="pods", preemptor=preemptor,
                               preemptor_priority=priority, reclaim=reclaim, pods=(),
                               reason=reason or f"preempted by {preemptor}")


def finished(key: str, outcome: str = "Succeeded") -> WorkloadFinished:
    return WorkloadFinished(key=key, outcome=outcome, reason=f"job {outcome.lower()}")


def deleted(key: str) -> WorkloadDeleted:
    return WorkloadDeleted(key=key)


def capacity(released: bool = True, nodes: int = 1, gpu_memory: int = 0, **total: str) -> CapacityChanged:
    """``capacity(cpu="16", memory="64Gi")``; GPUs via ``**{"nvidia.com/gpu": "4"}``; ``gpu_memory``: the
    least MiB per GPU device any node states."""
    return CapacityChanged(total=parse_resources(total), nodes=nodes, released=released, gpu_memory=gpu_memory)


class QueueDriver:
    """A QueueCore plus the clock: ``send`` delivers one payload, ``settle`` fires due timers."""

    def __init__(self, policy: Policy | None = None, **policy_fields: Any) -> None:
        self.policy = policy or Policy(**policy_fields)
        self.core = QueueCore(self.policy)
        self.timers: list[float] = []
        self.now = 0.0
        self.log: list[tuple[float, Any]] = []

    def send(self, payload: Any, at: float | None = None) -> list[Any]:
        """Deliver ``payload`` at ``at`` (default: now); returns what the core emitted, timers included."""
        if at is not None:
            self.settle(at, inclusive=False)
            self.now = at
        out = self.core.handle(envelope(payload, self.now))
        for item in out:
            self.log.append((self.now, item))
            if isinstance(item, TimerSet):
                assert item.key == "cycle", item
                assert item.at >= self.now, item
                if item.at not in self.timers:
                    self.timers.append(item.at)
                    self.timers.sort()
        return out

    def settle(self, until: float | None = None, *, inclusive: bool = True) -> list[Any]:
        """Fire every timer due up to ``until`` (default: now), earliest first; returns non-timer output."""
        until = self.now if until is None else until
        emitted: list[Any] = []
        while self.timers and (self.timers[0] < until or (inclusive and self.timers[0] == until)):
            at = self.timers.pop(0)
            self.now = max(self.now, at)
            emitted.extend(x for x in self.send(TimerFired(key="cycle")) if not isinstance(x, TimerSet))
        if inclusive:
            self.now = max(self.now, until)
        return emitted

    def step(self, payload: Any, at: float | None = None) -> list[Any]:
        """``send`` then ``settle`` at that instant: everything the event caused, timers left out."""
        out = [x for x in self.send(payload, at) if not isinstance(x, TimerSet)]
        return out + self.settle()

    def of(self, kind: type, key: str | None = None) -> list[Any]:
        """Every logged output of one type (optionally for one workload key)."""
        return [x for _, x in self.log if isinstance(x, kind) and (key is None or getattr(x, "key", None) == key)]


def names(out: list[Any]) -> list[tuple[str, str]]:
    """``[("Dequeued", "ns/a"), ...]`` for compact assertions."""
    return [(x.type, getattr(x, "key", getattr(x, "name", ""))) for x in out]
