"""muster against the peers' own schedulers on the same dev cluster, the same manifests, in one run.

``make bench SECTIONS=peers``. One dev cluster (``shared.parts.devcluster``: etcd, kube-apiserver,
controller manager, KWOK, real KubeRay), one real Apache Kafka broker; per shape a fresh set of KWOK
nodes and the shape's manifests, scheduled once by each peer built by ``make tools`` (Volcano's
vc-scheduler and controllers, KAI's scheduler, binder, pod grouper and queue controller) and once by
muster deployed as processes on Kafka (``muster run admission``, ``queue``, ``placement``,
``reconciler``, ``cluster``) answering to the peer's scheduler name, so the manifests are the same
bytes. The shapes (sizes overridable, ``MUSTER_BENCH_PEERS_*``):

- ``jobs``: 10,000 one-pod jobs in 10 queues (Volcano's KWOK test: a PodGroup of minMember 1 and
  its pod per job, Volcano Queues of equal weight) on 1,000 nodes of 32 CPU; Volcano only;
- ``rayclusters``: 1,000 RayClusters of a head and 8 workers through real KubeRay
  (``--batch-scheduler`` of the peer: KubeRay makes the PodGroups) on 2,000 nodes;
- ``gpu``: 4,000 single-GPU jobs on 500 nodes of 8 GPUs (KAI's published shape: a pod per job
  labelled with its queue, KAI's pod grouper or muster making the group); KAI only.

Each scheduler meets a backlog: the shape's objects are created (and KubeRay has made its pods)
while no scheduler runs, then the scheduler starts and the bench waits for every pod bound. So the
figures time the scheduler, not the bench's client or KubeRay's 100 requests/s: pods bound per second
and the seconds until all are bound, both from the instant the scheduler's processes are ready (for
muster: every service answers ``/readyz``; its processes' start is ``startup_seconds``, apart); p50/p99
per pod from the later of its creation and that instant to bound (a pod bound during the start counts 0); the API server's requests per pod made by the scheduler's
processes (each with a client certificate of its own: the API server's audit log tells them apart);
CPU seconds of its processes from their start (muster's also per service,
``muster_as_<peer>_cpu_seconds_<service>``: where its time goes). muster's figures are named for the
peer it ran beside (``muster_as_volcano_*``: the same manifests, KubeRay with that peer's setting). ``peers_<shape>_ratio_<peer>_pods_per_second`` is muster's figure over
the peer's, paired run by run. Figures only, never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.e2e_bench import _cpu, _service, _with_children
from bench.podwatch import PodWatch
from bench.stats import percentile, spread
from shared.kernel.topology import SERVICES
from shared.parts import catalog, kai
from shared.parts.peers import PEERS, Peer
from shared.parts.devcluster import DevCluster
from shared.parts.kafka import KafkaBroker
from shared.parts.kwok import node
from shared.runtime.bus.app import ensure_topics
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.driver import EventLoopThread

RUNS = int(os.environ.get("MUSTER_BENCH_PEERS_RUNS", "2"))
JOBS = int(os.environ.get("MUSTER_BENCH_PEERS_JOBS", "10000"))
JOB_QUEUES = 10
JOB_NODES = int(os.environ.get("MUSTER_BENCH_PEERS_JOB_NODES", "1000"))
CLUSTERS = int(os.environ.get("MUSTER_BENCH_PEERS_RAYCLUSTERS", "1000"))
CLUSTER_NODES = int(os.environ.get("MUSTER_BENCH_PEERS_RAYCLUSTER_NODES", "2000"))
GPU_JOBS = int(os.environ.get("MUSTER_BENCH_PEERS_GPU_JOBS", "4000"))
GPU_NODES = int(os.environ.get("MUSTER_BENCH_PEERS_GPU_NODES", "500"))
WORKERS = 8
NAMESPACE = "bench"
MUSTER_USER = "muster-cluster-link"
CREATORS = 6
"""``kubectl create`` processes writing a shape's objects side by side (each has its own client rate limit)."""


@dataclass(frozen=True)
class Shape:
    """A workload shape: its nodes, its objects, how many pods they make, which peers it is theirs."""

    name: str
    nodes: Callable[[], list[dict[str, Any]]]
    objects: Callable[[str], list[dict[str, Any]]]
    """The shape's objects for a scheduler name (``volcano``, ``kai-scheduler``)."""
    pods: int
    peers: tuple[str, ...]
    kuberay: bool


def _cpu_nodes(count: int) -> list[dict[str, Any]]:
    return [node(f"kwok-{i + 1}", {"cpu": "32", "memory": "256Gi", "pods": "110"}) for i in range(count)]


def _gpu_nodes(count: int) -> list[dict[str, Any]]:
    return [node(f"kwok-gpu-{i + 1}", {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8", "pods": "110"},
                 labels={"nvidia.com/gpu.present": "true"}) for i in range(count)]


def volcano_queues() -> list[dict[str, Any]]:
    return [{"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": f"q{i}"},
             "spec": {"weight": 1, "reclaimable": True}} for i in range(JOB_QUEUES)]


def kai_queues() -> list[dict[str, Any]]:
    """KAI's two levels: a department and one leaf queue under it, unlimited (-1) as KAI's quick start."""
    unlimited = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
    resources = {"cpu": unlimited, "memory": unlimited, "gpu": unlimited}
    return [{"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "bench-department"},
             "spec": {"resources": resources}},
            {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "bench"},
             "spec": {"parentQueue": "bench-department", "resources": resources}}]


def one_pod_jobs(scheduler: str) -> list[dict[str, Any]]:
    """Volcano's KWOK shape: per job a PodGroup (minMember 1, its queue) and its pod."""
    out: list[dict[str, Any]] = []
    for n in range(JOBS):
        group = f"job-{n}"
        out.append({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                    "metadata": {"name": group, "namespace": NAMESPACE},
                    "spec": {"minMember": 1, "queue": f"q{n % JOB_QUEUES}"}})
        out.append({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"{group}-0", "namespace": NAMESPACE,
                                 "annotations": {"scheduling.k8s.io/group-name": group}},
                    "spec": {"schedulerName": scheduler, "containers": [
                        {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}})
    return out


def gpu_jobs(scheduler: str) -> list[dict[str, Any]]:
    """KAI's shape: a pod per job asking for one GPU, labelled with its queue."""
    return [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"gpu-{n}", "namespace": NAMESPACE, "labels": {"kai.scheduler/queue": "bench"}},
             "spec": {"schedulerName": scheduler, "containers": [
                 {"name": "c", "image": "busybox",
                  "resources": {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"nvidia.com/gpu": "1"}}}]}}
            for n in range(GPU_JOBS)]


def ray_clusters(scheduler: str) -> list[dict[str, Any]]:
    """RayClusters of a head (2 CPU) and 8 workers (4 CPU) in one queue: KubeRay gives them the
    peer's PodGroup and scheduler name (``--batch-scheduler``), the queue from the label."""
    queue_label = {"volcano": {"ray.io/scheduler-name": "volcano", "volcano.sh/queue-name": "q0"},
                   "kai-scheduler": {"ray.io/scheduler-name": "kai-scheduler", "kai.scheduler/queue": "bench"}}[scheduler]

    def template(name: str, cpu: int, memory: str) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": name, "image": "rayproject/ray:2.46.0",
                                         "resources": {"requests": {"cpu": str(cpu), "memory": memory}}}]}}

    return [{"apiVersion": "ray.io/v1", "kind": "RayCluster",
             "metadata": {"name": f"rc-{n}", "namespace": NAMESPACE, "labels": dict(queue_label)},
             "spec": {"headGroupSpec": {"rayStartParams": {}, "template": template("ray-head", 2, "4Gi")},
                      "workerGroupSpecs": [{"groupName": "worker", "replicas": WORKERS, "minReplicas": WORKERS,
                                            "maxReplicas": WORKERS, "rayStartParams": {},
                                            "template": template("ray-worker", 4, "8Gi")}]}}
            for n in range(CLUSTERS)]


SHAPES = (
    Shape("jobs", lambda: _cpu_nodes(JOB_NODES), one_pod_jobs, JOBS, ("volcano",), kuberay=False),
    Shape("rayclusters", lambda: _cpu_nodes(CLUSTER_NODES), ray_clusters, CLUSTERS * (WORKERS + 1),
          ("volcano", "kai"), kuberay=True),
    Shape("gpu", lambda: _gpu_nodes(GPU_NODES), gpu_jobs, GPU_JOBS, ("kai",), kuberay=False),
)


def _create(cluster: DevCluster, objs: list[dict[str, Any]]) -> None:
    """``objs`` created by ``CREATORS`` kubectl processes side by side, cluster-scoped ones first."""
    chunks = [objs[i::CREATORS] for i in range(CREATORS)]
    procs = [subprocess.Popen([catalog.binary("kubernetes", "kubectl"), "--kubeconfig", str(cluster.kubeconfig),
                               "create", "-f", "-"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for chunk in chunks if chunk]
    for proc, chunk in zip(procs, chunks):
        assert proc.stdin is not None
        proc.stdin.write("---\n".join(yaml.safe_dump(o) for o in chunk))
        proc.stdin.close()
    for proc in procs:
        proc.wait(timeout=1800)
        assert proc.stderr is not None
        if proc.returncode:
            raise RuntimeError(f"kubectl create failed: {proc.stderr.read()[-2000:]}")


@contextmanager
def _muster(cluster: DevCluster, bootstrap: str, scheduler: str) -> Iterator[list[int]]:
    """muster's services on fresh topics answering to ``scheduler``, stopped on leaving."""
    config = BusConfig(bootstrap, prefix=f"bench.peers.{int(time.time() * 1000)}.")
    bus = EventLoopThread()
    try:
        bus.run(ensure_topics(config))
    finally:
        bus.close()
    previous = os.environ.get("MUSTER_SCHEDULER_NAMES")
    os.environ["MUSTER_SCHEDULER_NAMES"] = scheduler
    try:
        with ExitStack() as stack:
            link = cluster.client(MUSTER_USER)
            yield [stack.enter_context(_service(config, name, ["--kubeconfig", str(link)] if name == "cluster" else []))
                   for name in (*SERVICES, "cluster")]
    finally:
        if previous is None:
            os.environ.pop("MUSTER_SCHEDULER_NAMES", None)
        else:
            os.environ["MUSTER_SCHEDULER_NAMES"] = previous


@contextmanager
def _peer(cluster: DevCluster, peer: Peer) -> Iterator[tuple[list[int], tuple[str, ...]]]:
    """The peer's processes started beside the cluster: their pids and the API server users they act as
    (each part has a client certificate of its own, named as the part)."""
    parts = peer.start(cluster, peer.configurations[0])
    try:
        yield [cluster.parts[name].pid for name in parts if name in cluster.parts], tuple(parts)
    finally:
        peer.stop(cluster, parts)


PEER_USERS = ("vc-controller-manager", "vc-scheduler", *(f"kai-{program}" for program in kai.PROGRAMS))
"""Every peer process's API server user, audited with muster's."""


def one_run(cluster: DevCluster, bootstrap: str, shape: Shape, peer: Peer) -> dict[str, float]:
    """The shape's backlog scheduled once by ``peer`` and once by muster, figures of both."""
    figures: dict[str, float] = {}
    scheduler = peer.batch_scheduler
    for who in (peer.name, "muster"):
        if shape.kuberay:
            cluster.start_kuberay(scheduler)
        cluster.kubectl("create", "namespace", NAMESPACE)
        watch = PodWatch(cluster.kubeconfig, NAMESPACE)
        try:
            _create(cluster, shape.objects(scheduler))
            watch.wait_seen(shape.pods, timeout=1800)
            created = dict(watch.seen)
            with ExitStack() as stack:
                before = cluster.audited_calls()
                begun = time.monotonic()
                if who == "muster":
                    users: tuple[str, ...] = (MUSTER_USER,)
                    pids = stack.enter_context(_muster(cluster, bootstrap, scheduler))
                else:
                    pids, users = stack.enter_context(_peer(cluster, peer))
                started = time.monotonic()
                startup = started - begun
                watch.wait_bound(shape.pods, timeout=3600)
                cpu = _cpu(_with_children(pids))
                if who == "muster":  # where muster's time goes: CPU seconds per service
                    for service, pid in zip((*SERVICES, "cluster"), pids):
                        figures[f"muster_as_{peer.name}_cpu_seconds_{service}"] = _cpu(_with_children([pid]))
            after = cluster.audited_calls()
        finally:
            watch.close()
        waits = sorted(max(0.0, at - max(created.get(name, started), started)) for name, at in watch.bound.items())
        key = who if who != "muster" else f"muster_as_{peer.name}"  # a shape may run muster beside two peers
        wall = max(watch.bound.values()) - started
        figures[f"{key}_pods_per_second"] = shape.pods / wall
        figures[f"{key}_seconds_to_all_bound"] = wall
        figures[f"{key}_p50_ms"] = percentile(waits, 0.5) * 1000
        figures[f"{key}_p99_ms"] = percentile(waits, 0.99) * 1000
        calls = sum((after[u] - before[u] for u in users), Counter[str]())
        figures[f"{key}_requests_per_pod"] = sum(calls.values()) / shape.pods
        for call, count in calls.items():  # where its requests go: per call, e.g. ..._requests_per_pod_create_pods/binding
            figures[f"{key}_requests_per_pod_{call.replace(' ', '_')}"] = count / shape.pods
        figures[f"{key}_cpu_seconds"] = cpu
        figures[f"{key}_startup_seconds"] = startup
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=900s", timeout=960)
    figures["ratio"] = figures[f"muster_as_{peer.name}_pods_per_second"] / figures[f"{peer.name}_pods_per_second"]
    return figures


def run() -> dict[str, Any]:
    out: dict[str, Any] = {}
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="muster-bench-peers-") as tmp:
        root = Path(tmp)
        cluster = DevCluster(root / "cluster", audited=(MUSTER_USER, *PEER_USERS))
        stack.callback(cluster.stop)
        cluster.up()
        cluster.kube_scheduler(False)
        broker = KafkaBroker(root / "kafka").start()
        stack.callback(broker.stop)
        out["peers_kafka"] = broker.describe()
        cluster.kubectl("apply", "-f", "-", input="---\n".join(yaml.safe_dump(q) for q in volcano_queues() + kai_queues()))
        chosen = os.environ.get("MUSTER_BENCH_PEERS_SHAPES", "")
        for shape in SHAPES:
            if chosen and shape.name not in chosen.split(","):
                continue
            manifests = shape.nodes()
            cluster.kubectl("apply", "--server-side", "-f", "-", input="---\n".join(yaml.safe_dump(m) for m in manifests),
                            timeout=900)
            for peer_name in shape.peers:
                peer = PEERS[peer_name]
                runs = []
                for i in range(RUNS):
                    print(f"  peers: {shape.name} with {peer_name}, run {i + 1} of {RUNS} ...", flush=True)
                    runs.append(one_run(cluster, broker.bootstrap, shape, peer))
                for key in dict.fromkeys(k for r in runs for k in r):  # a call one run made and another did not is 0 there
                    name = (f"peers_{shape.name}_ratio_{peer.name}_pods_per_second" if key == "ratio"
                            else f"peers_{shape.name}_{key}")
                    out[name] = spread([r.get(key, 0.0) for r in runs], digits=3 if key == "ratio" else 2)
            cluster.kubectl("delete", "nodes", "--all", "--wait=true", timeout=900)
        out["peers_sizes"] = {"jobs": JOBS, "job_nodes": JOB_NODES, "rayclusters": CLUSTERS,
                              "raycluster_nodes": CLUSTER_NODES, "gpu_jobs": GPU_JOBS, "gpu_nodes": GPU_NODES}
    return out


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
