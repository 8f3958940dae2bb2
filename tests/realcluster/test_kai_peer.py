"""The real KAI Scheduler on the dev cluster (issue 32): its programs from ``make tools``, run as its
operator runs them (``shared.parts.kai``), scheduling KWOK nodes' pods that real KubeRay makes.

- a RayCluster labelled for a KAI queue is gang-scheduled: KubeRay (``--batch-scheduler=kai-scheduler``)
  gives its pods KAI's scheduler name and queue label, KAI's pod grouper makes its PodGroup, KAI's
  scheduler and binder bind every pod; a second RayCluster one CPU too big for what is left gets no
  pod bound at all, until the first goes, and then all of them;
- preemption: a priority-125 pod takes the CPUs of one priority-50 pod of its queue, which KAI evicts;
- GPU fractions: two ``gpu-fraction: "0.5"`` pods are mutated by KAI's admission webhook, share one
  GPU of a GPU node (one reservation pod, one GPU group: binpack), and a pod asking a fraction and a
  whole GPU at once is refused by its validating webhook.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from shared.parts import kai, kwok
from shared.parts.devcluster import DevCluster
from tests.builders.cli import invoke
from tests.realcluster.conftest import create, eventually, get
from tests.realcluster.test_cli_cluster import NODES, _alive

QUEUE = "team-a"


@pytest.fixture(scope="module")
def kai_running(devcluster: DevCluster) -> Iterator[kai.Kai]:
    """KAI's programs beside the session's cluster, KubeRay with ``--batch-scheduler=kai-scheduler``;
    afterwards KAI is stopped (its webhooks removed) and KubeRay has no batch scheduler again."""
    devcluster.reset()
    devcluster.start_kuberay("kai-scheduler")
    handle = kai.start(devcluster)
    try:
        yield handle
    finally:
        handle.stop()
        devcluster.start_kuberay("none")


@pytest.fixture
def kai_cluster(devcluster: DevCluster, kai_running: kai.Kai) -> Iterator[DevCluster]:
    """The cluster emptied (``reset``), KAI's defaults back (the reset deletes its namespaces, queues and
    PriorityClasses) and a queue ``team-a`` under the chart's ``default-parent-queue``."""
    devcluster.reset()
    kai.install_defaults(devcluster)
    unlimited = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
    create(devcluster, {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": QUEUE},
                        "spec": {"parentQueue": "default-parent-queue",
                                 "resources": {"cpu": unlimited, "gpu": unlimited, "memory": unlimited}}})
    yield devcluster
    assert not kai_running.problems(), kai_running.problems()


def ray_cluster(name: str, workers: int) -> dict[str, Any]:
    container = {"image": "rayproject/ray:2.50.1", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": name, "namespace": "default", "labels": {kai.QUEUE_LABEL: QUEUE}},
            "spec": {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head", **container}]}}},
                     "workerGroupSpecs": [{"groupName": "workers", "replicas": workers, "minReplicas": workers,
                                           "maxReplicas": workers,
                                           "template": {"spec": {"containers": [{"name": "ray-worker", **container}]}}}]}}


def pods(cluster: DevCluster, selector: str, namespace: str = "default") -> list[dict[str, Any]]:
    listed = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    return list(json.loads(listed)["items"])


def bound(cluster: DevCluster, selector: str) -> list[str]:
    return sorted(p["spec"]["nodeName"] for p in pods(cluster, selector) if p["spec"].get("nodeName"))


def test_a_raycluster_in_a_kai_queue_is_gang_scheduled_by_kai(kai_cluster: DevCluster) -> None:
    create(kai_cluster, *(kwok.node(f"kai-cpu-{i}", {"cpu": "4", "memory": "16Gi"}) for i in (1, 2)))
    create(kai_cluster, ray_cluster("fits", 3))  # 4 CPUs of the 8
    eventually(lambda: len(bound(kai_cluster, "ray.io/cluster=fits")) == 4, "fits: its 4 pods bound")
    made = pods(kai_cluster, "ray.io/cluster=fits")
    assert {p["spec"]["schedulerName"] for p in made} == {kai.SCHEDULER_NAME}
    assert {p["metadata"]["labels"][kai.QUEUE_LABEL] for p in made} == {QUEUE}
    eventually(lambda: all(p["status"].get("phase") == "Running" for p in pods(kai_cluster, "ray.io/cluster=fits")),
               "fits: its pods Running on the KWOK nodes")
    groups = json.loads(kai_cluster.kubectl("get", "podgroups.scheduling.run.ai", "-n", "default", "-o",
                                            "json").stdout)["items"]
    fits = [g for g in groups if g["metadata"]["ownerReferences"][0]["name"] == "fits"]
    assert len(fits) == 1 and fits[0]["spec"]["minMember"] == 4 and fits[0]["spec"]["queue"] == QUEUE, fits

    create(kai_cluster, ray_cluster("too-big", 4))  # 5 CPUs, 4 left: all or nothing
    eventually(lambda: len(pods(kai_cluster, "ray.io/cluster=too-big")) == 5, "too-big: KubeRay made its 5 pods")
    eventually(lambda: any(g["metadata"]["ownerReferences"][0]["name"] == "too-big" for g in json.loads(
        kai_cluster.kubectl("get", "podgroups.scheduling.run.ai", "-n", "default", "-o", "json").stdout)["items"]),
        "too-big: its PodGroup")
    # KAI's scheduling cycle is a second; a few of them pass without a pod of too-big bound
    waited = eventually(lambda: _unschedulable_event(kai_cluster, "too-big"), "too-big: KAI says why it waits")
    assert bound(kai_cluster, "ray.io/cluster=too-big") == [], waited

    kai_cluster.kubectl("delete", "raycluster", "fits", "-n", "default", "--wait=true")
    eventually(lambda: len(bound(kai_cluster, "ray.io/cluster=too-big")) == 5, "too-big: all 5 bound once fits went")


def _unschedulable_event(cluster: DevCluster, owner: str) -> str | None:
    events = json.loads(cluster.kubectl("get", "events", "-n", "default", "-o", "json").stdout)["items"]
    for event in events:
        involved = event["involvedObject"]
        if involved.get("kind") == "PodGroup" and owner in involved.get("name", "") and event.get("reason") == "Unschedulable":
            return str(event.get("message"))
    return None


def queue(name: str, cpu_millis: int, parent: str | None = None) -> dict[str, Any]:
    """A KAI queue; its CPU quota is in millicores (KAI's unit), GPU quota none, memory unlimited."""
    spec: dict[str, Any] = {"resources": {"cpu": {"quota": cpu_millis, "limit": -1, "overQuotaWeight": 1},
                                          "gpu": {"quota": 0, "limit": -1, "overQuotaWeight": 1},
                                          "memory": {"quota": -1, "limit": -1, "overQuotaWeight": 1}}}
    if parent:
        spec["parentQueue"] = parent
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def test_an_inference_pod_preempts_a_train_pod_of_its_queue(kai_cluster: DevCluster) -> None:
    """KAI's preempt action on KWOK: priority 125 (inference, not preemptible, so within its queue's quota
    and its parent's) takes the CPU of one priority-50 (train) pod of the same queue, which KAI evicts."""
    create(kai_cluster, kwok.node("kai-cpu-1", {"cpu": "16", "memory": "64Gi"}),
           queue("dept", 16000), queue("team-b", 16000, parent="dept"))
    low = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "low", "namespace": "default"},
           "spec": {"parallelism": 4, "completions": 4, "template": {
               "metadata": {"labels": {kai.QUEUE_LABEL: "team-b"}},
               "spec": {"schedulerName": kai.SCHEDULER_NAME, "priorityClassName": "train", "restartPolicy": "Never",
                        "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "2"}}}]}}}}
    create(kai_cluster, low)
    eventually(lambda: len(bound(kai_cluster, "job-name=low")) == 4, "low: its 4 train pods bound (8 of 16 CPUs)")
    first = {p["metadata"]["name"] for p in pods(kai_cluster, "job-name=low")}
    create(kai_cluster, {"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": "urgent", "namespace": "default",
                                      "labels": {kai.QUEUE_LABEL: "team-b", "app": "urgent"}},
                         "spec": {"schedulerName": kai.SCHEDULER_NAME, "priorityClassName": "inference",
                                  "containers": [{"name": "c", "image": "busybox",
                                                  "resources": {"requests": {"cpu": "10"}}}]}})
    eventually(lambda: bound(kai_cluster, "app=urgent") == ["kai-cpu-1"], "urgent bound, 10 CPUs")

    def evicted() -> set[str]:
        left = {p["metadata"]["name"] for p in pods(kai_cluster, "job-name=low")
                if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")}
        return first - left if left < first else set()
    gone = eventually(evicted, "one train pod evicted")
    assert len(gone) == 1, gone  # 3 x 2 + 10 = 16 CPUs
    eventually(lambda: len(bound(kai_cluster, "job-name=low")) == 3 and len(pods(kai_cluster, "job-name=low")) == 4,
               "the Job's new pod made, and waiting: no room")


def fraction_pod(name: str, fraction: str, *, whole: bool = False) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "128Mi"}}
    if whole:
        resources["limits"] = {"nvidia.com/gpu": "1"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {kai.QUEUE_LABEL: QUEUE, "app": "fraction"},
                         "annotations": {"gpu-fraction": fraction}},
            "spec": {"schedulerName": kai.SCHEDULER_NAME,
                     "containers": [{"name": "main", "image": "ubuntu", "resources": resources}]}}


def test_gpu_fractions_share_one_gpu_and_a_bad_request_is_refused(kai_cluster: DevCluster) -> None:
    create(kai_cluster, kwok.node("kai-gpu-1", {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"}),
           kwok.node("kai-cpu-1", {"cpu": "8", "memory": "32Gi"}))
    create(kai_cluster, fraction_pod("half-a", "0.5"), fraction_pod("half-b", "0.5"))
    eventually(lambda: bound(kai_cluster, "app=fraction") == ["kai-gpu-1", "kai-gpu-1"],
               "both halves bound to the GPU node")
    made = pods(kai_cluster, "app=fraction")
    # admission's mutation: the GPU sharing configmap named on the pod, the nvidia RuntimeClass set
    assert all(p["spec"].get("runtimeClassName") == "nvidia" for p in made), [p["spec"] for p in made]
    groups = {p["metadata"]["labels"].get("runai-gpu-group") for p in made}
    assert len(groups) == 1 and None not in groups, groups  # binpack: one GPU shared
    reservations = pods(kai_cluster, "app=kai-resource-reservation", namespace="kai-resource-reservation")
    assert len(reservations) == 1 and reservations[0]["spec"]["nodeName"] == "kai-gpu-1", reservations
    eventually(lambda: all(p["status"].get("phase") == "Running" for p in pods(kai_cluster, "app=fraction")),
               "both halves Running")

    refused = kai_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(fraction_pod("both", "0.5", whole=True)),
                                  check=False)
    assert refused.returncode != 0
    assert "cannot have both GPU fraction request and whole GPU resource request/limit" in refused.stderr
    assert get(kai_cluster, "pod", "both", "default") is None


def test_devcluster_up_with_peer_kai_leaves_kai_running_and_down_stops_it(tmp_path: Path) -> None:
    """``muster devcluster up --peer kai`` (``make devcluster PEER=kai``): KubeRay defaults to
    ``--batch-scheduler=kai-scheduler``, KAI's programs are the cluster's parts, ``down`` stops them."""
    root = tmp_path / "dc"
    up = subprocess.run([sys.executable, "-m", "shared.cli.main", "devcluster", "up", "--dir", str(root),
                         "--nodes", str(NODES), "--peer", "kai"], capture_output=True, text=True, timeout=400)
    pids: dict[str, int] = {}
    try:
        assert up.returncode == 0, up.stderr
        assert "--batch-scheduler=kai-scheduler, peer kai running" in up.stdout
        state = json.loads((root / "state.json").read_text())
        pids = state["pids"]
        assert {f"kai-{program}" for program in kai.PROGRAMS} <= set(pids)
        assert state["batch_scheduler"] == "kai-scheduler"
        assert all(_alive(pid) for pid in pids.values())
    finally:
        down = invoke("devcluster", "down", "--dir", root)
    assert down.exit_code == 0, down.output
    assert "kai-scheduler" in down.output
    assert not any(_alive(pid) for pid in pids.values())
