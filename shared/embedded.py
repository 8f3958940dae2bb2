"""The embedded runtime: in-process ordered inboxes, a virtual clock, timers as events.

One global FIFO of deliveries keeps the run deterministic: the same scenario gives the same event
log, byte for byte, every run. Virtual time advances only when every inbox is drained; at one
instant the scenario's steps go first, then the cluster's own timers (pods starting, jobs
finishing), then the services' timers (scheduling cycles, backoff expiry) — so everything that
happens at an instant is known before any service decides on it.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from services.admission.core import AdmissionCore
from services.placement.core import PlacementCore
from services.queue.core import QueueCore
from services.reconciler.core import ReconcilerCore
from services.reconciler.ingest import observe
from shared.core import Core
from shared.events import Envelope, TimerFired, wrap
from shared.policy import Policy
from shared.sim.cluster import SimCluster
from shared.topology import destinations

Listener = Callable[[Envelope], None]

_SIM_TIMER, _CORE_TIMER = 0, 1


class RunawayError(RuntimeError):
    """A single instant produced more deliveries than any sane scenario would (a feedback loop)."""


def build_cores(policy: Policy) -> dict[str, Core]:
    """The composition root: one pure core per service, all reading the same policy."""
    return {
        "admission": AdmissionCore(policy),
        "queue": QueueCore(policy),
        "placement": PlacementCore(policy),
        "reconciler": ReconcilerCore(policy),
    }


@dataclass(order=True)
class _Timer:
    at: float
    phase: int
    seq: int
    target: str = field(compare=False)
    key: str = field(compare=False)
    cause: Envelope | None = field(compare=False, default=None)


class EmbeddedRuntime:
    """Runs the four cores against a ``SimCluster`` on virtual time."""

    def __init__(self, policy: Policy, cluster: SimCluster, *, cores: dict[str, Core] | None = None,
                 max_deliveries_per_instant: int = 2_000_000) -> None:
        self.policy = policy
        self.cluster = cluster
        self.cores = cores if cores is not None else build_cores(policy)
        self.now = 0.0
        self.log: list[Envelope] = []
        self.listeners: list[Listener] = []
        self._deliveries: deque[tuple[str, Envelope]] = deque()
        self._timers: list[_Timer] = []
        self._armed: set[tuple[str, str, float]] = set()
        self._seen: dict[str, set[str]] = {name: set() for name in self.cores}
        self._seq = 0
        self._limit = max_deliveries_per_instant
        self._delivered_at_instant = 0

    # ------------------------------------------------------------------ publishing
    def subscribe(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def publish(self, env: Envelope) -> None:
        self.log.append(env)
        for listener in self.listeners:
            listener(env)
        for dest in destinations(env):
            if dest == "clock":
                self._arm(env.source, env.payload.key, env.payload.at, env)
            else:
                self._deliveries.append((dest, env))

    def _arm(self, target: str, key: str, at: float, cause: Envelope | None, phase: int = _CORE_TIMER) -> None:
        at = max(at, self.now)
        marker = (target, key, at)
        if marker in self._armed:
            return
        self._armed.add(marker)
        self._seq += 1
        heapq.heappush(self._timers, _Timer(at, phase, self._seq, target, key, cause))

    def _ingest(self) -> None:
        """Watch events and timer requests from the cluster become envelopes and timers."""
        for change, obj in self.cluster.take_watch_events():
            self._seq += 1
            self.publish(wrap(observe(change, obj), source="ingest", cause=None, index=self._seq, at=self.now))
        for at, key in self.cluster.take_timer_requests():
            self._arm("cluster", key, at, None, _SIM_TIMER)

    # ------------------------------------------------------------------ delivery
    def drain(self) -> None:
        """Deliver until every inbox is empty."""
        self._ingest()
        while self._deliveries:
            dest, env = self._deliveries.popleft()
            self._delivered_at_instant += 1
            if self._delivered_at_instant > self._limit:
                raise RunawayError(f"more than {self._limit} deliveries at t={self.now:g}s; last: {env.type} {env.subject}")
            if dest == "cluster":
                self.cluster.perform(env.payload, self.now)
            else:
                self._deliver(dest, env)
            self._ingest()

    def _deliver(self, service: str, env: Envelope) -> None:
        seen = self._seen[service]
        if env.id in seen:  # at-least-once delivery: a redelivered envelope is a no-op
            return
        seen.add(env.id)
        for index, payload in enumerate(self.cores[service].handle(env)):
            self.publish(wrap(payload, source=service, cause=env, index=index))

    # ------------------------------------------------------------------ the clock
    def _advance(self, t: float) -> None:
        if t > self.now:
            self.now = t
            self._delivered_at_instant = 0

    def _fire(self, timer: _Timer) -> None:
        self._armed.discard((timer.target, timer.key, timer.at))
        if timer.target == "cluster":
            self.cluster.fire(timer.key, self.now)
            return
        env = wrap(TimerFired(key=timer.key), source="clock", cause=timer.cause, index=0, at=self.now)
        self.publish(env)  # logged for replay; TimerFired has no route of its own
        self._deliveries.append((timer.target, env))

    def run(self, steps: Iterable[tuple[float, Callable[[float], None]]], until: float) -> None:
        """Run timed actions (``(at, action(now))``) and everything they cause, up to ``until``."""
        pending = deque(sorted(steps, key=lambda s: s[0]))
        while True:
            next_step = pending[0][0] if pending else float("inf")
            next_timer = self._timers[0].at if self._timers else float("inf")
            t = min(next_step, next_timer)
            if t == float("inf") or t > until:
                break
            self._advance(t)
            if next_step <= t:
                while pending and pending[0][0] <= t:
                    pending.popleft()[1](self.now)
                    self.drain()
                continue
            self._fire(heapq.heappop(self._timers))
            self.drain()
        self._advance(until)

    # ------------------------------------------------------------------ introspection
    def core(self, service: str) -> Any:
        return self.cores[service]
