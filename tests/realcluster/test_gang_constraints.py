"""Gangs with anti-affinity and spread, placed by muster on the real cluster, checked afterwards (issue 31).

The differential test compares muster with kube-scheduler one pod at a time; this one checks what
muster does with whole gangs, whose pods constrain each other within one attempt. Real KubeRay makes
the pods of a few RayClusters on KWOK nodes in three zones, muster (its embedded stack on the cluster
link, ``simulate_live``, as the parity tier runs it) binds them, and the bound pods are read back from
the API server and checked against the constraints themselves, not against muster's own account:

- ``apart``: workers with required pod anti-affinity by hostname: no two on one node;
- ``spread``: workers with a zone spread constraint (maxSkew 1): per-zone counts within 1;
- ``crowd``: more anti-affine workers than nodes, and ``thin``: a zone spread with ``minDomains``
  above the zones there are (the global minimum is then 0, so at most one worker per zone): neither
  fits whole, so no pod of either is bound and each waits with kube-scheduler's reason.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from shared.kubernetes.realcluster import simulate_live
from shared.parts.devcluster import DevCluster
from shared.sim.scenario import parse_scenario

ZONE = "topology.kubernetes.io/zone"
NODES = [(f"n{i}", f"zone-{'abc'[i % 3]}") for i in range(6)]


def ray_cluster(name: str, workers: int, affinity: str) -> str:
    """A RayCluster step whose workers carry ``affinity`` (a YAML fragment of the pod spec, at its indentation)."""
    return f"""
  - at: 1s
    apply: |
      apiVersion: ray.io/v1
      kind: RayCluster
      metadata: {{name: {name}, namespace: default}}
      spec:
        headGroupSpec:
          template:
            spec:
              containers:
              - {{name: ray-head, image: rayproject/ray:2.50.1, resources: {{requests: {{cpu: "1", memory: 1Gi}}}}}}
        workerGroupSpecs:
        - groupName: workers
          replicas: {workers}
          template:
            spec:
{affinity}
              containers:
              - {{name: ray-worker, image: rayproject/ray:2.50.1, resources: {{requests: {{cpu: "1", memory: 1Gi}}}}}}"""


def anti(name: str) -> str:
    return f"""              affinity:
                podAntiAffinity:
                  requiredDuringSchedulingIgnoredDuringExecution:
                  - topologyKey: kubernetes.io/hostname
                    labelSelector:
                      matchLabels: {{ray.io/cluster: {name}, ray.io/node-type: worker}}"""


def spread(name: str, min_domains: int | None = None) -> str:
    extra = f"\n                minDomains: {min_domains}" if min_domains else ""
    return f"""              topologySpreadConstraints:
              - maxSkew: 1
                topologyKey: {ZONE}
                whenUnsatisfiable: DoNotSchedule{extra}
                labelSelector:
                  matchLabels: {{ray.io/cluster: {name}, ray.io/node-type: worker}}"""


SCENARIO = "name: gang-constraints\ncluster:\n  nodes:\n" + "".join(
    f'    - {{name: {n}, capacity: {{cpu: "8", memory: 32Gi, pods: "110"}}, '
    f"labels: {{kubernetes.io/hostname: {n}, {ZONE}: {z}}}}}\n" for n, z in NODES) + "steps:" + "".join((
        ray_cluster("apart", 4, anti("apart")),
        ray_cluster("spread", 5, spread("spread")),
        ray_cluster("crowd", 7, anti("crowd")),
        ray_cluster("thin", 4, spread("thin", min_domains=4)),
    )) + "\nuntil: 20s\n"
"""Six 8-cpu nodes, two per zone; every pod asks 1 cpu, so only the constraints keep a pod off a node."""


def bound_workers(cluster: DevCluster) -> dict[str, list[str]]:
    """Per RayCluster, the nodes its workers are bound to (as the API server has them; "" for an unbound one)."""
    pods = json.loads(cluster.kubectl("get", "pods", "-n", "default", "-o", "json").stdout)["items"]
    out: dict[str, list[str]] = {}
    for pod in pods:
        labels = pod["metadata"].get("labels", {})
        if labels.get("ray.io/node-type") == "worker":
            out.setdefault(labels["ray.io/cluster"], []).append(pod["spec"].get("nodeName", ""))
    return out


def test_gangs_bound_by_muster_keep_their_anti_affinity_and_spread(devcluster: DevCluster) -> None:
    """The constraints hold among the pods muster bound, and the two gangs that cannot keep them wait unbound
    with kube-scheduler's words."""
    scenario = parse_scenario(SCENARIO, "gang-constraints")
    devcluster.prepare(scenario)
    run = simulate_live(scenario, devcluster.kubeconfig)
    workers = bound_workers(devcluster)
    zone_of = dict(NODES)

    assert len(workers["apart"]) == 4 and all(workers["apart"])
    assert len(set(workers["apart"])) == 4, f"anti-affine workers share a node: {workers['apart']}"

    assert len(workers["spread"]) == 5 and all(workers["spread"])
    per_zone = Counter(zone_of[n] for n in workers["spread"])
    counts = [per_zone.get(z, 0) for z in sorted(set(zone_of.values()))]
    assert max(counts) - min(counts) <= 1, f"zone skew above 1: {dict(per_zone)}"

    result: dict[str, Any] = run.result()["workloads"]
    for name, words in (("crowd", "didn't match pod anti-affinity rules"),
                        ("thin", "didn't match pod topology spread constraints")):
        assert len(workers[name]) == (7 if name == "crowd" else 4)
        assert not any(workers[name]), f"{name}: a gang that cannot keep its constraints has bound pods: {workers[name]}"
        reason = result[f"default/{name}"]["transitions"][-1]["reason"]
        assert words in reason, f"{name} waits for another reason: {reason}"
