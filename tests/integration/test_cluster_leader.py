"""Exactly one applier: two ``muster run cluster`` processes, one Lease, the leader killed mid-run.

The API server is the emulator (tests/kubeapi.py, real HTTP); the services run in this process on a
real broker; the two bridges are processes of their own, as deployed (two replicas of one
Deployment). The test plays the user and KubeRay: a suspended RayCluster is admitted by the first
leader; the leader is SIGKILLed; a second RayCluster is admitted by the standby once the lease has
run out. Every write the API server took is tagged with the bridge that sent it (User-Agent): no
write of the second bridge comes before the first bridge's last, and every effect changed the cluster
once (each pod bound once, each cluster unsuspended once, no Event twice).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from shared.bus.config import BusConfig
from shared.bus.localbroker import free_port
from tests.builders import node, ray_cluster, worker_group
from tests.integration.test_cluster_bridge import QUEUE, eventually, ray_pod, stack
from tests.kubeapi import KubeApiEmulator

LEASE = ("Lease", "coordination.k8s.io/v1", "muster-system", "muster-cluster")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def kube() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator() as emulator:
        yield emulator


def bridge(config: BusConfig, kube: KubeApiEmulator, identity: str, log: Path, port: int) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "shared.cli", "run", "cluster", "--kube-url", kube.url, "--identity", identity,
            "--lease", "muster-system/muster-cluster", "--lease-duration", "4", "--renew-deadline", "3",
            "--retry-period", "0.5", "--log-level", "warning", "--metrics-port", str(port)]
    env = {**os.environ, **config.env(), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(args, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT, cwd=ROOT)


def probe(port: int, path: str) -> int:
    """The status code of GET http://127.0.0.1:PORT/PATH (0 when nothing answers)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def holder(kube: KubeApiEmulator) -> str:
    lease = kube.get(*LEASE)
    return (lease or {}).get("spec", {}).get("holderIdentity", "")


def admit(kube: KubeApiEmulator, name: str) -> None:
    """Create a suspended RayCluster, wait for muster to unsuspend it, play KubeRay, wait for the binds."""
    kube.create(ray_cluster(name, "team-a", suspend=True, head={"cpu": "1", "memory": "1Gi"},
                            workers=[worker_group("worker", 1, {"cpu": "1", "memory": "1Gi"})],
                            labels={"volcano.sh/queue-name": "research"}))
    eventually(lambda: (kube.get("RayCluster", "ray.io/v1", "team-a", name) or {}).get("spec", {}).get("suspend")
               is False, f"{name} to be unsuspended", timeout=90)
    pods = [ray_pod(name, f"{name}-head", "head", "headgroup", "1"),
            ray_pod(name, f"{name}-worker-0", "worker", "worker", "1")]
    for p in pods:
        kube.create(p)
    eventually(lambda: all((kube.get("Pod", "v1", "team-a", p["metadata"]["name"]) or {}).get("spec", {})
                           .get("nodeName") for p in pods), f"{name}'s pods to be bound", timeout=60)


def test_the_standby_takes_over_when_the_leader_dies_and_nothing_is_applied_twice(
        kafka_bootstrap: str, topic_prefix: str, kube: KubeApiEmulator, tmp_path: Path) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    kube.create(node("n1", cpu="16", memory="64Gi"))
    kube.create(QUEUE)
    bridges: dict[str, subprocess.Popen[bytes]] = {}
    try:
        with stack(config, kube.url, cluster=False):
            ports = {"bridge-a": free_port(), "bridge-b": free_port()}
            for identity in ("bridge-a", "bridge-b"):
                bridges[identity] = bridge(config, kube, identity, tmp_path / f"{identity}.log", ports[identity])
            first = eventually(lambda: holder(kube), "a bridge to take the lease", timeout=60)
            second = "bridge-b" if first == "bridge-a" else "bridge-a"
            admit(kube, "rc-1")
            assert holder(kube) == first
            # the standby is alive and not ready; the leader is both (its Deployment's probes)
            assert eventually(lambda: probe(ports[second], "/healthz") == 200, "the standby's /healthz")
            assert probe(ports[second], "/readyz") == 503
            assert eventually(lambda: probe(ports[first], "/readyz") == 200, "the leader's /readyz")

            bridges[first].send_signal(signal.SIGKILL)
            bridges[first].wait()
            killed_at = kube.loop.time()
            admit(kube, "rc-2")
            assert holder(kube) == second
            assert bridges[second].poll() is None
    finally:
        for process in bridges.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("*.log")))
        print(logs)

    writers = [(at, agent.rpartition("/")[2]) for at, _, _, agent in kube.state.writes if agent.startswith("muster")]
    firsts = [at for at, who in writers if who == first]
    seconds = [at for at, who in writers if who == second]
    assert firsts and seconds
    assert max(firsts) <= killed_at < min(seconds)   # never two appliers at once
    assert {who for _, who in writers} == {first, second}

    changes = kube.state.changes
    for name in ("rc-1-head", "rc-1-worker-0", "rc-2-head", "rc-2-worker-0"):
        bound = [c for c in changes if c.resource.kind == "Pod" and c.obj["metadata"]["name"] == name
                 and c.obj["spec"].get("nodeName")]
        assert bound and bound[0].obj["spec"]["nodeName"] == "n1"
        assert len([c for c in bound if c.type == "MODIFIED"]) == 1, f"{name} bound more than once"
    for name in ("rc-1", "rc-2"):
        flips = [c for c in changes if c.resource.kind == "RayCluster" and c.obj["metadata"]["name"] == name]
        unsuspended = [i for i, c in enumerate(flips) if c.obj["spec"]["suspend"] is False
                       and (i == 0 or flips[i - 1].obj["spec"]["suspend"] is not False)]
        assert len(unsuspended) == 1, f"{name} unsuspended {len(unsuspended)} times"
    events = kube.items("Event")
    assert len({e["metadata"]["name"] for e in events}) == len(events)
    assert {e["involvedObject"]["name"] for e in events if e["reason"] == "Scheduled"} == {"rc-1", "rc-2"}
