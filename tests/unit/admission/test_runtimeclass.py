"""A pod set named by a template that names a RuntimeClass is counted as the API server will admit its pods
(kube-apiserver's RuntimeClass admission plugin): the class's overhead on top, its node selector and
tolerations merged in; a missing class or a conflicting node selector is a rejection that is lifted
when the class is created or fixed."""

from __future__ import annotations

from typing import Any

import pytest

from shared.kernel import runtimeclass
from shared.kernel.model import Toleration
from shared.kernel.quantity import format_resources
from tests.builders import ray_cluster, worker_group
from tests.builders.admission import AdmissionDriver


def runtime_class(name: str, overhead: dict[str, str] | None = None, selector: dict[str, str] | None = None,
                  tolerations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    rc: dict[str, Any] = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name},
                          "handler": name}
    if overhead is not None:
        rc["overhead"] = {"podFixed": overhead}
    if selector is not None or tolerations is not None:
        rc["scheduling"] = {k: v for k, v in (("nodeSelector", selector), ("tolerations", tolerations)) if v}
    return rc


def boxed(**head_spec: Any) -> dict[str, Any]:
    rc = ray_cluster("rc", head={"cpu": "1", "memory": "1Gi"}, workers=[worker_group("w", 1, {"cpu": "1"})])
    rc["spec"]["headGroupSpec"]["template"]["spec"].update(runtimeClassName="kata", **head_spec)
    return rc


def head(spec: Any) -> Any:
    return next(ps for ps in spec.gang.pod_sets if ps.name == "head")


def test_the_class_overhead_comes_on_top_of_the_head_and_its_scheduling_is_merged() -> None:
    d = AdmissionDriver()
    d.send(runtime_class("kata", {"cpu": "2", "memory": "128Mi"}, {"sandbox": "kata"},
                         [{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}]))
    spec = d.submitted(boxed(nodeSelector={"zone": "a"}))
    assert format_resources(head(spec).resources) == {"cpu": "3", "memory": "1152Mi"}
    assert head(spec).node_selector == {"zone": "a", "sandbox": "kata"}
    assert head(spec).tolerations == (Toleration(key="sandbox", operator="Exists", effect="NoSchedule"),)
    worker = next(ps for ps in spec.gang.pod_sets if ps.name == "w")
    assert format_resources(worker.resources) == {"cpu": "1"} and worker.node_selector == {}


def test_a_missing_class_is_rejected_until_it_is_created() -> None:
    d = AdmissionDriver()
    reason = d.rejected(boxed())
    assert reason == ('spec.headGroupSpec.template.spec.runtimeClassName: pod rejected: RuntimeClass "kata" not '
                      'found: the API server refuses its pods until the RuntimeClass is created')
    out = d.send(runtime_class("kata", {"cpu": "2"}))
    assert [o.type for o in out] == ["WorkloadSubmitted"]
    assert format_resources(head(out[0].workload).resources)["cpu"] == "3"


def test_a_changed_class_updates_a_waiting_workload_and_a_deleted_one_leaves_it_as_it_was() -> None:
    d = AdmissionDriver()
    d.send(runtime_class("kata", {"cpu": "2"}))
    assert format_resources(head(d.submitted(boxed())).resources)["cpu"] == "3"
    out = d.send(runtime_class("kata", {"cpu": "500m"}), "Modified")
    assert [o.type for o in out] == ["WorkloadUpdated"]
    assert format_resources(head(out[0].workload).resources)["cpu"] == "1500m"
    assert d.send(runtime_class("kata", {"cpu": "500m"}), "Modified") == []  # nothing read changed
    assert d.send(runtime_class("kata"), "Deleted") == []  # its pods keep what the API server gave them


def test_a_conflicting_node_selector_is_the_api_servers_refusal() -> None:
    d = AdmissionDriver()
    d.send(runtime_class("kata", selector={"sandbox": "kata"}))
    assert d.rejected(boxed(nodeSelector={"sandbox": "gvisor"})) == (
        "spec.headGroupSpec.template.spec.runtimeClassName: conflict: runtimeClass.scheduling.nodeSelector[sandbox] "
        "= kata; pod.spec.nodeSelector[sandbox] = gvisor: the API server refuses such a pod, so none is made")


@pytest.mark.parametrize("overhead, refusal", [
    ({"cpu": "1"}, "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead"),
    ({"cpu": "2000m"}, None),
])
def test_a_template_overhead_must_be_the_classs(overhead: dict[str, str], refusal: str | None) -> None:
    d = AdmissionDriver()
    d.send(runtime_class("kata", {"cpu": "2"}))
    if refusal is None:
        assert format_resources(head(d.submitted(boxed(overhead=overhead))).resources)["cpu"] == "3"
    else:
        assert refusal in d.rejected(boxed(overhead=overhead))


def test_an_overhead_the_class_does_not_define_is_refused() -> None:
    with pytest.raises(runtimeclass.Refused, match="Pod Overhead set without corresponding RuntimeClass"):
        runtimeclass.admit({"runtimeClassName": "kata", "overhead": {"cpu": "1"}}, {"kata": {}})


def test_tolerations_merge_as_merge_tolerations_does() -> None:
    """A toleration another one covers is dropped (``MergeTolerations``, pkg/util/tolerations)."""
    mine = [{"key": "a", "operator": "Equal", "value": "1", "effect": "NoSchedule"}]
    theirs = [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}]
    assert runtimeclass.merge_tolerations(mine, theirs) == theirs
    assert runtimeclass.merge_tolerations(theirs, theirs) == theirs
