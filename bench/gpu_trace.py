"""GPU allocation on Alibaba's openb trace: binpack, spread and fragmentation, as in the FGD paper.

Reproduces the experiment of Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads
with Fragmentation Gradient Descent" (USENIX ATC '23, Fig. 9; their simulator is
hkust-adsl/kubernetes-scheduler-simulator) with muster's own admission and placement:

- the cluster: every node of ``openb_node_list_gpu_node.csv`` (cpu, memory, GPUs) as a Node;
- the workload ("workload inflation"): the pod list drawn in random order with a fixed seed, pods
  sampled again from it (deletions ignored) until the requested GPU reaches 130% of the cluster's;
  a list asking more than that is cut to a random subset (the paper's tune-down);
- each pod is a plain Pod with ``schedulerName: muster`` (a fraction as KAI's ``gpu-fraction``
  annotation, whole GPUs as ``nvidia.com/gpu``), which admission makes a workload of one pod;
  placement is asked to place it (``Dequeued``), exactly the events the queue would send from one
  unlimited queue;
- every strategy sees the same sequence. Capacity only shrinks (nothing finishes), so a pod that
  did not fit when it arrived never fits later: retrying it (what the queue does after a backoff)
  changes no outcome, and is left out.

Reported at every 10% of arrived GPU demand (requested GPU of the pods so far / cluster GPU): the
share of cluster GPU allocated and the GPUs left unallocated. Headline: unallocated GPUs when the
arrived demand equals the capacity, fragmentation against binpack. Everything but the wall times
is deterministic.

    python -m bench.gpu_trace [--lists default,gpushare100,multigpu50] [--trace DIR] [--seed 42]

writes bench/gpu_trace.md (tables) and bench/gpu_trace.png (allocated GPU % against arrived %).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.admission.core import AdmissionCore
from services.placement import PlacementCore
from shared.kernel import kube
from shared.kernel.events import Dequeued, GangPlaced, ObjectChanged, WorkloadSubmitted, wrap
from shared.kernel.policy import Policy

HERE = Path(__file__).parent
TRACE = HERE.resolve().parents[1] / "shared" / "traces" / "openb"
LISTS = ("default", "gpushare100", "multigpu50")
STRATEGIES = ("binpack", "spread", "fragmentation")
INFLATION = 1.3
SEED = 42
NAMESPACE = "openb"


@dataclass(frozen=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int

    @property
    def gpu_request(self) -> int:
        """Thousandths of a GPU the pod asks for (a fraction of one device, or whole devices)."""
        return self.num_gpu * self.gpu_milli


def read_nodes(trace: Path) -> list[dict[str, str]]:
    with open(trace / "openb_node_list_gpu_node.csv", newline="") as f:
        return list(csv.DictReader(f))


def read_pods(trace: Path, name: str) -> list[TracePod]:
    with open(trace / f"openb_pod_list_{name}.csv", newline="") as f:
        return [TracePod(r["name"], int(r["cpu_milli"]), int(r["memory_mib"]), int(r["num_gpu"]), int(r["gpu_milli"]))
                for r in csv.DictReader(f)]


def inflate(pods: list[TracePod], capacity: int, seed: int = SEED, ratio: float = INFLATION) -> list[TracePod]:
    """The submission sequence: requested GPU up to ``ratio`` × capacity, in a random order drawn from ``seed``."""
    rng = random.Random(seed)
    target = ratio * capacity
    chosen = list(pods)
    requested = sum(p.gpu_request for p in chosen)
    if requested > target:
        rng.shuffle(chosen)
        out, requested = [], 0
        for pod in chosen:
            if requested + pod.gpu_request > target:
                break
            out.append(pod)
            requested += pod.gpu_request
        return out
    while True:
        pod = pods[rng.randrange(len(pods))]
        if requested + pod.gpu_request > target:
            break
        chosen.append(pod)
        requested += pod.gpu_request
    rng.shuffle(chosen)
    return chosen


def node_object(row: dict[str, str]) -> dict[str, Any]:
    capacity = {"cpu": f"{row['cpu_milli']}m", "memory": f"{row['memory_mib']}Mi",
                "nvidia.com/gpu": row["gpu"], "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": row["sn"], "labels": {"nvidia.com/gpu.product": row["model"]}},
            "status": {"capacity": capacity, "allocatable": capacity}}


def pod_object(pod: TracePod, name: str) -> dict[str, Any]:
    """The trace pod as a user would write it for muster: a plain pod, which muster schedules as a gang of one."""
    requests = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    annotations: dict[str, str] = {}
    if pod.num_gpu == 1 and 0 < pod.gpu_milli < 1000:
        annotations[kube.GPU_FRACTION] = f"{pod.gpu_milli / 1000:g}"
    elif pod.num_gpu:
        requests["nvidia.com/gpu"] = str(pod.num_gpu)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations},
            "spec": {"schedulerName": "muster",
                     "containers": [{"name": "main", "image": "trace", "resources": {
                         "requests": requests, "limits": {k: v for k, v in requests.items() if k == "nvidia.com/gpu"}}}]}}


def replay(nodes: list[dict[str, str]], sequence: list[TracePod], strategy: str) -> dict[str, Any]:
    """Submit the sequence to admission and placement, one pod after the other: the allocation curve
    (arrived %, allocated %) after every pod, and where each placed pod went (name, node, devices)."""
    policy = Policy(placement=strategy)
    admission, placement = AdmissionCore(policy), PlacementCore(policy)
    capacity = sum(int(r["gpu"]) for r in nodes) * 1000
    for i, row in enumerate(nodes):
        obj = node_object(row)
        placement.handle(wrap(ObjectChanged(change="Added", kind="Node", api_version="v1", name=row["sn"],
                                            object=obj), source="bench", cause=None, index=i, at=0.0))
    arrived = allocated = 0
    curve: list[tuple[float, float]] = []
    where: list[tuple[str, str, tuple[int, ...]]] = []
    started, cpu_started = time.perf_counter(), time.process_time()
    for i, pod in enumerate(sequence):
        name = f"{pod.name}-{i:05d}"
        obj = pod_object(pod, name)
        env = wrap(ObjectChanged(change="Added", kind="Pod", api_version="v1", namespace=NAMESPACE, name=name,
                                 object=obj), source="bench", cause=None, index=i, at=float(i + 1))
        submitted = [p for p in admission.handle(env) if isinstance(p, WorkloadSubmitted)]
        placement.handle(env)
        if len(submitted) != 1:
            raise RuntimeError(f"admission did not submit {name}")
        spec = submitted[0].workload
        ask = Dequeued(key=spec.key, queue=spec.queue, workload=spec, reason="bench")
        out = placement.handle(wrap(ask, source="queue", cause=env, index=0))
        arrived += pod.gpu_request
        for decision in out:
            if isinstance(decision, GangPlaced):
                allocated += pod.gpu_request
                slot = decision.slots[0]
                where.append((name, slot.node, slot.gpu.devices if slot.gpu else ()))
        curve.append((100.0 * arrived / capacity, 100.0 * allocated / capacity))
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    return {"strategy": strategy, "pods": len(sequence), "placed": len(where), "capacity_gpus": capacity // 1000,
            "curve": curve, "placements": where, "seconds": seconds, "cpu_seconds": cpu_seconds}


def _job(job: tuple[Path, str, int, str]) -> dict[str, Any]:
    """One (list, strategy) run in a worker process: the sequence is rebuilt there, identically."""
    trace, name, seed, strategy = job
    nodes = read_nodes(trace)
    capacity = sum(int(r["gpu"]) for r in nodes) * 1000
    return replay(nodes, inflate(read_pods(trace, name), capacity, seed), strategy)


def checkpoints(result: dict[str, Any], step: int = 10) -> list[dict[str, float]]:
    """Allocated % and unallocated GPUs right after arrived demand first reaches each multiple of
    ``step``%, and at the end (arrived just short of the inflation target)."""
    capacity = result["capacity_gpus"]
    out: list[dict[str, float]] = []
    mark = step

    def point(arrived: float, allocated: float) -> dict[str, float]:
        return {"arrived_percent": arrived, "allocated_percent": round(allocated, 2),
                "unallocated_gpus": round(capacity * (1 - allocated / 100), 1)}

    for arrived, allocated in result["curve"]:
        while arrived >= mark - 1e-9:
            out.append(point(mark, allocated))
            mark += step
    if result["curve"] and (not out or out[-1]["arrived_percent"] < result["curve"][-1][0] - 1e-9):
        out.append(point(round(result["curve"][-1][0], 1), result["curve"][-1][1]))
    return out


def at_capacity(result: dict[str, Any]) -> float:
    """Unallocated GPUs when the arrived demand reaches the cluster's GPU capacity (100%)."""
    return next(c["unallocated_gpus"] for c in checkpoints(result) if c["arrived_percent"] == 100)


def table(name: str, results: dict[str, dict[str, Any]]) -> str:
    marks = [c["arrived_percent"] for c in checkpoints(next(iter(results.values())))]
    head = "| arrived GPU demand | " + " | ".join(f"{s} allocated % (unallocated GPUs)" for s in results) + " |"
    rows = [head, "|" + " --- |" * (len(results) + 1)]
    per = {s: {c["arrived_percent"]: c for c in checkpoints(r)} for s, r in results.items()}
    for mark in marks:
        cells = [f"{per[s][mark]['allocated_percent']:.1f} ({per[s][mark]['unallocated_gpus']:.0f})"
                 if mark in per[s] else "" for s in results]
        rows.append(f"| {mark}% | " + " | ".join(cells) + " |")
    return f"#### `{name}`\n\n" + "\n".join(rows) + "\n"


def plot(all_results: dict[str, dict[str, dict[str, Any]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(all_results), figsize=(5 * len(all_results), 4), sharey=True, squeeze=False)
    styles = {"binpack": ("tab:blue", "--"), "spread": ("tab:gray", ":"), "fragmentation": ("tab:red", "-")}
    for ax, (name, results) in zip(axes[0], all_results.items()):
        for strategy, result in results.items():
            xs = [a for a, _ in result["curve"]]
            ys = [b for _, b in result["curve"]]
            colour, line = styles.get(strategy, ("black", "-"))
            ax.plot(xs, ys, line, color=colour, label=strategy, linewidth=1.5)
        ax.plot([0, 100], [0, 100], color="lightgray", linewidth=0.8)
        ax.set_title(f"openb {name}")
        ax.set_xlabel("arrived workload (% of cluster GPU)")
        ax.set_xlim(60, 130)
        ax.set_ylim(60, 100)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("allocated GPU (% of cluster GPU)")
    axes[0][-1].legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Every list with every strategy (``make bench`` calls this); writes the table and the plot."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--lists", default=",".join(LISTS))
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", type=Path, default=HERE, help="directory for gpu_trace.md and gpu_trace.png")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1,
                        help="runs side by side (each run is one process; the figures do not depend on it)")
    args = parser.parse_args(argv if argv is not None else [])
    nodes = read_nodes(args.trace)
    capacity = sum(int(r["gpu"]) for r in nodes) * 1000
    lists, strategies = args.lists.split(","), args.strategies.split(",")
    figures: dict[str, Any] = {"nodes": len(nodes), "gpus": capacity // 1000, "seed": args.seed,
                               "processes": args.processes}
    wall = time.perf_counter()
    # The slow ones (fragmentation, the longest list) first, so the processes finish together.
    jobs = sorted(((args.trace, name, args.seed, strategy) for name in lists for strategy in strategies),
                  key=lambda job: (job[3] != "fragmentation", job[1] != "gpushare100"))
    with ProcessPoolExecutor(max_workers=args.processes) as pool:
        done = dict(zip([(name, strategy) for _, name, _, strategy in jobs], pool.map(_job, jobs)))
    all_results: dict[str, dict[str, dict[str, Any]]] = {}
    for name in lists:
        results = all_results[name] = {s: done[(name, s)] for s in strategies}
        entry: dict[str, Any] = {"pods": results[strategies[0]]["pods"]}
        for s, r in results.items():
            entry[s] = {"placed": r["placed"], "unallocated_gpus_at_100": at_capacity(r),
                        "seconds": round(r["seconds"], 2), "cpu_seconds": round(r["cpu_seconds"], 2),
                        "cpu_ms_per_pod": round(1000 * r["cpu_seconds"] / r["pods"], 2)}
        if "binpack" in results and "fragmentation" in results:
            base, frag = entry["binpack"]["unallocated_gpus_at_100"], entry["fragmentation"]["unallocated_gpus_at_100"]
            entry["fragmentation_vs_binpack_percent"] = round(100 * (frag - base) / base, 1) if base else 0.0
        figures[name] = entry
        print(json.dumps({name: entry}), flush=True)
    figures["wall_seconds"] = round(time.perf_counter() - wall, 1)
    figures["cpu_seconds"] = round(sum(r["cpu_seconds"] for results in all_results.values()
                                       for r in results.values()), 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_trace.md").write_text(report(figures, all_results))
    plot(all_results, args.out / "gpu_trace.png")
    return figures


def report(figures: dict[str, Any], all_results: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = [f"Cluster: {figures['nodes']} nodes, {figures['gpus']} GPUs; seed {figures['seed']}; "
             f"allocated % of cluster GPU (unallocated GPUs) after arrived GPU demand reaches each step.\n"]
    for name, results in all_results.items():
        lines.append(table(name, results))
    lines.append("| list | pods | " + " | ".join(f"{s}: unallocated GPUs at 100%" for s in STRATEGIES)
                 + " | fragmentation vs binpack |")
    lines.append("|" + " --- |" * (len(STRATEGIES) + 3))
    for name in all_results:
        e = figures[name]
        cells = [str(e[s]["unallocated_gpus_at_100"]) if s in e else "" for s in STRATEGIES]
        change = e.get("fragmentation_vs_binpack_percent")
        lines.append(f"| `{name}` | {e['pods']} | " + " | ".join(cells) + f" | {change:+.1f}% |"
                     if change is not None else f"| `{name}` | {e['pods']} | " + " | ".join(cells) + " | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    print(json.dumps(run(sys.argv[1:]), indent=2))


if __name__ == "__main__":
    main()
