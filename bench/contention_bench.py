"""What contention costs: more RayClusters than the cluster holds, against the case that fits.

- **fits**: ``scenario_bench``'s 1,000 RayClusters × 9 pods (34 CPU each) on 2,000 nodes of 32 CPU,
  one every 100 ms: 53 % of the cluster, every gang placed at its first attempt.
- **contended**: 3,000 of the same RayClusters on the same nodes (102,000 CPU asked of 64,000:
  160 %), one every 100 ms; from 200 s on they are deleted in the order they came, one every
  200 ms, so room comes back over time and every one of them is placed in the end.

Figures: CPU seconds of the simulation (loading and running, in this process, keeping no event log:
``muster simulate`` keeps one only for ``--store`` or ``--trace``) per submitted workload, and the
contended case's over the fitting case's within each of three pairs of runs, the median and the
spread (the target is ≤ 1.5); placement attempts (``GangPlaced`` + ``PlacementFailed``) per admitted
workload (target < 3), and the failed placements and backoffs behind them.

    python -m bench.contention_bench          # prints the figures as JSON
"""

from __future__ import annotations

import gc
import json
import time
from collections import Counter
from typing import Any

from bench.scenario_bench import generated_scenario
from bench.stats import spread
from shared.kernel.events import Envelope
from shared.runtime.embedded import EmbeddedRuntime
from shared.runtime.simulate import actions, new_cluster
from shared.sim.scenario import parse_scenario

NODES, FITTING, CONTENDED = 2000, 1000, 3000
DELETE_FROM, DELETE_EVERY = 200.0, 0.2
RUNS = 3
"""Pairs of runs; ``contention_fits`` and ``contention_contended`` are the pair with the median ratio."""


CPU_BUDGET = 600.0
"""CPU seconds the contended case may take before it is stopped: the figures are then lower bounds
(``finished: false``, with the scenario time it reached). Today the contended case needs about
800 CPU seconds on this machine, a quarter of it in one busy hour (124 placement attempts per admitted
workload): without the budget a quadratic case would hold ``make bench`` for much longer."""


class _OverBudget(Exception):
    pass


class _Count:
    """Counts envelope types as they are published, and stops the run once it has used its budget."""

    def __init__(self, budget: float) -> None:
        self.types: Counter[str] = Counter()
        self.admitted: set[str] = set()
        self.deadline = time.process_time() + budget
        self.at = 0.0
        self.seen = 0

    def __call__(self, env: Envelope) -> None:
        self.types[env.type] += 1
        self.at = env.occurred_at
        if env.type == "GangPlaced":
            self.admitted.add(env.payload.key)
        self.seen += 1  # not Counter.total(), a sum over every type on every envelope the figure times
        if self.seen % 10_000 == 0 and time.process_time() > self.deadline:
            raise _OverBudget()


def _case(clusters: int, delete_from: float | None, budget: float = CPU_BUDGET) -> dict[str, Any]:
    text = generated_scenario(NODES, clusters, delete_from=delete_from, delete_every=DELETE_EVERY)
    gc.collect()  # the run before's cycles are collected here, not charged to this case
    cpu, wall = time.process_time(), time.perf_counter()
    scenario = parse_scenario(text, origin="generated")
    policy = scenario.effective_policy()
    runtime = EmbeddedRuntime(policy, new_cluster(scenario, policy), keep_log=False)  # as kueue_bench: never read
    count = _Count(budget)
    runtime.subscribe(count)
    try:
        runtime.run(actions(scenario, runtime.cluster), scenario.until)
        finished = True
    except _OverBudget:
        finished = False
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    types = count.types
    attempts = types["GangPlaced"] + types["PlacementFailed"]
    admitted = len(count.admitted)
    return {"rayclusters": clusters, "finished": finished, "scenario_seconds_reached": round(count.at, 1),
            "cpu_seconds": round(cpu, 2), "wall_seconds": round(wall, 2),
            "cpu_ms_per_workload": round(1000 * cpu / clusters, 2), "events": types.total(),
            "admitted": admitted, "placement_attempts": attempts,
            "placement_attempts_per_admitted": round(attempts / admitted, 2) if admitted else None,
            "placements_failed": types["PlacementFailed"], "backoffs": types["BackedOff"],
            "dequeued": types["Dequeued"]}


def run(runs: int = RUNS) -> dict[str, Any]:
    """Both cases in turn, ``runs`` times: each ratio is taken within one pair, minutes apart at most,
    because this machine's speed moves between hours by more than the gap to the target."""
    pairs = []
    for _ in range(runs):
        fits = _case(FITTING, None)
        contended = _case(CONTENDED, DELETE_FROM)
        pairs.append((contended["cpu_ms_per_workload"] / fits["cpu_ms_per_workload"], fits, contended))
    ratios = [ratio for ratio, _, _ in pairs]
    _, fits, contended = sorted(pairs, key=lambda pair: pair[0])[len(pairs) // 2]
    return {
        "contention_span": "parsing and simulating the generated scenario in this process (CPU time)",
        "contention_nodes": NODES,
        "contention_fits": fits,
        "contention_contended": contended,
        "contention_cpu_per_workload_ratio": spread(ratios),
        "contention_fits_cpu_seconds": spread([f["cpu_seconds"] for _, f, _ in pairs]),
        "contention_contended_cpu_seconds": spread([c["cpu_seconds"] for _, _, c in pairs]),
        "contention_target_cpu_per_workload_ratio": 1.5,
        "contention_placement_attempts_per_admitted": contended["placement_attempts_per_admitted"],
        "contention_target_placement_attempts_per_admitted": 3,
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
