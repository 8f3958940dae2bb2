"""The embedded runtime: in-process inboxes, a virtual clock, timers as events.

Deliveries go breadth first, one *round* at a time: every envelope published while a round is
handled is delivered in the next round, in the order it was published. That is one global FIFO
(the same scenario gives the same event log, byte for byte, every run), cut where each round
ends — the cut is what lets the distributed runtime (``shared.runtime.bus.driver``) hand a whole round to
the services on Kafka and still deliver each inbox in exactly this order.

Virtual time advances only when every inbox is drained; at one instant the scenario's steps go
first, then the cluster's own timers (pods starting, jobs finishing), then the services' timers
(scheduling cycles, backoff expiry) — so everything that happens at an instant is known before any
service decides on it.

A core that raises on one envelope stops nothing: ``Service.handle`` rejects what it concerns
(``shared.kernel.faults``) and the failure is kept in ``faults`` (logged), where the Kafka worker would
dead-letter the record; the outputs are the same on both runtimes.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Callable, Iterable

from services.reconciler.ingest import observe
from services.reconciler.owners import Owners
from shared.kernel.core import Core
from shared.kernel.events import Envelope, TimerFired, wrap
from shared.kernel.faults import Fault
from shared.kernel.policy import Policy
from shared.kernel.topology import SERVICES, WATCHED_KINDS, destinations
from shared.runtime.build import policy_applied
from shared.runtime.clock import Timer, Timers
from shared.runtime.cores import build_cores
from shared.runtime.cycles import CycleGuard
from shared.runtime.service import Service, collect_less
from shared.sim.cluster import SimCluster

log = logging.getLogger("muster.embedded")

Listener = Callable[[Envelope], None]
Delivery = tuple[str, Envelope]
"""(destination, envelope): a service name, or ``cluster`` for an effect the cluster applies."""
Outputs = dict[tuple[str, str], list[Envelope]]
"""What a round's deliveries produced: (service, input id) -> output envelopes in order."""

_SIM_TIMER, _CORE_TIMER = 0, 1

RUNTIME = "runtime"
"""The source of the embedded runtime's own ``PolicyApplied`` (no service's: it speaks for all four)."""

class RunawayError(RuntimeError):
    """A single instant produced more deliveries than any sane scenario would (a feedback loop)."""


class EmbeddedRuntime:
    """Runs the four cores against a ``SimCluster`` on virtual time."""

    def __init__(self, policy: Policy, cluster: SimCluster, *, cores: dict[str, Core] | None = None,
                 max_deliveries_per_instant: int = 2_000_000, traced: bool = False, keep_log: bool = True) -> None:
        self.policy = policy
        self.cluster = cluster
        self.cores = cores if cores is not None else build_cores(policy)
        self.services = {name: Service(core, traced=traced) for name, core in self.cores.items()}
        self.now = 0.0
        self.log: list[Envelope] = []
        """Every envelope published, in order: replay material (``--store``, traces, the audit). Empty when
        ``keep_log`` is off: a run whose log nobody reads keeps no copy of every watch object, which the
        cyclic collector would walk in every full collection (a cost that grows with the run's length)."""
        self.keep_log = keep_log
        self.published = 0
        """Envelopes published, kept or not."""
        self.faults: list[Fault] = []
        """Envelopes a core raised on, in the order handled (each rejected what it concerned)."""
        self.listeners: list[Listener] = []
        self.rounds = 0
        self._deliveries: list[Delivery] = []
        self._timers = Timers()
        """The services' timers and the cluster's (``shared.runtime.clock``: one per target, key and instant)."""
        self._seq = 0
        self._limit = max_deliveries_per_instant
        self._delivered_at_instant = 0
        self.owners = Owners()
        """Which RayJob each pod serves, as the cluster link finds it (``services.reconciler.owners``)."""
        self.announced = False
        """Whether the log has its ``PolicyApplied`` (``announce``: once, first)."""
        self.cycles = CycleGuard()
        """Effects applied again and again at one instant are stopped (``shared.runtime.cycles``)."""
        self.cycles_stopped: list[str] = []
        """Why each stopped effect was stopped, in order (each said once)."""

    # ------------------------------------------------------------------ publishing
    def subscribe(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def publish(self, env: Envelope) -> None:
        self.published += 1
        if self.keep_log:
            self.log.append(env)
        for listener in self.listeners:
            listener(env)
        for dest in destinations(env):
            if dest == "clock":
                self._arm(env.source, env.payload.key, env.payload.at, env)
            else:
                self._deliveries.append((dest, env))

    def announce(self) -> Envelope | None:
        """Put the policy every core decides with at the start of the log (once): a ``PolicyApplied``
        for all four services, so the log names what reproduces it (``shared.audit.replay``). Its id
        derives as other uncaused events' do (source, time, index, type, subject). None if done."""
        if self.announced:
            return None
        self.announced = True
        env = wrap(policy_applied(self.policy, SERVICES), source=RUNTIME, cause=None, index=0, at=self.now)
        self.publish(env)
        return env

    def _arm(self, target: str, key: str, at: float, cause: Envelope | None, phase: int = _CORE_TIMER) -> None:
        if self._timers.arm(target, key, at, self.now, cause=cause, phase=phase):
            self._seq += 1  # counted with the ingest index: the ids of watch events depend on it

    def _ingest(self) -> None:
        """Watch events and timer requests from the cluster become envelopes and timers."""
        for change, obj in self.cluster.take_watch_events():
            if obj.get("kind") not in WATCHED_KINDS:
                continue  # what the cluster link does not watch (a submitter's Job): only its pods matter
            wanted = self.owners.look_up(obj)
            if wanted is not None:
                self.owners.learn(wanted, self.cluster.get(*wanted))
            obj = self.owners.stamped(change, obj)
            self._seq += 1
            self.publish(wrap(observe(change, obj), source="ingest", cause=None, index=self._seq, at=self.now))
        for at, key in self.cluster.take_timer_requests():
            self._arm("cluster", key, at, None, _SIM_TIMER)

    # ------------------------------------------------------------------ delivery
    def drain(self) -> None:
        """Deliver round after round until every inbox is empty."""
        self._ingest()
        while self._deliveries:
            deliveries, self._deliveries = self._deliveries, []
            self._count(deliveries)
            self.rounds += 1
            outputs = self.handle_round([d for d in deliveries if d[0] != "cluster"])
            for dest, env in deliveries:  # publish in delivery order: the FIFO order of the next round
                if dest == "cluster":
                    stopped = self.cycles.allows(env.payload, self.now)
                    if stopped is None:
                        self.cluster.perform(env.payload, self.now)
                        self._ingest()
                    elif stopped not in self.cycles_stopped:
                        log.error("t=%gs: %s", self.now, stopped)
                        self.cycles_stopped.append(stopped)
                else:
                    for out in outputs.pop((dest, env.id), ()):
                        self.publish(out)

    def handle_round(self, deliveries: list[Delivery]) -> Outputs:
        """Hand each service its part of the round, in order (the distributed runtime overrides this)."""
        outputs: Outputs = {}
        for service, env in deliveries:
            handler = self.services[service]
            outputs.setdefault((service, env.id), []).extend(handler.handle(env))
            if handler.faults:
                self._failed(handler.take_faults())
        return outputs

    def _failed(self, faults: list[Fault]) -> None:
        for fault in faults:
            log.error("t=%gs: %s; the object is rejected and the run goes on", self.now, fault.error)
        self.faults.extend(faults)

    def _count(self, deliveries: list[Delivery]) -> None:
        room = self._limit - self._delivered_at_instant
        if len(deliveries) > room:
            _, env = deliveries[max(room, 0)]
            raise RunawayError(f"more than {self._limit} deliveries at t={self.now:g}s; last: {env.type} {env.subject}")
        self._delivered_at_instant += len(deliveries)

    # ------------------------------------------------------------------ the clock
    def _advance(self, t: float) -> None:
        if t > self.now:
            self.now = t
            self._delivered_at_instant = 0

    def _fire(self, timer: Timer) -> None:
        if timer.target == "cluster":
            self.cluster.fire(timer.key, self.now)
            return
        env = wrap(TimerFired(key=timer.key, at=timer.at), source="clock", cause=timer.cause, index=0, at=self.now)
        self.publish(env)  # logged for replay; TimerFired has no route of its own
        self._deliveries.append((timer.target, env))

    def run(self, steps: Iterable[tuple[float, Callable[[float], None]]], until: float) -> None:
        """Run timed actions (``(at, action(now))``) and everything they cause, up to ``until``."""
        collect_less()  # the services' collector settings, embedded as on Kafka
        self.announce()
        pending = deque(sorted(steps, key=lambda s: s[0]))
        while True:
            next_step = pending[0][0] if pending else float("inf")
            armed = self._timers.next_at()
            next_timer = float("inf") if armed is None else armed
            t = min(next_step, next_timer)
            if t == float("inf") or t > until:
                break
            self._advance(t)
            if next_step <= t:
                while pending and pending[0][0] <= t:
                    pending.popleft()[1](self.now)
                    self.drain()
                continue
            timer = self._timers.pop(t)
            if timer is not None:
                self._fire(timer)
            self.drain()
        self._advance(until)

    # ------------------------------------------------------------------ introspection
    def core(self, service: str) -> Any:
        return self.cores[service]
