"""Elastic pods in placement: which slots go first when a gang needs the room.

A gang's pods beyond its minimum get slots of their own, one per pod the queue granted
(``Slot.elastic``). When a higher-priority gang of the same queue cannot be placed, or the queue
names elastic pods as victims of a reclaim, these slots go before any whole gang (Volcano's gang
plugin lets only tasks beyond minAvailable be preempted; KAI evicts one task of a subgroup above
its minimum before a whole job): among the candidate workloads in victim order, each one's newest
elastic pods first (the highest slot index; later pod sets first).
"""

from __future__ import annotations

from typing import Sequence

from services.placement.workloads import Slot, WorkloadRecord

Victim = tuple[WorkloadRecord, Slot]


def victim_slots(candidates: Sequence[WorkloadRecord]) -> list[Victim]:
    """Every elastic slot of the candidates (given in victim order) that may be evicted, each workload's
    newest first; a pod set pinned alone keeps its slots (``WorkloadSpec.elastic_preemptible``)."""
    out: list[Victim] = []
    for wrec in candidates:
        order = {ps.name: i for i, ps in enumerate(wrec.spec.gang.pod_sets)}
        slots = sorted((s for s in wrec.slots if s.elastic and wrec.spec.elastic_preemptible(s.pod_set)),
                       key=lambda s: (-s.index, -order.get(s.pod_set, 0)))
        out += [(wrec, s) for s in slots]
    return out


def newest(wrec: WorkloadRecord, pod_set: str, count: int) -> list[Victim]:
    """The ``count`` newest elastic slots of one pod set (the queue named that many as victims)."""
    slots = sorted((s for s in wrec.slots if s.elastic and s.pod_set == pod_set), key=lambda s: -s.index)
    return [(wrec, s) for s in slots[:count]]


def by_pod_set(victims: Sequence[Victim]) -> dict[tuple[str, str], list[Victim]]:
    """Victims grouped per (workload, pod set), in the order first seen: one release each."""
    groups: dict[tuple[str, str], list[Victim]] = {}
    for wrec, slot in victims:
        groups.setdefault((wrec.key, slot.pod_set), []).append((wrec, slot))
    return groups


def counts(victims: Sequence[Victim]) -> dict[tuple[str, str], int]:
    """How many victims per (workload, pod set), in the order first seen: what a reason names."""
    return {group: len(members) for group, members in by_pod_set(victims).items()}
