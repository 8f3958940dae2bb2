"""Status in the simulated cluster after a run: what ``kubectl get -o yaml`` would show mid-scenario."""

from __future__ import annotations

from pathlib import Path

from shared.runtime.simulate import simulate
from shared.sim.scenario import load_scenario

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def run_until(name: str, until: float):  # type: ignore[no-untyped-def]
    scenario = load_scenario(EXAMPLES / name)
    return simulate(scenario.model_copy(update={"until": until})).runtime.cluster


def test_volcano_queue_and_podgroup_say_what_muster_decided():
    cluster = run_until("volcano-gang-queue.yaml", 60)  # cluster-0 runs, cluster-1 waits for its quota
    queue = cluster.get("Queue", None, "kuberay-test-queue")["status"]
    assert {k: queue[k] for k in ("state", "pending", "inqueue", "running")} == \
        {"state": "Open", "pending": 1, "inqueue": 0, "running": 1}
    assert queue["allocated"] == {"cpu": "3", "memory": "4Gi"}
    waiting = cluster.get("PodGroup", "default", "ray-test-cluster-1-pg")["status"]
    assert waiting["phase"] == "Pending"
    assert waiting["conditions"][0]["type"] == "Unschedulable"
    assert "3/3 tasks in gang unschedulable" in waiting["conditions"][0]["message"]
    assert cluster.get("PodGroup", "default", "ray-test-cluster-0-pg")["status"]["phase"] == "Running"


def test_elastic_quota_tree_shows_used_and_the_waiting_rayjob():
    tree = run_until("kube-queue-quota-tree-rayjobs.yaml", 60).get("ElasticQuotaTree", "kube-system",
                                                                   "elasticquotatree")["status"]["queues"]
    assert tree["video"]["used"] == tree["algorithm"]["used"] == tree["root"]["used"]
    assert tree["video"]["used"]["cpu"] == "12"  # kube-queue charges a RayJob without its submitter
    # it waits in line for quota under video's max (no backoff timer: a release in video wakes it)
    assert tree["video"]["queueItemDetails"] == {
        "active": [{"name": "rayjob-video-b", "namespace": "video", "position": 1}], "backoff": []}


def test_kai_queue_shows_allocated_and_requested_with_its_children():
    cluster = run_until("kai-queues-gpu-sharing.yaml", 60)
    for name in ("department-1", "team-a"):
        status = cluster.get("Queue", None, name)["status"]
        assert status["allocated"] == status["requested"] == {"cpu": "6", "memory": "10Gi", "nvidia.com/gpu": "1"}
