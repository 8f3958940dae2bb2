"""The simulated KubeRay with each ``--batch-scheduler`` plugin: what pods, clusters and PodGroups get.

Each expectation is what KubeRay's plugin does (ray-operator/controllers/ray/batchscheduler/*):
see shared/sim/batchscheduler.py for the table.
"""

from __future__ import annotations

import pytest

from shared.kernel.kube import rayjob_cluster_name
from tests.builders import node, ray_cluster, ray_job, worker_group
from tests.builders.sim import SimHarness, effect

VOLCANO = {"volcano.sh/queue-name": "research", "ray.io/priority-class-name": "high"}


def pod_groups(h: SimHarness) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in h.sim.api.objects("PodGroup", "default")}


def test_volcano_gives_a_raycluster_a_podgroup_and_its_pods_the_group():
    cluster = ray_cluster("rc", labels=VOLCANO, head={"cpu": "1", "memory": "2Gi"},
                          workers=[worker_group("w", 2, {"cpu": "2", "memory": "1Gi"})])
    h = SimHarness(batch_scheduler="volcano").apply(cluster)
    group = pod_groups(h)["ray-rc-pg"]
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"] == {"minMember": 3, "minResources": {"cpu": "5", "memory": "4Gi"},
                             "queue": "research", "priorityClassName": "high"}
    owner = group["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("RayCluster", "rc", True)
    head, worker, _ = h.pods()
    for pod, task in ((head, "headgroup"), (worker, "w")):
        assert pod["spec"]["schedulerName"] == "volcano"
        assert pod["metadata"]["annotations"] == {"scheduling.k8s.io/group-name": "ray-rc-pg",
                                                  "volcano.sh/task-spec": task}
        assert pod["metadata"]["labels"]["volcano.sh/queue-name"] == "research"
        assert pod["metadata"]["labels"]["ray.io/priority-class-name"] == "high"


def test_volcano_resizes_the_podgroup_when_the_cluster_changes():
    h = SimHarness(batch_scheduler="volcano").apply(ray_cluster("rc", labels=VOLCANO, workers=[worker_group("w", 1)]))
    h.apply(ray_cluster("rc", labels=VOLCANO, workers=[worker_group("w", 3)]), at=1.0)
    assert pod_groups(h)["ray-rc-pg"]["spec"]["minMember"] == 4


def test_volcano_gives_a_rayjob_one_podgroup_with_the_submitter_in_its_resources_not_its_members():
    h = SimHarness(batch_scheduler="volcano").apply(node("n1", cpu="64", memory="256Gi"), ray_job("rj", labels=VOLCANO))
    assert pod_groups(h) == {}  # suspended: nothing yet
    h.perform(effect("unsuspend", "RayJob", "rj"), at=1.0)
    groups = pod_groups(h)
    assert list(groups) == ["ray-rj-pg"]  # the job's cluster gets none of its own
    assert groups["ray-rj-pg"]["spec"]["minMember"] == 2
    assert groups["ray-rj-pg"]["spec"]["minResources"] == {"cpu": "2500m", "memory": "3272Mi"}
    cluster = h.sim.get("RayCluster", "default", rayjob_cluster_name("rj"))
    assert cluster["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "ray-rj-pg"
    assert cluster["metadata"]["labels"]["volcano.sh/queue-name"] == "research"
    assert {p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] for p in h.pods()} == {"ray-rj-pg"}
    h.bind_all("n1", at=1.0).advance(3.0)
    submitter = [p for p in h.pods() if p["metadata"]["labels"].get("batch.kubernetes.io/job-name") == "rj"][0]
    assert submitter["spec"]["schedulerName"] == "volcano"
    assert submitter["metadata"]["annotations"]["volcano.sh/task-spec"] == "submitter"


def test_volcano_shrinks_a_finished_rayjobs_podgroup_to_what_is_left():
    job = ray_job("rj", labels=VOLCANO, annotations={"muster.dev/sim-duration": "5s"})
    h = SimHarness(batch_scheduler="volcano").apply(node("n1", cpu="64", memory="256Gi"), job)
    h.perform(effect("unsuspend", "RayJob", "rj"), at=1.0)
    h.bind_all("n1", at=1.0).advance(3.0)
    h.bind_all("n1", at=3.0).advance(20.0)
    assert h.sim.get("RayJob", "default", "rj")["status"]["jobDeploymentStatus"] == "Complete"
    assert pod_groups(h)["ray-rj-pg"]["spec"] == {"minMember": 2, "minResources": {"cpu": "2", "memory": "3Gi"},
                                                  "queue": "research", "priorityClassName": "high"}


def test_volcano_refuses_a_rayjob_on_an_existing_cluster():
    job = ray_job("rj", labels=VOLCANO)
    del job["spec"]["rayClusterSpec"]
    job["spec"]["clusterSelector"] = {"ray.io/cluster": "shared"}
    h = SimHarness(batch_scheduler="volcano").apply(job)
    h.perform(effect("unsuspend", "RayJob", "rj"), at=1.0)
    assert h.sim.get("RayJob", "default", "rj")["status"] == {"jobDeploymentStatus": "Initializing"}


def test_kai_names_itself_and_carries_the_queue_label():
    h = SimHarness(batch_scheduler="kai-scheduler").apply(ray_cluster("rc", labels={"kai.scheduler/queue": "team-a"}))
    assert pod_groups(h) == {}  # KAI's own pod grouper makes them
    for pod in h.pods():
        assert pod["spec"]["schedulerName"] == "kai-scheduler"
        assert pod["metadata"]["labels"]["kai.scheduler/queue"] == "team-a"


@pytest.mark.parametrize("setting, mode, refused", [
    ("kai-scheduler", None, True), ("kai-scheduler", "HTTPMode", False), ("kai-scheduler", "SidecarMode", False),
    ("scheduler-plugins", "HTTPMode", True), ("none", None, False),
])
def test_plugins_that_cannot_gang_a_rayjob_leave_it_initializing_without_a_cluster(setting, mode, refused):
    h = SimHarness(batch_scheduler=setting).apply(ray_job("rj", submission_mode=mode))
    h.perform(effect("unsuspend", "RayJob", "rj"), at=1.0)
    assert (h.sim.get("RayCluster", "default", rayjob_cluster_name("rj")) is None) == refused
    assert h.sim.get("RayJob", "default", "rj")["status"]["jobDeploymentStatus"] == "Initializing"


def test_scheduler_plugins_gang_label_brings_a_podgroup_named_after_the_cluster():
    gang = ray_cluster("rc", labels={"ray.io/gang-scheduling-enabled": "true"}, workers=[worker_group("w", 2)])
    h = SimHarness(batch_scheduler="scheduler-plugins").apply(gang, ray_cluster("plain"))
    groups = pod_groups(h)
    assert list(groups) == ["rc"]
    assert groups["rc"]["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert groups["rc"]["spec"] == {"minMember": 3, "minResources": {"cpu": "3", "memory": "4Gi"}}
    for pod in h.pods(cluster="rc"):
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "rc"
    for pod in h.pods(cluster="plain"):
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
        assert "scheduling.x-k8s.io/pod-group" not in pod["metadata"]["labels"]


def test_none_keeps_the_templates_scheduler():
    cluster = ray_cluster("rc", labels=VOLCANO, workers=[worker_group("w", 1, schedulerName="muster")])
    h = SimHarness().apply(cluster)
    assert [p["spec"]["schedulerName"] for p in h.pods()] == ["default-scheduler", "muster"]
    assert pod_groups(h) == {}


SUSPENDED = {
    # setting -> the suspended workload real KubeRay runs with it (KAI refuses K8sJobMode RayJobs,
    # scheduler-plugins every RayJob)
    "none": ray_job("w", labels={"volcano.sh/queue-name": "q"}),
    "volcano": ray_job("w", labels={"volcano.sh/queue-name": "q"}),
    "kai-scheduler": ray_job("w", labels={"kai.scheduler/queue": "q"}, submission_mode="SidecarMode"),
    "scheduler-plugins": ray_cluster("w", suspend=True, labels={"ray.io/gang-scheduling-enabled": "true"}),
}


@pytest.mark.parametrize("setting", list(SUSPENDED))
def test_a_suspend_gated_workload_is_admitted_and_runs_with_every_setting(setting):
    import yaml

    from shared.runtime.simulate import simulate
    from shared.sim.scenario import parse_scenario

    queue = ({"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "q"},
              "spec": {"resources": {r: {"quota": -1, "limit": -1, "overQuotaWeight": 1}
                                     for r in ("cpu", "gpu", "memory")}}}
             if setting == "kai-scheduler" else
             {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "q"},
              "spec": {"weight": 1}})
    scenario = parse_scenario(yaml.safe_dump({
        "name": f"suspended-{setting}", "cluster": {"kuberay": {"batch_scheduler": setting},
                                                   "nodes": [{"name": "n1", "capacity": {"cpu": "16", "memory": "64Gi"}}]},
        "steps": [{"at": "0s", "apply": yaml.safe_dump_all([queue, SUSPENDED[setting]])}],
        "until": "30s",
        "expect": [{"at": "20s", "workload": "default/w", "phase": "Running", "pods_bound": 2}]}))
    run = simulate(scenario)
    assert run.check() == []
    pods = run.runtime.cluster.api.objects("Pod", "default")
    assert pods and {p["spec"]["schedulerName"] for p in pods} == {
        "none": {"default-scheduler"}, "volcano": {"volcano"}, "kai-scheduler": {"kai-scheduler"},
        "scheduler-plugins": {"scheduler-plugins-scheduler"}}[setting]
