"""What becomes of an admitted workload's slots afterwards: withdrawn, edited smaller, or evicted.

Each undoes part of an admission: reservations go back to their nodes (``NodeTable.uncharge``),
pods lose their slots, the gang leaves the preemption index, the displaced and disruption books
forget it. The eviction bookkeeping for a preemption victim is written here once, whoever
preempts (in-queue preemption or a reclaim the queue asked for), and a stale gang (one that stayed
below its minimum past its queue's staleness grace period) is evicted with the same bookkeeping.
"""

from __future__ import annotations

from services.placement.disruption import Disruptions
from services.placement.elasticpods import ElasticPods
from services.placement.ledger import PodLedger
from services.placement.nodes import NodeTable
from services.placement.payloads import Output
from services.placement.preemption import Preemption
from services.placement.signals import CapacitySignals
from services.placement.slots import Slots
from services.placement.statement import Statement
from services.placement.workloads import WorkloadRecord
from shared.kernel.events import GangEvicted, PreemptionRequested
from shared.kernel.model import Gang, shrunk


class Lifecycle:
    def __init__(self, nodes: NodeTable, ledger: PodLedger, slots: Slots, signals: CapacitySignals,
                 disruptions: Disruptions, preemption: Preemption, elastic: ElasticPods) -> None:
        self.nodes = nodes
        self.ledger = ledger
        self.slots = slots
        self.signals = signals
        self.disruptions = disruptions
        self.preemption = preemption
        self.elastic = elastic

    def withdraw(self, key: str) -> list[Output]:
        """Drop the slots; its pods keep counting on their nodes until they are gone.

        Pods still bound then (a finished RayJob that keeps its cluster, or its cluster's TTL) hold
        no quota any more, so like any pod outside an admitted workload they lower
        CapacityChanged.total: the queue must not count their room as free.
        """
        rec = self.slots.workloads.pop(key, None)
        self.signals.stop_waiting(key)
        self.disruptions.forget(key)  # no longer wanted: nothing to judge
        if rec is None:
            return []
        self.slots.displaced.pop(key, None)
        self.preemption.unhold(rec)
        pods = self.ledger.pods
        freed = False
        for slot in rec.slots:
            if slot.reserving:
                self.nodes.uncharge(slot.node, slot.demand, slot.devices)
                freed = True
            if slot.pod is not None and slot.pod in pods:
                pods[slot.pod].slot = None
        rec.slots = []
        out: list[Output] = self.slots.signal(self.slots.now, released=True) if freed and self.signals.waiting else []
        for pod in self.ledger.pods_of.get(key, {}):
            out += self.slots.set_foreign(pods[pod], True)
        return out + self.slots.retry_displaced()  # its reservations are free again

    def edit(self, key: str, gang: Gang, now: float) -> list[Output]:
        """Slots follow what was admitted. An edit asking for fewer pods (``shrunk``, the queue's rule
        too) drops the surplus slots: those holding no pod now (done, lost, then reserving ones,
        highest index first), releasing their reservations; those holding a pod when it goes away
        (``Slots.vacate``). Then a capacity release, so what waits retries. An edit asking for more
        changes nothing here: the pods beyond the slots wait unbound, without quota."""
        wrec = self.slots.admitted(key)
        if wrec is None:
            return []
        wrec.latest = gang
        out: list[Output] = [*self.elastic.trim(wrec)]
        smaller = shrunk(wrec.spec.gang, gang)
        if smaller is None:
            return out + (self.slots.signal(now, released=True) if out else [])
        wrec.spec = wrec.spec.model_copy(update={"gang": smaller})
        for ps in smaller.pod_sets:
            surplus = wrec.surplus(ps.name)
            idle = sorted((s for s in wrec.slots if s.pod_set == ps.name and s.pod is None),
                          key=lambda s: (not s.done, not s.lost, -s.index))
            for slot in idle[:max(surplus, 0)]:
                if slot.reserving:
                    self.nodes.uncharge(slot.node, slot.demand, slot.devices)
                wrec.slots.remove(slot)
        if wrec.key in self.slots.displaced and not any(s.free and (s.lost or not self.nodes.present[s.node])
                                                   for s in wrec.slots):
            del self.slots.displaced[wrec.key]
        return out + self.slots.signal(now, released=True) + self.disruptions.check_running(wrec, now)

    def evict(self, victim: WorkloadRecord, preemptor: WorkloadRecord, why: str) -> PreemptionRequested:
        """Bookkeeping after the statement released the victim: its pods no longer count or fill, it
        holds no slot, is no longer admitted, and nothing of it is displaced or left to judge."""
        names = self._let_go(victim)
        return PreemptionRequested(key=victim.key, kind=victim.spec.kind, gate=victim.spec.gate,
                                   preemptor=preemptor.key, preemptor_priority=preemptor.spec.priority,
                                   reclaim=preemptor.queue != victim.queue, pods=tuple(names), reason=why)

    def evict_stale(self, stale: list[tuple[WorkloadRecord, str]], now: float) -> list[Output]:
        """Gangs that stayed below their minimum past their queue's staleness grace period
        (``Disruptions.stale_due``) are evicted as KAI's ``stalegangeviction`` does, preemptible or not
        (no one preempts them: they cannot run as they are). Their reservations go back to their
        nodes and their pods count as gone (as a preemption victim's), their pods are evicted, and what
        waits retries."""
        out: list[Output] = []
        for wrec, why in stale:
            stmt = Statement(self.nodes)
            self.ledger.release_into(stmt, wrec)  # its pods count as gone, as a preemption victim's do
            stmt.commit()
            names = self._let_go(wrec)
            out.append(GangEvicted(key=wrec.key, kind=wrec.spec.kind, gate=wrec.spec.gate, pods=tuple(names),
                                   reason=why))
        if out:
            out += self.slots.signal(now, released=True) + self.slots.retry_displaced()
        return out

    def _let_go(self, victim: WorkloadRecord) -> list[str]:
        """What every eviction undoes once the victim's reservations are off their nodes: its pods no
        longer count or fill, it holds no slot, is no longer admitted, and nothing of it is displaced or
        left to judge. The names of the pods to evict."""
        self.slots.displaced.pop(victim.key, None)
        self.disruptions.forget(victim.key)
        names = []
        for key in self.ledger.own_pods(victim):
            pod = self.ledger.pods[key]
            if pod.evicted or not pod.facts.live or (pod.node is None and pod.slot is None):
                continue
            names.append(pod.facts.name)
            self.ledger.evicted(pod)
        victim.slots, victim.admitted, victim.running, victim.started_at = [], False, False, None
        self.preemption.unhold(victim)
        return names
