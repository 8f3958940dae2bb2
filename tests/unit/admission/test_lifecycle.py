"""Added → Submitted, spec change → Updated, RayJob end → Finished once, Deleted → Deleted once, dedup."""

from __future__ import annotations

import datetime

import pytest

from shared.kernel.events import (
    ObjectChanged,
    WorkloadDeleted,
    WorkloadFinished,
    WorkloadRejected,
    WorkloadSubmitted,
    WorkloadUpdated,
)
from tests.builders import envelope, ray_cluster, ray_job, worker_group
from tests.builders.admission import AdmissionDriver, changed, volcano_queue, with_status


def test_added_submits_with_the_event_time() -> None:
    spec = AdmissionDriver().submitted(ray_cluster("rc", "ml"), at=12.5)
    assert (spec.key, spec.namespace, spec.name, spec.submitted_at, spec.queue) == ("ml/rc", "ml", "rc", 12.5, "default")


def test_namespace_defaults_to_default() -> None:
    rc = ray_cluster("rc")
    del rc["metadata"]["namespace"]
    assert AdmissionDriver().submitted(rc).key == "default/rc"


def test_duplicate_watch_events_produce_nothing_new() -> None:
    d = AdmissionDriver()
    rc = ray_cluster()
    env = envelope(changed(rc))
    assert len(d.core.handle(env)) == 1
    assert d.core.handle(env) == []          # the same envelope redelivered
    assert d.send(rc) == []                  # the same watch event re-ingested (new envelope)
    assert d.send(rc, "Modified") == []


def test_status_and_metadata_only_changes_produce_nothing() -> None:
    d = AdmissionDriver()
    rc = ray_cluster(suspend=True)
    assert d.submitted(rc).gate == "suspend"
    running = with_status(rc, state="ready", availableWorkerReplicas=1)
    running["metadata"]["annotations"]["muster.dev/status"] = "Running: all pods running"
    running["metadata"]["resourceVersion"] = "42"
    running["spec"]["suspend"] = False       # the reconciler unsuspended it: the gate stays suspend
    assert d.send(running, "Modified") == []


def test_gate_is_pods_unless_created_suspended() -> None:
    assert AdmissionDriver().submitted(ray_cluster()).gate == "pods"
    assert AdmissionDriver().submitted(ray_job(suspend=False)).gate == "pods"
    assert AdmissionDriver().submitted(ray_job(suspend=True)).gate == "suspend"


def test_spec_change_is_an_update_keeping_submitted_at() -> None:
    d = AdmissionDriver()
    d.submitted(ray_cluster(workers=[worker_group(replicas=1)]), at=3.0)
    out = d.send(ray_cluster(workers=[worker_group(replicas=4)]), "Modified", at=8.0)
    assert len(out) == 1 and isinstance(out[0], WorkloadUpdated)
    assert (out[0].workload.gang.min_member, out[0].workload.submitted_at) == (5, 3.0)
    assert d.send(ray_cluster(workers=[worker_group(replicas=4)]), "Modified", at=9.0) == []


@pytest.mark.parametrize("labels", [{"priorityClassName": "build"}, {"kai.scheduler/queue": "other"},
                                    {"kai.scheduler/preemptibility": "non-preemptible"}])
def test_priority_queue_or_preemptibility_change_is_an_update(labels: dict) -> None:
    d = AdmissionDriver()
    before = d.submitted(ray_cluster())
    out = d.send(ray_cluster(labels=labels), "Modified")
    assert len(out) == 1 and isinstance(out[0], WorkloadUpdated) and out[0].workload != before


def test_first_event_modified_is_treated_as_added() -> None:
    out = AdmissionDriver().send(ray_cluster(), "Modified", at=4.0)
    assert len(out) == 1 and isinstance(out[0], WorkloadSubmitted) and out[0].workload.submitted_at == 4.0


@pytest.mark.parametrize(
    ("status", "outcome", "reason"),
    [
        ({"jobStatus": "SUCCEEDED", "jobDeploymentStatus": "Complete"}, "Succeeded",
         "RayJob finished: jobStatus SUCCEEDED, jobDeploymentStatus Complete"),
        ({"jobStatus": "FAILED", "jobDeploymentStatus": "Complete", "message": "exit code 1"}, "Failed",
         "RayJob finished: jobStatus FAILED, jobDeploymentStatus Complete: exit code 1"),
        ({"jobDeploymentStatus": "Failed"}, "Failed", "RayJob finished: jobDeploymentStatus Failed"),
        ({"jobStatus": "SUCCEEDED"}, "Succeeded", "RayJob finished: jobStatus SUCCEEDED"),
    ],
)
def test_rayjob_finishes_once(status: dict, outcome: str, reason: str) -> None:
    d = AdmissionDriver()
    job = ray_job("rj")
    d.submitted(job)
    assert d.send(with_status(job, jobStatus="RUNNING", jobDeploymentStatus="Running"), "Modified") == []
    done = with_status(job, **status)
    assert d.send(done, "Modified") == [WorkloadFinished(key="default/rj", outcome=outcome, reason=reason)]
    assert d.send(done, "Modified") == []
    assert d.send(with_status(done, message="cleaned up"), "Modified") == []
    assert d.send(done, "Deleted") == [WorkloadDeleted(key="default/rj")]


def test_deleted_once_and_recreated_is_a_new_workload() -> None:
    d = AdmissionDriver()
    rc = ray_cluster()
    d.submitted(rc, at=1.0)
    assert d.send(rc, "Deleted", at=2.0) == [WorkloadDeleted(key="default/rc")]
    assert d.send(rc, "Deleted", at=2.0) == []
    assert d.send(rc, "Modified", at=2.0) == []           # a stale event of the deleted object
    assert d.submitted(rc, at=3.0).submitted_at == 3.0     # created again under the same name


def test_a_stale_added_of_the_deleted_object_is_ignored_by_uid() -> None:
    d = AdmissionDriver()
    rc = ray_cluster()
    rc["metadata"]["uid"] = "u-1"
    d.submitted(rc)
    d.send(rc, "Deleted")
    assert d.send(rc) == []
    rc["metadata"]["uid"] = "u-2"
    assert len(d.send(rc)) == 1


def test_deleting_an_unknown_object_says_nothing() -> None:
    assert AdmissionDriver().send(ray_cluster(), "Deleted") == []


def test_rejected_object_deleted_is_deleted() -> None:
    d = AdmissionDriver()
    d.rejected(ray_cluster(workers=[worker_group(replicas=-1)]))
    assert d.send(ray_cluster(), "Deleted") == [WorkloadDeleted(key="default/rc")]


def test_valid_then_invalid_then_valid_again() -> None:
    d = AdmissionDriver()
    good = d.submitted(ray_cluster(), at=1.0)
    assert d.rejected(ray_cluster(workers=[worker_group(replicas=-1)]), "Modified") == \
        "spec.workerGroupSpecs[worker].replicas: -1 is negative"
    out = d.send(ray_cluster(), "Modified")
    assert out == [WorkloadUpdated(workload=good)]   # the queue hears that the rejection is over


@pytest.mark.parametrize("marker", ["label", "owner"])
def test_rayclusters_created_by_a_rayjob_are_ignored(marker: str) -> None:
    rc = ray_cluster("rj-abcde")
    if marker == "label":
        rc["metadata"]["labels"]["ray.io/originated-from-crd"] = "RayJob"
    else:
        rc["metadata"]["ownerReferences"] = [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "rj", "uid": "x"}]
    d = AdmissionDriver()
    assert d.send(rc) == [] and d.send(rc, "Modified") == [] and d.send(rc, "Deleted") == []


def test_one_key_one_workload_across_kinds() -> None:
    d = AdmissionDriver()
    d.submitted(ray_job("same"))
    assert d.send(ray_cluster("same")) == [WorkloadRejected(
        key="default/same", kind="RayCluster", reason="workload default/same is already taken by RayJob default/same")]


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        ({"metadata": "nope", "spec": {"headGroupSpec": []}}, "spec.headGroupSpec: a list is not a mapping"),
        ({"metadata": "nope", "spec": ray_cluster()["spec"]}, "metadata: 'nope' is not a mapping"),
        ({"metadata": {"annotations": [1]}, "spec": ray_cluster()["spec"]}, "metadata.annotations: a list is not a mapping"),
        ({}, "spec: missing"),
    ],
)
def test_never_raises_on_nonsense(obj: dict, reason: str) -> None:
    weird = ObjectChanged(change="Added", kind="RayCluster", namespace="", name="x", object=obj)
    assert AdmissionDriver().core.handle(envelope(weird)) == [
        WorkloadRejected(key="default/x", kind="RayCluster", reason=reason)]


def test_outputs_are_deterministic() -> None:
    def run() -> list:
        d = AdmissionDriver()
        out = []
        for i in range(5):
            out += d.send(ray_cluster(f"rc-{i}", labels={"kai.scheduler/queue": f"q{i % 2}"}), at=float(i))
        return [e.model_dump() for e in out]

    first = run()
    assert first == run()
    assert [e["workload"]["key"] for e in first] == [f"default/rc-{i}" for i in range(5)]


def test_a_spec_equal_only_by_python_equality_is_read_again() -> None:
    # admission skips reading a spec it read before (status-only events): ``true`` == 1 in Python, but
    # ``replicas: true`` is no integer, so the skip must not take it for the ``replicas: 1`` it read
    d = AdmissionDriver()
    d.submitted(ray_cluster(workers=[worker_group(replicas=1)]))
    running = with_status(ray_cluster(workers=[worker_group(replicas=1)]), state="ready")
    running["metadata"]["annotations"]["muster.dev/status"] = "Running"
    assert d.send(running, "Modified") == []
    running["spec"]["workerGroupSpecs"][0]["replicas"] = True
    assert "replicas" in d.rejected(running, "Modified")


def test_a_spec_holding_what_marshal_refuses_is_still_read_once_per_change() -> None:
    # the skip keys a spec by ``tree_key``: a YAML timestamp is keyed by its ``repr``, so a status-only
    # event still skips the read and a real edit beside it is still read
    d = AdmissionDriver()
    rc = ray_cluster(workers=[worker_group(replicas=1)])
    rc["spec"]["note"] = datetime.datetime(2024, 1, 1)
    d.submitted(rc)
    assert d.send(with_status(rc, state="starting"), "Modified") == []
    w = d.core.workloads["RayCluster:default/rc"]
    built = w.last
    assert built is not None and isinstance(built[0][2], str)
    assert d.send(with_status(rc, state="ready"), "Modified") == []
    assert w.last is built                   # the spec was not built again
    rc["spec"]["workerGroupSpecs"][0]["replicas"] = 3
    out = d.send(rc, "Modified")
    assert len(out) == 1 and isinstance(out[0], WorkloadUpdated) and out[0].workload.gang.desired_count == 4


def test_a_status_only_event_after_a_queue_change_still_sees_the_queue() -> None:
    # the skip holds only while queues are as they were: a queue defined since is read again
    d = AdmissionDriver(unknown_queue="reject")
    assert "does not exist" in d.rejected(ray_cluster(labels={"volcano.sh/queue-name": "q"}))
    d.add(volcano_queue("q"))
    assert d.send(with_status(ray_cluster(labels={"volcano.sh/queue-name": "q"}), state="ready"), "Modified") == []
    assert d.core.workloads["RayCluster:default/rc"].spec is not None
