"""A pod addressed to muster with no pod group is a gang of one (KAI's pod grouper, Volcano's shadow
PodGroup): workload ``namespace/<pod name>`` of kind ``Pod``, charged and placed like any other."""

from __future__ import annotations

from shared.kernel.events import WorkloadDeleted, WorkloadFinished, WorkloadRejected, WorkloadSubmitted
from shared.kernel.quantity import parse_resources
from tests.builders import pod, ray_cluster
from tests.builders.admission import AdmissionDriver, elastic_quota_tree, eqt_node, kai_queue
from tests.builders.placement import ray_pod


def test_a_plain_pod_for_muster_is_a_gang_of_one_with_its_gpu_fraction() -> None:
    d = AdmissionDriver()
    spec = d.submitted(pod("notebook", requests={"cpu": "1", "memory": "2Gi"}, annotations={"gpu-fraction": "0.5"}),
                       at=3.0)
    assert (spec.key, spec.kind, spec.name, spec.gate, spec.queue, spec.submitted_at) == (
        "default/notebook", "Pod", "notebook", "pods", "default", 3.0)
    assert spec.gang.min_member == 1 and len(spec.gang.pod_sets) == 1
    ps = spec.gang.pod_sets[0]
    assert (ps.name, ps.count, ps.elastic, ps.gpu_share) == ("pods", 1, 0, 500)
    assert spec.gang.quota_demand == {**parse_resources({"cpu": "1", "memory": "2Gi"}), "nvidia.com/gpu": 500}


def test_whole_gpus_and_the_queue_its_labels_or_namespace_name() -> None:
    d = AdmissionDriver()
    d.add(kai_queue("team-a"), elastic_quota_tree(eqt_node("root", children=[eqt_node("ml", namespaces=["ml"])])))
    whole = d.submitted(pod("trainer", requests={"cpu": "4"}, labels={"kai.scheduler/queue": "team-a"}))
    whole_limits = pod("gpu", requests={"cpu": "1"})
    whole_limits["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "2"}
    assert (whole.queue, d.submitted(whole_limits).gang.quota_demand["nvidia.com/gpu"]) == ("team-a", 2000)
    assert d.submitted(pod("p", "ml")).queue == "ml"


def test_pods_of_other_schedulers_bound_pods_and_kuberay_pods_are_not_gangs_of_one() -> None:
    d = AdmissionDriver()
    out = d.add(pod("web", scheduler="default-scheduler"),
                pod("static", node_name="n1"),        # bound before muster saw it wait: not muster's to place
                ray_pod("rc", "head"),                # its RayCluster is the workload
                ray_cluster("rc"))
    assert [(type(x).__name__, x.workload.key) for x in out] == [("WorkloadSubmitted", "default/rc")]
    assert d.send(pod("unnamed", scheduler="")) == []  # no schedulerName: not addressed to muster


def test_lifecycle_bound_then_finished_then_deleted() -> None:
    d = AdmissionDriver()
    job = pod("job")
    d.submitted(job, at=1.0)
    assert d.send(pod("job", node_name="n1", phase="Running"), "Modified", at=2.0) == []
    done = d.send(pod("job", node_name="n1", phase="Succeeded"), "Modified", at=3.0)
    assert done == [WorkloadFinished(key="default/job", outcome="Succeeded",
                                     reason="all 1 pods finished: 1 Succeeded, 0 Failed")]
    assert d.send(pod("job", node_name="n1", phase="Succeeded"), "Deleted", at=4.0) == [
        WorkloadDeleted(key="default/job")]
    again = d.send(pod("job"), at=5.0)                  # the same name again: a new workload
    assert isinstance(again[0], WorkloadSubmitted) and again[0].workload.submitted_at == 5.0


def test_a_pod_named_like_another_workload_of_its_namespace_is_refused_by_name() -> None:
    d = AdmissionDriver()
    d.submitted(ray_cluster("train"))
    assert d.rejected(pod("train")) == "workload default/train is already taken by RayCluster default/train"
    assert d.send(pod("train"), "Deleted") == [WorkloadDeleted(key="default/train")]


def test_bad_requests_are_a_rejection_naming_the_pod() -> None:
    d = AdmissionDriver()
    out = d.send(pod("bad", requests={"cpu": "lots"}))
    assert out == [WorkloadRejected(key="default/bad", kind="Pod",
                                    reason="pod bad: spec.containers[main].resources.requests.cpu: 'lots' is not a "
                                           "quantity")]


def test_what_muster_writes_on_a_pod_it_binds_never_makes_it_another_shape() -> None:
    """An earlier muster bound a whole-GPU pod with ``gpu-fraction: "1"`` (today it writes only its
    device list): read with its GPU request that would be "a fraction or whole GPUs, not both"; a
    member's shape is read once, when it comes, and muster's own mark is no request."""
    d = AdmissionDriver()
    trainer = pod("trainer", requests={"cpu": "1"})
    trainer["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    d.submitted(trainer)
    bound = pod("trainer", requests={"cpu": "1"}, node_name="n1", phase="Running",
                annotations={"gpu-fraction": "1", "muster.dev/gpu-devices": "0"})
    bound["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    assert d.send(bound, "Modified") == []

