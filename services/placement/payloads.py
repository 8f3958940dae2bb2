"""Placement's commonest decisions built as validation would leave them, without running it.

Every gang placed is a ``GangPlaced`` with one ``SlotAssignment`` per gang pod, and every pod told
where to go a ``PodAssigned``: validating them was a visible part of a ``Dequeued``'s cost in a replay.
As ``shared.kernel.events.kube_effect`` does for effects, only values of exactly the types validation
leaves as they are take the short way (text a ``str``, an index an ``int`` and no ``bool``, the
gate one of its literals, a GPU assignment a ``GpuAssignment`` or None, slots a tuple of
``SlotAssignment``); anything else is validated, so it is refused or coerced exactly as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence, Union, get_args

from services.placement import gpu

from shared.kernel.events import (
    CapacityChanged, ElasticReleased, GangDisrupted, GangEvicted, GangPlaced, GangRunning, GpuAssignment, PlacementFailed,
    PodAssigned, PodsMoved, PreemptionRequested, SlotAssignment, TimerSet,
)
from shared.kernel.fastmodel import built

if TYPE_CHECKING:
    from services.placement.gang import GangAttempt
    from services.placement.workloads import WorkloadRecord

Output = Union[GangPlaced, PlacementFailed, PodAssigned, GangRunning, GangDisrupted, GangEvicted, PreemptionRequested,
               PodsMoved, CapacityChanged, ElasticReleased, TimerSet]
"""What placement emits (``shared.kernel.topology`` routes each)."""

_GATES = frozenset(get_args(GangPlaced.model_fields["gate"].annotation))


def _gpu_ok(gpu: object) -> bool:
    return gpu is None or type(gpu) is GpuAssignment


def slot_assignment(pod_set: str, index: int, node: str, gpu: GpuAssignment | None) -> SlotAssignment:
    """``SlotAssignment(...)`` of these fields."""
    if type(pod_set) is str and type(index) is int and type(node) is str and _gpu_ok(gpu):
        return built(SlotAssignment, {"pod_set": pod_set, "index": index, "node": node, "gpu": gpu})
    return SlotAssignment(pod_set=pod_set, index=index, node=node, gpu=gpu)


def gang_placed(key: str, queue: str, kind: str, gate: str, slots: tuple[SlotAssignment, ...],
                reason: str) -> GangPlaced:
    """``GangPlaced(...)`` of these fields."""
    if (type(key) is str and type(queue) is str and type(kind) is str and type(gate) is str and gate in _GATES
            and type(reason) is str and type(slots) is tuple and all(type(s) is SlotAssignment for s in slots)):
        return built(GangPlaced, {"key": key, "type": "GangPlaced", "queue": queue, "kind": kind, "gate": gate,
                                  "slots": slots, "reason": reason})
    # Any other value is validated: a gate outside the Literal is refused here, which is why ``gate`` is a str.
    return GangPlaced(key=key, queue=queue, kind=kind, gate=gate, slots=slots, reason=reason)  # type: ignore[arg-type]


def pod_assigned(key: str, pod_namespace: str, pod: str, pod_set: str, node: str, gpu: GpuAssignment | None,
                 elastic: bool, claims: tuple[str, ...] = ()) -> PodAssigned:
    """``PodAssigned(...)`` of these fields."""
    if (type(key) is str and type(pod_namespace) is str and type(pod) is str and type(pod_set) is str
            and type(node) is str and _gpu_ok(gpu) and type(elastic) is bool and type(claims) is tuple
            and all(type(c) is str for c in claims)):
        return built(PodAssigned, {"key": key, "type": "PodAssigned", "pod_namespace": pod_namespace, "pod": pod,
                                   "pod_set": pod_set, "node": node, "gpu": gpu, "elastic": elastic,
                                   "claims": claims})
    return PodAssigned(key=key, pod_namespace=pod_namespace, pod=pod, pod_set=pod_set, node=node, gpu=gpu,
                       elastic=elastic, claims=claims)


def gang_placed_of(rec: WorkloadRecord, names: Sequence[str]) -> GangPlaced:
    """The ``GangPlaced`` of an admitted workload: one assignment per gang slot (elastic pods are told
    one by one), on nodes named by their row in ``names``."""
    slots = tuple(slot_assignment(s.pod_set, s.index, names[s.node],
                                  gpu.assignment(rec.key, names[s.node], s.devices, s.demand.gpu_memory))
                  for s in rec.slots if not s.elastic)
    return gang_placed(rec.key, rec.queue, rec.spec.kind, rec.spec.gate, slots, rec.reason)


def placed_reason(attempt: GangAttempt, strategy: str) -> str:
    nodes = len(dict.fromkeys(p.node for p in attempt.placements))
    return f"{len(attempt.placements)}/{attempt.total} pods placed on {nodes} node(s) ({strategy})"
