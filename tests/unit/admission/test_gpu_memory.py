"""KAI's ``gpu-memory`` on a pod template or a plain pod: the pod set asks that many MiB of one GPU, and a
pod asking for two kinds of GPU (a fraction and memory, or either with whole GPUs) is refused as KAI's
admission webhook refuses it (``ValidateGpuRequests``)."""

from __future__ import annotations

import pytest

from shared.kernel import gpumemory
from tests.builders import pod, ray_cluster, worker_group
from tests.builders.admission import AdmissionDriver

W = "spec.workerGroupSpecs[w].template.metadata"


def _cluster(annotations: dict, limits: dict | None = None) -> dict:
    return ray_cluster("rc", workers=[worker_group("w", 2, {"cpu": "1", "memory": "4Gi"}, annotations=annotations,
                                                   limits=limits)])


def test_a_worker_group_asking_gpu_memory_is_a_pod_set_of_that_many_mib() -> None:
    spec = AdmissionDriver().submitted(_cluster({"gpu-memory": "20480"}))
    head, workers = spec.gang.pod_sets
    assert (head.gpu_memory, workers.gpu_memory, workers.gpu_share, workers.count) == (0, 20480, 0, 2)
    # Its share of a GPU depends on the device, which admission does not know: the queue charges it.
    assert "nvidia.com/gpu" not in spec.gang.quota_demand
    assert spec.gang.quota_demand_at(40900)["nvidia.com/gpu"] == 1020


def test_a_plain_pod_asking_gpu_memory_is_a_gang_of_one_with_it() -> None:
    spec = AdmissionDriver().submitted(pod("notebook", annotations={"gpu-memory": "10240"}))
    assert [(ps.name, ps.gpu_memory) for ps in spec.gang.pod_sets] == [("pods", 10240)]


def test_both_gpu_sharing_annotations_on_one_pod_are_refused_in_one_line() -> None:
    reason = AdmissionDriver().rejected(_cluster({"gpu-fraction": "0.5", "gpu-memory": "20480"}))
    assert reason == (f"{W}.annotations: gpu-fraction '0.5' and gpu-memory '20480': a pod asks for a fraction of "
                      f"one GPU or for GPU memory, not both (KAI refuses it)")
    single = AdmissionDriver().rejected(pod("nb", annotations={"gpu-fraction": "0.5", "gpu-memory": "1"}))
    assert single == ("pod nb: metadata.annotations: gpu-fraction '0.5' and gpu-memory '1': a pod asks for a "
                      "fraction of one GPU or for GPU memory, not both (KAI refuses it)")
    assert "\n" not in reason + single


def test_gpu_memory_with_whole_gpus_is_refused() -> None:
    reason = AdmissionDriver().rejected(_cluster({"gpu-memory": "20480"}, limits={"nvidia.com/gpu": "1"}))
    assert reason == (f"{W}.annotations.gpu-memory: a pod asks for GPU memory or for whole GPUs "
                      f"(nvidia.com/gpu: 1), not both")


@pytest.mark.parametrize("raw, why", [
    ("lots", "'lots' is not a whole number of MiB above 0"),
    ("20Gi", "'20Gi' is not a whole number of MiB above 0"),
    ("-1", "'-1' is not a whole number of MiB above 0"),
    ("0", "'0' is not a whole number of MiB above 0"),
    ("2048.5", "'2048.5' is not a whole number of MiB above 0"),
    ("9" * 30, f"'{'9' * 30}' is not a whole number of MiB above 0"),
    (str(gpumemory.LARGEST + 1), f"'{gpumemory.LARGEST + 1}' MiB can never fit: no node can state that much "
                                 f"memory per GPU (at most {gpumemory.LARGEST} MiB)"),
])
def test_a_gpu_memory_that_can_never_be_valid_is_rejected_naming_the_field(raw: str, why: str) -> None:
    assert AdmissionDriver().rejected(_cluster({"gpu-memory": raw})) == f"{W}.annotations.gpu-memory: {why}"


def test_more_memory_than_any_gpu_today_is_no_rejection_a_node_may_come() -> None:
    spec = AdmissionDriver().submitted(_cluster({"gpu-memory": "1000000"}))
    assert spec.gang.pod_sets[1].gpu_memory == 1000000


def test_a_rejected_cluster_fixed_by_an_edit_is_submitted() -> None:
    d = AdmissionDriver()
    d.rejected(_cluster({"gpu-fraction": "0.5", "gpu-memory": "20480"}))
    out = d.send(_cluster({"gpu-memory": "20480"}), "Modified")
    assert [type(x).__name__ for x in out] == ["WorkloadSubmitted"]
