from shared.kernel.kube import pod_requests, rayjob_cluster_name, short_hash
from tests.builders import node, pod_template, ray_job, worker_group
from tests.builders.sim import SimHarness, effect

CLUSTER = rayjob_cluster_name("rj")


def submitter_name(job: str = "rj", generation: int = 0) -> str:
    return f"{job}-{short_hash(job, 'submitter', generation)}"


def job_status(h: SimHarness, name: str = "rj") -> dict:
    return h.sim.get("RayJob", "default", name)["status"]


def started(h: SimHarness, job: dict, *, at: float = 1.0) -> SimHarness:
    """Apply a suspended job, unsuspend it and bind every pod as it appears until the job runs."""
    h.apply(node("n1", cpu="64", memory="256Gi"), job, at=0.0)
    h.perform(effect("unsuspend", "RayJob", job["metadata"]["name"]), at=at)
    h.bind_all("n1", at=at).advance(at + 2.0)      # Ray pods Running -> cluster ready -> submitter
    h.bind_all("n1", at=at + 2.0).advance(at + 4.0)  # submitter Running -> job Running
    return h


def test_suspended_job_has_no_cluster():
    h = SimHarness().apply(ray_job("rj"))
    assert job_status(h) == {"jobDeploymentStatus": "Suspended"}
    assert h.sim.get("RayCluster", "default", CLUSTER) is None
    assert h.pod_names() == []


def test_unsuspended_job_creates_its_cluster_and_pods():
    h = SimHarness().apply(ray_job("rj", labels={"kai.scheduler/queue": "team-a"}))
    h.perform(effect("unsuspend", "RayJob", "rj"), at=1.0)
    cluster = h.sim.get("RayCluster", "default", CLUSTER)
    assert cluster["metadata"]["labels"] == {"kai.scheduler/queue": "team-a", "ray.io/originated-from-crd": "RayJob",
                                             "ray.io/originated-from-cr-name": "rj"}
    owner = cluster["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("RayJob", "rj")
    assert job_status(h) == {"jobDeploymentStatus": "Initializing", "rayClusterName": CLUSTER}
    head = h.pods()[0]
    assert head["metadata"]["name"] == f"{CLUSTER}-head-{short_hash(CLUSTER, 'headgroup', 0, 0)}"
    assert head["metadata"]["labels"] == {"ray.io/cluster": CLUSTER, "ray.io/node-type": "head",
                                          "ray.io/group": "headgroup"}  # as labelPod: never the RayJob


def test_submitter_pod_comes_when_the_cluster_is_ready():
    h = SimHarness().apply(node("n1"), ray_job("rj"))
    h.perform(effect("unsuspend", "RayJob", "rj"), at=1.0)
    assert submitter_name() not in h.pod_names()
    h.bind_all("n1", at=1.0).advance(3.0)
    submitter = h.sim.get("Pod", "default", submitter_name())
    job = h.sim.get("Job", "default", "rj")  # createNewK8sJob: a batch/v1 Job named as the RayJob, which it owns
    assert job["metadata"]["labels"] == {"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": "rj",
                                         "app.kubernetes.io/created-by": "kuberay-operator"}
    assert [(o["kind"], o["name"]) for o in job["metadata"]["ownerReferences"]] == [("RayJob", "rj")]
    uid = job["metadata"]["uid"]
    assert submitter["metadata"]["labels"] == {"batch.kubernetes.io/job-name": "rj", "job-name": "rj",
                                               "batch.kubernetes.io/controller-uid": uid, "controller-uid": uid}
    assert [(o["kind"], o["name"], o["controller"]) for o in submitter["metadata"]["ownerReferences"]] == [
        ("Job", "rj", True)]
    assert pod_requests(submitter["spec"]) == {"cpu": 500, "memory": 200 * 1024**2 * 1000}
    assert submitter["spec"]["schedulerName"] == "default-scheduler"
    assert submitter["status"] == {"phase": "Pending"}
    assert job_status(h)["jobDeploymentStatus"] == "Initializing"
    h.bind_all("n1", at=3.0).advance(5.0)
    assert job_status(h) == {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterName": CLUSTER,
                             "startTime": "1970-01-01T00:00:05Z"}


def test_submitter_pod_template_resources_are_used():
    job = ray_job("rj")
    job["spec"]["submitterPodTemplate"] = pod_template({"cpu": "2", "memory": "1Gi"}, name="submit")
    h = SimHarness().apply(node("n1"), job)
    h.perform(effect("unsuspend", "RayJob", "rj"), at=1.0).bind_all("n1", at=1.0).advance(3.0)
    submitter = h.sim.get("Pod", "default", submitter_name())
    assert pod_requests(submitter["spec"]) == {"cpu": 2000, "memory": 1024**3 * 1000}


def test_job_runs_for_its_sim_duration_then_tears_down():
    h = started(SimHarness(), ray_job("rj", annotations={"muster.dev/sim-duration": "2m"}))
    assert job_status(h)["jobStatus"] == "RUNNING"
    h.advance(124.9)
    assert job_status(h)["jobStatus"] == "RUNNING"
    h.take_watch()
    h.advance(125.0)
    assert job_status(h)["jobStatus"] == "SUCCEEDED"
    assert job_status(h)["jobDeploymentStatus"] == "Complete"
    assert h.sim.get("RayCluster", "default", CLUSTER) is None
    assert h.phases() == {submitter_name(): "Succeeded"}
    assert h.take_watch()[:3] == [("Modified", "RayJob", "rj"), ("Modified", "Pod", submitter_name()),
                                  ("Deleted", "RayCluster", CLUSTER)]


def test_failed_outcome_and_ttl_before_teardown():
    job = ray_job("rj", annotations={"muster.dev/sim-duration": "10", "muster.dev/sim-outcome": "Failed"})
    job["spec"]["ttlSecondsAfterFinished"] = 30
    h = started(SimHarness(), job)
    h.advance(15.0)
    assert (job_status(h)["jobStatus"], job_status(h)["jobDeploymentStatus"]) == ("FAILED", "Failed")
    assert h.phases()[submitter_name()] == "Failed"
    h.advance(44.9)
    assert h.sim.get("RayCluster", "default", CLUSTER) is not None
    h.advance(45.0)
    assert h.sim.get("RayCluster", "default", CLUSTER) is None


def test_cluster_is_kept_without_shutdown_after_job_finishes():
    h = started(SimHarness(), ray_job("rj", shutdown=False, annotations={"muster.dev/sim-duration": "5s"}))
    h.advance(100.0)
    assert job_status(h)["jobStatus"] == "SUCCEEDED"
    assert h.sim.get("RayCluster", "default", CLUSTER)["status"] == {"state": "ready"}


def test_job_without_duration_runs_until_deleted():
    h = started(SimHarness(), ray_job("rj"))
    h.advance(10_000.0)
    assert job_status(h)["jobStatus"] == "RUNNING"
    h.delete("RayJob", "rj", at=10_001.0)
    assert h.sim.get("RayCluster", "default", CLUSTER) is None
    assert h.pod_names() == []


def test_preemption_tears_down_and_a_new_run_starts_over():
    h = started(SimHarness(), ray_job("rj", annotations={"muster.dev/sim-duration": "100s"}))  # runs from t=5
    first_pods = h.pod_names()
    h.perform(effect("suspend", "RayJob", "rj"), at=50.0)
    assert job_status(h) == {"jobDeploymentStatus": "Suspended"}
    assert h.sim.get("RayCluster", "default", CLUSTER) is None
    assert h.pod_names() == []
    h.perform(effect("unsuspend", "RayJob", "rj"), at=60.0)
    h.bind_all("n1", at=60.0).advance(62.0).bind_all("n1", at=62.0).advance(64.0)
    assert job_status(h)["jobStatus"] == "RUNNING"
    assert set(h.pod_names()).isdisjoint(first_pods)
    assert submitter_name(generation=1) in h.pod_names()
    h.advance(150.0)  # the first run's end (t=105) is stale
    assert job_status(h)["jobStatus"] == "RUNNING"
    h.advance(164.0)
    assert job_status(h)["jobStatus"] == "SUCCEEDED"


def test_sidecar_mode_adds_a_container_to_the_head_and_no_submitter_pod():
    h = SimHarness().apply(node("n1"), ray_job("rj", submission_mode="SidecarMode", workers=[]))
    h.perform(effect("unsuspend", "RayJob", "rj"), at=1.0)
    (head,) = h.pods()
    assert [c["name"] for c in head["spec"]["containers"]] == ["ray", "ray-job-submitter"]
    assert pod_requests(head["spec"]) == {"cpu": 1500, "memory": (2 * 1024 + 200) * 1024**2 * 1000}
    h.bind_all("n1", at=1.0).advance(3.0)
    assert job_status(h)["jobStatus"] == "RUNNING"
    assert len(h.pod_names()) == 1


def test_lost_cluster_pod_sends_a_running_job_back_to_initializing():
    h = started(SimHarness(), ray_job("rj", workers=[worker_group("w", 1)]))
    worker = [n for n in h.pod_names() if "-w-worker-" in n][0]
    h.perform(effect("evict", "Pod", worker), at=10.0)
    assert job_status(h)["jobDeploymentStatus"] == "Initializing"
    h.bind_all("n1", at=10.0).advance(12.0)
    assert job_status(h)["jobDeploymentStatus"] == "Running"


def test_reapplying_the_manifest_keeps_the_unsuspended_state():
    job = ray_job("rj")
    h = SimHarness().apply(job)
    h.perform(effect("unsuspend", "RayJob", "rj"), at=1.0)
    h.apply(job, at=2.0)
    assert h.sim.get("RayJob", "default", "rj")["spec"]["suspend"] is False
    assert h.sim.get("RayCluster", "default", CLUSTER) is not None
