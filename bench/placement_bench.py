"""Placement throughput: gangs through ``PlacementCore.handle`` on a 5,000-node cluster.

The cluster is fed as Node ``ObjectChanged`` envelopes; the gangs arrive as ``Dequeued``
envelopes (built before the clock starts), so the figure covers the whole decision: filtering,
scoring, GPU device choice, the statement, and the GangPlaced payloads. Target: ≥ 5,000 pods/s.

Cluster: every 5th node is a tainted 8-GPU node (64 CPU), the rest 32-CPU nodes. Gangs: a head
and 8 workers; a quarter select a zone, a quarter want GPUs (whole or half devices).

``run_anti_affinity``: the same decision for gangs whose workers keep apart (required pod
anti-affinity on ``kubernetes.io/hostname`` among a RayCluster's workers), 1,000 of them over 2,000
nodes: the price of the inter-pod index and filter, beside the figure of gangs that have none.

    python -m bench.placement_bench            # prints the figures (binpack, spread, fragmentation) as JSON
"""

from __future__ import annotations

import json
import time
from typing import Any

from services.placement import PlacementCore
from shared.kernel.events import Dequeued, Envelope, GangPlaced, ObjectChanged, PlacementFailed, wrap
from shared.kernel import kube
from shared.kernel.model import Gang, LabelSelector, PodAffinity, PodAffinityTerm, PodSet, Toleration, WorkloadSpec
from shared.kernel.policy import Policy
from shared.kernel.quantity import parse_resources

from bench.stats import spread

GPU_EVERY = 5
_TOLERATE_GPU = (Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),)


def _node(i: int) -> dict[str, Any]:
    gpu_node = i % GPU_EVERY == 0
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"} if gpu_node else \
        {"cpu": "32", "memory": "128Gi", "pods": "110"}
    taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}] if gpu_node else []
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"node-{i:05d}", "labels": {"zone": f"z{i % 3}", "gpu": str(gpu_node).lower(),
                                                              "kubernetes.io/hostname": f"node-{i:05d}"}},
            "spec": {"taints": taints}, "status": {"capacity": capacity, "allocatable": capacity}}


def _worker(g: int, workers: int) -> PodSet:
    if g % 8 == 3:  # half a GPU each
        return PodSet(name="gpu", count=workers, resources=parse_resources({"cpu": "4", "memory": "16Gi"}),
                      gpu_share=500, node_selector={"gpu": "true"}, tolerations=_TOLERATE_GPU)
    if g % 8 == 7:  # one whole GPU each
        return PodSet(name="gpu", count=workers,
                      resources=parse_resources({"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"}),
                      node_selector={"gpu": "true"}, tolerations=_TOLERATE_GPU)
    selector = {"zone": f"z{g % 3}"} if g % 4 == 1 else {}
    return PodSet(name="worker", count=workers, resources=parse_resources({"cpu": "3", "memory": "12Gi"}),
                  node_selector=selector)


def _spec(key: str, gang: Gang) -> WorkloadSpec:
    namespace, name = key.split("/")
    return WorkloadSpec(key=key, kind="RayCluster", namespace=namespace, name=name, queue="default", gang=gang,
                        cluster_name=name)


def _envelopes(payloads: list[Any], at: float) -> list[Envelope]:
    return [wrap(p, source="bench", cause=None, index=i, at=at) for i, p in enumerate(payloads)]


def _cluster(nodes: int) -> list[Envelope]:
    return _envelopes([ObjectChanged(change="Added", kind="Node", api_version="v1", name=f"node-{i:05d}",
                                     object=_node(i)) for i in range(nodes)], at=0.0)


def _gangs(gangs: int, workers: int) -> list[Envelope]:
    head = PodSet(name="head", count=1, resources=parse_resources({"cpu": "2", "memory": "8Gi"}))
    specs = [_spec(f"bench/g{g:05d}", Gang(min_member=1 + workers, pod_sets=(head, _worker(g, workers))))
             for g in range(gangs)]
    return _envelopes([Dequeued(key=s.key, queue="default", workload=s, reason="bench") for s in specs], at=1.0)


def _too_big(attempts: int) -> list[Envelope]:
    """A gang of 1,001 eight-GPU pods: it places ~1,000 pods before it fails and rolls back."""
    worker = PodSet(name="worker", count=1001, tolerations=_TOLERATE_GPU,
                    resources=parse_resources({"cpu": "60", "memory": "8Gi", "nvidia.com/gpu": "8"}))
    spec = _spec("bench/too-big", Gang(min_member=1001, pod_sets=(worker,)))
    return _envelopes([Dequeued(key=spec.key, queue="default", workload=spec, reason="bench")] * attempts, at=2.0)


def run(nodes: int = 5000, gangs: int = 2000, workers: int = 8, strategy: str = "binpack") -> dict[str, Any]:
    """Build the cluster, place the gangs, return the figures (only this function reads a clock)."""
    core = PlacementCore(Policy(placement=strategy))
    node_envs, gang_envs, fail_envs = _cluster(nodes), _gangs(gangs, workers), _too_big(5)

    started = time.perf_counter()
    for env in node_envs:
        core.handle(env)
    ingested = time.perf_counter()
    placed_gangs = placed_pods = failed = 0
    for env in gang_envs:
        for payload in core.handle(env):
            if isinstance(payload, GangPlaced):
                placed_gangs += 1
                placed_pods += len(payload.slots)
            elif isinstance(payload, PlacementFailed):
                failed += 1
    placed = time.perf_counter()
    for env in fail_envs:
        assert isinstance(core.handle(env)[0], PlacementFailed)
    finished = time.perf_counter()

    seconds = placed - ingested
    return {
        "placement_pods_per_second": round(placed_pods / seconds, 1),
        "placement_gangs_per_second": round(placed_gangs / seconds, 1),
        "nodes": nodes,
        "gangs": gangs,
        "gangs_placed": placed_gangs,
        "gangs_failed": failed,
        "pods": placed_pods,
        "strategy": strategy,
        "placement_seconds": round(seconds, 3),
        "node_ingest_per_second": round(nodes / (ingested - started), 1),
        "failed_1001_pod_gang_ms": round((finished - placed) / len(fail_envs) * 1000, 2),
    }


def _apart(name: str, workers: int) -> PodSet:
    """Workers of RayCluster ``name`` that never share a node (the labels KubeRay gives its pods)."""
    term = PodAffinityTerm(selector=LabelSelector(match_labels=((kube.RAY_CLUSTER, name), (kube.RAY_GROUP, "worker"))),
                           topology_key="kubernetes.io/hostname", anti=True)
    return PodSet(name="worker", count=workers, resources=parse_resources({"cpu": "3", "memory": "12Gi"}),
                  pod_affinity=PodAffinity(terms=(term,)))


def run_anti_affinity(nodes: int = 2000, gangs: int = 1000, workers: int = 8, runs: int = 3) -> dict[str, Any]:
    """Gangs whose workers keep apart, placed on ``nodes`` plain nodes: pods per second, median of ``runs``."""
    head = PodSet(name="head", count=1, resources=parse_resources({"cpu": "2", "memory": "8Gi"}))
    rates: list[float] = []
    placed_pods = 0
    for _ in range(runs):
        core = PlacementCore(Policy())
        for env in _cluster(nodes):
            core.handle(env)
        envs = _envelopes([Dequeued(key=f"bench/a{g:05d}", queue="default", reason="bench",
                                    workload=_spec(f"bench/a{g:05d}", Gang(min_member=1 + workers,
                                                   pod_sets=(head, _apart(f"a{g:05d}", workers)))))
                           for g in range(gangs)], at=1.0)
        started = time.perf_counter()
        placed_pods = 0
        shared = 0
        for env in envs:
            for payload in core.handle(env):
                if isinstance(payload, GangPlaced):
                    placed_pods += len(payload.slots)
                    apart = [s.node for s in payload.slots if s.pod_set == "worker"]
                    shared += len(apart) - len(set(apart))
        rates.append(placed_pods / (time.perf_counter() - started))
        assert not shared, f"{shared} workers shared a node: the figure would not time the rule"
    return {"anti_affinity_pods_per_second": spread(rates, 1), "anti_affinity_nodes": nodes,
            "anti_affinity_gangs": gangs, "anti_affinity_pods_placed": placed_pods}


def run_all() -> dict[str, Any]:
    """``make bench``'s placement section: gangs without inter-pod constraints (``run``), then with them."""
    return {**run(), **run_anti_affinity()}


def main() -> None:
    print(json.dumps({s: run(strategy=s) for s in ("binpack", "spread", "fragmentation")}, indent=2))


if __name__ == "__main__":
    main()
