"""A day of RayJobs: does any core keep what finished workloads leave behind? (issue 14 §2)

RayJobs arrive evenly (one every 1.73 s: 50,000 a day) on 1,000 nodes (one kube-queue quota, each
job suspended until admitted, a head and one worker, 5 to 8 minutes of work), KubeRay tears each
finished job's cluster down after a minute and the user deletes the RayJob two minutes after that:
the cluster holds a couple of hundred live jobs at any time while thousands pass through it. The
embedded runtime runs it (the cores are the same on Kafka; ``bench.restart_bench`` covers the bus).

``make bench`` runs the full day, 50,000 jobs over 24 simulated hours (about 21 minutes of wall
time on this machine: the cores cost about 20 ms per job); ``python -m bench.soak_bench 3000`` runs
1.4 hours of the same stream in about a minute (same arrival rate and live population; the slope
needs the long run to mean anything).

Every ``SAMPLE`` simulated seconds the soak samples each service with ``shared.kernel.footprint.retained``:
its core, and apart from it its bounded windows (the dedupe windows, ``shared.kernel.dedupe.Seen``, and
placement's shape mix and node index: constant caps that fill during the run; ``windows``), and the process's
resident memory. The figure is the least-squares
slope of each core's retained bytes against finished jobs after the first quarter (warm-up), in
bytes per 1,000 finished jobs; the target is under 1 KiB. RSS is reported beside it: it includes
the simulated cluster, the dedupe windows filling up to their cap and the allocator's slack.

    python -m bench.soak_bench [JOBS] [HOURS]
"""

from __future__ import annotations

import json
import resource
import sys
import time
from typing import Any, Callable

from services.placement.fragmentation import Mix
from services.placement.nodes import ScoreIndex
from shared.kernel.dedupe import DEDUPE_WINDOW
from shared.kernel.footprint import retained
from shared.kernel.policy import Policy
from shared.runtime.embedded import EmbeddedRuntime
from shared.sim.cluster import SimCluster

JOBS, NODES = 50_000, 1_000
HOURS = JOBS * 24 / 50_000
SAMPLE = 300.0
WARM_UP = 0.25
"""Share of the run left out of the slope."""
TARGET_BYTES_PER_1000 = 1024


def _page_size() -> int:
    import os

    return os.sysconf("SC_PAGE_SIZE")


def rss_mib() -> float:
    """Resident memory now (not the peak: the curve is the point)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _page_size() / 2**20


def _quota(nodes: int) -> dict[str, Any]:
    total = {"cpu": nodes * 32, "memory": f"{nodes * 128}Gi"}
    return {"apiVersion": "scheduling.sigs.k8s.io/v1beta1", "kind": "ElasticQuotaTree",
            "metadata": {"name": "elasticquotatree", "namespace": "kube-system"},
            "spec": {"root": {"name": "root", "min": total, "max": total, "children": [
                {"name": "soak", "min": total, "max": total, "namespaces": ["soak"]}]}}}


def _node(n: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{n}"},
            "status": {"capacity": {"cpu": "32", "memory": "128Gi", "pods": "110"},
                       "allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"}}}


def _group(name: str, cpu: str) -> dict[str, Any]:
    return {"template": {"spec": {"containers": [{"name": name, "image": "rayproject/ray:2.36.1",
                                                  "resources": {"requests": {"cpu": cpu, "memory": "4Gi"}}}]}}}


def rayjob(n: int, duration: float) -> dict[str, Any]:
    """The ``n``th job: suspended until the queue admits it, torn down a minute after it ends."""
    worker = {**_group("ray-worker", "4"), "groupName": "w", "replicas": 1, "rayStartParams": {}}
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": f"job-{n}", "namespace": "soak",
                         "annotations": {"muster.dev/sim-duration": f"{duration:.0f}s"}},
            "spec": {"entrypoint": "python main.py", "suspend": True, "shutdownAfterJobFinishes": True,
                     "ttlSecondsAfterFinished": 60,
                     "rayClusterSpec": {"headGroupSpec": {**_group("ray-head", "2"), "rayStartParams": {}},
                                        "workerGroupSpecs": [worker]}}}


def steps(cluster: SimCluster, jobs: int, nodes: int, seconds: float) -> list[tuple[float, Callable[[float], None]]]:
    """Nodes and the quota at 0, then each job's arrival and its deletion (two minutes after its
    cluster is torn down had it started at once: a queued job is deleted while waiting, as users do)."""
    def boot(now: float) -> None:
        for n in range(nodes):
            cluster.apply(_node(n), now)
        cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "soak"}}, now)
        cluster.apply(_quota(nodes), now)

    out: list[tuple[float, Callable[[float], None]]] = [(0.0, boot)]
    gap = seconds / jobs
    for n in range(jobs):
        at, duration = 1.0 + n * gap, 300.0 + (n % 4) * 60.0
        out.append((at, lambda now, n=n, d=duration: cluster.apply(rayjob(n, d), now)))
        out.append((at + duration + 60 + 120, lambda now, n=n: cluster.delete("RayJob", "soak", f"job-{n}", now)))
    out.sort(key=lambda s: s[0])
    return out


def windows(core: Any) -> list[Any]:
    """The bounded windows a core holds — placement's shape mix and node index (``ScoreIndex``) — whose
    size is a constant cap, not a function of history: they fill during a short run, so they are
    measured apart from the rest of the core (the service's dedupe window is measured beside them)."""
    found = [v for v in vars(core).values() if isinstance(v, Mix)]
    nodes = getattr(core, "nodes", None)
    if nodes is not None and isinstance(getattr(nodes, "mix", None), Mix):
        found.append(nodes.mix)
    if nodes is not None and isinstance(getattr(nodes, "scored", None), ScoreIndex):
        found.append(nodes.scored)  # the node index: kept score vectors and the rows changed since
    return found


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``ys`` against ``xs`` (0 for fewer than two points)."""
    if len(xs) < 2:
        return 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def soak(jobs: int = JOBS, hours: float = HOURS, nodes: int = NODES, every: float = SAMPLE) -> dict[str, Any]:
    """Run the day and sample it; the figures (see the module docstring)."""
    policy = Policy.from_mapping({"scheduler_names": [*Policy().scheduler_names, "default-scheduler"]})
    cluster = SimCluster(pod_startup=2.0, annotation_history=False)  # as ``muster simulate`` without --check's annotations
    runtime = EmbeddedRuntime(policy, cluster)
    finished = [0]

    def count(env: Any) -> None:
        if env.type == "WorkloadFinished":
            finished[0] += 1

    runtime.subscribe(count)
    seconds = hours * 3600.0
    plan = steps(cluster, jobs, nodes, seconds)
    samples: list[dict[str, Any]] = []

    def sample(now: float) -> None:
        runtime.log.clear()  # the runtime's own record of every envelope (replay material), not a core's
        cluster.api.watch.clear()
        row: dict[str, Any] = {"hour": round(now / 3600, 2), "finished": finished[0], "rss_mib": round(rss_mib(), 1)}
        for name, service in runtime.services.items():
            bounded = windows(service.core)
            core = retained(service.core, exclude=(policy, *bounded))
            row[name] = {"bytes": core.bytes, "entries": core.entries,
                         "window_bytes": retained([service.seen, *bounded], exclude=(policy,)).bytes}
        samples.append(row)

    t = every
    while t <= seconds + 900:
        plan.append((t, sample))
        t += every
    plan.sort(key=lambda s: s[0])
    started = time.perf_counter()
    runtime.run(plan, seconds + 900)
    wall = time.perf_counter() - started
    steady = [s for s in samples if hours * WARM_UP <= s["hour"] <= hours]  # arrivals still coming
    xs = [s["finished"] / 1000 for s in steady]
    figures: dict[str, Any] = {"jobs": jobs, "nodes": nodes, "simulated_hours": hours, "finished_jobs": finished[0],
                               "wall_seconds": round(wall, 1),
                               "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                               "target_bytes_per_1000_finished": TARGET_BYTES_PER_1000}
    for name in runtime.services:
        ys = [s[name]["bytes"] for s in steady]
        figures[f"{name}_bytes_per_1000_finished"] = round(slope(xs, ys), 1)
        figures[f"{name}_retained_kib"] = {"after_warm_up": round(ys[0] / 1024, 1) if ys else None,
                                           "end": round(ys[-1] / 1024, 1) if ys else None,
                                           "peak": round(max(s[name]["bytes"] for s in samples) / 1024, 1)}
        figures[f"{name}_windows_kib_end"] = round(samples[-1][name]["window_bytes"] / 1024, 1)
    figures["rss_mib_per_1000_finished"] = round(slope(xs, [s["rss_mib"] for s in steady]), 3)
    figures["dedupe_window_ids_per_source"] = DEDUPE_WINDOW
    figures["samples"] = samples
    return figures


def run() -> dict[str, Any]:
    return soak()


if __name__ == "__main__":
    args = [float(a) for a in sys.argv[1:]]
    jobs = int(args[0]) if args else JOBS
    result = soak(jobs, args[1] if len(args) > 1 else jobs * 24 / 50_000)
    print(json.dumps(result, indent=2))
