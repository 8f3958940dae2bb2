"""``muster simulate`` end to end on a generated scenario: 2,000 nodes, 1,000 RayClusters of 9 pods.

The figure is the command as a user runs it — ``muster simulate FILE --json OUT -q`` in a process of
its own, loading and writing the result included — ``RUNS`` times; the median with the spread.
Span: from the command's start to its exit; pods bound per second of that wall time.

    python -m bench.scenario_bench            # prints the figures as JSON
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.stats import spread

RUNS = 3


def generated_scenario(nodes: int = 2000, clusters: int = 1000, workers: int = 8, queues: int = 4, *,
                       delete_from: float | None = None, delete_every: float = 0.2) -> str:
    """Four Volcano queues, RayClusters arriving one every 100 ms, each head + 8 workers (34 CPU).

    With ``delete_from``, the RayClusters are deleted in the order they came, one every
    ``delete_every`` seconds from that time on: users giving room back over time."""
    docs: list[dict[str, Any]] = []
    for i in range(queues):
        docs.append({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                     "metadata": {"name": f"team-{i}"}, "spec": {"weight": 1}})
    steps: list[dict[str, Any]] = [{"at": "0s", "apply": yaml.safe_dump_all(docs)}]
    for n in range(clusters):
        rc = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
              "metadata": {"name": f"rc-{n}", "namespace": "bench",
                           "labels": {"volcano.sh/queue-name": f"team-{n % queues}"}},
              "spec": {"headGroupSpec": {"template": {"spec": {"containers": [
                  {"name": "ray-head", "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}]}}},
                       "workerGroupSpecs": [{"groupName": "worker", "replicas": workers, "template": {"spec": {
                           "containers": [{"name": "ray-worker",
                                           "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}]}}}]}}
        steps.append({"at": f"{1 + n * 0.1:.1f}s", "apply": yaml.safe_dump(rc)})
    end = clusters * 0.1 + 60
    if delete_from is not None:
        for n in range(clusters):
            steps.append({"at": f"{delete_from + n * delete_every:.1f}s",
                          "delete": {"kind": "RayCluster", "namespace": "bench", "name": f"rc-{n}"}})
        end = delete_from + clusters * delete_every + 60
    steps.sort(key=lambda s: float(s["at"][:-1]))
    scenario = {"name": f"bench-{nodes}-nodes", "until": f"{end:.0f}s",
                "cluster": {"nodes": [{"count": nodes, "name_prefix": "node-",
                                       "capacity": {"cpu": "32", "memory": "128Gi", "pods": "110"}}]},
                "steps": steps}
    return yaml.safe_dump(scenario)


def _simulate_cli(path: Path, out: Path, *extra: str) -> tuple[float, float, float]:
    """One ``muster simulate`` process: (wall seconds, its CPU seconds, its peak RSS in MiB), from its
    own rusage (``wait4``): ``RUSAGE_CHILDREN``'s peak is the largest of every child this process
    ever waited for, which in ``make bench`` was an earlier section's (1,602 MiB read here once)."""
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "shared.cli.main", "simulate", str(path), "--json", str(out), "-q",
                              *extra])
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    if child.returncode:
        raise subprocess.CalledProcessError(child.returncode, child.args)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def run(nodes: int = 2000, clusters: int = 1000, runs: int = RUNS) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="muster-bench-") as tmp:
        path, out = Path(tmp) / "scenario.yaml", Path(tmp) / "result.json"
        path.write_text(generated_scenario(nodes, clusters))
        walls, cpus, peak = [], [], 0.0
        for _ in range(runs):
            wall, cpu, rss = _simulate_cli(path, out)
            walls.append(wall)
            cpus.append(cpu)
            peak = max(peak, rss)
        result = json.loads(out.read_text())
    workloads = result["workloads"].values()
    pods = sum(len(w["pods"]) for w in workloads)
    bound = sum(1 for w in workloads for p in w["pods"] if p["bound"])
    wall = spread(walls)
    return {
        "simulate_span": "`muster simulate FILE --json OUT -q` as a process: loading, simulating, writing the result",
        "simulate_nodes": nodes,
        "simulate_rayclusters": clusters,
        "simulate_pods": pods,
        "simulate_pods_bound": bound,
        "simulate_running_rayclusters": sum(1 for w in workloads if w["phase"] == "Running"),
        "simulate_events": result["stats"]["events"],
        "simulate_wall_seconds": wall,
        "simulate_cpu_seconds": spread(cpus),
        "simulate_pods_bound_per_second": round(bound / wall["median"], 1),
        "simulate_target_pods_bound_per_second": 600,
        "simulate_peak_rss_mib": round(peak, 1),
    }


def run_store(nodes: int = 2000, clusters: int = 5000, workers: int = 2) -> dict[str, Any]:
    """Peak memory of ``muster simulate`` with and without ``--store`` (a SQLite file) on 5,000
    RayClusters of 3 pods: what writing the history costs in memory (the log streamed to the store
    in batches, ``shared.history.stream``; it used to be kept whole until the end)."""
    with tempfile.TemporaryDirectory(prefix="muster-bench-") as tmp:
        path, out = Path(tmp) / "scenario.yaml", Path(tmp) / "result.json"
        path.write_text(generated_scenario(nodes, clusters, workers))
        wall, _, without = _simulate_cli(path, out)
        wall_store, _, with_store = _simulate_cli(path, out, "--store", f"sqlite:///{Path(tmp) / 'history.db'}")
        events = json.loads(out.read_text())["stats"]["events"]
    return {
        "simulate_store_span": "`muster simulate FILE --json OUT -q [--store sqlite:///FILE]` as a process, its peak RSS",
        "simulate_store_rayclusters": clusters,
        "simulate_store_pods": clusters * (1 + workers),
        "simulate_store_events": events,
        "simulate_peak_rss_mib_without_store": round(without, 1),
        "simulate_peak_rss_mib_with_store": round(with_store, 1),
        "simulate_wall_seconds_without_store": round(wall, 1),
        "simulate_wall_seconds_with_store": round(wall_store, 1),
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
