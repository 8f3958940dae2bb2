"""Slots of admitted workloads and the pods that fill them.

A pod watch event charges or uncharges the pod (``ledger``), vacates its slot when it goes (reserved
again for the recreated pod, or gone: done, surplus, an elastic pod's own, a stand-in's), gives a
live pod of an admitted workload a slot (a bound one the slot on its node, an unbound one muster
answers to a ``PodAssigned``; a pod-gated gang only once every gang pod waits: ``assemble``), and
re-places slots whose node left, all of them or none (``relocate``, retried on every release).
"""

from __future__ import annotations

from typing import Any

from services.placement import gpu, interpod
from services.placement.disruption import Disruptions
from services.placement.elasticpods import released
from services.placement.gang import Placement, ordered_pod_sets, place_pods
from services.placement.ledger import PodLedger
from services.placement.nodes import NodeTable
from services.placement.payloads import Output, pod_assigned
from services.placement.pods import PodRecord, pod_facts, pod_key, pod_set_of
from services.placement.signals import CapacitySignals
from services.placement.statement import Statement
from services.placement.workloads import Slot, WorkloadRecord
from shared.kernel import kube
from shared.kernel.events import ObjectChanged, PodAssigned
from shared.kernel.listing import Held, last_state
from shared.kernel.policy import Policy


class Slots:
    def __init__(self, policy: Policy, nodes: NodeTable, ledger: PodLedger, signals: CapacitySignals,
                 disruptions: Disruptions) -> None:
        self.policy = policy
        self.nodes = nodes
        self.ledger = ledger
        self.workloads: dict[str, WorkloadRecord] = {}
        """Every workload placement was asked to place (``PlacementCore.workloads``)."""
        self.signals = signals
        self.disruptions = disruptions
        self.displaced: dict[str, None] = {}
        """Admitted workloads with free slots whose node left, waiting to be re-placed together."""
        self.now = 0.0
        """The time of the event being handled."""
        self.unclaimed: dict[str, str] = {}
        """Pods (key -> their workload's key) that hold their slot but are not told to bind yet: a claim
        of theirs does not let them be bound now (``VolumeBook.prebind``), so they wait for a claim event."""

    def on_pod(self, p: ObjectChanged, now: float, held: Held | None = None) -> list[Output]:
        """Count bound live pods, fill or free slots, assign new pods of admitted workloads. A version
        ingest refused (``kube.REFUSED``) is not read: the pod's last readable version stands, and
        admission rejects its workload naming it. ``held``: the watch book's ``Held`` of this event's
        object (None for a deletion, whose object the book no longer holds)."""
        if p.change != "Deleted" and kube.refused(p.object) is not None:
            if held is not None:  # the book keeps a copy: this version may share parts with the record's
                held.obj = last_state(held.obj)
            return []
        if not self.nodes.marking and p.change != "Deleted" and interpod.holds_anti(p.object):
            interpod.activate(self.nodes, self.ledger.pods.values(), self.workloads.values())  # others must respect it
        rec = self.ledger.pods.get(pod_key(p.object, p.name, p.namespace))
        facts = pod_facts(p.change, p.object, p.name, p.namespace, self.policy.answers_to,
                          None if rec is None else (rec.facts, rec.obj))
        if rec is None:
            if not facts.live or (not facts.bound and facts.workload is None):
                return []
            rec = PodRecord(facts=facts, held=held or Held(p.object))
            self.ledger.add(rec)
        else:
            rec.facts, rec.held = facts, held or Held(p.object)
        wrec = self.admitted(facts.workload)
        if wrec is not None and facts.kind not in (None, wrec.spec.kind):
            wrec = None  # another kind's object under the same name: not this workload's pod
        out: list[Output] = []
        was_counting, reserved_again = rec.node is not None, False
        if rec.node is not None and not self.ledger.charge_holds(rec):
            self.ledger.uncharge(rec)
        if rec.slot is not None and not facts.live:
            slot = rec.slot
            reserved_again, assigned = self.vacate(rec, wrec)
            if reserved_again and wrec is not None and wrec.running and slot.in_gang:
                out += self.disruptions.suspect(wrec, facts.name, slot.lost, now)
            out += assigned
        if wrec is not None and facts.live and not rec.evicted:
            if rec.slot is None:
                out += self.attach(wrec, rec)
            if rec.slot is not None and facts.bound and not rec.slot.filled:
                self.fill(rec.slot)
        if rec.node is None and facts.live and facts.bound and not rec.evicted:
            out += self.charge_pod(rec, wrec, now)
        if was_counting and rec.node is None and not reserved_again:
            out += self.signal(now, released=True)
        if wrec is not None:
            out += self.disruptions.check_running(wrec, now)
        if not facts.live:
            self.ledger.forget(rec)
        return out

    def admitted(self, key: str | None) -> WorkloadRecord | None:
        rec = self.workloads.get(key) if key else None
        return rec if rec is not None and rec.admitted else None

    def charge_pod(self, rec: PodRecord, wrec: WorkloadRecord | None, now: float) -> list[Output]:
        self.ledger.charge(rec, foreign=wrec is None)
        return self.signal(now, released=False) if rec.foreign else []

    def signal(self, now: float, released: bool) -> list[Output]:
        """One CapacityChanged at the end of this instant (``CapacitySignals.request``)."""
        return [*self.signals.request(now, released)]

    def set_foreign(self, rec: PodRecord, foreign: bool) -> list[Output]:
        return self.signal(self.now, released=False) if self.ledger.set_foreign(rec, foreign) else []

    def vacate(self, rec: PodRecord, wrec: WorkloadRecord | None) -> tuple[bool, list[Output]]:
        """A gone pod leaves its slot: reserve it again for the recreated pod (True), unless it is done
        or the slot is surplus after a shrinking edit (then the slot goes with its pod)."""
        slot = rec.slot
        assert slot is not None
        rec.slot = None
        was_filled, was_reserving = slot.filled, slot.reserving
        slot.pod, slot.filled = None, False
        if wrec is None:
            return False, []
        if slot.elastic:  # its own pod only: a replacement asks the queue for quota again
            if was_reserving:
                self.nodes.uncharge(slot.node, slot.demand, slot.devices)
            wrec.slots.remove(slot)
            what = "finished" if rec.facts.phase in ("Succeeded", "Failed") else "went away"
            return False, [released(wrec, slot.pod_set, 1, f"pod {rec.facts.name} {what}")]
        surplus = wrec.surplus(slot.pod_set) > 0
        if rec.facts.phase == "Succeeded" or surplus:
            if was_reserving:
                self.nodes.uncharge(slot.node, slot.demand, slot.devices)
            if surplus:
                wrec.slots.remove(slot)
            else:
                slot.done = True
            return False, []
        stand_in = self.stand_in(wrec, slot)
        if stand_in is not None:  # a running elastic pod of the pod set takes the gang place
            if was_reserving:
                self.nodes.uncharge(slot.node, slot.demand, slot.devices)
            wrec.slots.remove(slot)
            stand_in.elastic, stand_in.in_gang = False, slot.in_gang
            assert stand_in.pod is not None
            return False, [released(wrec, slot.pod_set, 1,
                                                  f"pod {stand_in.pod.partition('/')[2]} takes the gang place of "
                                                  f"pod {rec.facts.name}", promoted=(stand_in.pod,))]
        if was_filled and self.nodes.present[slot.node]:
            self.nodes.charge(slot.node, slot.demand, slot.devices)
        elif was_filled:
            slot.lost = True
            self.displaced[wrec.key] = None
        return True, self.assign_waiting(wrec, slot.pod_set)

    def stand_in(self, wrec: WorkloadRecord, gone: Slot) -> Slot | None:
        """The newest elastic slot of the same pod set holding a bound pod on a present node: the pod that
        may take a gone gang pod's place (a gang is a count of running pods, not particular ones)."""
        found = None  # the highest index; of equal ones the first, as a stable sort by -index gives
        for slot in wrec.slots:
            if slot.elastic and slot.pod_set == gone.pod_set and slot.filled and self.nodes.present[slot.node] \
                    and (found is None or slot.index > found.index):
                found = slot
        return found

    def attach(self, wrec: WorkloadRecord, rec: PodRecord) -> list[Output]:
        """Give a live pod of an admitted workload a slot; unbound pods muster answers to are told where
        to go. A bound pod fills a free slot of its pod set, on its node if one is there (a pod another
        scheduler bound elsewhere takes a slot all the same: its own charge replaces the reservation)."""
        facts = rec.facts
        pod_set = self.pod_set_name(wrec, rec)
        if facts.bound:
            slot = wrec.free_slot(pod_set, self.nodes.index.get(facts.node_name))
            if slot is None:
                return []
            slot.pod, rec.slot = facts.key, slot
            return self.set_foreign(rec, False)
        if not self.policy.answers_to(facts.scheduler_name):
            return []  # another scheduler's pod: it binds it (the pod then fills a slot where it landed)
        if not wrec.assembled:
            return self.assemble(wrec)
        slot = wrec.free_slot(pod_set)
        if slot is not None and (slot.lost or not self.nodes.present[slot.node]):
            slot = wrec.free_slot(pod_set) if self.relocate(wrec) else None
        if slot is None:  # beyond its slots (an elastic pod not granted yet): it waits unbound, no quota
            return []
        slot.pod, rec.slot = facts.key, slot
        return self.tell(wrec, rec, slot)

    def tell(self, wrec: WorkloadRecord, rec: PodRecord, slot: Slot) -> list[Output]:
        """Tell a pod that holds ``slot`` where to go, unless its claims keep it back for now: kube-scheduler
        binds a pod only once its ephemeral claims exist (PreFilter) and writes the node on its delayed
        claims first (PreBind); a pod kept back keeps its slot and is told when a claim changes."""
        prebind = self.nodes.volumes.prebind(rec.obj, self.nodes.names[slot.node]) \
            if "volumes" in kube.mapping(rec.obj.get("spec")) else None
        if prebind is not None and prebind.wait:
            self.unclaimed[rec.key] = wrec.key
            return []
        self.unclaimed.pop(rec.key, None)
        return [self.pod_assigned(wrec, rec, slot, prebind.claims if prebind is not None else ())]

    def tell_unclaimed(self) -> list[Output]:
        """A claim changed: pods kept back by their claims are told where to go if they now may be."""
        out: list[Output] = []
        for key, workload in list(self.unclaimed.items()):
            rec, wrec = self.ledger.pods.get(key), self.admitted(workload)
            if rec is None or wrec is None or rec.slot is None or rec.slot.pod != key or rec.facts.bound \
                    or not rec.facts.live or rec.evicted:
                del self.unclaimed[key]  # gone, bound, or no longer in that slot: nothing to tell
                continue
            out += self.tell(wrec, rec, rec.slot)
        return out

    def assemble(self, wrec: WorkloadRecord) -> list[Output]:
        """A pod-gated gang binds nothing until a pod waits for every one of its gang slots: then all
        of them are told where to go at once, in the order they were observed (Volcano binds a job
        only when minAvailable tasks are present; a gang whose evicted plain pods never come back
        must not run with some of them). A suspend-gated gang's pods are created after admission,
        on reserved nodes: they go as they come."""
        if wrec.spec.gate == "pods":
            missing: dict[str, int] = {}
            for slot in wrec.slots:
                if slot.in_gang and not slot.elastic and slot.free:
                    missing[slot.pod_set] = missing.get(slot.pod_set, 0) + 1
            for key in self.ledger.own_pods(wrec):
                pod = self.ledger.pods[key]
                if pod.slot is None and pod.facts.live and not pod.facts.bound and not pod.evicted:
                    name = self.pod_set_name(wrec, pod)
                    if missing.get(name):
                        missing[name] -= 1
            if any(missing.values()):
                return []
        wrec.assembled = True
        out: list[Output] = []
        for key in self.ledger.own_pods(wrec):
            pod = self.ledger.pods[key]
            if pod.slot is None and pod.facts.live and not pod.facts.bound and not pod.evicted:
                out += self.attach(wrec, pod)
        return out

    def pod_set_name(self, wrec: WorkloadRecord, rec: PodRecord) -> str:
        """The pod set a pod fills. KubeRay's pods say it in their labels; a plain pod gang's pods are
        matched by shape to the gang's pod sets (``pods``, ``pods-2``, ...), so a pod only ever fills
        a slot reserved for exactly what it asks; one of no known shape fills none (it waits unbound,
        like any pod beyond the gang)."""
        if wrec.spec.kind not in ("PodGroup", "Pod"):
            return rec.facts.pod_set
        mine = pod_set_of(rec.obj, rec.facts.pod_set, rec.facts)
        if mine is None:
            return ""
        for ps in wrec.spec.gang.pod_sets:
            if ps.task == mine.task and ps.shape == mine.shape:
                return ps.name
        return ""

    def fill(self, slot: Slot) -> None:
        """A bound pod now holds what its slot reserved."""
        if slot.reserving:
            self.nodes.uncharge(slot.node, slot.demand, slot.devices)
        slot.filled = True

    def relocate(self, wrec: WorkloadRecord) -> bool:
        """Place every free slot whose node left again: all of them in one statement, or none.

        A gang that lost pods with a node never half-lands again: the pods KubeRay recreates wait
        unbound until every displaced slot fits (Volcano's gang rule: the job is ready only when
        running + newly allocated tasks reach minAvailable), a pod still bound to a node that left
        counted among them. The survivors keep running. Retried whenever capacity appears
        (``retry_displaced``). True when nothing is displaced any more.
        """
        present = self.nodes.present
        displaced = [s for s in wrec.slots if s.free and not s.elastic and (s.lost or not present[s.node])]
        if not displaced:
            self.displaced.pop(wrec.key, None)
            return True
        if any(s.filled and not s.elastic and not present[s.node] for s in wrec.slots):
            # a pod still bound to a node that left goes too (its deletion is not seen yet): its slot is
            # re-placed with the others once it has, all or none (KubeRay re-creates one pod at a time)
            self.displaced[wrec.key] = None
            return False
        for slot in displaced:
            if slot.reserving:  # reserved on a node that left: the reservation left with it
                self.nodes.uncharge(slot.node, slot.demand, slot.devices)
                slot.lost = True
        strategy = self.policy.placement_for(wrec.queue)
        stmt = Statement(self.nodes)
        moves: list[tuple[Slot, Any]] = []
        for pod_set in ordered_pod_sets(wrec.spec.gang):
            slots = [s for s in displaced if s.pod_set == pod_set.name]
            if not slots:
                continue
            placed = place_pods(self.nodes, stmt, pod_set, slots[0].demand, len(slots), strategy)
            if len(placed) < len(slots):
                stmt.rollback()
                self.displaced[wrec.key] = None
                return False
            moves += zip(slots, placed)
        stmt.commit()
        for slot, placement in moves:
            slot.node, slot.devices, slot.lost = placement.node, placement.devices, False
        self.displaced.pop(wrec.key, None)
        return True

    def move(self, wrec: WorkloadRecord, slot: Slot, to: Placement) -> tuple[str, list[Output]]:
        """A bound pod's slot goes where a statement placed it again (consolidation): the pod counts no more
        (the statement took its charge off its node) and is to be evicted, the slot reserves its new place
        for the pod its owner makes again, which is bound there when it comes (``attach``), or at once to a
        pod of the pod set already waiting. The key of the pod to evict."""
        assert slot.pod is not None
        pod = self.ledger.pods[slot.pod]
        self.ledger.evicted(pod)
        slot.pod, slot.filled = None, False
        slot.node, slot.devices = to.node, to.devices
        return pod.key, self.assign_waiting(wrec, slot.pod_set)

    def compact_nodes(self) -> None:
        """Drop the node table's rows of gone nodes nothing refers to (``NodeTable.compact``) and move
        every row number placement holds (charged pods, slots) to its row's new place. Only between two
        events: no statement is open, no row is in flight."""
        slots = {id(s): s for wrec in self.workloads.values() for s in wrec.slots}
        for rec in self.ledger.pods.values():
            if rec.slot is not None:
                slots.setdefault(id(rec.slot), rec.slot)
        referenced = {rec.node for rec in self.ledger.pods.values() if rec.node is not None}
        referenced.update(s.node for s in slots.values())
        moved = self.nodes.compact(referenced).tolist()
        for rec in self.ledger.pods.values():
            if rec.node is not None:
                rec.node = moved[rec.node]
        for slot in slots.values():
            slot.node = moved[slot.node]

    def retry_displaced(self) -> list[Output]:
        """Capacity appeared: gangs whose pods lost their node try again, then hand the waiting pods their slots."""
        out: list[Output] = []
        for key in list(self.displaced):
            wrec = self.admitted(key)
            if wrec is None:
                del self.displaced[key]
                continue
            if not self.relocate(wrec):
                continue
            for pod_set in ordered_pod_sets(wrec.spec.gang):
                while assigned := self.assign_waiting(wrec, pod_set.name):
                    out += assigned
        return out

    def waiting(self, wrec: WorkloadRecord, pod_set: str) -> int:
        """How many pods of that pod set wait for a slot (live, unbound, not evicted)."""
        return sum(1 for key in self.ledger.own_pods(wrec) if self._waits(wrec, self.ledger.pods[key], pod_set))

    def _waits(self, wrec: WorkloadRecord, rec: PodRecord, pod_set: str) -> bool:
        facts = rec.facts
        return rec.slot is None and facts.live and not facts.bound and not rec.evicted \
            and self.pod_set_name(wrec, rec) == pod_set

    def assign_waiting(self, wrec: WorkloadRecord, pod_set: str) -> list[Output]:
        """A slot came free: the first pod of that pod set still waiting for one takes it."""
        for key in self.ledger.own_pods(wrec):
            rec = self.ledger.pods[key]
            if self._waits(wrec, rec, pod_set):
                return self.attach(wrec, rec)
        return []

    def pod_assigned(self, wrec: WorkloadRecord, rec: PodRecord, slot: Slot, claims: tuple[str, ...] = ()) -> PodAssigned:
        node = self.nodes.names[slot.node]
        return pod_assigned(wrec.key, rec.facts.namespace, rec.facts.name, slot.pod_set, node,
                            gpu.assignment(wrec.key, node, slot.devices, slot.demand.gpu_memory), slot.elastic,
                            claims)
    def hand_out(self, rec: WorkloadRecord, now: float) -> list[Output]:
        """A gang was just admitted: hand its existing pods their slots in observed order."""
        out: list[Output] = []
        for key in self.ledger.own_pods(rec):
            pod = self.ledger.pods[key]
            if pod.facts.live and not pod.evicted and pod.slot is None:
                out += self.attach(rec, pod)
                slot = self.ledger.pods[key].slot  # the one attach gave it, if any (read anew: mypy keeps pod.slot None)
                if slot is not None and pod.facts.bound and not slot.filled:
                    self.fill(slot)
        out += self.disruptions.check_running(rec, now)
        return out
