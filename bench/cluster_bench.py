"""muster on the real-cluster tier, against kube-scheduler on the same cluster in the same run.

``make bench SECTIONS=cluster``. A dev cluster (``shared.parts.devcluster``: etcd, kube-apiserver,
controller manager, kube-scheduler, KWOK, KubeRay with no batch scheduler) with ``NODES`` KWOK nodes
of 32 CPUs, a real Apache Kafka broker, and muster deployed as processes: ``muster run admission``,
``queue``, ``placement``, ``reconciler`` and ``muster run cluster`` (its own client certificate, so
the API server's audit log tells its requests apart). Each run:

1. **muster**: ``CLUSTERS`` RayClusters of a head (2 CPU) and 8 workers (4 CPU), their templates
   naming ``schedulerName: muster``, created at one instant; real KubeRay makes their pods, muster
   binds them (gang by gang), KWOK runs them. Figures: pods bound per second (from the instant the
   RayClusters exist to the last pod bound), p50/p99 per RayCluster from its creation to its last
   pod bound, the API server's requests per RayCluster made by muster's cluster link.
2. **kube-scheduler**: the same number of plain pods with the same requests (``CLUSTERS`` × 9),
   created the same way, bound by kube-scheduler alone: pods per second, p50/p99 per pod from
   creation to bound, its requests per pod. The ceiling this machine's API server allows.

``cluster_ratio_pods_per_second`` = muster / kube-scheduler, paired run by run (the machine's speed
varies between hours, not between two halves of one run). Creation and bind times come from watches
in this process (the instant ``spec.nodeName`` first appears), so both are measured alike. muster's
figure includes what KubeRay takes to create the pods (its client's default 100 requests/s);
kube-scheduler's pods are written by the bench. Figures only, never asserted.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

from bench.e2e_bench import _cpu, _service, _with_children
from bench.podwatch import PodWatch
from bench.stats import percentile, spread
from shared.kernel.topology import SERVICES
from shared.parts.devcluster import DevCluster
from shared.parts.kafka import KafkaBroker
from shared.parts.kwok import node
from shared.runtime.bus.app import ensure_topics
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.driver import EventLoopThread

NODES = int(os.environ.get("MUSTER_BENCH_CLUSTER_NODES", "200"))
CLUSTERS = int(os.environ.get("MUSTER_BENCH_CLUSTER_RAYCLUSTERS", "100"))
RUNS = int(os.environ.get("MUSTER_BENCH_CLUSTER_RUNS", "3"))
WORKERS, HEAD_CPU, WORKER_CPU = 8, 2, 4
LINK_USER = "muster-cluster-link"
SCHEDULER_USER = "system:kube-scheduler"
NAMESPACE = "bench"


def ray_cluster(n: int) -> dict[str, Any]:
    def template(name: str, cpu: int, memory: str) -> dict[str, Any]:
        return {"spec": {"schedulerName": "muster", "containers": [
            {"name": name, "image": "rayproject/ray:2.46.0", "resources": {"requests": {"cpu": str(cpu), "memory": memory}}}]}}

    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": f"rc-{n}", "namespace": NAMESPACE},
            "spec": {"headGroupSpec": {"rayStartParams": {}, "template": template("ray-head", HEAD_CPU, "4Gi")},
                     "workerGroupSpecs": [{"groupName": "worker", "replicas": WORKERS, "minReplicas": WORKERS,
                                           "maxReplicas": WORKERS, "rayStartParams": {},
                                           "template": template("ray-worker", WORKER_CPU, "8Gi")}]}}


def plain_pod(n: int, i: int) -> dict[str, Any]:
    cpu, memory = (HEAD_CPU, "4Gi") if i == 0 else (WORKER_CPU, "8Gi")
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"plain-{n}-{i}", "namespace": NAMESPACE, "labels": {"bench/group": f"plain-{n}"}},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                                     "resources": {"requests": {"cpu": str(cpu), "memory": memory}}}]}}


def _create(cluster: DevCluster, objs: list[dict[str, Any]]) -> None:
    """Create ``objs`` with one ``kubectl create`` (one request each, as fast as kubectl sends them)."""
    cluster.kubectl("create", "-f", "-", input="---\n".join(yaml.safe_dump(o) for o in objs), timeout=600)


def _clear(cluster: DevCluster) -> None:
    """The namespace deleted and made again: its controller removes the pods with one deletecollection,
    where ``kubectl delete pods --all`` sends a request per pod at kubectl's client rate (minutes for 900)."""
    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=600s", timeout=660)
    cluster.kubectl("create", "namespace", NAMESPACE)


def one_run(cluster: DevCluster, stack_pids: list[int]) -> dict[str, float]:
    pods = CLUSTERS * (WORKERS + 1)
    figures: dict[str, float] = {}
    for who in ("muster", "kube_scheduler"):
        before = cluster.audited_requests()
        cpu_before = _cpu(_with_children(stack_pids)) if who == "muster" else _cpu([cluster.parts["kube-scheduler"].pid])
        watch = PodWatch(cluster.kubeconfig, NAMESPACE, rayclusters=True)
        try:
            started = time.monotonic()
            if who == "muster":
                _create(cluster, [ray_cluster(n) for n in range(CLUSTERS)])
            else:
                _create(cluster, [plain_pod(n, i) for n in range(CLUSTERS) for i in range(WORKERS + 1)])
            watch.wait_bound(pods, timeout=900.0)
            wall = max(watch.bound.values()) - started
            per_group = watch.latencies()
            restarts = watch.restarts
        finally:
            watch.close()
        after = cluster.audited_requests()
        user = LINK_USER if who == "muster" else SCHEDULER_USER
        cpu_after = _cpu(_with_children(stack_pids)) if who == "muster" else _cpu([cluster.parts["kube-scheduler"].pid])
        unit = CLUSTERS if who == "muster" else pods
        figures[f"{who}_pods_per_second"] = pods / wall
        figures[f"{who}_p50_ms"] = percentile(per_group, 0.5) * 1000
        figures[f"{who}_p99_ms"] = percentile(per_group, 0.99) * 1000
        figures[f"{who}_requests_per_{'raycluster' if who == 'muster' else 'pod'}"] = (after[user] - before[user]) / unit
        figures[f"{who}_cpu_seconds"] = cpu_after - cpu_before
        figures[f"{who}_watch_restarts"] = restarts  # > 0: some binds were seen late (see bench.podwatch)
        _clear(cluster)
    figures["ratio"] = figures["muster_pods_per_second"] / figures["kube_scheduler_pods_per_second"]
    return figures


def _nodes(cluster: DevCluster) -> None:
    manifests = [node(f"kwok-{i + 1}", {"cpu": "32", "memory": "128Gi"}) for i in range(NODES)]
    cluster.kubectl("apply", "--server-side", "-f", "-", input="---\n".join(yaml.safe_dump(m) for m in manifests),
                    timeout=600)
    cluster.kubectl("wait", "--for=condition=Ready", "nodes", "--all", "--timeout=300s", timeout=360)
    cluster.kubectl("create", "namespace", NAMESPACE)


def _stack(cluster: DevCluster, bootstrap: str, link_config: Path, stack: ExitStack) -> list[int]:
    config = BusConfig(bootstrap, prefix="bench.cluster.")
    bus = EventLoopThread()
    try:
        bus.run(ensure_topics(config))
    finally:
        bus.close()
    pids = [stack.enter_context(_service(config, name, ["--kubeconfig", str(link_config)] if name == "cluster" else []))
            for name in (*SERVICES, "cluster")]
    return pids


def run() -> dict[str, Any]:
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="muster-bench-cluster-") as tmp:
        root = Path(tmp)
        cluster = DevCluster(root / "cluster", audited=(LINK_USER, SCHEDULER_USER))
        stack.callback(cluster.stop)
        cluster.up()
        broker = KafkaBroker(root / "kafka").start()
        stack.callback(broker.stop)
        _nodes(cluster)
        pids = _stack(cluster, broker.bootstrap, cluster.client(LINK_USER), stack)
        runs = []
        for i in range(RUNS):
            print(f"  cluster: run {i + 1} of {RUNS} ...", flush=True)
            runs.append(one_run(cluster, pids))
        figures: dict[str, Any] = {"cluster_nodes": NODES, "cluster_rayclusters": CLUSTERS,
                                   "cluster_pods": CLUSTERS * (WORKERS + 1), "cluster_kafka": broker.describe()}
        for key in runs[0]:
            name = "cluster_ratio_pods_per_second" if key == "ratio" else f"cluster_{key}"
            figures[name] = spread([r[key] for r in runs], digits=3 if key == "ratio" else 2)
        return figures


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
