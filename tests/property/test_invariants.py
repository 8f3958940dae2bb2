"""Random scenarios never break the scheduler's safety invariants, and always run the same way.

Checked at the end of every instant (when virtual time moves on), from the event log alone:
- no node holds more than its allocatable of any resource;
- no GPU device carries more than 1.0 of fractional shares;
- no gang is partly bound (0 or all of its minMember pods);
- no queue's held quota exceeds its limit, at any level of the tree.
"""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared import kube
from shared import quantity as q
from shared.events import Envelope, to_json
from shared.model import UNLIMITED
from shared.projection import ResultProjection
from shared.scenario import parse_scenario
from shared.simulate import simulate

CPU_CHOICES = ["500m", "1", "2", "3"]
GPU_KIND = st.sampled_from(["none", "none", "quarter", "half", "whole"])

@st.composite
def scenarios(draw: st.DrawFn) -> str:
    nodes = [{"name": f"n{i}", "capacity": {"cpu": str(draw(st.integers(2, 12))), "memory": "32Gi",
                                             "nvidia.com/gpu": str(draw(st.integers(0, 2))), "pods": "110"}}
             for i in range(draw(st.integers(1, 4)))]
    queues = [{"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": f"q{i}"},
               "spec": {"weight": draw(st.integers(1, 3)),
                        "capability": {"cpu": str(draw(st.integers(4, 30)))}}} for i in range(draw(st.integers(1, 2)))]
    steps: list[dict[str, Any]] = [{"at": "0s", "apply": yaml.safe_dump_all(queues)}]
    for n in range(draw(st.integers(1, 6))):
        gpu = draw(GPU_KIND)
        worker: dict[str, Any] = {"requests": {"cpu": draw(st.sampled_from(CPU_CHOICES)), "memory": "1Gi"}}
        annotations = {}
        if gpu == "whole":
            worker["limits"] = {"nvidia.com/gpu": "1"}
        elif gpu != "none":
            annotations = {"gpu-fraction": "0.25" if gpu == "quarter" else "0.5"}
        labels = {"volcano.sh/queue-name": f"q{draw(st.integers(0, len(queues) - 1))}"}
        prio = draw(st.sampled_from([None, "train", "build", "inference"]))
        if prio:
            labels["priorityClassName"] = prio
        template: dict[str, Any] = {"spec": {"containers": [{"name": "w", "resources": worker}]}}
        if annotations:
            template["metadata"] = {"annotations": annotations}
        rc = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
              "metadata": {"name": f"rc{n}", "namespace": "p", "labels": labels},
              "spec": {"suspend": draw(st.booleans()),
                       "headGroupSpec": {"template": {"spec": {"containers": [
                           {"name": "h", "resources": {"requests": {"cpu": draw(st.sampled_from(CPU_CHOICES))}}}]}}},
                       "workerGroupSpecs": [{"groupName": "g", "replicas": draw(st.integers(0, 3)), "template": template}]}}
        at = draw(st.integers(1, 40))
        steps.append({"at": f"{at}s", "apply": yaml.safe_dump(rc)})
        if draw(st.integers(0, 3)) == 0:
            steps.append({"at": f"{at + draw(st.integers(1, 60))}s",
                          "delete": {"kind": "RayCluster", "namespace": "p", "name": f"rc{n}"}})
    return yaml.safe_dump({"name": "random", "cluster": {"nodes": nodes}, "steps": steps, "until": "150s"})

class InvariantWatcher:
    """Rebuilds cluster and quota state from the log and checks it whenever time moves on."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, int]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.gpu: dict[str, Any] = {}
        self.history = ResultProjection()
        self.last_t = 0.0
        self.violations: list[str] = []

    def __call__(self, env: Envelope) -> None:
        if env.occurred_at > self.last_t:
            self.check(self.last_t)
            self.last_t = env.occurred_at
        self.history.apply(env)
        p = env.payload
        if env.type == "PodAssigned" and p.gpu is not None:
            self.gpu[f"{p.pod_namespace}/{p.pod}"] = p.gpu
        if env.type != "ObjectChanged":
            return
        name = f"{p.namespace}/{p.name}"
        if p.kind == "Node":
            status = p.object.get("status") or {}
            if p.change == "Deleted":
                self.nodes.pop(p.name, None)
            else:
                self.nodes[p.name] = q.parse_resources(status.get("allocatable") or status.get("capacity"))
        elif p.kind == "Pod":
            if p.change == "Deleted" or (p.object.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                self.pods.pop(name, None)
            else:
                self.pods[name] = p.object

    def check(self, t: float) -> None:
        used: dict[str, dict[str, int]] = {}
        devices: dict[tuple[str, int], float] = {}
        bound_by_workload: dict[str, int] = {}
        for name, pod in self.pods.items():
            node = (pod.get("spec") or {}).get("nodeName")
            if not node:
                continue
            req = kube.pod_requests(pod["spec"])
            req[q.PODS] = 1000
            used[node] = q.add(used.get(node, {}), req)
            gpu = self.gpu.get(name)
            if gpu is not None and gpu.fraction < 1:
                for d in gpu.devices:
                    devices[(node, d)] = devices.get((node, d), 0.0) + gpu.fraction
            key = kube.workload_key_of_pod(pod)
            if key and kube.pod_set_of_pod(pod) != "submitter":
                bound_by_workload[key] = bound_by_workload.get(key, 0) + 1
        for node, res in sorted(used.items()):
            alloc = self.nodes.get(node, {})
            over = [r for r, v in res.items() if v > alloc.get(r, 0) and not (r == q.PODS and q.PODS not in alloc)]
            if over:
                self.violations.append(f"t={t}: node {node} over-committed on {over}: {res} > {alloc}")
        for (node, d), share in sorted(devices.items()):
            if share > 1.0 + 1e-9:
                self.violations.append(f"t={t}: GPU {node}/{d} carries {share}")
        for key, n in sorted(bound_by_workload.items()):
            view = self.history.workloads.get(key)
            if view and view.min_member and n < view.min_member:
                self.violations.append(f"t={t}: gang {key} partly bound: {n}/{view.min_member}")
        for queue, usage in sorted(self.history.queue_usage().items()):
            spec = self.history.queues.get(queue)
            if spec is None:
                continue
            for r, v in usage.items():
                limit = spec.limit.get(r)
                if limit is not None and limit != UNLIMITED and v > limit:
                    self.violations.append(f"t={t}: queue {queue} holds {r}={v} over its limit {limit}")

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_scenarios_keep_every_invariant_and_replay_identically(text: str) -> None:
    scenario = parse_scenario(text)
    watcher = InvariantWatcher()

    run = simulate(scenario)
    for env in run.runtime.log:
        watcher(env)
    watcher.check(watcher.last_t)
    assert not watcher.violations, "\n".join(watcher.violations[:10]) + "\n" + text
    again = simulate(scenario)
    assert [to_json(e) for e in again.runtime.log] == [to_json(e) for e in run.runtime.log]
