"""The stack on a real cluster with the ServiceAccount's token: two ``muster run cluster``, one Lease.

The services run in this process on the session's Kafka broker; the two bridges are processes of
their own, as deployed (two replicas of one Deployment), each with a kubeconfig holding the token the
API server issued to ``muster-cluster``, so every request they make passes the real RBAC authorizer
with deploy/k8s's roles. Real KubeRay makes the pods of the RayClusters the test creates; KWOK runs
what muster binds. The first bridge to take the Lease (coordination.k8s.io, through
kubernetes-asyncio's ``leaderelection``) admits the first RayCluster, binds its pods and writes its
Events and the Volcano queue's status; it is SIGKILLed; the standby takes the Lease over within the
lease duration and does the same for a second RayCluster, then for a RayJob, whose cluster's pods it
finds through the cluster KubeRay made (asking the API server for it when need be).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from shared.kernel.policy import Policy
from shared.kernel.topology import SERVICES
from shared.parts.devcluster import DevCluster
from shared.parts.localbroker import free_port
from shared.runtime.bus.app import ensure_topics, service_app
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.driver import EventLoopThread, gather_all
from tests.integration.test_cluster_bridge import stop_apps
from tests.realcluster.conftest import (NAMESPACE, ROOT, create, eventually, get, install, node, probe,
                                     token_kubeconfig)

LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 4, 3, 1
QUEUE = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "research"},
         "spec": {"weight": 1, "capability": {"cpu": "8", "memory": "16Gi"}}}


def ray_cluster(name: str) -> dict[str, Any]:
    """A suspended RayCluster of one head and one worker in the Volcano queue research, its pods naming muster."""
    def template(container: str) -> dict[str, Any]:
        return {"spec": {"schedulerName": "muster", "containers": [{
            "name": container, "image": "rayproject/ray:2.50.1",
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}]}}

    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": name, "namespace": "team-a", "labels": {"volcano.sh/queue-name": "research"}},
            "spec": {"suspend": True, "headGroupSpec": {"rayStartParams": {}, "template": template("ray-head")},
                     "workerGroupSpecs": [{"groupName": "worker", "replicas": 1, "minReplicas": 1, "maxReplicas": 1,
                                           "rayStartParams": {}, "template": template("ray-worker")}]}}


def ray_job(name: str) -> dict[str, Any]:
    """A suspended RayJob in the Volcano queue research whose cluster is ``ray_cluster``'s: real KubeRay
    names that cluster ``<name>-<random>`` and labels its pods with the cluster only, so the link finds the
    RayJob through the cluster (``services.reconciler.owners``, its ``get`` under the deployed role)."""
    spec = ray_cluster(name)["spec"]
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": name, "namespace": "team-a", "labels": {"volcano.sh/queue-name": "research"}},
            "spec": {"suspend": True, "entrypoint": "python -c 'pass'", "shutdownAfterJobFinishes": True,
                     "rayClusterSpec": {k: v for k, v in spec.items() if k != "suspend"}}}


@contextmanager
def services(config: BusConfig) -> Iterator[None]:
    """admission, queue, placement, reconciler (and projector) as apps in this process, answering to
    ``muster`` and ``volcano`` (so the reconciler writes the Volcano queue's status)."""
    bus = EventLoopThread()
    try:
        bus.run(ensure_topics(config))
        policy = Policy().with_scheduler_names("muster,volcano")
        apps = {name: service_app(name, config, policy) for name in SERVICES}
        bus.run(gather_all(app.start() for app in apps.values()), timeout=90)
        try:
            yield
        finally:
            stop_apps(bus, apps)
    finally:
        bus.close()


def bridge(config: BusConfig, kubeconfig: Path, identity: str, log: Path, port: int) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "shared.cli.main", "run", "cluster", "--kubeconfig", str(kubeconfig),
            "--identity", identity, "--lease", f"{NAMESPACE}/muster-cluster",
            "--lease-duration", str(LEASE_DURATION), "--renew-deadline", str(RENEW_DEADLINE),
            "--retry-period", str(RETRY_PERIOD), "--log-level", "warning", "--metrics-port", str(port)]
    env = {**os.environ, **config.env(), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(args, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT, cwd=ROOT)


def holder(cluster: DevCluster) -> str:
    lease = get(cluster, "leases.coordination.k8s.io", "muster-cluster", NAMESPACE) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def admitted(cluster: DevCluster, workload: dict[str, Any]) -> list[str]:
    """Create the RayCluster or RayJob; wait until muster unsuspended it and bound the two pods of its
    cluster (the RayCluster itself, or the one KubeRay named ``<rayjob>-<random>``)."""
    create(cluster, workload)
    kind, name = workload["kind"], workload["metadata"]["name"]
    eventually(lambda: (get(cluster, f"{kind.lower()}s.ray.io", name, "team-a") or {}).get("spec", {})
               .get("suspend") is False, f"{name} to be unsuspended", timeout=90)

    def ours(cluster_name: str) -> bool:
        return cluster_name == name if kind == "RayCluster" else cluster_name.startswith(f"{name}-")

    def bound() -> list[str]:
        pods = [p for p in get(cluster, "pods", namespace="team-a")["items"]
                if ours(p["metadata"].get("labels", {}).get("ray.io/cluster", ""))]
        ok = len(pods) == 2 and all(p["spec"].get("nodeName") == "n1" and p["status"].get("phase") == "Running"
                                    for p in pods)
        return [p["metadata"]["name"] for p in pods] if ok else []

    return eventually(bound, f"{name}'s pods to be bound by muster and run", timeout=90)


def test_the_stack_works_with_the_service_account_token_and_the_standby_takes_over(
        clean_cluster: DevCluster, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    cluster = clean_cluster
    install(cluster)
    cluster.kubectl("create", "namespace", "team-a")
    create(cluster, node("n1"), QUEUE)
    kubeconfig = token_kubeconfig(cluster, tmp_path / "muster.kubeconfig")
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    bridges: dict[str, subprocess.Popen[bytes]] = {}
    try:
        with services(config):
            ports = {"bridge-a": free_port(), "bridge-b": free_port()}
            for identity in ports:
                bridges[identity] = bridge(config, kubeconfig, identity, tmp_path / f"{identity}.log", ports[identity])
            def taken() -> str:
                assert all(b.poll() is None for b in bridges.values()), "a bridge exited"
                return holder(cluster)

            first = eventually(taken, "a bridge to take the lease", timeout=60)
            second = "bridge-b" if first == "bridge-a" else "bridge-a"
            admitted(cluster, ray_cluster("rc-1"))
            assert holder(cluster) == first
            # the standby is alive and not ready; the leader is both (its Deployment's probes)
            eventually(lambda: probe(ports[second], "/healthz") == 200, "the standby's /healthz")
            assert probe(ports[second], "/readyz") == 503
            eventually(lambda: probe(ports[first], "/readyz") == 200, "the leader's /readyz")
            # the Volcano queue's status, through the status subresource
            eventually(lambda: ((get(cluster, "queues.scheduling.volcano.sh", "research") or {}).get("status") or {})
                       .get("running") == 1, "the queue's status to count rc-1 running")

            bridges[first].send_signal(signal.SIGKILL)
            bridges[first].wait()
            killed = time.monotonic()
            eventually(lambda: holder(cluster) == second, "the standby to take the lease", timeout=30, every=0.1)
            took = time.monotonic() - killed
            # the standby waits for the record to stay still for the lease duration, seen on its own clock
            assert took <= LEASE_DURATION + 2 * RETRY_PERIOD + 2, f"took over after {took:.1f}s"
            admitted(cluster, ray_cluster("rc-2"))
            assert holder(cluster) == second and bridges[second].poll() is None
            eventually(lambda: ((get(cluster, "queues.scheduling.volcano.sh", "research") or {}).get("status") or {})
                       .get("running") == 2, "the queue's status to count both running")
            admitted(cluster, ray_job("rj-1"))  # after the count of two: the job is the queue's third
    finally:
        for process in bridges.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        print("\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("*.log"))))

    events = [e for e in get(cluster, "events", namespace="team-a")["items"]
              if (e.get("source") or {}).get("component") == "muster" or e.get("reportingComponent") == "muster"]
    assert {e["involvedObject"]["name"] for e in events} >= {"rc-1", "rc-2"}
    assert all(e.get("count", 1) == 1 for e in events)  # each effect's Event written once
    # the standby, stopped cleanly, released the Lease (no holder): a next bridge need not wait it out
    assert not (get(cluster, "leases.coordination.k8s.io", "muster-cluster", NAMESPACE)["spec"].get("holderIdentity"))
