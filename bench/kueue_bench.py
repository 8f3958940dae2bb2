"""Kueue's scheduler performance baseline, in muster's terms, on the embedded stack.

Kueue's test (kubernetes-sigs/kueue, test/performance/scheduler: configs/baseline/generator.yaml
for the load, configs/baseline/rangespec.yaml for the thresholds, runner/ for how it measures):
5 cohorts of 6 ClusterQueues, each with a nominal quota of 20 CPU and a borrowing limit of 100;
into each queue three generators write at once, each sleeping its interval before every workload:

    class    count per queue   interval   runtime   priority   CPU
    small    350               100 ms     200 ms    50         1
    medium   100               500 ms     500 ms    100        5
    large     50               1200 ms    1000 ms   200        20

15,000 workloads. A workload runs for its runtime from its admission, then finishes. Kueue's
published thresholds (its averages over five runs in comments): mean time to admission large
≤ 11 s (6.7 s), medium ≤ 90 s (76.8 s), small ≤ 260 s (215.5 s); wall ≤ 425 s (351 s); the
queues' CPU usage ≥ 55 % (58.7 %) of their nominal quota over the time they were watched
(``CQGroupSummary``: the CPU·time every queue held, over the nominal quotas times the span from
the first queue event to the last).

Here: an ElasticQuotaTree whose 5 parents are the cohorts (min = max = the children's 120 CPU)
and whose 30 leaves are the queues (min 20, max 120: the borrowing limit), each leaf owning a
namespace; the workloads are RayJobs created suspended in their queue's namespace, HTTPMode (no
submitter pod), a head of the class's CPU and no workers, ``muster.dev/sim-duration`` the class's
runtime, PriorityClasses of Kueue's values. Pods start at once (``pod_startup: 0s``): Kueue's
workloads have no pods, their runtime counts from admission. The nodes hold more than the
quotas (``NODE_CPU`` × ``NODES``), so quota is what binds, as in Kueue's test.

Time to admission is scenario time from the RayJob's creation to its first ``Admitted`` (its gang
placed); usage integrates the CPU each leaf holds (from ``Dequeued`` until release) as Kueue
integrates the ClusterQueue's usage. Wall time is the simulation's, loading included.

    python -m bench.kueue_bench [--cohorts N]     # prints the figures as JSON
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from typing import Any

import yaml

from bench.stats import spread
from shared.kernel.events import Envelope
from shared.kernel.projection import ResultProjection
from shared.runtime.embedded import EmbeddedRuntime
from shared.runtime.simulate import actions, new_cluster
from shared.sim.scenario import parse_scenario


@dataclass(frozen=True)
class WorkloadClass:
    name: str
    count: int
    interval_ms: int
    runtime_ms: int
    priority: int
    cpu: int


CLASSES = (WorkloadClass("small", 350, 100, 200, 50, 1),
           WorkloadClass("medium", 100, 500, 500, 100, 5),
           WorkloadClass("large", 50, 1200, 1000, 200, 20))
COHORTS, QUEUES_PER_COHORT, NOMINAL_CPU, BORROWING_LIMIT_CPU = 5, 6, 20, 100
NODES, NODE_CPU = 40, 20
"""800 CPU for 600 of quota: a large workload (20 CPU) needs a whole node, so the nodes hold a
third more than the quotas and placement never stands in for quota."""

KUEUE_THRESHOLDS = {"large": 11.0, "medium": 90.0, "small": 260.0, "wall_seconds": 425.0, "usage_percent": 55.0}
KUEUE_AVERAGES = {"large": 6.666, "medium": 76.768, "small": 215.468, "wall_seconds": 351.1, "usage_percent": 58.7}


def _queue(cohort: int, index: int) -> str:
    return f"cq-{cohort}-{index}"


def generated_scenario(cohorts: int = COHORTS) -> str:
    """The baseline's objects and arrivals as a muster scenario."""
    tree = {"name": "root", "min": {"cpu": NOMINAL_CPU * QUEUES_PER_COHORT * cohorts},
            "max": {"cpu": NOMINAL_CPU * QUEUES_PER_COHORT * cohorts}, "children": [
                {"name": f"cohort-{c}", "min": {"cpu": NOMINAL_CPU * QUEUES_PER_COHORT},
                 "max": {"cpu": NOMINAL_CPU * QUEUES_PER_COHORT},
                 "children": [{"name": _queue(c, i), "min": {"cpu": NOMINAL_CPU},
                               "max": {"cpu": NOMINAL_CPU + BORROWING_LIMIT_CPU}, "namespaces": [_queue(c, i)]}
                              for i in range(QUEUES_PER_COHORT)]}
                for c in range(cohorts)]}
    setup: list[dict[str, Any]] = [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                    "metadata": {"name": k.name}, "value": k.priority} for k in CLASSES]
    setup.append({"apiVersion": "scheduling.sigs.k8s.io/v1beta1", "kind": "ElasticQuotaTree",
                  "metadata": {"name": "elasticquotatree", "namespace": "kube-system"}, "spec": {"root": tree}})
    arrivals: dict[int, list[dict[str, Any]]] = {}
    for c in range(cohorts):
        for i in range(QUEUES_PER_COHORT):
            for set_index, klass in enumerate(CLASSES):
                for n in range(klass.count):  # Kueue's generator sleeps the interval before each one
                    arrivals.setdefault((n + 1) * klass.interval_ms, []).append(
                        _rayjob(f"{klass.name}-{set_index}-{n}-0", _queue(c, i), klass))
    steps = [{"at": "0s", "apply": _dump_all(setup)}]
    steps += [{"at": f"{ms}ms", "apply": _dump_all(docs)} for ms, docs in sorted(arrivals.items())]
    last = max(arrivals)
    scenario = {"name": "kueue-baseline", "until": f"{last // 1000 + 600}s", "pod_startup": "0s",
                "cluster": {"nodes": [{"count": NODES, "name_prefix": "node-",
                                       "capacity": {"cpu": str(NODE_CPU), "memory": "256Gi", "pods": "110"}}]},
                "steps": steps}
    return yaml.dump(scenario, Dumper=_Dumper, sort_keys=False)


_Dumper: type = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _dump_all(docs: list[dict[str, Any]]) -> str:
    return yaml.dump_all(docs, Dumper=_Dumper)


def _rayjob(name: str, namespace: str, klass: WorkloadClass) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"ray.io/priority-class-name": klass.name, "bench/class": klass.name},
                         "annotations": {"muster.dev/sim-duration": f"{klass.runtime_ms}ms"}},
            "spec": {"entrypoint": "python main.py", "suspend": True, "submissionMode": "HTTPMode",
                     "shutdownAfterJobFinishes": True,
                     "rayClusterSpec": {"headGroupSpec": {"template": {"spec": {"containers": [
                         {"name": "ray-head", "resources": {"requests": {"cpu": str(klass.cpu)}}}]}}},
                         "workerGroupSpecs": []}}}


class _QuotaHeld:
    """CPU·seconds each queue held, read off the result view after every envelope: a workload holds
    its queue's quota while the view says so (from ``Dequeued`` until it is released)."""

    def __init__(self, history: ResultProjection) -> None:
        self.history = history
        self.since: dict[str, tuple[float, str, int]] = {}
        self.cpu_seconds: dict[str, float] = {}
        self.last_release: dict[str, float] = {}

    CHANGES = frozenset({"WorkloadWithdrawn", "BackedOff", "Dequeued", "ReclaimRequested", "PlacementFailed",
                         "GangPlaced", "PreemptionRequested", "WorkloadFinished", "WorkloadDeleted"})
    """The events after which the view's ``holds_quota`` may differ (``ResultProjection``'s handlers)."""

    def __call__(self, env: Envelope) -> None:
        if env.type not in self.CHANGES:
            return
        view = self.history.workloads.get(env.payload.key)
        if view is None:
            return
        held = self.since.get(view.key)
        if view.holds_quota and held is None and view.queue:
            self.since[view.key] = (env.occurred_at, view.queue, view.demand.get("cpu", 0))
        elif not view.holds_quota and held is not None:
            start, queue, milli = self.since.pop(view.key)
            self.cpu_seconds[queue] = self.cpu_seconds.get(queue, 0.0) + milli / 1000 * (env.occurred_at - start)
            self.last_release[queue] = max(self.last_release.get(queue, 0.0), env.occurred_at)


RUNS = 3


def run(cohorts: int = COHORTS, runs: int = RUNS) -> dict[str, Any]:
    """``runs`` simulations: the scenario-time figures are the same every time (a check that they
    are), the wall time is the median with the spread."""
    text = generated_scenario(cohorts)
    results = [_once(text, cohorts) for _ in range(runs)]
    walls = [r.pop("kueue_wall_seconds") for r in results]
    if any(r != results[0] for r in results):
        raise RuntimeError("the same scenario gave different figures: the simulation is not deterministic")
    return {**results[0], "kueue_wall_seconds": spread(walls), "kueue_thresholds": KUEUE_THRESHOLDS,
            "kueue_published_averages": KUEUE_AVERAGES, "kueue_target_wall_seconds": 60}


def _once(text: str, cohorts: int) -> dict[str, Any]:
    started = time.perf_counter()  # from here as ``muster simulate`` would: loading, running, the result
    scenario = parse_scenario(text, origin="kueue-baseline")
    policy = scenario.effective_policy()
    runtime = EmbeddedRuntime(policy, new_cluster(scenario, policy), keep_log=False)  # replay material, never read here
    history = ResultProjection(scenario.name)
    held = _QuotaHeld(history)
    runtime.subscribe(history.apply)
    runtime.subscribe(held)
    runtime.run(actions(scenario, runtime.cluster), scenario.until)
    wall = time.perf_counter() - started

    waits: dict[str, list[float]] = {k.name: [] for k in CLASSES}
    unadmitted: dict[str, int] = {k.name: 0 for k in CLASSES}
    for key, view in history.workloads.items():
        klass = key.split("/")[1].split("-")[0]
        queued = next((t["t"] for t in view.transitions if t["phase"] == "Queued"), None)
        admitted = next((t["t"] for t in view.transitions if t["phase"] == "Admitted"), None)
        if queued is None or admitted is None:
            unadmitted[klass] += 1
        else:
            waits[klass].append(admitted - queued)
    queues = [_queue(c, i) for c in range(cohorts) for i in range(QUEUES_PER_COHORT)]
    end = max(held.last_release.values(), default=0.0)
    group_usage = 100 * sum(held.cpu_seconds.values()) / (NOMINAL_CPU * len(queues) * end) if end else 0.0
    per_queue = {q: 100 * held.cpu_seconds.get(q, 0.0) / (NOMINAL_CPU * held.last_release[q])
                 for q in queues if held.last_release.get(q)}
    lowest = min(per_queue, key=lambda q: per_queue[q]) if per_queue else None
    figures: dict[str, Any] = {
        "kueue_workloads": sum(len(w) for w in waits.values()) + sum(unadmitted.values()),
        "kueue_queues": len(queues), "kueue_cohorts": cohorts,
        "kueue_not_admitted": sum(unadmitted.values()),
        "kueue_wall_seconds": round(wall, 2),
        "kueue_events": runtime.published,
        "kueue_last_release_scenario_seconds": round(end, 2),
        "kueue_usage_percent": round(group_usage, 1),
        "kueue_lowest_queue_usage_percent": round(per_queue[lowest], 1) if lowest else None,
        "kueue_lowest_usage_queue": lowest,
    }
    for klass in CLASSES:
        w = waits[klass.name]
        figures[f"kueue_{klass.name}_mean_admission_seconds"] = round(sum(w) / len(w), 3) if w else None
        figures[f"kueue_{klass.name}_max_admission_seconds"] = round(max(w), 3) if w else None
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cohorts", type=int, default=COHORTS)
    parser.add_argument("--runs", type=int, default=RUNS)
    args = parser.parse_args()
    print(json.dumps(run(args.cohorts, args.runs), indent=2))
