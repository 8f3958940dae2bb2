"""The whole stack over Kafka, from a watch event to a pod bound on an API server.

The API server is the emulator of tests/kubeapi.py (real HTTP; kubernetes-asyncio on the other end)
in a process of its own, as an API server is: its JSON and HTTP work is not muster's. The stack runs
as it is deployed, one process per service: ``muster run admission``, ``queue``, ``placement``,
``reconciler`` and ``muster run cluster`` (which watches the emulator, writes what it sees into the
log and the inboxes, and applies the reconciler's effects — unsuspend, annotate, bind — over HTTP),
each started with its ``/readyz`` awaited (the cluster link watches in a child process of its own,
``shared.kubernetes.cluster_watch``). ``MUSTER_BENCH_E2E_ONE_PROCESS=1`` runs the five apps on
one event loop in this process instead (the link's watch still in its child), as the bench did
before issue 16's last round: every service's work and its periodic snapshot then wait on one
another, which a deployment never does. The bench plays the users and KubeRay: it writes
RayClusters with their pods into the emulator. Broker: Apache Kafka of the bench's own
(``make tools``) unless ``MUSTER_BENCH_KAFKA`` names one.

- ``e2e_pods_per_second``: 2,000 nodes and four Volcano queues known to the stack, then 1,000
  RayClusters of 9 pods (head + 8 workers, 34 CPU) created in the emulator at one instant. Span:
  from that instant (the objects exist) until the emulator has taken the binding of the last of the
  9,000 pods (``MUSTER_BENCH_E2E_CLUSTERS`` sets another count, to iterate quickly).
- ``loaded_latency``: the cluster first filled to 80 % (1,500 such RayClusters placed and bound),
  with 200 more waiting in a queue whose capability is used up; then RayClusters written at 50
  per second while, for each, one of the first ones is deleted with its pods (the cluster stays
  80 % full). Per workload, the time from writing it to the binding of its last pod.

Each figure: ``RUNS`` runs, each on a fresh emulator, fresh topics and fresh apps; the median with
the spread. Figures only, never asserted.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from contextlib import ExitStack, contextmanager
from multiprocessing.connection import Connection
from typing import Any, Callable, Iterator

from bench.bus_bench import _settle, _stop
from bench.stats import percentile, spread
from shared.kernel import kube
from shared.kernel.policy import Policy
from shared.kernel.topology import SERVICES
from shared.kubernetes.app import cluster_app
from shared.kubernetes.cluster import KubeTarget
from shared.parts.kafka import broker_for
from shared.runtime.bus.app import ensure_topics, service_app
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.driver import EventLoopThread, gather_all

RUNS = 3
NODES, NODE_CPU = 2000, 32
WORKERS, HEAD_CPU, WORKER_CPU = 8, 2, 4
QUEUES = tuple(f"team-{i}" for i in range(4))
FULL_QUEUE = "full"
"""The queue whose capability is used up: its workloads wait (the waiting work in the queues)."""


# --------------------------------------------------------------------------- the API server's process
def _serve(conn: Connection) -> None:
    """The emulator in a child process, driven by (command, argument) messages on ``conn``."""
    from tests.kubeapi import KubeApiEmulator

    with KubeApiEmulator() as api:
        conn.send(api.url)
        while True:
            command, argument = conn.recv()
            if command == "create":
                api.create_many(argument)
                conn.send(time.monotonic())
            elif command == "delete":
                for kind, api_version, namespace, name in argument:
                    api.delete(kind, api_version, namespace, name)
                conn.send(None)
            elif command == "bound":
                conn.send(dict(api.state.bound_at))
            elif command == "count":
                conn.send(len(api.state.bound_at))
            elif command == "requests":
                conn.send(_request_kinds(api.state.requests))
            else:
                conn.send(None)
                return


def _request_kinds(requests: list[tuple[str, str]]) -> dict[str, int]:
    """Requests by what they did: ``POST binding``, ``PATCH rayclusters``, ``GET pods`` (watches and
    lists included)..."""
    counts: dict[str, int] = {}
    for method, path in requests:
        parts = [p for p in path.split("/") if p]
        rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
        if rest[:1] == ["namespaces"] and len(rest) > 2:
            rest = rest[2:]
        what = f"{method} {rest[2] if len(rest) > 2 else rest[0] if rest else path}"
        counts[what] = counts.get(what, 0) + 1
    return dict(sorted(counts.items()))


class ApiServer:
    """The emulator's process, as the bench talks to it: ``create``, ``delete``, ``bound``."""

    def __init__(self) -> None:
        self._conn, child = multiprocessing.Pipe()
        self._process = multiprocessing.get_context("spawn").Process(target=_serve, args=(child,), daemon=True)
        self._process.start()
        self.url: str = self._conn.recv()

    def _ask(self, command: str, argument: Any = None) -> Any:
        self._conn.send((command, argument))
        return self._conn.recv()

    def create(self, objs: list[dict[str, Any]]) -> float:
        """Create ``objs`` at one instant; that instant (``time.monotonic()``, one clock for every process)."""
        return self._ask("create", objs)

    def delete(self, objs: list[dict[str, Any]]) -> None:
        self._ask("delete", [(o["kind"], o["apiVersion"], o["metadata"].get("namespace", ""), o["metadata"]["name"])
                             for o in objs])

    def bound(self) -> dict[tuple[str, str], float]:
        """(namespace, pod) -> ``time.monotonic()`` of its binding (one clock for every process)."""
        return self._ask("bound")

    def count(self) -> int:
        return self._ask("count")

    def requests(self) -> dict[str, int]:
        """How many requests of each kind the API server answered."""
        return self._ask("requests")

    def close(self) -> None:
        self._ask("stop")
        self._process.join(timeout=10)


# --------------------------------------------------------------------------- what users and KubeRay write
def setup_objects(full_queue_cpu: int = 0) -> list[dict[str, Any]]:
    """The nodes and the queues (and the used-up queue, when ``full_queue_cpu``)."""
    capacity = {"cpu": str(NODE_CPU), "memory": "128Gi", "pods": "110"}
    objs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{i + 1}", "labels": {}},
         "spec": {}, "status": {"capacity": capacity, "allocatable": capacity}} for i in range(NODES)]
    for name in QUEUES:
        objs.append({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": name},
                     "spec": {"weight": 1}})
    if full_queue_cpu:
        objs.append({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": FULL_QUEUE},
                     "spec": {"weight": 1, "capability": {"cpu": str(full_queue_cpu)}}})
    return objs


def ray_cluster(n: int, queue: str) -> list[dict[str, Any]]:
    """A RayCluster of a head and ``WORKERS`` workers, and its pods as KubeRay names and labels them."""
    name = f"rc-{n}"
    rc = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
          "metadata": {"name": name, "namespace": "bench", "labels": {"volcano.sh/queue-name": queue}},
          "spec": {"headGroupSpec": {"template": {"spec": {"containers": [
              {"name": "ray-head", "resources": {"requests": {"cpu": str(HEAD_CPU), "memory": "4Gi"}}}]}}},
                   "workerGroupSpecs": [{"groupName": "worker", "replicas": WORKERS, "template": {"spec": {
                       "containers": [{"name": "ray-worker",
                                       "resources": {"requests": {"cpu": str(WORKER_CPU), "memory": "8Gi"}}}]}}}]}}
    pods = [_pod(name, f"{name}-head-{kube.short_hash(name, 'head', 0, 0)}", "head", "headgroup", HEAD_CPU, "4Gi")]
    pods += [_pod(name, f"{name}-worker-worker-{kube.short_hash(name, 'worker', i, 0)}", "worker", "worker",
                  WORKER_CPU, "8Gi") for i in range(WORKERS)]
    return [rc, *pods]


def _pod(cluster: str, name: str, node_type: str, group: str, cpu: int, memory: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "bench", "labels": {
                kube.RAY_CLUSTER: cluster, kube.RAY_NODE_TYPE: node_type, kube.RAY_GROUP: group,
                kube.RAY_ORIGIN_KIND: "RayCluster", kube.RAY_ORIGIN_NAME: cluster}},
            "spec": {"schedulerName": "muster", "containers": [
                {"name": "ray", "resources": {"requests": {"cpu": str(cpu), "memory": memory}}}]},
            "status": {"phase": "Pending"}}


# --------------------------------------------------------------------------- the stack
ONE_PROCESS = os.environ.get("MUSTER_BENCH_E2E_ONE_PROCESS", "") == "1"
CLUSTERS = int(os.environ.get("MUSTER_BENCH_E2E_CLUSTERS", "1000"))
"""RayClusters of ``e2e_pods_per_second`` (``MUSTER_BENCH_E2E_CLUSTERS=300`` for a quicker look while
iterating; the figure records its size, ``e2e_rayclusters``)."""


class Stack:
    """The running services: their topics' config and, per service process, its CPU seconds so far."""

    def __init__(self, config: BusConfig, pids: list[int], children: Callable[[], list[int]] = list) -> None:
        self.config = config
        self.pids = pids
        self.children = children
        """In one-process mode: the processes the apps started (the cluster link's watching process)."""

    def cpu_seconds(self) -> float:
        """CPU the services have used: their processes' and their children's (``/proc``: the cluster
        link's watching process, ``shared.kubernetes.cluster_watch``), or in one-process mode this process's
        and the watching process's."""
        if not self.pids:
            return time.process_time() + _cpu(self.children())
        return _cpu(_with_children(self.pids))


def _cpu(pids: list[int]) -> float:
    """CPU seconds of the processes ``pids`` (``/proc/PID/stat``; one that has ended counts nothing)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue  # ended between the listing and the read
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def _with_children(pids: list[int]) -> list[int]:
    """``pids`` and their descendants alive now (``/proc/PID/task/TID/children``)."""
    out, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo.extend(int(child) for child in f.read().split())
        except FileNotFoundError:
            continue
    return out


@contextmanager
def stack(bootstrap: str, api: ApiServer) -> Iterator[Stack]:
    """Admission, queue, placement, reconciler and ``muster run cluster`` on fresh topics, started
    and caught up with what the API server holds; all stopped afterwards."""
    config = BusConfig(bootstrap, prefix=f"bench.{uuid.uuid4().hex[:8]}.")
    bus = EventLoopThread()
    try:
        bus.run(ensure_topics(config))
        if ONE_PROCESS:
            apps = [service_app(name, config, Policy()) for name in SERVICES]
            apps.append(cluster_app(config, KubeTarget(url=api.url)))
            bus.run(gather_all(app.start() for app in apps), timeout=120)
            try:
                bus.run(_settle(config))  # the nodes and queues listed, published and decided on
                watcher = apps[-1].muster_watcher  # type: ignore[attr-defined]
                yield Stack(config, [], lambda: [watcher.pid] if watcher.pid is not None else [])
            finally:
                bus.run(gather_all(app.stop() for app in apps), timeout=60)
        else:
            with ExitStack() as processes:
                pids = [processes.enter_context(_service(config, name, ["--kube-url", api.url])) for name in (*SERVICES, "cluster")]
                bus.run(_settle(config))
                yield Stack(config, pids)
    finally:
        bus.close()


@contextmanager
def _service(config: BusConfig, name: str, kube_args: list[str]) -> Iterator[int]:
    """``muster run NAME`` as a process of its own, returned once its ``/readyz`` says ready
    (``kube_args``: where ``muster run cluster`` finds the API server, ``--kube-url`` or ``--kubeconfig``)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = [sys.executable, "-m", "shared.cli.main", "run", name, "--kafka", config.bootstrap, "--topic-prefix",
            config.prefix, "--metrics-port", str(port), "--log-level", "warning"]
    if name == "cluster":
        args += [*kube_args, "--lease", "none"]
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=errors)
        try:
            deadline = time.monotonic() + 120
            while not _ready(port):
                if process.poll() is not None or time.monotonic() > deadline:
                    errors.seek(0)
                    raise RuntimeError(f"muster run {name} did not get ready: "
                                       + errors.read().decode(errors="replace")[-2000:])
                time.sleep(0.1)
            yield process.pid
        finally:
            _stop(process)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as answer:
            return answer.status == 200
    except OSError:
        return False


def _wait_bound(api: ApiServer, pods: int, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while api.count() < pods:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{api.count()} of {pods} pods bound after {timeout:g}s")
        time.sleep(0.05)


# --------------------------------------------------------------------------- figures
def throughput(bootstrap: str, clusters: int | None = None, runs: int = RUNS) -> dict[str, Any]:
    """``e2e_pods_per_second``: RayClusters and their pods written at once → every pod bound."""
    walls, cpus = [], []
    clusters = CLUSTERS if clusters is None else clusters
    pods = clusters * (WORKERS + 1)
    workloads = [obj for n in range(clusters) for obj in ray_cluster(n, QUEUES[n % len(QUEUES)])]
    for _ in range(runs):
        api = ApiServer()
        try:
            api.create(setup_objects())
            with stack(bootstrap, api) as services:
                cpu = services.cpu_seconds()
                started = api.create(workloads)
                _wait_bound(api, pods)
                walls.append(max(api.bound().values()) - started)
                cpus.append(services.cpu_seconds() - cpu)
        finally:
            api.close()
    return {"e2e_span": "RayClusters and their pods written into the API server -> the API server has taken the "
                        "binding of every pod (watch, ingest, admission, queue, placement, reconciler, "
                        "`muster run cluster` binding over HTTP), "
                        + ("the five apps on one event loop in one process" if ONE_PROCESS else
                           "each service a `muster run` process of its own, as deployed")
                        + "; the API server (emulator) runs in a process of its own, its CPU not in "
                          "e2e_services_cpu_ms_per_pod (the services' processes' CPU over the span)",
            "e2e_nodes": NODES, "e2e_rayclusters": clusters, "e2e_pods": pods, "e2e_wall_seconds": spread(walls),
            "e2e_pods_per_second": spread([pods / w for w in walls], 1), "e2e_target_pods_per_second": 800,
            "e2e_services_cpu_ms_per_pod": spread([1000 * c / pods for c in cpus], 2)}


def loaded_latency(bootstrap: str, rate: float = 50.0, workloads: int = 500, fill: int = 1500, waiting: int = 200,
                   runs: int = RUNS) -> dict[str, Any]:
    """Submission → last pod bound, at ``rate`` workloads a second on a cluster kept 80 % full."""
    p50s, p99s, fills = [], [], []
    requests: dict[str, float] = {}
    for _ in range(runs):
        waits, fill_seconds, requests = _loaded_run(bootstrap, rate, workloads, fill, waiting)
        p50s.append(percentile(waits, 0.50))
        p99s.append(percentile(waits, 0.99))
        fills.append(fill_seconds)
    share = fill * (HEAD_CPU + WORKERS * WORKER_CPU) / (NODES * NODE_CPU)
    return {"loaded_latency_span": "a RayCluster and its pods written into the API server -> the API server has "
                                   "taken the binding of its last pod",
            "loaded_latency_cluster_full_percent": round(100 * share, 1), "loaded_latency_waiting_workloads": waiting,
            "loaded_latency_rate_per_second": rate, "loaded_latency_workloads": workloads,
            "loaded_latency_p50_ms": spread(p50s, 1), "loaded_latency_p99_ms": spread(p99s, 1),
            "loaded_latency_fill_seconds": spread(fills, 1),
            "loaded_latency_api_requests_per_workload": requests, "loaded_latency_target_p99_ms": 100}


Inspect = Callable[[BusConfig, dict[str, tuple[float, list[str]]], dict[tuple[str, str], float]], None]
"""Called with the stack still up, after the measured part: (config, RayCluster -> (when written,
its pods), (namespace, pod) -> when bound); ``bench.e2e_stages`` reads the log there."""


def _loaded_run(bootstrap: str, rate: float, workloads: int, fill: int, waiting: int,
                inspect: Inspect | None = None) -> tuple[list[float], float, dict[str, float]]:
    """One run: fill, then measure; (each workload's wait in ms, sorted; seconds the fill took;
    requests the API server answered while measuring, per submitted workload, by kind)."""
    per_cluster = HEAD_CPU + WORKERS * WORKER_CPU
    api = ApiServer()
    try:
        api.create(setup_objects(full_queue_cpu=per_cluster))
        with stack(bootstrap, api) as services:
            config = services.config
            filled = [ray_cluster(n, QUEUES[n % len(QUEUES)]) for n in range(fill)]
            started = time.monotonic()
            api.create([obj for objs in filled for obj in objs])
            _wait_bound(api, fill * (WORKERS + 1))
            fill_seconds = time.monotonic() - started
            # one fits the used-up queue, the rest wait in it
            api.create([obj for n in range(fill, fill + waiting + 1) for obj in ray_cluster(n, FULL_QUEUE)])
            _wait_bound(api, (fill + 1) * (WORKERS + 1))
            time.sleep(2.0)  # the waiting ones are queued and have backed off before the clock starts
            submitted: dict[str, tuple[float, list[str]]] = {}
            first = fill + waiting + 1
            before = api.requests()
            start = time.monotonic()
            for i in range(workloads):
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                objs = ray_cluster(first + i, QUEUES[i % len(QUEUES)])
                submitted[objs[0]["metadata"]["name"]] = (api.create(objs), [o["metadata"]["name"] for o in objs[1:]])
                api.delete(filled[i])  # a user gives room back: the cluster stays as full as it was
            expected = (fill + 1 + workloads) * (WORKERS + 1)
            _wait_bound(api, expected)
            bound = api.bound()
            after = api.requests()
            if inspect is not None:
                inspect(config, submitted, bound)
    finally:
        api.close()
    waits = sorted(1000 * (max(bound[("bench", p)] for p in pods) - at) for at, pods in submitted.values())
    requests = {k: round((n - before.get(k, 0)) / workloads, 1) for k, n in after.items() if n > before.get(k, 0)}
    return waits, fill_seconds, requests


def run() -> dict[str, Any]:
    given = os.environ.get("MUSTER_BENCH_KAFKA")
    with ExitStack() as stack_:
        bootstrap, broker = broker_for(stack_, given)
        figures: dict[str, Any] = {"e2e_broker": broker}
        for part in (throughput, loaded_latency):
            print(f"  e2e: {part.__name__} ...", flush=True)
            figures.update(part(bootstrap))
        return figures


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
