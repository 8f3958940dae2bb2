"""``muster simulate``: a scenario through the stack on a simulated cluster.

``simulate`` runs the embedded stack (in-process inboxes); ``simulate_on_bus`` runs the same
scenario through the services on Kafka (``shared.runtime.bus.driver``), ``simulate_live`` on a real
cluster (``shared.kubernetes.realcluster``). All give the same result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from shared.kernel.events import Envelope
from shared.kernel.policy import Policy
from shared.kernel.projection import ResultProjection
from shared.runtime.embedded import EmbeddedRuntime
from shared.sim.check import Failure, check
from shared.sim.cluster import ScenarioError as ClusterError
from shared.sim.cluster import SimCluster
from shared.sim.scenario import Scenario, ScenarioError

Action = tuple[float, Callable[[float], None]]


@dataclass
class Run:
    scenario: Scenario
    policy: Policy
    runtime: EmbeddedRuntime
    history: ResultProjection
    wall_seconds: float

    def result(self) -> dict[str, Any]:
        return self.history.result(self.wall_seconds)

    tolerance: float = 0.0
    """Seconds either side of an expectation's time ``check`` allows (a real cluster's run)."""

    def check(self) -> list[Failure]:
        return check(self.history, self.scenario.expect, self.runtime.cluster.annotation_history,
                     tolerance=self.tolerance)


def new_cluster(scenario: Scenario, policy: Policy) -> SimCluster:
    """The scenario's simulated cluster; it records annotation writes only when an expectation reads them."""
    return SimCluster(pod_startup=scenario.startup_seconds, batch_scheduler=scenario.batch_scheduler,
                      annotation_history=any(e.annotations_present is not None for e in scenario.expect))


def simulate(scenario: Scenario, policy: Policy | None = None, *, traced: bool = False,
             keep_log: bool = True, listener: Callable[[Envelope], None] | None = None) -> Run:
    """Run ``scenario`` to its ``until``; bad manifests raise ``ScenarioError`` naming the step.
    ``traced``: every output carries its trace context (``shared.observability.tracing.context``). ``keep_log`` off:
    ``runtime.log`` stays empty (the result and the checks read the history, never the log).
    ``listener``: told every envelope as it is published, in the log's order (``--store`` writes them
    so, ``shared.history.stream``, instead of keeping the log)."""
    effective = scenario.effective_policy(policy)
    runtime = EmbeddedRuntime(effective, new_cluster(scenario, effective), traced=traced, keep_log=keep_log)
    if listener is not None:
        runtime.subscribe(listener)
    return play(scenario, effective, runtime)


def play(scenario: Scenario, policy: Policy, runtime: EmbeddedRuntime) -> Run:
    """Drive ``runtime`` through the scenario's steps, recording the result view."""
    history = ResultProjection(scenario.name)
    runtime.subscribe(history.apply)
    started = time.perf_counter()
    runtime.run(actions(scenario, runtime.cluster), scenario.until)
    return Run(scenario, policy, runtime, history, time.perf_counter() - started)


def actions(scenario: Scenario, cluster: SimCluster) -> list[Action]:
    """The scenario's nodes and steps as timed actions on ``cluster``."""
    def bootstrap(now: float) -> None:
        for spec in scenario.cluster.nodes:
            for manifest in spec.manifests():
                _guard("cluster.nodes", lambda m=manifest: cluster.apply(m, now))

    out: list[Action] = [(0.0, bootstrap)]
    for index, step in enumerate(scenario.steps):
        if step.apply is not None:
            docs = scenario.documents[index]
            out.append((step.at, lambda now, docs=docs, i=index: [
                _guard(f"steps[{i}]", lambda d=d: cluster.apply(d, now)) for d in docs]))
        elif step.delete is not None:
            ref = step.delete
            out.append((step.at, lambda now, ref=ref, i=index: _guard(
                f"steps[{i}]", lambda: cluster.delete(ref.kind, ref.namespace, ref.name, now))))
    return out


def _guard(where: str, action: Any) -> None:
    try:
        action()
    except ClusterError as exc:
        raise ScenarioError(f"{where}: {exc}") from None
