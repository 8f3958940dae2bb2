"""A key that comes close to a queue key muster reads, or a peer's queue key it does not read, is warned of.

The decision is admission's (``resolve.queue_key_slips``, keys only); the Warning Event is the
reconciler's (``tests/unit/reconciler/test_reconciler_core.py``). Nothing falls silently into the
default queue: the workload goes where the keys muster reads send it, and is told why.
"""

from __future__ import annotations

import pytest

from services.admission.resolve import queue_key_slips
from shared.kernel.events import WorkloadRejected, WorkloadSubmitted, WorkloadUpdated, WorkloadWarned
from tests.builders import ray_cluster, worker_group
from tests.builders.admission import AdmissionDriver, gang_pod, volcano_queue


@pytest.mark.parametrize(("where", "key", "meant"), [
    ("labels", "volcano.sh/queue", "label volcano.sh/queue-name"),
    ("labels", "volcano.sh/queuename", "label volcano.sh/queue-name"),
    ("labels", "kai.scheduler/queue-name", "label kai.scheduler/queue"),
    ("labels", "kai-scheduler/queue", "label kai.scheduler/queue"),
    ("labels", "quota.scheduling.alibabacloud.com/queue", "label quota.scheduling.alibabacloud.com/name"),
    ("labels", "scheduling.volcano.sh/queue-name", "annotation scheduling.volcano.sh/queue-name"),
    ("annotations", "volcano.sh/queue-name", "label volcano.sh/queue-name"),
])
def test_a_key_close_to_one_muster_reads_is_a_slip_naming_it(where: str, key: str, meant: str) -> None:
    slips = queue_key_slips([key], []) if where == "labels" else queue_key_slips([], [key])
    place = "label" if where == "labels" else "annotation"
    assert slips == [f"{place} {key} is not read by muster (did you mean {meant}?)"]


def test_kueues_queue_label_and_one_close_to_it_are_slips_naming_what_muster_reads() -> None:
    reads = ("label volcano.sh/queue-name, annotation scheduling.volcano.sh/queue-name, label kai.scheduler/queue, "
             "label quota.scheduling.alibabacloud.com/name")
    assert queue_key_slips(["kueue.x-k8s.io/queue-name"], []) == [
        f"label kueue.x-k8s.io/queue-name is Kueue's LocalQueue label, which muster does not read (it reads {reads})"]
    assert queue_key_slips(["kueue.x-k8s.io/queue"], []) == [
        "label kueue.x-k8s.io/queue is not read by muster (it comes close to Kueue's LocalQueue label "
        f"kueue.x-k8s.io/queue-name, which muster does not read either; it reads {reads})"]


def test_keys_muster_reads_and_keys_that_name_no_queue_are_no_slips() -> None:
    """Keys of the same prefix that name something else (a Volcano task, a KAI node pool) are left alone."""
    keys = ["volcano.sh/queue-name", "kai.scheduler/queue", "quota.scheduling.alibabacloud.com/name",
            "volcano.sh/job-name", "volcano.sh/group-name", "volcano.sh/task-spec", "volcano.sh/preemptable",
            "kai.scheduler/node-pool", "kai.scheduler/preemptibility", "kai.scheduler/subgroup",
            "ray.io/scheduler-name", "ray.io/priority-class-name", "priorityClassName", "app.kubernetes.io/name",
            "queue", "team-queue"]
    assert queue_key_slips(keys, ["scheduling.volcano.sh/queue-name", "scheduling.k8s.io/group-name"]) == []


def test_the_workload_goes_where_it_is_sent_and_is_warned_once_after_its_submission() -> None:
    d = AdmissionDriver()
    d.send(volcano_queue("team-a"))
    rc = ray_cluster(labels={"volcano.sh/queue": "team-a"})
    out = d.send(rc, at=1.0)
    assert [type(e) for e in out] == [WorkloadSubmitted, WorkloadWarned]
    assert out[0].workload.queue == "default"
    assert out[1] == WorkloadWarned(
        key="default/rc", kind="RayCluster", cause="QueueLabelIgnored",
        reason="label volcano.sh/queue is not read by muster (did you mean label volcano.sh/queue-name?); "
               "it is in queue default")
    assert d.send(rc, "Modified", at=2.0) == []  # told once
    fixed = ray_cluster(labels={"volcano.sh/queue-name": "team-a"})
    out = d.send(fixed, "Modified", at=3.0)
    assert [type(e) for e in out] == [WorkloadUpdated] and out[0].workload.queue == "team-a"
    again = d.send(rc, "Modified", at=4.0)  # the slip came back: told again
    assert [type(e) for e in again] == [WorkloadUpdated, WorkloadWarned]


def test_a_rejected_workload_is_warned_without_a_queue_and_a_pod_gang_by_its_first_pod() -> None:
    d = AdmissionDriver()
    bad = ray_cluster(labels={"kueue.x-k8s.io/queue-name": "lq"}, workers=[worker_group(replicas=-1)])
    out = d.send(bad)
    assert [type(e) for e in out] == [WorkloadRejected, WorkloadWarned]
    assert out[1].reason.endswith("quota.scheduling.alibabacloud.com/name)")  # no queue: it is in none
    pods = [gang_pod(f"p-{i}", "g", min_available="2", labels={"kai.scheduler/queues": "q"}) for i in range(2)]
    out = d.add(*pods)
    assert [type(e) for e in out] == [WorkloadSubmitted, WorkloadWarned]
    assert (out[1].key, out[1].kind, out[1].reason) == (
        "default/g", "PodGroup",
        "label kai.scheduler/queues is not read by muster (did you mean label kai.scheduler/queue?); it is in queue default")


def test_an_object_with_keys_that_are_not_text_is_judged_by_its_text_keys() -> None:
    rc = ray_cluster()
    rc["metadata"]["labels"] = {1: "x", "volcano.sh/queue": "a"}
    out = AdmissionDriver().send(rc)
    assert [type(e) for e in out] == [WorkloadSubmitted, WorkloadWarned]
    assert out[1].reason == ("label volcano.sh/queue is not read by muster (did you mean label "
                             "volcano.sh/queue-name?); it is in queue default")
