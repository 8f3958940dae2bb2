"""shared/kernel/kube.py ``effective_requests``: a pod's requests as kube-scheduler counts them, with the
cases of ``k8s.io/component-helpers/resource/helpers_test.go`` (``TestPodResourceRequests``): init
containers, restartable (sidecar) init containers, pod-level requests and overhead."""

from __future__ import annotations

import pytest

from shared.kernel import kube
from shared.kernel.quantity import QuantityError

MI = (1 << 20) * 1000
GI = (1 << 30) * 1000
"""Memory in thousandths of a byte, as every quantity is held."""


def _c(name: str, cpu: str, memory: str | None = None, *, sidecar: bool = False) -> dict:
    requests = {"cpu": cpu, **({"memory": memory} if memory else {})}
    return {"name": name, "resources": {"requests": requests}, **({"restartPolicy": "Always"} if sidecar else {})}


def _asks(**spec) -> dict:
    return kube.effective_requests({"containers": [_c("app", "1", "1Gi")], **spec})


def test_the_containers_alone_add_up():
    assert kube.effective_requests({"containers": [_c("a", "1"), _c("b", "500m", "1Gi")]}) == {
        "cpu": 1500, "memory": GI}


def test_an_init_container_larger_than_the_containers_sets_the_floor():
    assert _asks(initContainers=[_c("init", "2", "512Mi")]) == {"cpu": 2000, "memory": GI}


def test_init_containers_run_one_at_a_time_so_the_largest_counts_not_their_sum():
    assert _asks(initContainers=[_c("i1", "2"), _c("i2", "3")]) == {"cpu": 3000, "memory": GI}


def test_a_sidecar_runs_beside_everything_started_after_it():
    # sidecar 1 cpu + app 1 cpu = 2; the init after the sidecar needs its 2 + the sidecar's 1 = 3
    assert _asks(initContainers=[_c("proxy", "1", sidecar=True), _c("init", "2")]) == {"cpu": 3000, "memory": GI}
    # an init before the sidecar runs alone: 2, below the 2 the sidecar and app need together
    assert _asks(initContainers=[_c("init", "2"), _c("proxy", "1", sidecar=True)]) == {"cpu": 2000, "memory": GI}


def test_pod_level_requests_replace_the_containers_cpu_and_memory_and_overhead_comes_on_top():
    assert _asks(resources={"requests": {"cpu": "4"}}) == {"cpu": 4000, "memory": GI}
    assert _asks(overhead={"cpu": "250m", "memory": "120Mi"}) == {"cpu": 1250, "memory": GI + 120 * MI}


def test_a_bad_quantity_names_its_field():
    with pytest.raises(QuantityError, match=r"spec.initContainers\[init\].resources.requests"):
        kube.effective_requests({"containers": [_c("app", "1")], "initContainers": [_c("init", "lots")]})
    with pytest.raises(QuantityError, match=r"spec.overhead"):
        kube.effective_requests({"containers": [_c("app", "1")], "overhead": {"cpu": "x"}})
