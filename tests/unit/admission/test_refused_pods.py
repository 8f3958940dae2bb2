"""A Pod ingest refused (out of bounds, ``shared.kernel.kube.REFUSED``) rejects the workload it belongs to,
naming the pod and the bound it broke; the rejection ends when that pod is gone or readable again."""

from __future__ import annotations

import copy

from services.reconciler.ingest import observe
from shared.kernel.events import WorkloadRejected, WorkloadSubmitted, WorkloadUpdated
from tests.builders import pod, ray_cluster, ray_job
from tests.builders.admission import AdmissionDriver, gang_pod
from tests.builders.placement import ray_pod

BAD_LABEL = {"note": "x" * 64}


def refused(obj: dict) -> dict:
    """What ingest sends for ``obj`` with a label value the API server would refuse."""
    out = copy.deepcopy(obj)
    out["metadata"]["labels"] = {**out["metadata"].get("labels", {}), **BAD_LABEL}
    sent = observe("Modified", out).object
    assert sent["metadata"]["annotations"]["muster.dev/ingest-refused"]
    return sent


def test_a_refused_kuberay_pod_rejects_its_raycluster_until_the_pod_is_deleted() -> None:
    d = AdmissionDriver()
    d.submitted(ray_cluster("rc"))
    head = ray_pod("rc", name="rc-head-x1")
    out = d.send(refused(head), "Modified")
    assert out == [WorkloadRejected(key="default/rc", kind="RayCluster", reason=(
        "pod rc-head-x1 refused at ingest: metadata.labels.note: " + repr("x" * 60 + "...")
        + " is not a label value (at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter "
          "or digit, or empty)"))]
    assert d.send(refused(head), "Modified") == []  # told once
    assert d.send(ray_cluster("rc"), "Modified") == []  # its own events do not clear it
    cleared = d.send(head, "Deleted")
    assert [type(e) for e in cleared] == [WorkloadUpdated] and cleared[0].workload.key == "default/rc"


def test_a_refused_pod_of_a_rayjobs_cluster_rejects_the_rayjob() -> None:
    d = AdmissionDriver()
    d.submitted(ray_job("rj"))
    submitter = ray_pod("rj", "submitter", name="rj-submitter")
    submitter["metadata"]["labels"] = {"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": "rj"}
    out = d.send(refused(submitter), "Modified")
    assert len(out) == 1 and isinstance(out[0], WorkloadRejected)
    assert (out[0].key, out[0].kind) == ("default/rj", "RayJob")
    assert out[0].reason.startswith("pod rj-submitter refused at ingest: metadata.labels.note")


def test_a_refused_pod_before_its_workload_comes_rejects_it_on_arrival() -> None:
    d = AdmissionDriver()
    assert d.send(refused(ray_pod("rc", name="rc-head-x1"))) == []
    assert d.rejected(ray_cluster("rc")).startswith("pod rc-head-x1 refused at ingest:")


def test_a_refused_member_of_a_plain_pod_gang_rejects_the_gang_until_it_is_readable_again() -> None:
    d = AdmissionDriver()
    first, second = gang_pod("p1", "g", min_available="2"), gang_pod("p2", "g", min_available="2")
    out = d.add(first, second)
    assert [type(e) for e in out] == [WorkloadSubmitted]
    out = d.send(refused(second), "Modified")
    assert len(out) == 1 and isinstance(out[0], WorkloadRejected) and out[0].key == "default/g"
    assert out[0].reason.startswith("pod p2 refused at ingest: metadata.labels.note")
    assert [type(e) for e in d.send(second, "Modified")] == [WorkloadUpdated]


def test_a_refused_single_pod_is_rejected_as_its_own_workload() -> None:
    d = AdmissionDriver()
    assert d.rejected(refused(pod("notebook"))).startswith("pod notebook refused at ingest: metadata.labels.note")



def test_a_deleted_kuberay_pod_clears_only_a_refusal_of_that_pod() -> None:
    """Every KubeRay pod's deletion reaches admission; with no pod refused (the common case, which
    returns at once) or another pod refused, it changes nothing."""
    d = AdmissionDriver()
    d.submitted(ray_cluster("rc"))
    head, worker = ray_pod("rc", name="rc-head-x1"), ray_pod("rc", name="rc-worker-x2")
    assert d.send(worker, "Deleted") == [] and d.core.refused_pods == {}
    assert [type(e) for e in d.send(refused(head), "Modified")] == [WorkloadRejected]
    assert d.send(worker, "Deleted") == []  # another pod: the workload stays rejected
    assert [type(e) for e in d.send(head, "Deleted")] == [WorkloadUpdated]
    assert d.core.refused_pods == {}
