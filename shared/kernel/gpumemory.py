"""KAI's GPU memory requests: a pod annotated ``gpu-memory`` (MiB of one device) gets the share of a
device that so much memory is, on the node it lands on, and is charged that share as GPU.

Read as KAI Scheduler reads them (``NVIDIA/KAI-Scheduler``), so a manifest means here what it means
there:

- The request (``request``): the pod's ``gpu-memory`` annotation, a base-10 whole number above 0, as
  KAI's admission webhook takes it (``validateMemoryAnnotation`` in
  ``pkg/binder/plugins/gpusharing/gpu-request/gpu_request_validator.go``, Go's ``strconv.ParseUint``:
  ASCII digits only, no sign, no unit).
- A node's memory per device (``device``): its label ``nvidia.com/gpu.memory`` (set by GPU feature
  discovery), a base-10 ``int64``; a value of a TiB or more in MiB is taken as bytes (GPU feature
  discovery once wrote bytes), and the result is floored to a multiple of 100 MiB (``getNodeGpuMemory``
  in ``pkg/scheduler/api/node_info/node_info.go``). KAI reads nothing else: no label, or one it cannot
  read, leaves the node's GPU memory unknown, and its predicate places no gpu-memory pod there
  (``pkg/scheduler/plugins/predicates/predicates.go``: "node is not a gpu node or the gpu memory count
  on the node was not synced yet"); muster does the same.
- The share (``share``): memory / device memory rounded *up* to hundredths of a device
  (``getGpuMemoryFractionalOnNode`` in ``pkg/scheduler/api/node_info/gpu_sharing_node_info.go``): the
  portion the pod is told (``GPU_PORTION``), the device share it holds, and what its queue is charged
  as GPU (``GetRequiredInitQuota`` and ``setAcceptedResources``, ``node_info.go``).

Amounts are whole MiB; shares are thousandths of a device, as ``PodSet.gpu_share``.
"""

from __future__ import annotations

import re
from typing import Mapping

from shared.kernel import quantity as q
from shared.kernel.validation import quoted

ANNOTATION = "gpu-memory"
"""KAI's pod annotation: MiB of one GPU device (``pkg/common/constants/constants.go`` ``GpuMemory``)."""
LABEL = "nvidia.com/gpu.memory"
"""GPU feature discovery's node label KAI reads a node's memory per device from (``GpuMemoryLabel``)."""
FULL = 1000
"""A whole device, in thousandths (as ``services.placement.gpu.FULL``)."""
BYTES_FROM = 1024 * 1024
"""KAI's ``TibInMib``: a label value at or above it is bytes, not MiB (``checkGpuMemoryIsInMib``)."""
LARGEST = (2**63 - 1) // (1024 * 1024) // 100 * 100
"""The largest memory per device a node label can state as KAI reads it (an ``int64`` of bytes, in MiB,
floored to 100): a request above it fits no device that can ever exist."""

_UNSIGNED = re.compile(r"[0-9]{1,20}")
"""Go's ``ParseUint(s, 10, 64)``: ASCII digits only (``int()`` would also take spaces, ``_``, ``+`` and
other scripts' digits); 20 digits hold every ``uint64``, and longer text is out of range."""
_SIGNED = re.compile(r"[+-]?[0-9]{1,19}")
"""Go's ``ParseInt(s, 10, 64)``: an optional sign, then ASCII digits; 19 digits hold every ``int64``."""


def request(annotations: Mapping[str, str], where: str) -> int:
    """The ``gpu-memory`` annotation in MiB; 0 when absent. Raises ``QuantityError`` naming the field
    when KAI would refuse the pod or when no device could ever hold it."""
    raw = annotations.get(ANNOTATION)
    if raw is None:
        return 0
    field = f"{where}.annotations.{ANNOTATION}"
    if not isinstance(raw, str) or _UNSIGNED.fullmatch(raw) is None or int(raw) == 0:
        raise q.QuantityError(f"{field}: {quoted(raw)} is not a whole number of MiB above 0")
    memory = int(raw)
    if memory > LARGEST:
        raise q.QuantityError(f"{field}: {quoted(raw)} MiB can never fit: no node can state that much memory "
                              f"per GPU (at most {LARGEST} MiB)")
    return memory


def device(labels: Mapping[str, str]) -> int:
    """A node's memory per GPU device in MiB from its ``nvidia.com/gpu.memory`` label, as KAI reads it;
    0 when unknown (no label, one that is not an ``int64``, or one KAI would read as 0 MiB or less)."""
    raw = labels.get(LABEL)
    if not isinstance(raw, str) or _SIGNED.fullmatch(raw) is None:
        return 0
    value = int(raw)
    if value >= 2**63 or value < -(2**63):
        return 0
    if value >= BYTES_FROM:
        value //= 1024 * 1024
    value -= value % 100
    return value if value > 0 else 0


def share(memory: int, device_memory: int) -> int:
    """Thousandths of a device ``memory`` MiB is on a device of ``device_memory`` MiB: the quotient
    rounded up to hundredths, as KAI rounds it (may exceed a whole device: then it fits no device of
    that size); 0 when either is not known."""
    if memory <= 0 or device_memory <= 0:
        return 0
    return 10 * -(-100 * memory // device_memory)


def portion(share_: int) -> str:
    """A share as KAI writes the portion it gives a pod: two decimals (``0.51``), as its scheduler
    formats ``ReceivedGPU.Portion`` (``pkg/scheduler/cache/cache.go`` ``createBindRequest``)."""
    return f"{share_ // FULL}.{share_ % FULL // 10:02d}"
