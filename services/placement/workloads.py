"""What placement remembers about a workload it was asked to place: its slots and their pods.

A slot is one planned pod (pod set, index, node, GPU devices). While no live bound pod fills it,
the slot *reserves* its demand on its node; once a pod bound there fills it, the pod's own
charge replaces the reservation. A freed slot (its pod failed or was deleted) reserves again
and waits for the recreated pod; a slot whose pod Succeeded is done and holds nothing.

Slots follow what was admitted: an edit that asks for fewer pods (``shrunk``) removes the surplus
slots, at once those holding no pod, the others when their pod goes away (``WorkloadRecord.surplus``).
Pods beyond the gang's slots are elastic: each gets a slot of its own (``Slot.elastic``) when the
queue grants it quota and a node has room; an elastic slot goes with its pod (it never waits for a
replacement: the replacement asks the queue again), and elastic slots are the first victims.
A pod-gated gang binds nothing until a pod waits for every one of its gang slots (``assembled``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.placement.gpu import GpuCharge
from services.placement.nodes import Demand
from shared.kernel.model import Gang, WorkloadSpec, elastic_wanted


@dataclass
class Slot:
    pod_set: str
    index: int
    node: int
    devices: GpuCharge
    demand: Demand
    in_gang: bool
    pod: str | None = None
    """``namespace/name`` of the pod assigned to this slot."""
    filled: bool = False
    done: bool = False
    lost: bool = False
    """Its node left while the slot was free: it reserves nothing until it is placed again."""
    elastic: bool = False
    """A pod beyond the gang, granted by the queue one at a time (never part of GangRunning)."""

    @property
    def reserving(self) -> bool:
        return not self.filled and not self.done and not self.lost

    @property
    def free(self) -> bool:
        return self.pod is None and not self.done


@dataclass
class WorkloadRecord:
    spec: WorkloadSpec
    queue: str
    slots: list[Slot] = field(default_factory=list)
    admitted: bool = False
    admitted_seq: int = 0
    """Placement's admission order (later admissions have larger numbers): the victim order's last key."""
    started_at: float | None = None
    """When GangRunning was emitted for the current admission (for min runtime)."""
    running: bool = False
    reason: str = ""
    """Why it was placed where it is (repeated if the queue asks again)."""
    latest: Gang | None = None
    """The owner's latest gang (an edit after admission): how many elastic pods it wants now."""
    admission: int = 0
    """The queue's number for this admission, from its elastic grants (echoed when they are released)."""
    assembled: bool = False
    """A pod waited for every gang slot at once: from then on pods are assigned as they come."""

    @property
    def key(self) -> str:
        return self.spec.key

    def free_slot(self, pod_set: str, node: int | None = None) -> Slot | None:
        """The lowest free slot of a pod set, preferring one on ``node``, then one not lost."""
        candidates = [s for s in self.slots if s.pod_set == pod_set and s.free]
        if node is not None:
            for slot in candidates:
                if slot.node == node:
                    return slot
        for slot in candidates:
            if not slot.lost:
                return slot
        return candidates[0] if candidates else None

    def surplus(self, pod_set: str) -> int:
        """Gang slots of a pod set beyond what its (possibly shrunk) spec asks for."""
        surplus = 0  # plain loops: asked on every pod that leaves its slot
        for ps in self.spec.gang.pod_sets:
            if ps.name == pod_set:
                surplus = -ps.count
                break
        for s in self.slots:
            if s.pod_set == pod_set and not s.elastic:
                surplus += 1
        return surplus

    def elastic_room(self, pod_set: str) -> int:
        """Elastic pods of a pod set the owner wants beyond the elastic slots it has (negative: too many)."""
        wanted = elastic_wanted(self.spec.gang, self.latest or self.spec.gang).get(pod_set, 0)
        return wanted - sum(1 for s in self.slots if s.pod_set == pod_set and s.elastic)

    def next_index(self, pod_set: str) -> int:
        """The index a new slot of the pod set gets: after every slot it has (the newest is the highest)."""
        return max((s.index + 1 for s in self.slots if s.pod_set == pod_set), default=0)


