"""Plain pod gangs: min-available pods of one group become a PodGroup workload; lifecycle from its pods."""

from __future__ import annotations

import pytest

from shared.kernel.events import WorkloadDeleted, WorkloadFinished, WorkloadRejected, WorkloadSubmitted, WorkloadUpdated
from shared.kernel.model import PodSet
from shared.kernel.quantity import parse_resources
from tests.builders import pod
from tests.builders.admission import AdmissionDriver, gang_pod, pod_group, priority_class, volcano_queue


def test_sigs_style_min_available_label_submits_at_the_last_needed_pod() -> None:
    d = AdmissionDriver()
    assert d.send(gang_pod("p-0", "g", style="sigs", min_available="3", requests={"cpu": "2", "memory": "1Gi"}), at=1.0) == []
    assert d.send(gang_pod("p-1", "g", style="sigs", min_available="3"), at=2.0) == []
    out = d.send(gang_pod("p-2", "g", style="sigs", min_available="3"), at=4.0)
    assert len(out) == 1 and isinstance(out[0], WorkloadSubmitted)
    spec = out[0].workload
    assert (spec.key, spec.kind, spec.gate, spec.queue, spec.submitted_at, spec.cluster_name) == (
        "default/g", "PodGroup", "pods", "default", 4.0, "g")
    assert spec.gang.min_member == 3
    # p-0 asks 2 CPU, p-1 and p-2 the builder's default 1 CPU: one pod set per shape, first seen first
    # each pod set shows the labels of its first pod (what other pods' affinity selectors match)
    labels = {"pod-group.scheduling.sigs.k8s.io/name": "g", "pod-group.scheduling.sigs.k8s.io/min-available": "3"}
    assert spec.gang.pod_sets == (
        PodSet(name="pods", count=1, resources=parse_resources({"cpu": "2", "memory": "1Gi"}), labels=labels),
        PodSet(name="pods-2", count=2, resources=parse_resources({"cpu": "1", "memory": "1Gi"}), labels=labels))
    # a pod beyond the minimum is elastic: it runs alone when quota and nodes allow (Volcano's tasks beyond
    # minAvailable); the gang's minimum and shapes stay as submitted
    out = d.send(gang_pod("p-3", "g", style="sigs", min_available="3"), at=5.0)
    assert len(out) == 1 and isinstance(out[0], WorkloadUpdated)
    assert [(ps.name, ps.count, ps.elastic) for ps in out[0].workload.gang.pod_sets] == [("pods", 1, 0), ("pods-2", 2, 1)]
    assert out[0].workload.gang.min_member == 3 and out[0].workload.submitted_at == 4.0


def test_x_k8s_style_takes_min_member_from_the_podgroup_object() -> None:
    d = AdmissionDriver()
    assert d.add(gang_pod("a", "g"), gang_pod("b", "g")) == []           # no minimum known yet
    out = d.send(pod_group("g", 2), at=3.0)
    assert len(out) == 1 and isinstance(out[0], WorkloadSubmitted)
    assert (out[0].workload.gang.min_member, out[0].workload.submitted_at) == (2, 3.0)


def test_podgroup_object_wins_over_the_label_and_later_changes_update_the_count() -> None:
    d = AdmissionDriver()
    d.send(pod_group("g", 1))
    out = d.send(gang_pod("a", "g", min_available="5"))
    assert out[0].workload.gang.min_member == 1
    out = d.send(pod_group("g", 2), "Modified")
    assert len(out) == 1 and isinstance(out[0], WorkloadUpdated) and out[0].workload.gang.pod_sets[0].count == 2


def test_only_unbound_pods_of_our_scheduler_count() -> None:
    d = AdmissionDriver(scheduler_names=["muster"])
    assert d.add(gang_pod("other", "g", min_available="2", scheduler="default-scheduler"),
                 gang_pod("bound", "g", min_available="2", node_name="n1"),
                 gang_pod("done", "g", min_available="2", phase="Succeeded"),
                 gang_pod("a", "g", min_available="2")) == []
    out = d.send(gang_pod("b", "g", min_available="2"))
    assert len(out) == 1 and isinstance(out[0], WorkloadSubmitted)


def test_an_unset_scheduler_name_is_default_scheduler() -> None:
    pods = [gang_pod(n, "g", min_available="2") for n in ("a", "b")]
    for p in pods:
        del p["spec"]["schedulerName"]
    assert AdmissionDriver().add(*pods) == []
    out = AdmissionDriver(scheduler_names="muster,default-scheduler").add(*pods)
    assert len(out) == 1 and isinstance(out[0], WorkloadSubmitted)


def test_pods_of_any_scheduler_muster_answers_to_count() -> None:
    pods = [gang_pod(n, "g", min_available="2", scheduler="volcano") for n in ("a", "b")]
    assert AdmissionDriver().add(*pods) == []
    out = AdmissionDriver(scheduler_names=["muster", "volcano"]).add(*pods)
    assert len(out) == 1 and isinstance(out[0], WorkloadSubmitted)


def test_kuberay_pods_with_a_pod_group_label_belong_to_their_raycluster() -> None:
    p = gang_pod("rc-head-x", "rc", min_available="1", labels={"ray.io/node-type": "head", "ray.io/cluster": "rc"})
    assert AdmissionDriver().send(p) == []


def test_podgroups_kuberay_made_are_not_plain_gang_minimums() -> None:
    d = AdmissionDriver()
    owned = pod_group("h", 1, ownerReferences=[{"kind": "RayCluster", "name": "h"}])
    volcano = {**pod_group("ray-h-pg", 1, ownerReferences=[{"kind": "RayCluster", "name": "h"}]),
               "apiVersion": "scheduling.volcano.sh/v1beta1"}
    assert d.add(owned, volcano, gang_pod("b", "h")) == []


def volcano_pod(name: str, group: str, task: str = "", **kw) -> dict:
    """A plain pod of Volcano PodGroup ``group`` (annotation ``scheduling.k8s.io/group-name``), of ``task``."""
    annotations = {"scheduling.k8s.io/group-name": group, **({"volcano.sh/task-spec": task} if task else {})}
    return pod(name, annotations=annotations, **kw)


def volcano_group(name: str, min_member: int, **spec) -> dict:
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"minMember": min_member, **spec}}


def test_volcano_podgroup_counts_min_task_member_per_task_and_the_rest_is_elastic() -> None:
    """Volcano's PodGroup: minMember in all, minTaskMember per task (the pod's volcano.sh/task-spec);
    its queue and priority class choose the queue and the priority; pods beyond the minimum are elastic."""
    d = AdmissionDriver()
    d.add(volcano_queue("train"), priority_class("high", 1000))
    d.send(volcano_group("mpi", 3, minTaskMember={"launcher": 1, "worker": 1}, queue="train",
                         priorityClassName="high"))
    assert d.add(volcano_pod("w-0", "mpi", "worker", requests={"cpu": "2"}),
                 volcano_pod("w-1", "mpi", "worker", requests={"cpu": "2"})) == []
    out = d.send(volcano_pod("l-0", "mpi", "launcher", requests={"cpu": "1"}), at=4.0)   # the launcher was missing
    spec = out[0].workload
    assert (spec.key, spec.kind, spec.queue, spec.priority, spec.gang.min_member) == ("default/mpi", "PodGroup",
                                                                                      "train", 1000, 3)
    assert [(ps.name, ps.count, ps.elastic, ps.resources["cpu"]) for ps in spec.gang.pod_sets] == [
        ("worker", 2, 0, 2000), ("launcher", 1, 0, 1000)]
    # any members may make up the minimum, each task keeping its own (placement's rule)
    assert spec.gang.interchangeable and spec.gang.task_minimums == (("launcher", 1), ("worker", 1))
    out = d.send(volcano_pod("w-2", "mpi", "worker", requests={"cpu": "2"}), at=5.0)
    assert [(ps.name, ps.count, ps.elastic) for ps in out[0].workload.gang.pod_sets] == [
        ("worker", 2, 1), ("launcher", 1, 0)]
    held = d.send(volcano_pod("l-0", "mpi", "launcher", requests={"cpu": "1"}), "Deleted", at=6.0)
    assert held[0].workload.not_ready == ("Not enough valid pods of each task for gang-scheduling: task launcher "
                                          "has 0, minTaskMember 1 (pod group mpi waits for its pods)")


def test_volcano_podgroup_waits_for_each_tasks_minimum() -> None:
    d = AdmissionDriver()
    d.send(volcano_group("mpi", 2, minTaskMember={"launcher": 1}))
    assert d.add(volcano_pod("w-0", "mpi", "worker"), volcano_pod("w-1", "mpi", "worker")) == []  # no launcher
    assert isinstance(d.send(volcano_pod("l-0", "mpi", "launcher"))[0], WorkloadSubmitted)


def test_queue_and_priority_come_from_the_first_pod() -> None:
    d = AdmissionDriver()
    d.add(volcano_queue("gangs"), priority_class("hi", 500))
    first = gang_pod("a", "g", min_available="2", labels={"volcano.sh/queue-name": "gangs"})
    first["spec"]["priorityClassName"] = "hi"
    d.send(first)
    out = d.send(gang_pod("b", "g", min_available="2", labels={"kai.scheduler/queue": "elsewhere"}))
    spec = out[0].workload
    assert (spec.queue, spec.priority, spec.priority_class, spec.preemptible) == ("gangs", 500, "hi", True)


def test_gpu_fraction_and_node_selector_of_the_first_pod() -> None:
    p = gang_pod("a", "g", min_available="1", annotations={"gpu-fraction": "0.25"})
    p["spec"]["nodeSelector"] = {"pool": "gpu"}
    ps = AdmissionDriver().submitted(p).gang.pod_sets[0]
    assert (ps.gpu_share, ps.node_selector) == (250, {"pool": "gpu"})


def test_every_pod_gone_is_deleted_once_then_a_new_gang_may_start() -> None:
    d = AdmissionDriver()
    a, b = gang_pod("a", "g", min_available="2"), gang_pod("b", "g", min_available="2")
    d.add(a, b, at=1.0)
    held = d.send(a, "Deleted")   # fewer pods than the minimum: held until pods come again
    assert len(held) == 1 and held[0].workload.not_ready == (
        "Not enough valid tasks for gang-scheduling, valid: 1, min: 2 (pod group g waits for its pods)")
    assert d.send(b, "Deleted") == [WorkloadDeleted(key="default/g")]
    assert d.send(b, "Deleted") == []
    assert d.send(a, at=7.0) == []
    out = d.send(b, at=8.0)
    assert isinstance(out[0], WorkloadSubmitted) and out[0].workload.submitted_at == 8.0


@pytest.mark.parametrize(("phases", "outcome", "reason"), [
    (("Succeeded", "Succeeded"), "Succeeded", "all 2 pods finished: 2 Succeeded, 0 Failed"),
    (("Succeeded", "Failed"), "Failed", "all 2 pods finished: 1 Succeeded, 1 Failed"),
])
def test_all_pods_finished_is_finished_once(phases: tuple[str, str], outcome: str, reason: str) -> None:
    d = AdmissionDriver()
    pods = [gang_pod(n, "g", min_available="2") for n in ("a", "b")]
    d.add(*pods)
    running = [gang_pod(n, "g", min_available="2", node_name="n1", phase="Running") for n in ("a", "b")]
    assert d.add(*running) == []
    first = gang_pod("a", "g", min_available="2", node_name="n1", phase=phases[0])
    assert d.send(first, "Modified") == []
    last = gang_pod("b", "g", min_available="2", node_name="n1", phase=phases[1])
    assert d.send(last, "Modified") == [WorkloadFinished(key="default/g", outcome=outcome, reason=reason)]
    assert d.send(last, "Modified") == []
    d.send(first, "Deleted")
    assert d.send(last, "Deleted") == [WorkloadDeleted(key="default/g")]


@pytest.mark.parametrize(("pod", "podgroup", "reason"), [
    (gang_pod("p-0", "g", style="sigs", min_available="abc"), None,
     "pod p-0 metadata.labels.pod-group.scheduling.sigs.k8s.io/min-available: 'abc' is not an integer"),
    (gang_pod("p-0", "g", style="sigs", min_available="0"), None,
     "pod p-0 metadata.labels.pod-group.scheduling.sigs.k8s.io/min-available: 0 is less than 1"),
    (gang_pod("p-0", "g"), pod_group("g", "two"), "PodGroup default/g spec.minMember: 'two' is not an integer"),
    (gang_pod("p-0", "g", min_available="1", requests={"cpu": "lots"}), None,
     "pod p-0: spec.containers[main].resources.requests.cpu: 'lots' is not a quantity"),
    (gang_pod("p-0", "g", min_available="1", annotations={"gpu-fraction": "2"}), None,
     "pod p-0: metadata.annotations.gpu-fraction: '2' must be a number between 0 and 1 (whole GPUs are asked with nvidia.com/gpu)"),
    (gang_pod("p-0", "g", min_available="1", labels={"priorityClassName": "nope"}), None,
     "metadata.labels.priorityClassName: priority class 'nope' does not exist"),
])
def test_pod_gang_rejections(pod: dict, podgroup: dict | None, reason: str) -> None:
    d = AdmissionDriver()
    if podgroup is not None:
        d.send(podgroup)
    assert d.send(pod) == [WorkloadRejected(key="default/g", kind="PodGroup", reason=reason)]
    assert d.send(pod, "Modified") == []
    assert d.send(pod, "Deleted") == [WorkloadDeleted(key="default/g")]


def test_a_pod_gang_larger_than_its_queue_is_submitted_for_the_queue_to_hold() -> None:
    d = AdmissionDriver()
    d.send(volcano_queue("q", capability={"cpu": 3}))
    pods = [gang_pod(n, "g", min_available="4", labels={"volcano.sh/queue-name": "q"}) for n in "abcd"]
    [out] = d.add(*pods)
    assert isinstance(out, WorkloadSubmitted) and (out.workload.queue, out.workload.gang.quota_demand["cpu"]) == ("q", 4000)


def test_alike_pods_make_one_pod_set_and_unlike_pods_one_per_shape() -> None:
    """An MPI launcher and its workers: the gang asks for what each pod asks, not the first pod's shape x N."""
    d = AdmissionDriver()
    same = d.add(*(gang_pod(f"w-{i}", "same", min_available="3", requests={"cpu": "2"}) for i in range(3)))
    assert [(ps.name, ps.count) for ps in same[0].workload.gang.pod_sets] == [("pods", 3)]
    launcher = gang_pod("launcher", "mpi", min_available="4", requests={"cpu": "1"})
    gpu_worker = gang_pod("mpi-w-0", "mpi", min_available="4", requests={"cpu": "2"})
    gpu_worker["spec"]["nodeSelector"] = {"pool": "gpu"}
    out = d.add(launcher, gpu_worker, *(gang_pod(f"mpi-w-{i}", "mpi", min_available="4", requests={"cpu": "2"})
                                         for i in (1, 2)))
    spec = out[0].workload
    assert [(ps.name, ps.count, ps.resources["cpu"], ps.node_selector) for ps in spec.gang.pod_sets] == [
        ("pods", 1, 1000, {}), ("pods-2", 1, 2000, {"pool": "gpu"}), ("pods-3", 2, 2000, {})]
    assert spec.gang.min_member == 4 and spec.gang.resources["cpu"] == 7000
