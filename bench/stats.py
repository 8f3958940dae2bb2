"""How every figure is reported: the median of several runs with their spread, and the machine's
load while they ran (this 2-core machine is shared; a figure from a loaded minute says so)."""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any, Callable, Sequence


def spread(values: Sequence[float], digits: int = 2) -> dict[str, Any]:
    """``{"median", "min", "max", "runs"}`` of one figure's runs."""
    if not values:
        raise ValueError("a figure needs at least one run")
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits), "runs": [round(v, digits) for v in values]}


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """The value below which ``fraction`` of the (sorted) values lie, nearest rank."""
    if not sorted_values:
        raise ValueError("no values")
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


def load() -> dict[str, Any]:
    """The 1-, 5- and 15-minute load averages and the CPU count now."""
    one, five, fifteen = os.getloadavg()
    return {"loadavg": [round(one, 2), round(five, 2), round(fifteen, 2)], "cpus": os.cpu_count()}


_PROBE_OBJECT = json.dumps({
    "kind": "Pod", "metadata": {"name": "rc-1-worker-x7k2p", "namespace": "default", "labels": {
        "ray.io/cluster": "rc-1", "ray.io/node-type": "worker"}, "annotations": {"a": "b" * 40}},
    "spec": {"schedulerName": "muster", "containers": [{"name": "ray", "resources": {
        "requests": {"cpu": "4", "memory": "8Gi"}}}]}, "status": {"phase": "Pending"}})


def pace() -> float:
    """CPU milliseconds this machine takes now for a fixed piece of pure Python (JSON of a pod, dicts,
    small objects: the kind of work muster's cores and plumbing do), the fastest of three.

    Loadavg does not say how fast a core is: on this shared machine the same code has run ≈ 3× slower
    in one hour than in another with the load average the same, so each section records its pace
    beside its figures, and figures of two hours compare in proportion to their paces."""
    best = float("inf")
    for _ in range(3):
        started = time.thread_time()
        for i in range(4000):
            obj = json.loads(_PROBE_OBJECT)
            labels = dict(obj["metadata"]["labels"], index=str(i))
            obj["metadata"]["labels"] = labels
            json.dumps(obj, separators=(",", ":"), sort_keys=True)
            sorted((k, v) for k, v in labels.items())
        best = min(best, time.thread_time() - started)
    return round(1000 * best, 1)


def measured(bench: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one benchmark and record the machine's load and pace (``pace``) before and after it."""
    before = {**load(), "pace_ms": pace()}
    figures = bench()
    return {**figures, "machine_load": {"before": before, "after": {**load(), "pace_ms": pace()}}}
