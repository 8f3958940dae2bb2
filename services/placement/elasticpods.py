"""Elastic pods' slots on the nodes: granted ones placed one by one, idle ones dropped, evicted ones
gone; every change is one ``ElasticReleased`` per (workload, pod set) for the queue and the
reconciler. Which elastic pods go first when a gang needs room is ``elastic``'s."""

from __future__ import annotations

from typing import Sequence

from services.placement import elastic, reasons
from services.placement.elastic import Victim
from services.placement.gang import place_pods, pod_demand
from services.placement.ledger import PodLedger
from services.placement.nodes import NodeTable
from services.placement.statement import Statement
from services.placement.workloads import Slot, WorkloadRecord
from shared.kernel.events import ElasticGranted, ElasticReleased


def released(wrec: WorkloadRecord, pod_set: str, count: int, reason: str, *, refused: bool = False,
             evicted: tuple[str, ...] = (), promoted: tuple[str, ...] = ()) -> ElasticReleased:
    return ElasticReleased(key=wrec.key, pod_set=pod_set, count=count, admission=wrec.admission, reason=reason,
                           refused=refused, evicted=evicted, promoted=promoted)


class ElasticPods:
    def __init__(self, nodes: NodeTable, ledger: PodLedger) -> None:
        self.nodes = nodes
        self.ledger = ledger

    def grant(self, wrec: WorkloadRecord, p: ElasticGranted, strategy: str,
              waiting: int | None = None) -> tuple[list[ElasticReleased], int]:
        """Place the granted elastic pods one by one (each alone: as many as nodes allow); what finds no
        node, or is no longer wanted, goes back to the queue at once. Also how many were placed.

        ``waiting``: for a pod group, its pods of the pod set that wait for a slot. Its pods exist before
        they are wanted, so a grant beyond them is for pods that went away (admission still counts a
        first pod a stand-in replaced, ``as_placed``): it goes back refused, asked again on a release."""
        wrec.admission = p.admission
        ps = next((x for x in wrec.spec.gang.pod_sets if x.name == p.pod_set), None)
        take = min(p.count, max(0, wrec.elastic_room(p.pod_set))) if ps is not None else 0
        unwanted = p.count - take
        out: list[ElasticReleased] = []
        if waiting is not None and take > waiting:
            out.append(released(wrec, p.pod_set, take - waiting, f"{take - waiting} elastic pod(s) of {p.pod_set} "
                                f"could not be placed: no pod of the group waits for them", refused=True))
            take = waiting
        placed = []
        if ps is not None and take:
            demand = pod_demand(self.nodes, ps)
            stmt = Statement(self.nodes)
            placed = place_pods(self.nodes, stmt, ps, demand, take, strategy, first_index=wrec.next_index(ps.name))
            stmt.commit()
            wrec.slots += [Slot(ps.name, x.index, x.node, x.devices, x.demand, in_gang=False, elastic=True)
                           for x in placed]
            if len(placed) < take:
                why, _ = reasons.fit_error(self.nodes, ps, demand, self.nodes.static_mask(ps))
                out.append(released(wrec, p.pod_set, take - len(placed),
                                    f"{take - len(placed)} elastic pod(s) of {p.pod_set} could not be "
                                    f"placed: {why}", refused=True))
        if unwanted:
            out.append(released(wrec, p.pod_set, unwanted, "its owner wants fewer pods"))
        return out, len(placed)

    def evict(self, pods: Sequence[Victim], why: str) -> list[ElasticReleased]:
        """Bookkeeping after the statement released elastic slots: they are gone, their pods evicted;
        one release per (workload, pod set) tells the queue and the reconciler."""
        out: list[ElasticReleased] = []
        for (_, pod_set), group in elastic.by_pod_set(pods).items():
            wrec = group[0][0]
            names = []
            for _, slot in group:
                wrec.slots.remove(slot)
                pod = self.ledger.pods.get(slot.pod) if slot.pod is not None else None
                if pod is not None:
                    names.append(pod.key)
                    self.ledger.evicted(pod)
            out.append(released(wrec, pod_set, len(group), why, evicted=tuple(names)))
        return out

    def drop(self, slots: Sequence[Victim], why: str) -> list[ElasticReleased]:
        """Elastic slots that hold no pod go (a node left, the owner wants fewer): the queue hears it."""
        out: list[ElasticReleased] = []
        for (_, pod_set), group in elastic.by_pod_set(slots).items():
            wrec = group[0][0]
            for _, slot in group:
                if slot.reserving:
                    self.nodes.uncharge(slot.node, slot.demand, slot.devices)
                wrec.slots.remove(slot)
            out.append(released(wrec, pod_set, len(group), why))
        return out

    def trim(self, wrec: WorkloadRecord) -> list[ElasticReleased]:
        """The owner wants fewer elastic pods: idle elastic slots beyond that go at once (the newest
        first); those holding a pod go when their pod does."""
        out: list[ElasticReleased] = []
        for ps in wrec.spec.gang.pod_sets:
            extra = -wrec.elastic_room(ps.name)
            if extra > 0:
                idle = [(w, s) for w, s in elastic.newest(wrec, ps.name, len(wrec.slots)) if s.free][:extra]
                out += self.drop(idle, "its owner wants fewer pods")
        return out
