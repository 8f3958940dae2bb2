"""PodGroups real KubeRay makes for a RayCluster / RayJob are the workload's gang definition.

Shapes as KubeRay writes them (ray-operator/controllers/ray/batchscheduler): ``--batch-scheduler
volcano`` makes ``scheduling.volcano.sh/v1beta1`` PodGroup ``ray-<name>-pg`` (controller owner the
RayCluster or RayJob; minMember, minResources, queue from ``volcano.sh/queue-name``,
priorityClassName from ``ray.io/priority-class-name``) and annotates the pods with
``scheduling.k8s.io/group-name``; ``scheduler-plugins`` makes ``scheduling.x-k8s.io/v1alpha1``
PodGroup named after the RayCluster (owner the RayCluster) and labels the pods
``scheduling.x-k8s.io/pod-group``. The pods stay the Ray workload's: never a plain gang of their own.
"""

from __future__ import annotations

from typing import Any

from shared.kernel.events import WorkloadUpdated
from tests.builders import ray_cluster, ray_job, worker_group
from tests.builders.admission import AdmissionDriver, priority_class, volcano_queue
from tests.builders.placement import ray_pod


def volcano_group(owner: dict, min_member: int, **spec: Any) -> dict:
    meta = owner["metadata"]
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": f"ray-{meta['name']}-pg", "namespace": meta["namespace"],
                         "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": owner["kind"], "name": meta["name"],
                                              "uid": "u-1", "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"minMember": min_member, "minResources": {"cpu": "3"}, **spec},
            "status": {"phase": "Pending"}}


def coscheduling_group(cluster: str, min_member: int) -> dict:
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": cluster, "namespace": "default",
                         "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": cluster,
                                              "uid": "u-2"}]},
            "spec": {"minMember": min_member, "minResources": {"cpu": "3"}}}


def test_volcano_podgroup_gives_the_minimum_and_the_queue_and_the_rest_is_elastic() -> None:
    d = AdmissionDriver()
    d.add(volcano_queue("q1"), volcano_queue("q2"), priority_class("high", 1000))
    rc = ray_cluster("rc", labels={"volcano.sh/queue-name": "q1"},
                     workers=[worker_group("a", 2), worker_group("b", 2)])
    assert d.submitted(rc).gang.min_member == 5
    out = d.send(volcano_group(rc, 2, queue="q2", priorityClassName="high"))
    assert len(out) == 1 and isinstance(out[0], WorkloadUpdated)
    spec = out[0].workload
    assert (spec.queue, spec.priority, spec.gang.min_member) == ("q2", 1000, 2)
    assert [(ps.name, ps.count, ps.elastic) for ps in spec.gang.pod_sets] == [("head", 1, 0), ("a", 1, 1), ("b", 0, 2)]
    assert d.send(volcano_group(rc, 2, queue="q2", priorityClassName="high"), "Modified") == []  # same group
    back = d.send(volcano_group(rc, 2), "Deleted")
    assert back[0].workload.queue == "q1" and back[0].workload.gang.min_member == 5


def test_a_stale_min_member_never_asks_for_more_pods_than_kuberay_makes() -> None:
    d = AdmissionDriver()
    rc = ray_cluster("rc", workers=[worker_group("w", 1)])
    d.send(volcano_group(rc, 9))
    assert d.submitted(rc).gang.min_member == 2


def test_volcano_podgroup_of_a_rayjob_keeps_the_submitter_out_of_the_minimum() -> None:
    d = AdmissionDriver()
    job = ray_job("rj", workers=[worker_group("w", 3)])
    d.send(volcano_group(job, 2))
    spec = d.submitted(job)
    assert [(ps.name, ps.count, ps.elastic, ps.in_gang) for ps in spec.gang.pod_sets] == [
        ("head", 1, 0, True), ("w", 1, 2, True), ("submitter", 1, 0, False)]


def test_scheduler_plugins_podgroup_of_a_rayjobs_cluster_is_the_rayjobs() -> None:
    """scheduler-plugins names the group after the RayCluster, which for a RayJob is the job's own cluster."""
    d = AdmissionDriver()
    job = ray_job("rj", workers=[worker_group("w", 3)])
    assert d.submitted(job).gang.min_member == 4
    cluster = ray_cluster("rj-abcde", labels={"ray.io/originated-from-crd": "RayJob",
                                              "ray.io/originated-from-cr-name": "rj"})
    assert d.send(cluster) == []
    out = d.send(coscheduling_group("rj-abcde", 3))
    assert out[0].workload.key == "default/rj" and out[0].workload.gang.min_member == 3


def test_the_groups_pods_stay_the_ray_workloads() -> None:
    d = AdmissionDriver()
    rc = ray_cluster("rc", workers=[worker_group("w", 1)])
    d.submitted(rc)
    volcano_pod = ray_pod("rc", "w", 0)
    volcano_pod["metadata"]["annotations"].update({"scheduling.k8s.io/group-name": "ray-rc-pg",
                                                   "volcano.sh/task-spec": "w"})
    plugins_pod = ray_pod("rc", "head")
    plugins_pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = "rc"
    assert d.add(coscheduling_group("rc", 2), volcano_pod, plugins_pod) == []
