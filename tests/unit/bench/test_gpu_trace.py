"""The openb benchmark drives admission and placement directly; the full embedded stack, given the
same pods one second apart, places every pod on the same node and device (so the shortcut — no
queue, no binding, no retries — changes no figure)."""

from __future__ import annotations

import pytest
import yaml

from bench import gpu_trace
from shared.runtime.simulate import simulate
from shared.sim.scenario import parse_scenario

pytestmark = pytest.mark.skipif(not (gpu_trace.TRACE / "openb_node_list_gpu_node.csv").exists(),
                                reason="the openb trace is not next to the repository")


def scenario(nodes: list[dict[str, str]], sequence: list[gpu_trace.TracePod], strategy: str) -> str:
    cluster = [{"name": r["sn"], "capacity": gpu_trace.node_object(r)["status"]["capacity"]} for r in nodes]
    steps = [{"at": f"{i + 1}s", "apply": yaml.safe_dump(gpu_trace.pod_object(pod, f"{pod.name}-{i:05d}"))}
             for i, pod in enumerate(sequence)]
    return yaml.safe_dump({"name": "openb-slice", "cluster": {"nodes": cluster}, "policy": {"placement": strategy},
                           "steps": steps, "until": f"{len(sequence) + 5}s"})


@pytest.mark.parametrize("strategy", ["fragmentation", "binpack"])
def test_the_bench_places_as_the_embedded_stack_does(strategy):
    nodes = gpu_trace.read_nodes(gpu_trace.TRACE)[::120]          # 11 nodes of several kinds
    capacity = sum(int(r["gpu"]) for r in nodes) * 1000
    sequence = gpu_trace.inflate(gpu_trace.read_pods(gpu_trace.TRACE, "default"), capacity, seed=7)
    bench = gpu_trace.replay(nodes, sequence, strategy)
    assert 0 < bench["placed"] < len(sequence)                     # some pods fit, some never do
    doc = simulate(parse_scenario(scenario(nodes, sequence, strategy), origin="openb-slice")).result()
    stack = []
    for key, w in doc["workloads"].items():
        for p in w["pods"]:
            if p["node"]:
                stack.append((p["name"], p["node"], tuple(p["gpu"]["devices"]) if p["gpu"] else ()))
    assert sorted(stack) == sorted(bench["placements"])
