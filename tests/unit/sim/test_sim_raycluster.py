from shared.kernel.kube import short_hash
from tests.builders import node, pod_template, ray_cluster, worker_group
from tests.builders.sim import SimHarness, effect


def head_name(cluster: str, generation: int = 0) -> str:
    return f"{cluster}-head-{short_hash(cluster, 'headgroup', 0, generation)}"


def worker_name(cluster: str, group: str, index: int, generation: int = 0) -> str:
    return f"{cluster}-{group}-worker-{short_hash(cluster, group, index, generation)}"


def test_pods_are_named_like_kuberay_with_hash_suffixes():
    h = SimHarness().apply(ray_cluster("rc", workers=[worker_group("gpu", 2)]))
    assert h.pod_names() == [head_name("rc"), worker_name("rc", "gpu", 0), worker_name("rc", "gpu", 1)]
    assert all(len(n.rsplit("-", 1)[1]) == 5 for n in h.pod_names())


def test_pod_labels_annotations_spec_and_status():
    workers = [worker_group("gpu", 1, annotations={"gpu-fraction": "0.5"})]
    h = SimHarness().apply(ray_cluster("rc", labels={"team": "a"}, workers=workers))
    head, worker = h.pods()
    assert head["metadata"]["labels"] == {
        "ray.io/cluster": "rc", "ray.io/node-type": "head", "ray.io/group": "headgroup"}
    assert worker["metadata"]["labels"] == {
        "ray.io/cluster": "rc", "ray.io/node-type": "worker", "ray.io/group": "gpu"}
    assert head["metadata"]["annotations"] == {}
    assert worker["metadata"]["annotations"] == {"gpu-fraction": "0.5"}
    assert worker["spec"]["schedulerName"] == "default-scheduler"
    assert worker["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"}}
    assert worker["status"] == {"phase": "Pending"}
    assert "nodeName" not in worker["spec"]
    owner = worker["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("RayCluster", "rc", h.sim.get("RayCluster", "default", "rc")["metadata"]["uid"])


def test_without_a_batch_scheduler_the_template_names_the_scheduler_else_the_api_server_default():
    cluster = ray_cluster("rc", workers=[worker_group("w", 1, schedulerName="muster")])
    h = SimHarness().apply(cluster)
    assert [p["spec"]["schedulerName"] for p in h.pods()] == ["default-scheduler", "muster"]


def test_worker_counts_follow_kuberay_arithmetic():
    workers = [
        worker_group("clamped-up", 0, min_replicas=2),
        worker_group("clamped-down", 5, max_replicas=3),
        worker_group("multi-host", 1, num_of_hosts=2),
        {**worker_group("off", 4), "suspend": True},
    ]
    h = SimHarness().apply(ray_cluster("rc", workers=workers))
    groups = [p["metadata"]["labels"]["ray.io/group"] for p in h.pods()]
    assert groups == ["headgroup"] + ["clamped-up"] * 2 + ["clamped-down"] * 3 + ["multi-host"] * 2


def test_autoscaling_cluster_gets_its_replicas_as_kuberay_creates_them():
    """KubeRay creates clamp(replicas) workers with autoscaling too; the autoscaler moves ``replicas``."""
    h = SimHarness().apply(ray_cluster("rc", workers=[worker_group("w", 4, min_replicas=1)],
                                       enableInTreeAutoscaling=True))
    assert len(h.pod_names()) == 5


def test_invalid_cluster_gets_no_pods():
    h = SimHarness().apply(ray_cluster("rc", workers=[worker_group("w", 1, min_replicas=3, max_replicas=2)]))
    assert h.pod_names() == []
    h.apply({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "broken"}, "spec": "nope"})
    assert h.pod_names() == []


def test_suspended_cluster_has_no_pods_until_unsuspended():
    h = SimHarness().apply(ray_cluster("rc", suspend=True))
    assert h.pod_names() == []
    assert h.sim.get("RayCluster", "default", "rc")["status"] == {"state": "suspended"}
    h.perform(effect("unsuspend", "RayCluster", "rc"), at=5.0)
    assert h.sim.get("RayCluster", "default", "rc")["spec"]["suspend"] is False
    assert h.pod_names() == [head_name("rc"), worker_name("rc", "worker", 0)]
    assert h.sim.get("RayCluster", "default", "rc").get("status") == {}


def test_suspending_deletes_pods_and_unsuspending_recreates_them_with_new_names():
    h = SimHarness().apply(ray_cluster("rc"))
    h.take_watch()
    h.perform(effect("suspend", "RayCluster", "rc"), at=1.0)
    assert h.pod_names() == []
    assert h.take_watch() == [("Modified", "RayCluster", "rc"), ("Deleted", "Pod", head_name("rc")),
                              ("Deleted", "Pod", worker_name("rc", "worker", 0)), ("Modified", "RayCluster", "rc")]
    h.perform(effect("unsuspend", "RayCluster", "rc"), at=2.0)
    assert h.pod_names() == [head_name("rc", 1), worker_name("rc", "worker", 0, 1)]


def test_deleted_cluster_takes_its_pods():
    h = SimHarness().apply(ray_cluster("rc"), ray_cluster("other"))
    h.delete("RayCluster", "rc", at=3.0)
    assert h.sim.get("RayCluster", "default", "rc") is None
    assert h.pod_names() == [head_name("other"), worker_name("other", "worker", 0)]


def test_evicted_pod_is_recreated_at_once_with_a_new_name():
    h = SimHarness().apply(node("n1"), ray_cluster("rc", workers=[worker_group("w", 2)]))
    h.bind_all("n1", at=1.0).advance(10.0)
    assert h.sim.get("RayCluster", "default", "rc")["status"] == {"state": "ready"}
    h.take_watch()
    victim = worker_name("rc", "w", 1)
    h.perform(effect("evict", "Pod", victim), at=20.0)
    replacement = worker_name("rc", "w", 1, 1)
    assert h.pod_names() == [head_name("rc"), worker_name("rc", "w", 0), replacement]
    assert h.take_watch() == [("Deleted", "Pod", victim), ("Added", "Pod", replacement),
                              ("Modified", "RayCluster", "rc")]
    assert h.sim.get("RayCluster", "default", "rc")["status"] == {}
    new = h.sim.get("Pod", "default", replacement)
    assert new["status"] == {"phase": "Pending"} and "nodeName" not in new["spec"]
    # Evicting again (a redelivered effect) changes nothing.
    h.perform(effect("evict", "Pod", victim), at=21.0)
    assert h.take_watch() == []


def test_bind_then_running_after_pod_startup():
    h = SimHarness(pod_startup=3.0).apply(node("n1"), ray_cluster("rc", workers=[]))
    head = head_name("rc")
    h.perform(effect("bind", "Pod", head, node="n1", annotations={"muster.dev/gpu-group": "g"}), at=10.0)
    pod = h.sim.get("Pod", "default", head)
    assert pod["spec"]["nodeName"] == "n1"
    assert pod["metadata"]["annotations"] == {"muster.dev/gpu-group": "g"}
    h.advance(12.999)
    assert h.phases() == {head: "Pending"}
    h.advance(13.0)
    assert h.phases() == {head: "Running"}
    assert h.sim.get("RayCluster", "default", "rc")["status"] == {"state": "ready"}


def test_bind_is_idempotent_and_never_moves_a_bound_pod():
    h = SimHarness().apply(node("n1"), node("n2"), ray_cluster("rc", workers=[]))
    head = head_name("rc")
    h.take_watch()
    h.perform(effect("bind", "Pod", head, node="n1"), at=1.0)
    h.perform(effect("bind", "Pod", head, node="n1"), at=1.0)
    h.perform(effect("bind", "Pod", head, node="n2"), at=1.0)
    assert h.take_watch() == [("Modified", "Pod", head)]
    assert h.sim.get("Pod", "default", head)["spec"]["nodeName"] == "n1"
    assert h.sim.take_timer_requests() == []  # the harness took the one request already
    h.advance(100.0)
    assert [k.split("|")[2] for _, k in h.fired] == [head]


def test_template_labels_reach_the_pods():
    tpl = pod_template({"cpu": "1"})
    tpl["metadata"] = {"labels": {"app": "ray"}}
    cluster = ray_cluster("rc", workers=[])
    cluster["spec"]["headGroupSpec"]["template"] = tpl
    pod = SimHarness().apply(cluster).pods()[0]
    assert pod["metadata"]["labels"]["app"] == "ray"
    assert pod["metadata"]["labels"]["ray.io/node-type"] == "head"


def test_the_simulator_refuses_to_create_absurd_numbers_of_pods():
    from shared.sim.kuberay import MAX_SIM_PODS, pod_slots
    from tests.builders import ray_cluster_spec, worker_group

    assert pod_slots(ray_cluster_spec(workers=[worker_group("w", MAX_SIM_PODS)])) is None
    assert len(pod_slots(ray_cluster_spec(workers=[worker_group("w", MAX_SIM_PODS - 1)]))) == MAX_SIM_PODS
