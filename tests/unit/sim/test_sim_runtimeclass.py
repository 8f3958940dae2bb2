"""The simulated API server admits the pods it creates as kube-apiserver's RuntimeClass admission plugin
does: the class's overhead and scheduling merged in, a pod naming a missing class refused (KubeRay makes
it once the class exists), a conflicting node selector refused."""

from __future__ import annotations

from typing import Any

import pytest

from shared.sim import ScenarioError, SimCluster
from tests.builders import pod, ray_cluster

KATA = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "kata"}, "handler": "kata",
        "overhead": {"podFixed": {"cpu": "250m"}},
        "scheduling": {"nodeSelector": {"sandbox": "kata"}, "tolerations": [{"key": "sandbox", "operator": "Exists"}]}}


def _heads(sim: SimCluster) -> list[dict[str, Any]]:
    return sim.api.objects("Pod")


def _kata_cluster() -> dict[str, Any]:
    rc = ray_cluster("rc", workers=[])
    rc["spec"]["headGroupSpec"]["template"]["spec"]["runtimeClassName"] = "kata"
    return rc


def test_a_kuberay_pod_gets_its_class_overhead_and_scheduling() -> None:
    sim = SimCluster()
    sim.apply(KATA, 0.0)
    sim.apply(_kata_cluster(), 1.0)
    [head] = _heads(sim)
    assert head["spec"]["overhead"] == {"cpu": "250m"}
    assert head["spec"]["nodeSelector"] == {"sandbox": "kata"}
    assert head["spec"]["tolerations"] == [{"key": "sandbox", "operator": "Exists"}]


def test_a_pod_naming_a_missing_class_is_made_once_the_class_exists() -> None:
    sim = SimCluster()
    sim.apply(_kata_cluster(), 1.0)
    assert _heads(sim) == []
    sim.apply(KATA, 2.0)
    assert [p["spec"]["overhead"] for p in _heads(sim)] == [{"cpu": "250m"}]


def test_a_pod_manifest_the_api_server_refuses_is_a_scenario_error() -> None:
    sim = SimCluster()
    sim.apply(KATA, 0.0)
    p = pod("p", requests={"cpu": "1"})
    p["spec"].update(runtimeClassName="kata", nodeSelector={"sandbox": "gvisor"})
    with pytest.raises(ScenarioError, match=r"conflict: runtimeClass.scheduling.nodeSelector\[sandbox\] = kata"):
        sim.apply(p, 1.0)
    p["spec"]["runtimeClassName"] = "gone"
    with pytest.raises(ScenarioError, match='pod rejected: RuntimeClass "gone" not found'):
        sim.apply(p, 1.0)
