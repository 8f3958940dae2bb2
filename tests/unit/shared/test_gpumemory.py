"""KAI's gpu-memory, read as KAI reads it: the pod's request, a node's memory per device, the share."""

from __future__ import annotations

import pytest

from shared.kernel import gpumemory
from shared.kernel.events import GangPlaced, GpuAssignment, SlotAssignment
from shared.kernel.quantity import QuantityError
from tests.builders import gang, pod_set

LABEL = "nvidia.com/gpu.memory"


@pytest.mark.parametrize("label, mib", [
    ("40960", 40900),          # GPU feature discovery's A100 40GB: floored to a multiple of 100, as KAI floors it
    ("81559", 81500),          # H100 80GB HBM3
    ("100", 100),              # KAI's tests' nodes (DefaultGpuMemory)
    (str(40960 * 1024 * 1024), 40900),   # a TiB or more in MiB is bytes (GPU feature discovery once wrote bytes)
    ("1048575", 1048500),      # just below a TiB in MiB: still MiB
    ("+40960", 40900),         # Go's ParseInt takes a sign
])
def test_a_nodes_memory_per_device_is_read_from_its_label_as_kai_reads_it(label: str, mib: int) -> None:
    assert gpumemory.device({LABEL: label}) == mib


@pytest.mark.parametrize("labels", [
    {}, {LABEL: ""}, {LABEL: "40Gi"}, {LABEL: "40960.0"}, {LABEL: " 40960"}, {LABEL: "4_0960"},
    {LABEL: "９９"},             # other scripts' digits: not Go's
    {LABEL: "99999999999999999999"},  # beyond int64
    {LABEL: "-40960"}, {LABEL: "0"}, {LABEL: "99"},  # read as 0 MiB or less: no device memory KAI could use
])
def test_a_node_without_a_readable_label_has_no_known_gpu_memory(labels: dict) -> None:
    assert gpumemory.device(labels) == 0


def test_a_share_is_the_memory_over_the_device_rounded_up_to_hundredths() -> None:
    assert gpumemory.share(50, 100) == 500          # KAI's own test: 50 MiB of a 100 MiB GPU is 0.5
    assert gpumemory.share(20450, 40900) == 500
    assert gpumemory.share(20480, 40900) == 510     # 0.5007... rounds up to 0.51
    assert gpumemory.share(1, 40900) == 10          # never below one hundredth
    assert gpumemory.share(40900, 40900) == 1000
    assert gpumemory.share(61440, 40900) == 1510    # more than a device: it fits none of that size
    assert gpumemory.share(20480, 0) == 0 and gpumemory.share(0, 40900) == 0  # unknown: no share
    assert [gpumemory.portion(s) for s in (510, 500, 10, 1000)] == ["0.51", "0.50", "0.01", "1.00"]


def test_the_request_is_a_whole_number_of_mib_above_zero() -> None:
    assert gpumemory.request({}, "metadata") == 0
    assert gpumemory.request({"gpu-memory": "20480"}, "metadata") == 20480
    assert gpumemory.request({"gpu-memory": str(gpumemory.LARGEST)}, "metadata") == gpumemory.LARGEST


@pytest.mark.parametrize("raw, why", [
    ("4Gi", "'4Gi' is not a whole number of MiB above 0"),
    ("-1", "'-1' is not a whole number of MiB above 0"),
    ("0", "'0' is not a whole number of MiB above 0"),
    ("1.5", "'1.5' is not a whole number of MiB above 0"),
    ("+20480", "'+20480' is not a whole number of MiB above 0"),   # Go's ParseUint takes no sign
    ("", "'' is not a whole number of MiB above 0"),
    ("1" * 40, f"'{'1' * 40}' is not a whole number of MiB above 0"),
    (str(gpumemory.LARGEST + 1), f"'{gpumemory.LARGEST + 1}' MiB can never fit: no node can state that much "
                                 f"memory per GPU (at most {gpumemory.LARGEST} MiB)"),
])
def test_a_request_kai_refuses_or_no_device_can_hold_is_one_line_naming_the_field(raw: str, why: str) -> None:
    with pytest.raises(QuantityError) as err:
        gpumemory.request({"gpu-memory": raw}, "spec.template.metadata")
    assert str(err.value) == f"spec.template.metadata.annotations.gpu-memory: {why}"


def test_quota_charges_the_share_of_the_device_memory_it_is_charged_at_and_then_what_it_holds() -> None:
    g = gang(pod_set("head", 1, cpu="1"), pod_set("w", 2, cpu="1", gpu_memory=20480))
    assert g.quota_demand == {"cpu": 3000}                                   # no device known: no GPU charge
    assert g.quota_demand_at(40900) == {"cpu": 3000, "nvidia.com/gpu": 1020}
    assert g.quota_demand_at(20000) == {"cpu": 3000, "nvidia.com/gpu": 2000}  # one whole device each at most
    assert g.quota_demand_at(40900, {"w": 520}) == {"cpu": 3000, "nvidia.com/gpu": 520}
    placed = GangPlaced(key="ns/a", queue="q", kind="RayCluster", gate="pods", reason="", slots=(
        SlotAssignment(pod_set="head", index=0, node="n"),
        SlotAssignment(pod_set="w", index=0, node="n", gpu=GpuAssignment(devices=(0,), fraction=0.51, memory=20480)),
        SlotAssignment(pod_set="w", index=1, node="m", gpu=GpuAssignment(devices=(1,), fraction=0.26, memory=20480)),
    ))
    assert placed.gpu_memory_held == {"w": 770}
