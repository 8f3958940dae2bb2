"""shared/kernel/kube.py ``gpu_share``: KAI's ``gpu-fraction``, strictly between 0 and 1 as KAI's
gpu-request validator takes it, and muster's own mark of an earlier version read as no request."""

from __future__ import annotations

import pytest

from shared.kernel import kube
from shared.kernel.quantity import QuantityError


@pytest.mark.parametrize("raw, share", [("0.5", 500), ("0.001", 1), (".25", 250), ("0.999", 999)])
def test_a_fraction_of_one_device_in_thousandths(raw: str, share: int) -> None:
    assert kube.gpu_share({"gpu-fraction": raw}, "metadata") == share


@pytest.mark.parametrize("raw", ["1", "1.0", "2", "0", "-0.5"])
def test_one_or_more_and_nothing_are_refused_as_kai_refuses_them(raw: str) -> None:
    with pytest.raises(QuantityError, match="must be a number between 0 and 1"):
        kube.gpu_share({"gpu-fraction": raw}, "metadata")


def test_the_one_an_earlier_muster_wrote_beside_its_device_list_is_no_request() -> None:
    """After a restart without its state, ingest meets whole-GPU pods an earlier muster bound with
    ``gpu-fraction: "1"``; they ask for whole GPUs, as their ``nvidia.com/gpu`` says."""
    assert kube.gpu_share({"gpu-fraction": "1", kube.GPU_DEVICES: "0"}, "metadata") == 0
    with pytest.raises(QuantityError):
        kube.gpu_share({"gpu-fraction": "2", kube.GPU_DEVICES: "0"}, "metadata")
