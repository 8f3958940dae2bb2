"""``muster simulate`` end to end on a generated scenario: 2,000 nodes, 1,000 RayClusters of 9 pods."""

from __future__ import annotations

import resource
import time
from typing import Any

import yaml

from shared.scenario import parse_scenario
from shared.simulate import simulate


def generated_scenario(nodes: int = 2000, clusters: int = 1000, workers: int = 8, queues: int = 4) -> str:
    """Four Volcano queues, RayClusters arriving one every 100 ms, each head + 8 workers."""
    docs: list[dict[str, Any]] = []
    for i in range(queues):
        docs.append({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                     "metadata": {"name": f"team-{i}"}, "spec": {"weight": 1}})
    steps = [{"at": "0s", "apply": yaml.safe_dump_all(docs)}]
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
    scenario = {"name": "bench-2000-nodes", "until": f"{clusters * 0.1 + 60:.0f}s",
                "cluster": {"nodes": [{"count": nodes, "name_prefix": "node-",
                                       "capacity": {"cpu": "32", "memory": "128Gi", "pods": "110"}}]},
                "steps": steps}
    return yaml.safe_dump(scenario)


def run(nodes: int = 2000, clusters: int = 1000) -> dict[str, Any]:
    scenario = parse_scenario(generated_scenario(nodes, clusters), origin="generated")
    started = time.perf_counter()
    result = simulate(scenario).result()
    wall = time.perf_counter() - started
    running = sum(1 for w in result["workloads"].values() if w["phase"] == "Running")
    pods = sum(len(w["pods"]) for w in result["workloads"].values())
    return {
        "simulate_nodes": nodes,
        "simulate_rayclusters": clusters,
        "simulate_pods": pods,
        "simulate_running_rayclusters": running,
        "simulate_wall_seconds": round(wall, 2),
        "simulate_events": result["stats"]["events"],
        "simulate_target_wall_seconds": 20,
        "simulate_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


if __name__ == "__main__":
    print(run())
