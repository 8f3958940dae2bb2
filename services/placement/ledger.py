"""The pods placement was told of, and what each charges on the node table.

A bound live pod is charged on its node (``NodeTable.charge``); one that fills no slot of an
admitted workload is *foreign* and also lowers ``CapacityChanged.total`` (``foreign``). The ledger
is the one place that charges, uncharges and evicts a pod, and that takes a victim's holdings off
the nodes inside a statement (the trial placements of ``preemption``).
"""

from __future__ import annotations

from typing import Sequence

from services.placement import gpu, interpod
from services.placement.elastic import Victim
from services.placement.nodes import NodeTable
from services.placement.pods import PodRecord
from services.placement.statement import Statement
from services.placement.workloads import WorkloadRecord
from shared.kernel import quantity as q


class PodLedger:
    def __init__(self, nodes: NodeTable) -> None:
        self.nodes = nodes
        self.pods: dict[str, PodRecord] = {}
        self.pods_of: dict[str, dict[str, None]] = {}
        """Workload key -> its pods' keys in the order they were first observed."""
        self.foreign: dict[str, int] = {}
        """What pods outside admitted workloads hold; CapacityChanged.total excludes it."""

    def own_pods(self, wrec: WorkloadRecord) -> list[str]:
        """Keys of the pods that belong to ``wrec``: same namespace/name and the same kind (a rejected
        RayCluster sharing a RayJob's name has pods too, and they are not the RayJob's)."""
        return [key for key in self.pods_of.get(wrec.key, {})
                if self.pods[key].facts.kind in (None, wrec.spec.kind)]

    def add(self, rec: PodRecord) -> None:
        self.pods[rec.key] = rec
        if rec.facts.workload:
            self.pods_of.setdefault(rec.facts.workload, {})[rec.key] = None

    def forget(self, rec: PodRecord) -> None:
        self.pods.pop(rec.key, None)
        workload = rec.facts.workload
        if workload and workload in self.pods_of:
            self.pods_of[workload].pop(rec.key, None)
            if not self.pods_of[workload]:
                del self.pods_of[workload]

    # ------------------------------------------------------------------ charges
    def charge_holds(self, rec: PodRecord) -> bool:
        facts = rec.facts
        if not (facts.live and facts.bound) or rec.evicted or self.nodes.index.get(facts.node_name) != rec.node:
            return False
        return self.nodes.demand(facts.requests, facts.gpu_share, facts.gpu_memory, self.mark(rec),
                                 facts.host_ports).same_as(rec.demand)

    def mark(self, rec: PodRecord) -> interpod.Mark | None:
        """The pod's mark once the inter-pod index is on (``interpod``), else None."""
        return interpod.object_mark(rec.facts.namespace, rec.obj) if self.nodes.marking else None

    def charge(self, rec: PodRecord, foreign: bool) -> None:
        """The pod counts on its node; GPU devices from its slot, its annotation, or a best guess. A
        ``gpu-memory`` pod bound where muster cannot work out its share (the node states no GPU memory,
        or less than it asks) is taken to hold a whole device: never less than it may use."""
        facts = rec.facts
        node = self.nodes.ensure(facts.node_name)
        demand = self.nodes.demand(facts.requests, facts.gpu_share, facts.gpu_memory, self.mark(rec), facts.host_ports)
        if rec.slot is not None and rec.slot.node == node:
            devices = rec.slot.devices
        else:
            devices = gpu.observed_charge(self.nodes.device_row(node), demand.gpu_whole,
                                          min(self.nodes.share_on(node, demand), gpu.FULL), facts.gpu_devices)
        self.nodes.charge(node, demand, devices)
        rec.node, rec.demand, rec.devices, rec.foreign = node, demand, devices, foreign
        if foreign:
            self.add_foreign(rec, +1)

    def uncharge(self, rec: PodRecord) -> None:
        assert rec.node is not None and rec.demand is not None
        self.nodes.uncharge(rec.node, rec.demand, rec.devices)
        if rec.foreign:
            self.add_foreign(rec, -1)
        rec.node, rec.demand, rec.devices, rec.foreign = None, None, (), False

    def set_foreign(self, rec: PodRecord, foreign: bool) -> bool:
        """A charged pod lowers CapacityChanged.total exactly while it fills no slot of an admitted
        workload. True when that changed (the caller signals capacity)."""
        if rec.node is None or rec.foreign == foreign:
            return False
        self.add_foreign(rec, 1 if foreign else -1)
        rec.foreign = foreign
        return True

    def add_foreign(self, rec: PodRecord, sign: int) -> None:
        assert rec.demand is not None
        for name, amount in rec.demand.items:
            if name != q.GPU:
                self.foreign[name] = self.foreign.get(name, 0) + sign * amount
        shares = sum(share for _, share in rec.devices)
        if shares:
            self.foreign[q.GPU] = self.foreign.get(q.GPU, 0) + sign * shares

    def evicted(self, pod: PodRecord) -> None:
        """Bookkeeping after a statement released an evicted pod's holding: it no longer counts or fills."""
        if pod.node is not None and pod.foreign:
            self.add_foreign(pod, -1)
        pod.node, pod.demand, pod.devices, pod.foreign = None, None, (), False
        pod.slot, pod.evicted = None, True

    # ------------------------------------------------------------------ releases inside a statement
    def release_into(self, stmt: Statement, victim: WorkloadRecord) -> None:
        """Take everything a victim holds off the nodes inside ``stmt`` (reservations and pods)."""
        for slot in victim.slots:
            if slot.reserving:
                stmt.uncharge(slot.node, slot.demand, slot.devices)
        for key in self.own_pods(victim):
            pod = self.pods[key]
            if pod.node is not None and pod.demand is not None:
                stmt.uncharge(pod.node, pod.demand, pod.devices)

    def release_slots_into(self, stmt: Statement, pods: Sequence[Victim]) -> None:
        """Take elastic slots off the nodes inside ``stmt``: the reservation, or the pod filling it."""
        for _, slot in pods:
            if slot.reserving:
                stmt.uncharge(slot.node, slot.demand, slot.devices)
            elif slot.pod is not None and slot.pod in self.pods:
                pod = self.pods[slot.pod]
                if pod.node is not None and pod.demand is not None:
                    stmt.uncharge(pod.node, pod.demand, pod.devices)
