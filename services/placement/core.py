"""The placement service's decision core: where a gang goes, and what follows for pods and capacity.

Where each decision is made:
- what a node offers and uses, static filters, scoring: ``nodes.NodeTable``
- one gang onto the nodes, all or nothing: ``gang.place_gang`` inside a ``statement.Statement``
- which GPU device a pod gets, group ids: ``gpu``
- who is preempted, and the fewest of them: ``preemption``; elastic pods first: ``elastic``
- failure text: ``reasons``
- GPU fragmentation against the recent workload mix (the ``fragmentation`` strategy): ``fragmentation``
- this module: routing events; slots of admitted workloads and the pods that fill them;
  GangRunning; CapacityChanged; feeding each arriving workload's pods to the mix.

Pure: no I/O, no clock (``env.occurred_at`` is now), no randomness; dicts keep inbox order.
"""

from __future__ import annotations

from typing import Any, Union

from services.placement import elastic, gpu, reasons
from services.placement.disruption import DISRUPTION_TIMER, Disruptions
from services.placement.elasticpods import ElasticPods, released as elastic_released
from services.placement.gang import GangAttempt, ordered_pod_sets, place_pods, pod_demand
from services.placement.nodes import FRAGMENTATION, NodeTable
from services.placement.payloads import gang_placed, pod_assigned, slot_assignment
from services.placement.pods import PodRecord, pod_facts, pod_key, pod_set_of
from services.placement.ledger import PodLedger
from services.placement.preemption import Preemption, trial
from services.placement.signals import CAPACITY_TIMER, RIPEN_TIMER, CapacitySignals
from services.placement.statement import Statement
from services.placement.workloads import Slot, WorkloadRecord
from shared.kernel import kube
from shared.kernel import quantity as q
from shared.kernel.model import shrunk
from shared.kernel.events import (
    CapacityChanged, Dequeued, ElasticGranted, ElasticReleased, Envelope, GangDisrupted, GangPlaced, GangRunning,
    ObjectChanged, ObjectsListed, PlacementFailed, PodAssigned, PreemptionRequested, QueueDefined, QueueRemoved, ReclaimRequested,
    TimerFired, TimerSet, WorkloadUpdated, WorkloadWithdrawn,
)
from shared.kernel.dedupe import RECENT_IDS, Seen
from shared.kernel.listing import Held, WatchBook, last_state
from shared.kernel.policy import Policy

Output = Union[GangPlaced, PlacementFailed, PodAssigned, GangRunning, GangDisrupted, PreemptionRequested,
               CapacityChanged, ElasticReleased, TimerSet]
"""What placement emits (``shared.kernel.topology`` routes each)."""


class PlacementCore:
    service = "placement"

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.nodes = NodeTable()
        self.workloads: dict[str, WorkloadRecord] = {}
        self.ledger = PodLedger(self.nodes)
        """Pod bookkeeping: what each pod charges, foreign pods, releases inside a statement."""
        self._handled = Seen(RECENT_IDS)
        """Ids of decision envelopes already handled (membership only: a redelivery yields nothing)."""
        self._admissions = 0
        self.signals = CapacitySignals(self.nodes, self.ledger)
        """CapacityChanged, its timers, and the gangs waiting for room."""
        self.disruptions = Disruptions(self.ledger)
        """GangRunning, and running gangs that lost a pod until they are judged."""
        self._now = 0.0
        self._displaced: dict[str, None] = {}
        """Admitted workloads with free slots whose node left, waiting to be re-placed together."""
        self.preemption = Preemption(self.nodes, self.ledger)
        self.elastic = ElasticPods(self.nodes, self.ledger)
        """Elastic pods' slots: granted, dropped, evicted."""
        """Who makes room: admitted workloads per queue and priority, minimum runtimes, the fewest victims."""
        self.book = WatchBook(by_reference=frozenset({"Pod"}))
        """Every node and pod placement was told of, to tell what a list lacks (``shared.kernel.listing``).
        Pods by reference: ``PodRecord.held`` is the book's ``Held``, so a pod's object is neither
        copied on each of its watch events nor held twice."""
        self._mixing = FRAGMENTATION in (policy.placement, *(q_.placement for q_ in policy.queues.values()))
        """Whether any queue places by fragmentation, the only reader of the workload mix (else not fed)."""

    @property
    def pods(self) -> dict[str, PodRecord]:
        """Every pod placement keeps, by key (the ledger's: one container, so a snapshot holds it once)."""
        return self.ledger.pods

    @property
    def pods_of(self) -> dict[str, dict[str, None]]:
        return self.ledger.pods_of

    # ------------------------------------------------------------------ routing
    def handle(self, env: Envelope) -> list[Output]:
        out = self._route(env)
        if self.nodes.compaction_due():  # between two events: no statement is open, no row is in flight
            self._compact_nodes()
        return out

    def _route(self, env: Envelope) -> list[Output]:
        p = env.payload
        now = env.occurred_at
        self._now = now
        if isinstance(p, ObjectChanged):
            held = self.book.observe(p)
            if p.kind == "Node":
                return self._on_node(p)
            if p.kind == "Pod":
                return self._on_pod(p, now, held)
            return []
        if isinstance(p, TimerFired):
            return self._on_timer(p.key, p.due(now), now)
        if isinstance(p, ObjectsListed):  # nodes and pods deleted while no watch was open
            out: list[Output] = []
            for gone in self.book.listed(p):
                out += self._on_node(gone) if gone.kind == "Node" else self._on_pod(gone, now)
            return out
        if isinstance(p, QueueDefined):
            self.preemption.define_queue(p.queue.name, p.queue.min_runtime)
            return []
        if isinstance(p, QueueRemoved):
            self.preemption.define_queue(p.name, None)
            return []
        if isinstance(p, WorkloadUpdated):
            return self._on_updated(p, now)
        if not isinstance(p, (Dequeued, ReclaimRequested, WorkloadWithdrawn, ElasticGranted)) or not self._handled.add(env.id, env.source):
            return []
        if isinstance(p, Dequeued):
            return self._on_dequeued(p, now)
        if isinstance(p, ReclaimRequested):
            return self._on_reclaim(p, now)
        if isinstance(p, ElasticGranted):
            return self._on_elastic_granted(p)
        return self._on_withdrawn(p)

    # ------------------------------------------------------------------ nodes and capacity
    def _on_node(self, p: ObjectChanged) -> list[Output]:
        """A node came, changed or left. One ingest refused (``kube.REFUSED``) is cordoned: left out
        of scheduling, its pods still charged (the cluster link logs and counts the refusal)."""
        if p.change == "Deleted":
            change = self.nodes.remove(p.name)
        elif kube.refused(p.object) is not None:
            change = self.nodes.cordon(p.name)
        else:
            change = self.nodes.upsert(p.name, p.object)
        if change is None:
            return []
        lost: list[Output] = []
        if p.change == "Deleted":
            gone = self.nodes.index[p.name]
            for wrec in self.workloads.values():
                if not wrec.admitted:
                    continue
                idle = [(wrec, s) for s in wrec.slots if s.elastic and s.node == gone and s.free]
                lost += self.elastic.drop(idle, f"its node {p.name} left")  # they ask the queue again
                if any(s.node == gone and s.free for s in wrec.slots):
                    self._displaced[wrec.key] = None
        pending = self.signals.take_pending()
        released = change.grew or change.constraints or pending
        out: list[Output] = lost + [self.signals.changed(released, everyone=bool(change.grew or change.constraints))]
        return out + self._retry_displaced() if released else out

    def _compact_nodes(self) -> None:
        """Drop the node table's rows of gone nodes nothing refers to (``NodeTable.compact``) and move
        every row number placement holds (charged pods, slots) to its row's new place."""
        slots = {id(s): s for wrec in self.workloads.values() for s in wrec.slots}
        for rec in self.pods.values():
            if rec.slot is not None:
                slots.setdefault(id(rec.slot), rec.slot)
        referenced = {rec.node for rec in self.pods.values() if rec.node is not None}
        referenced.update(s.node for s in slots.values())
        moved = self.nodes.compact(referenced).tolist()
        for rec in self.pods.values():
            if rec.node is not None:
                rec.node = moved[rec.node]
        for slot in slots.values():
            slot.node = moved[slot.node]

    def _on_timer(self, key: str, due: float, now: float) -> list[Output]:
        """A timer set for ``due`` fired, handled at ``now`` (later, when inputs stamped after ``due``
        were handled first)."""
        if key == DISRUPTION_TIMER:
            return [*self.disruptions.judge(now, self.workloads)]
        if key == RIPEN_TIMER:
            return [self.signals.ripened(due)]
        if key != CAPACITY_TIMER:
            return []
        events, released = self.signals.fired(due)
        out: list[Output] = [*events]
        return out + self._retry_displaced() if released else out

    def _signal(self, now: float, released: bool) -> list[Output]:
        """One CapacityChanged at the end of this instant (``CapacitySignals.request``)."""
        return [*self.signals.request(now, released)]

    def _set_foreign(self, rec: PodRecord, foreign: bool) -> list[Output]:
        return self._signal(self._now, released=False) if self.ledger.set_foreign(rec, foreign) else []

    # ------------------------------------------------------------------ pods
    def _on_pod(self, p: ObjectChanged, now: float, held: Held | None = None) -> list[Output]:
        """Count bound live pods, fill or free slots, assign new pods of admitted workloads. A version
        ingest refused (``kube.REFUSED``) is not read: the pod's last readable version stands, and
        admission rejects its workload naming it. ``held``: the watch book's ``Held`` of this event's
        object (None for a deletion, whose object the book no longer holds)."""
        if p.change != "Deleted" and kube.refused(p.object) is not None:
            if held is not None:  # the book keeps a copy: this version may share parts with the record's
                held.obj = last_state(held.obj)
            return []
        rec = self.pods.get(pod_key(p.object, p.name, p.namespace))
        facts = pod_facts(p.change, p.object, p.name, p.namespace, self.policy.answers_to,
                          None if rec is None else (rec.facts, rec.obj))
        if rec is None:
            if not facts.live or (not facts.bound and facts.workload is None):
                return []
            rec = PodRecord(facts=facts, held=held or Held(p.object))
            self.ledger.add(rec)
        else:
            rec.facts, rec.held = facts, held or Held(p.object)
        wrec = self._admitted(facts.workload)
        if wrec is not None and facts.kind not in (None, wrec.spec.kind):
            wrec = None  # another kind's object under the same name: not this workload's pod
        out: list[Output] = []
        was_counting, reserved_again = rec.node is not None, False
        if rec.node is not None and not self.ledger.charge_holds(rec):
            self.ledger.uncharge(rec)
        if rec.slot is not None and not facts.live:
            slot = rec.slot
            reserved_again, assigned = self._vacate(rec, wrec)
            if reserved_again and wrec is not None and wrec.running and slot.in_gang:
                out += self.disruptions.suspect(wrec, facts.name, slot.lost, now)
            out += assigned
        if wrec is not None and facts.live and not rec.evicted:
            if rec.slot is None:
                out += self._attach(wrec, rec)
            if rec.slot is not None and facts.bound and not rec.slot.filled:
                self._fill(rec.slot)
        if rec.node is None and facts.live and facts.bound and not rec.evicted:
            out += self._charge_pod(rec, wrec, now)
        if was_counting and rec.node is None and not reserved_again:
            out += self._signal(now, released=True)
        if wrec is not None:
            out += self.disruptions.check_running(wrec, now)
        if not facts.live:
            self.ledger.forget(rec)
        return out

    def _admitted(self, key: str | None) -> WorkloadRecord | None:
        rec = self.workloads.get(key) if key else None
        return rec if rec is not None and rec.admitted else None

    def _charge_pod(self, rec: PodRecord, wrec: WorkloadRecord | None, now: float) -> list[Output]:
        self.ledger.charge(rec, foreign=wrec is None)
        return self._signal(now, released=False) if rec.foreign else []

    def _vacate(self, rec: PodRecord, wrec: WorkloadRecord | None) -> tuple[bool, list[Output]]:
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
            return False, [elastic_released(wrec, slot.pod_set, 1, f"pod {rec.facts.name} {what}")]
        surplus = wrec.surplus(slot.pod_set) > 0
        if rec.facts.phase == "Succeeded" or surplus:
            if was_reserving:
                self.nodes.uncharge(slot.node, slot.demand, slot.devices)
            if surplus:
                wrec.slots.remove(slot)
            else:
                slot.done = True
            return False, []
        stand_in = self._stand_in(wrec, slot)
        if stand_in is not None:  # a running elastic pod of the pod set takes the gang place
            if was_reserving:
                self.nodes.uncharge(slot.node, slot.demand, slot.devices)
            wrec.slots.remove(slot)
            stand_in.elastic, stand_in.in_gang = False, slot.in_gang
            assert stand_in.pod is not None
            return False, [elastic_released(wrec, slot.pod_set, 1,
                                                  f"pod {stand_in.pod.partition('/')[2]} takes the gang place of "
                                                  f"pod {rec.facts.name}", promoted=(stand_in.pod,))]
        if was_filled and self.nodes.present[slot.node]:
            self.nodes.charge(slot.node, slot.demand, slot.devices)
        elif was_filled:
            slot.lost = True
            self._displaced[wrec.key] = None
        return True, self._assign_waiting(wrec, slot.pod_set)

    def _stand_in(self, wrec: WorkloadRecord, gone: Slot) -> Slot | None:
        """The newest elastic slot of the same pod set holding a bound pod on a present node: the pod that
        may take a gone gang pod's place (a gang is a count of running pods, not particular ones)."""
        found = None  # the highest index; of equal ones the first, as a stable sort by -index gives
        for slot in wrec.slots:
            if slot.elastic and slot.pod_set == gone.pod_set and slot.filled and self.nodes.present[slot.node] \
                    and (found is None or slot.index > found.index):
                found = slot
        return found

    def _attach(self, wrec: WorkloadRecord, rec: PodRecord) -> list[Output]:
        """Give a live pod of an admitted workload a slot; unbound pods muster answers to are told where
        to go. A bound pod fills a free slot of its pod set, on its node if one is there (a pod another
        scheduler bound elsewhere takes a slot all the same: its own charge replaces the reservation)."""
        facts = rec.facts
        pod_set = self._pod_set_name(wrec, rec)
        if facts.bound:
            slot = wrec.free_slot(pod_set, self.nodes.index.get(facts.node_name))
            if slot is None:
                return []
            slot.pod, rec.slot = facts.key, slot
            return self._set_foreign(rec, False)
        if not self.policy.answers_to(facts.scheduler_name):
            return []  # another scheduler's pod: it binds it (the pod then fills a slot where it landed)
        if not wrec.assembled:
            return self._assemble(wrec)
        slot = wrec.free_slot(pod_set)
        if slot is not None and (slot.lost or not self.nodes.present[slot.node]):
            slot = wrec.free_slot(pod_set) if self._relocate(wrec) else None
        if slot is None:  # beyond its slots (an elastic pod not granted yet): it waits unbound, no quota
            return []
        slot.pod, rec.slot = facts.key, slot
        return [self._pod_assigned(wrec, rec, slot)]

    def _assemble(self, wrec: WorkloadRecord) -> list[Output]:
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
                pod = self.pods[key]
                if pod.slot is None and pod.facts.live and not pod.facts.bound and not pod.evicted:
                    name = self._pod_set_name(wrec, pod)
                    if missing.get(name):
                        missing[name] -= 1
            if any(missing.values()):
                return []
        wrec.assembled = True
        out: list[Output] = []
        for key in self.ledger.own_pods(wrec):
            pod = self.pods[key]
            if pod.slot is None and pod.facts.live and not pod.facts.bound and not pod.evicted:
                out += self._attach(wrec, pod)
        return out

    def _pod_set_name(self, wrec: WorkloadRecord, rec: PodRecord) -> str:
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

    def _fill(self, slot: Slot) -> None:
        """A bound pod now holds what its slot reserved."""
        if slot.reserving:
            self.nodes.uncharge(slot.node, slot.demand, slot.devices)
        slot.filled = True

    def _relocate(self, wrec: WorkloadRecord) -> bool:
        """Place every free slot whose node left again: all of them in one statement, or none.

        A gang that lost pods with a node never half-lands again: the pods KubeRay recreates wait
        unbound until every displaced slot fits (Volcano's gang rule: the job is ready only when
        running + newly allocated tasks reach minAvailable), a pod still bound to a node that left
        counted among them. The survivors keep running. Retried whenever capacity appears
        (``_retry_displaced``). True when nothing is displaced any more.
        """
        present = self.nodes.present
        displaced = [s for s in wrec.slots if s.free and not s.elastic and (s.lost or not present[s.node])]
        if not displaced:
            self._displaced.pop(wrec.key, None)
            return True
        if any(s.filled and not s.elastic and not present[s.node] for s in wrec.slots):
            # a pod still bound to a node that left goes too (its deletion is not seen yet): its slot is
            # re-placed with the others once it has, all or none (KubeRay re-creates one pod at a time)
            self._displaced[wrec.key] = None
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
                self._displaced[wrec.key] = None
                return False
            moves += zip(slots, placed)
        stmt.commit()
        for slot, placement in moves:
            slot.node, slot.devices, slot.lost = placement.node, placement.devices, False
        self._displaced.pop(wrec.key, None)
        return True

    def _retry_displaced(self) -> list[Output]:
        """Capacity appeared: gangs whose pods lost their node try again, then hand the waiting pods their slots."""
        out: list[Output] = []
        for key in list(self._displaced):
            wrec = self._admitted(key)
            if wrec is None:
                del self._displaced[key]
                continue
            if not self._relocate(wrec):
                continue
            for pod_set in ordered_pod_sets(wrec.spec.gang):
                while assigned := self._assign_waiting(wrec, pod_set.name):
                    out += assigned
        return out

    def _assign_waiting(self, wrec: WorkloadRecord, pod_set: str) -> list[Output]:
        """A slot came free: the first pod of that pod set still waiting for one takes it."""
        for key in self.ledger.own_pods(wrec):
            rec = self.pods[key]
            facts = rec.facts
            if rec.slot is None and facts.live and not facts.bound and not rec.evicted \
                    and self._pod_set_name(wrec, rec) == pod_set:
                return self._attach(wrec, rec)
        return []

    # ------------------------------------------------------------------ gangs
    def _begin(self, p: Dequeued | ReclaimRequested) -> tuple[list[Output], WorkloadRecord | None]:
        """The start of every placement request. A redelivered request for an admitted gang repeats its
        GangPlaced (record None); otherwise gangs that lost pods are re-placed first (they hold their
        quota already), then the request gets a fresh record."""
        current = self.workloads.get(p.key)
        if current is not None and current.admitted:
            return [self._gang_placed(current)], None
        restored = self._retry_displaced()
        self.signals.stop_waiting(p.key)
        rec = WorkloadRecord(spec=p.workload, queue=p.queue)
        self.workloads[p.key] = rec
        # Every pod set's demand is made here, mixing or not: it names the table's resource columns in the
        # order gangs arrive, which ``totals()`` (CapacityChanged) keeps; logs made before must verify.
        shapes = [(pod_demand(self.nodes, ps).shape, ps.count) for ps in p.workload.gang.pod_sets]
        if self._mixing:
            self.nodes.mix.observe(p.key, shapes)
        return restored, rec

    def _on_dequeued(self, p: Dequeued, now: float) -> list[Output]:
        """Place the whole gang; else preempt lower priorities of its queue; else explain."""
        restored, rec = self._begin(p)
        if rec is None:
            return restored
        strategy = self.policy.placement_for(p.queue)
        stmt, attempt = trial(self.nodes, self.ledger, rec.spec.gang, strategy, [], [], explain=True)
        if attempt.ok:
            stmt.commit()
            return restored + self._admit(rec, attempt, now, self._placed_reason(attempt, strategy))
        stmt.rollback()
        min_runtime = self.preemption.queue_min_runtime.get(rec.queue, self.policy.min_runtime_for(rec.queue))
        candidates = self.preemption.candidates(rec, now, min_runtime)
        pods, victims = self.preemption.choose(rec, candidates, strategy)
        if victims is None:
            ripe, reason = self.preemption.why_not(rec, candidates, strategy, now, min_runtime, attempt.reason)
            ripening: list[Output] = [*self.signals.ripen(ripe)] if ripe is not None else []
            room_key = self.signals.wait_for_room(rec, strategy) if attempt.capacity_short and not ripening else ""
            return restored + ripening + [PlacementFailed(key=rec.key, queue=rec.queue, reason=reason,
                                                          capacity_short=attempt.capacity_short, room_key=room_key)]
        why = f"preempted by {rec.key} (priority {rec.spec.priority}) in queue {rec.queue}"
        out = self._place_over(rec, victims, why, "preempting", strategy, now, pods)  # elastic pods before gangs
        assert out is not None  # the trial above placed it with exactly these victims gone
        return restored + out

    def _on_reclaim(self, p: ReclaimRequested, now: float) -> list[Output]:
        """The queue named victims: in other queues (reclaim) or in the workload's own queue, whose limit
        blocked it (in-queue preemption for quota). Place the gang as if they were gone, or fail."""
        restored, rec = self._begin(p)
        if rec is None:
            return restored
        named = dict.fromkeys(k for k in p.victims if k != p.key)
        victims = [w for k in named if (w := self._admitted(k)) is not None]
        pods: list[elastic.Victim] = []
        for unit in p.elastic_victims:
            owner = self._admitted(unit.key)
            if owner is not None and owner.key != p.key:
                pods += elastic.newest(owner, unit.pod_set, unit.count)
        strategy = self.policy.placement_for(p.queue)
        queues = [v.queue for v in victims] + [w.queue for w, _ in pods]
        if queues and all(q_ == rec.queue for q_ in queues):  # the queue's own limit blocked: in-queue
            why, verb = f"preempted by {rec.key} (priority {rec.spec.priority}) in queue {rec.queue}", "preempting"
        else:
            why, verb = f"reclaimed by {rec.key} for queue {rec.queue}", "reclaiming"
        out = self._place_over(rec, victims, why, verb, strategy, now, pods)
        if out is not None:
            return restored + out
        stmt, attempt = trial(self.nodes, self.ledger, rec.spec.gang, strategy, victims, pods, explain=True)
        stmt.rollback()
        return restored + [PlacementFailed(key=rec.key, queue=rec.queue, reason=attempt.reason,
                                           capacity_short=attempt.capacity_short)]

    def _on_withdrawn(self, p: WorkloadWithdrawn) -> list[Output]:
        """Drop the slots; its pods keep counting on their nodes until they are gone.

        Pods still bound then (a finished RayJob that keeps its cluster, or its cluster's TTL) hold
        no quota any more, so like any pod outside an admitted workload they lower
        CapacityChanged.total: the queue must not count their room as free.
        """
        rec = self.workloads.pop(p.key, None)
        self.signals.stop_waiting(p.key)
        self.disruptions.forget(p.key)  # no longer wanted: nothing to judge
        if rec is None:
            return []
        self._displaced.pop(p.key, None)
        self.preemption.unhold(rec)
        freed = False
        for slot in rec.slots:
            if slot.reserving:
                self.nodes.uncharge(slot.node, slot.demand, slot.devices)
                freed = True
            if slot.pod is not None and slot.pod in self.pods:
                self.pods[slot.pod].slot = None
        rec.slots = []
        out: list[Output] = self._signal(self._now, released=True) if freed and self.signals.waiting else []
        for key in self.pods_of.get(p.key, {}):
            out += self._set_foreign(self.pods[key], True)
        return out + self._retry_displaced()  # its reservations are free again

    def _on_updated(self, p: WorkloadUpdated, now: float) -> list[Output]:
        """Slots follow what was admitted. An edit asking for fewer pods (``shrunk``, the queue's rule
        too) drops the surplus slots: those holding no pod now (done, lost, then reserving ones,
        highest index first), releasing their reservations; those holding a pod when it goes away
        (``_vacate``). Then a capacity release, so what waits retries. An edit asking for more
        changes nothing here: the pods beyond the slots wait unbound, without quota."""
        wrec = self._admitted(p.workload.key)
        if wrec is None:
            return []
        wrec.latest = p.workload.gang
        out: list[Output] = [*self.elastic.trim(wrec)]
        smaller = shrunk(wrec.spec.gang, p.workload.gang)
        if smaller is None:
            return out + (self._signal(now, released=True) if out else [])
        wrec.spec = wrec.spec.model_copy(update={"gang": smaller})
        for ps in smaller.pod_sets:
            surplus = wrec.surplus(ps.name)
            idle = sorted((s for s in wrec.slots if s.pod_set == ps.name and s.pod is None),
                          key=lambda s: (not s.done, not s.lost, -s.index))
            for slot in idle[:max(surplus, 0)]:
                if slot.reserving:
                    self.nodes.uncharge(slot.node, slot.demand, slot.devices)
                wrec.slots.remove(slot)
        if wrec.key in self._displaced and not any(s.free and (s.lost or not self.nodes.present[s.node])
                                                   for s in wrec.slots):
            del self._displaced[wrec.key]
        return out + self._signal(now, released=True) + self.disruptions.check_running(wrec, now)

    def _place_over(self, rec: WorkloadRecord, victims: list[WorkloadRecord], why: str, verb: str, strategy: str,
                    now: float, pods: list[elastic.Victim] | None = None) -> list[Output] | None:
        """Place the gang with the victims' holdings (whole workloads, elastic pods) released; commit and
        evict them, or undo (None)."""
        pods = pods or []
        stmt, attempt = trial(self.nodes, self.ledger, rec.spec.gang, strategy, victims, pods, explain=False)
        if not attempt.ok:
            stmt.rollback()
            return None
        stmt.commit()
        out: list[Output] = [self._evict(victim, rec, why) for victim in victims]
        out += self.elastic.evict(pods, why)
        reason = self._placed_reason(attempt, strategy)
        if victims or pods:
            named = [v.key for v in victims] + [f"{n} elastic pod(s) of {key} ({pod_set})"
                                                 for (key, pod_set), n in _counts(pods).items()]
            reason += f" after {verb} {', '.join(named)}"
        return out + self._admit(rec, attempt, now, reason)

    def _on_elastic_granted(self, p: ElasticGranted) -> list[Output]:
        """Granted elastic pods get slots (``ElasticPods.grant``); each placed one may take a waiting pod."""
        wrec = self._admitted(p.key)
        if wrec is None:
            return [ElasticReleased(key=p.key, pod_set=p.pod_set, count=p.count, admission=p.admission,
                                    reason="not admitted any more")]
        back, placed = self.elastic.grant(wrec, p, self.policy.placement_for(wrec.queue))
        out: list[Output] = [*back]
        for _ in range(placed):
            out += self._assign_waiting(wrec, p.pod_set)
        return out

    def _evict(self, victim: WorkloadRecord, preemptor: WorkloadRecord, why: str) -> PreemptionRequested:
        """Bookkeeping after the statement released the victim: its pods no longer count or fill."""
        names = []
        for key in self.ledger.own_pods(victim):
            pod = self.pods[key]
            if pod.evicted or not pod.facts.live or (pod.node is None and pod.slot is None):
                continue
            names.append(pod.facts.name)
            self.ledger.evicted(pod)
        victim.slots, victim.admitted, victim.running, victim.started_at = [], False, False, None
        self.preemption.unhold(victim)
        self._displaced.pop(victim.key, None)
        self.disruptions.forget(victim.key)
        return PreemptionRequested(key=victim.key, kind=victim.spec.kind, gate=victim.spec.gate,
                                   preemptor=preemptor.key, preemptor_priority=preemptor.spec.priority,
                                   reclaim=preemptor.queue != victim.queue, pods=tuple(names), reason=why)

    def _admit(self, rec: WorkloadRecord, attempt: GangAttempt, now: float, reason: str) -> list[Output]:
        """Turn the committed placements into slots; hand existing pods their slots in observed order."""
        self._admissions += 1
        rec.admitted, rec.admitted_at, rec.admitted_seq = True, now, self._admissions
        self.preemption.hold(rec)
        rec.running, rec.started_at = False, None
        rec.slots = [Slot(p.pod_set.name, p.index, p.node, p.devices, p.demand, p.pod_set.in_gang)
                     for p in attempt.placements]
        rec.reason = reason
        out: list[Output] = [self._gang_placed(rec)]
        for key in self.ledger.own_pods(rec):
            pod = self.pods[key]
            if pod.facts.live and not pod.evicted and pod.slot is None:
                out += self._attach(rec, pod)
                slot = self.pods[key].slot  # the one _attach gave it, if any (read anew: mypy keeps pod.slot None)
                if slot is not None and pod.facts.bound and not slot.filled:
                    self._fill(slot)
        out += self.disruptions.check_running(rec, now)
        return out

    # ------------------------------------------------------------------ payloads
    def _placed_reason(self, attempt: GangAttempt, strategy: str) -> str:
        nodes = len(dict.fromkeys(p.node for p in attempt.placements))
        return f"{len(attempt.placements)}/{attempt.total} pods placed on {nodes} node(s) ({strategy})"

    def _gang_placed(self, rec: WorkloadRecord) -> GangPlaced:
        names = self.nodes.names
        slots = tuple(slot_assignment(s.pod_set, s.index, names[s.node], gpu.assignment(rec.key, names[s.node], s.devices))
                      for s in rec.slots if not s.elastic)
        return gang_placed(rec.key, rec.queue, rec.spec.kind, rec.spec.gate, slots, rec.reason)

    def _pod_assigned(self, wrec: WorkloadRecord, rec: PodRecord, slot: Slot) -> PodAssigned:
        node = self.nodes.names[slot.node]
        return pod_assigned(wrec.key, rec.facts.namespace, rec.facts.name, slot.pod_set, node,
                            gpu.assignment(wrec.key, node, slot.devices), slot.elastic)


def _counts(pods: list[elastic.Victim]) -> dict[tuple[str, str], int]:
    return {group: len(members) for group, members in elastic.by_pod_set(pods).items()}
