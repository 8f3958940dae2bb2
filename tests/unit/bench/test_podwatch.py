"""bench.podwatch: what the cluster and peers benches time pods by, read from the lines the real
kubectl prints for its watches."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from bench.podwatch import NAME_LINE, POD_LINE, PodTimes
from shared.parts import catalog


def printed(output: str, *objects: dict[str, object]) -> list[str]:
    """The lines kubectl prints of ``objects`` with ``-o output`` (``label --local``: no API server)."""
    try:
        kubectl = catalog.binary("kubernetes", "kubectl")
    except catalog.MissingPart as exc:
        pytest.skip(f"no kubectl: {exc}")
    done = subprocess.run([kubectl, "label", "--local", "-f", "-", "bench/seen=yes", "-o", output],
                          input="---\n".join(yaml.safe_dump(o) for o in objects), capture_output=True, text=True,
                          check=True, timeout=60)
    return done.stdout.splitlines(keepends=True)


def pod(name: str, node: str | None = None, cluster: str | None = None) -> dict[str, object]:
    metadata: dict[str, object] = {"name": name, "namespace": "bench"}
    if cluster:
        metadata["labels"] = {"ray.io/cluster": cluster}
    spec: dict[str, object] = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def test_a_pod_is_seen_once_and_bound_once_with_its_raycluster() -> None:
    times = PodTimes()
    for line, now in zip(printed(POD_LINE, pod("rc-1-head", cluster="rc-1"), pod("plain-0")), (1.0, 1.5)):
        times.pod(line, now)
    for line, now in zip(printed(POD_LINE, pod("rc-1-head", "kwok-1", "rc-1"), pod("plain-0", "kwok-2")), (3.0, 3.5)):
        times.pod(line, now)
    for line in printed(POD_LINE, pod("rc-1-head", "kwok-1", "rc-1")):
        times.pod(line, 9.0)  # a later event of a bound pod (its status) moves nothing
    assert times.seen == {"rc-1-head": 1.0, "plain-0": 1.5}
    assert times.bound == {"rc-1-head": 3.0, "plain-0": 3.5}
    assert times.cluster_of == {"rc-1-head": "rc-1"}


def test_a_rayclusters_latency_runs_from_its_sighting_to_its_last_pod_bound() -> None:
    times = PodTimes()
    ray_cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc-1", "namespace": "bench"}}
    for line in printed(NAME_LINE, ray_cluster):
        times.raycluster(line, 0.5)
    for name, node, cluster, seen, bound in (("rc-1-head", "kwok-1", "rc-1", 1.0, 2.0),
                                             ("rc-1-worker", "kwok-2", "rc-1", 1.2, 4.0),
                                             ("plain-0", "kwok-3", None, 2.0, 2.25)):
        times.pod(printed(POD_LINE, pod(name, cluster=cluster))[0], seen)
        times.pod(printed(POD_LINE, pod(name, node, cluster))[0], bound)
    assert times.clusters == {"rc-1": 0.5}
    assert times.latencies() == [0.25, 3.5]  # plain-0: 2.0 -> 2.25; rc-1: 0.5 -> its worker's 4.0
