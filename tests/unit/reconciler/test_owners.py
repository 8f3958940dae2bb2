"""Which RayJob a pod serves, found at the edge from its RayCluster or its submitter Job (``owners``)."""

from __future__ import annotations

from typing import Any

from services.reconciler.owners import Owners
from shared.kernel import kube


def _owner(kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1" if kind.startswith("Ray") else "batch/v1", "kind": kind, "name": name,
            "uid": f"uid-{name}", "controller": True}


def raycluster(name: str, job: str | None = None) -> dict[str, Any]:
    """A RayCluster; with ``job``, the one KubeRay made for that RayJob (``constructRayClusterForRayJob``)."""
    meta: dict[str, Any] = {"name": name, "namespace": "team-a"}
    if job is not None:
        meta["labels"] = {kube.RAY_ORIGIN_KIND: "RayJob", kube.RAY_ORIGIN_NAME: job}
        meta["ownerReferences"] = [_owner("RayJob", job)]
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": meta}


def rayjob(name: str) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": name, "namespace": "team-a"}}


def ray_pod(name: str, cluster: str, **labels: str) -> dict[str, Any]:
    """A pod as real KubeRay labels it (``labelPod``): its RayCluster only."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-a", "labels": {kube.RAY_CLUSTER: cluster, **labels},
                         "ownerReferences": [_owner("RayCluster", cluster)]}}


def job_pod(name: str, job: str) -> dict[str, Any]:
    """A pod the Job controller made for Job ``job``."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-a", "labels": {kube.JOB_NAME: job},
                         "ownerReferences": [_owner("Job", job)]}}


def test_a_rayjob_clusters_pods_are_the_rayjobs():
    owners = Owners()
    owners.stamped("Added", raycluster("train-x7k2p", job="train"))
    pod = owners.stamped("Added", ray_pod("train-x7k2p-head-abcde", "train-x7k2p", **{kube.RAY_NODE_TYPE: "head"}))
    assert kube.workload_key_of_pod(pod) == "team-a/train"
    assert kube.workload_kind_of_pod(pod) == "RayJob"
    assert kube.pod_set_of_pod(pod) == "head"


def test_a_rayclusters_own_pods_stay_the_rayclusters_and_are_not_copied():
    owners = Owners()
    owners.stamped("Added", raycluster("rc"))
    pod = ray_pod("rc-head-abcde", "rc")
    assert owners.look_up(pod) is None
    assert owners.stamped("Added", pod) is pod
    assert (kube.workload_key_of_pod(pod), kube.workload_kind_of_pod(pod)) == ("team-a/rc", "RayCluster")


def test_a_submitter_pod_is_found_through_its_job_named_as_the_rayjob():
    owners = Owners()
    owners.stamped("Added", rayjob("train"))
    pod = owners.stamped("Added", job_pod("train-q9z4t", "train"))
    assert (kube.workload_key_of_pod(pod), kube.workload_kind_of_pod(pod)) == ("team-a/train", "RayJob")
    assert kube.pod_set_of_pod(pod) == "submitter"


def test_a_plain_jobs_pod_is_nobodys():
    owners = Owners()
    pod = job_pod("etl-abcde", "etl")
    assert owners.look_up(pod) == ("RayJob", "team-a", "etl")
    owners.learn(("RayJob", "team-a", "etl"), None)  # the API server has no such RayJob
    assert owners.look_up(pod) is None
    assert owners.stamped("Added", pod) is pod and kube.workload_key_of_pod(pod) is None


def test_a_pod_seen_before_its_cluster_names_the_cluster_to_look_up():
    owners = Owners()
    pod = ray_pod("train-x7k2p-head-abcde", "train-x7k2p")
    assert owners.look_up(pod) == ("RayCluster", "team-a", "train-x7k2p")
    owners.learn(("RayCluster", "team-a", "train-x7k2p"), raycluster("train-x7k2p", job="train"))
    assert owners.look_up(pod) is None and owners.lookups == 1
    assert kube.workload_key_of_pod(owners.stamped("Added", pod)) == "team-a/train"


def test_what_a_pod_says_of_itself_in_musters_labels_is_replaced():
    owners = Owners()
    owners.stamped("Added", raycluster("rc"))
    forged = ray_pod("rc-head-abcde", "rc", **{kube.OWNER_JOB: "someone-else", kube.SUBMITTER_LABEL: "submitter"})
    pod = owners.stamped("Added", forged)
    assert kube.OWNER_JOB not in kube.labels(pod) and kube.SUBMITTER_LABEL not in kube.labels(pod)
    assert kube.workload_key_of_pod(pod) == "team-a/rc"


def test_pods_deleted_after_their_cluster_still_find_it_within_what_is_remembered():
    owners = Owners(remembered=2)
    owners.stamped("Added", raycluster("a-1", job="a"))
    owners.stamped("Deleted", raycluster("a-1", job="a"))  # a background cascade: the pods go after
    assert kube.workload_key_of_pod(owners.stamped("Deleted", ray_pod("a-1-head-x", "a-1"))) == "team-a/a"
    for name in ("b-1", "c-1"):
        owners.stamped("Deleted", raycluster(name, job=name[0]))
    assert owners.look_up(ray_pod("a-1-head-x", "a-1")) == ("RayCluster", "team-a", "a-1")  # forgotten


def test_a_cluster_created_again_is_no_longer_forgotten():
    owners = Owners(remembered=1)
    owners.stamped("Deleted", raycluster("a-1", job="a"))
    owners.stamped("Added", raycluster("a-1", job="a"))
    owners.stamped("Deleted", raycluster("b-1", job="b"))
    assert owners.look_up(ray_pod("a-1-head-x", "a-1")) is None
