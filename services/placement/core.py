"""The placement service's decision core: where a gang goes, and what follows for pods and capacity.

Where each decision is made:
- routing an event to its handler; a placement attempt (``_on_Dequeued``, ``_on_ReclaimRequested``) read as
  KAI's ``allocate.Execute``: pick the gang (``_begin``), open a statement and try
  (``preemption.trial``), commit and admit (``_admit``) or discard, then move pods so that it fits
  (``_consolidate``, KAI's consolidation action, which runs before its preempt), then ask who makes
  room and place over them (``_place_over``), or explain: this module
- what a node offers and uses, static filters, scoring: ``nodes.NodeTable``
- one gang onto the nodes, all or nothing: ``gang.place_gang`` inside a ``statement.Statement``; a pod
  group's other members standing in for its first pods: ``gang.substitute``
- the trial placement with victims released (the only one): ``preemption.trial``
- who is preempted, and the fewest of them (per-queue index, minimum runtimes, why not):
  ``preemption.Preemption``; which elastic pods go first: ``elastic``
- pods, what each charges, foreign pods, eviction bookkeeping: ``ledger.PodLedger``
- slots of admitted workloads and the pods that fill them; gangs displaced by a node leaving:
  ``slots.Slots``
- elastic pods' slots granted, dropped, evicted: ``elasticpods.ElasticPods``
- an admitted workload withdrawn, edited smaller, or evicted, and what each undoes:
  ``lifecycle.Lifecycle``
- CapacityChanged, the ``capacity`` and ``ripen`` timers, gangs waiting for room:
  ``signals.CapacitySignals``
- GangRunning, judging disruptions (the ``disruption`` timer), and which disrupted gangs of a queue that
  evicts stale gangs (KAI's) are still below their minimum after its grace (the ``stale`` timer):
  ``disruption.Disruptions``; evicting them: ``lifecycle.Lifecycle.evict_stale``
- consolidation (KAI's): which running fractional pods may move so that a gang fits, the fewest of them,
  and the trial placing the gang and every moved pod at once: ``consolidation.Consolidation``; a moved
  pod's slot going to its new place: ``slots.Slots.move``
- inter-pod affinity and anti-affinity, topology spread (filters, soft scores, the index of where pods
  with which labels run, turned on by the first such constraint): ``interpod``, read by
  ``gang.place_pods`` and ``reasons.fit_error``
- which nodes a pod set's claims let it use (claims, volumes, storage classes watched): ``volumes``, folded
  into ``nodes.NodeTable.static_mask``; host ports held per node and preferred node affinity: ``nodes``
- which GPU device a pod gets, group ids: ``gpu``; failure text: ``reasons``
- GPU fragmentation against the recent workload mix (the ``fragmentation`` strategy): ``fragmentation``
- what is emitted (``Output``) and built without validation: ``payloads``

Pure: no I/O, no clock (``env.occurred_at`` is now), no randomness; dicts keep inbox order.
"""

from __future__ import annotations

from services.placement import elastic, interpod
from services.placement.consolidation import Consolidation
from services.placement.disruption import DISRUPTION_TIMER, STALE_TIMER, Disruptions
from services.placement.elasticpods import ElasticPods
from services.placement.gang import GangAttempt, pod_demand
from services.placement.nodes import FRAGMENTATION, NodeTable
from services.placement.payloads import Output, gang_placed_of, placed_reason
from services.placement.slots import Slots
from services.placement.pods import PodRecord
from services.placement.ledger import PodLedger
from services.placement.lifecycle import Lifecycle
from services.placement.preemption import Preemption, named_victims, reclaim_words, trial
from services.placement.signals import CAPACITY_TIMER, RIPEN_TIMER, CapacitySignals
from services.placement.workloads import Slot, WorkloadRecord
from shared.kernel import kube
from shared.kernel.events import (
    Dequeued, ElasticGranted, ElasticReleased, Envelope, ObjectChanged, ObjectsListed, PlacementFailed,
    QueueDefined, QueueRemoved, ReclaimRequested, TimerFired, WorkloadUpdated, WorkloadWithdrawn,
)
from shared.kernel.fold import Folds
from shared.kernel.listing import WatchBook
from shared.kernel.policy import Policy
from shared.kernel.topology import VOLUME_KINDS

class PlacementCore(Folds):
    service = "placement"

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.nodes = NodeTable()
        self.ledger = PodLedger(self.nodes)
        """Pod bookkeeping: what each pod charges, foreign pods, releases inside a statement."""
        self._admissions = 0
        self.signals = CapacitySignals(self.nodes, self.ledger)
        """CapacityChanged, its timers, and the gangs waiting for room."""
        self.disruptions = Disruptions(self.ledger, policy)
        """GangRunning, and running gangs that lost a pod until they are judged."""
        self.preemption = Preemption(self.nodes, self.ledger)
        self.elastic = ElasticPods(self.nodes, self.ledger)
        """Elastic pods' slots: granted, dropped, evicted."""
        """Who makes room: admitted workloads per queue and priority, minimum runtimes, the fewest victims."""
        self.slots = Slots(policy, self.nodes, self.ledger, self.signals, self.disruptions)
        """Slots of admitted workloads and the pods that fill them; gangs displaced by a node leaving."""
        self.consolidation = Consolidation(policy, self.nodes, self.ledger, self.preemption)
        """Which queues consolidate, and which running fractional pods move so that a gang fits."""
        self.lifecycle = Lifecycle(self.nodes, self.ledger, self.slots, self.signals, self.disruptions,
                                   self.preemption, self.elastic)
        """What withdrawing, shrinking or evicting an admitted workload undoes."""
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
    def workloads(self) -> dict[str, WorkloadRecord]:
        """Every workload placement was asked to place, by key (the slots' own dict)."""
        return self.slots.workloads

    @property
    def pods_of(self) -> dict[str, dict[str, None]]:
        return self.ledger.pods_of

    # ------------------------------------------------------------------ routing
    def handle(self, env: Envelope) -> list[Output]:
        """Fold one inbox event through its ``_on_<PayloadType>`` handler (``shared.kernel.fold``)."""
        now = env.occurred_at
        self.slots.now = now
        handler = self.folds.get(env.type)
        out: list[Output] = handler(self, env.payload, now) if handler is not None else []
        if self.nodes.compaction_due():  # between two events: no statement is open, no row is in flight
            self.slots.compact_nodes()
        return out

    def _on_ObjectChanged(self, p: ObjectChanged, now: float) -> list[Output]:
        held = self.book.observe(p)
        if p.kind == "Node":
            return self._node_changed(p)
        if p.kind == "Pod":
            return self.slots.on_pod(p, now, held)
        if p.kind in VOLUME_KINDS:
            return self._storage_changed(p)
        return []

    def _on_ObjectsListed(self, p: ObjectsListed, now: float) -> list[Output]:
        """Nodes, pods and storage deleted while no watch was open."""
        out: list[Output] = []
        for gone in self.book.listed(p):
            if gone.kind == "Node":
                out += self._node_changed(gone)
            elif gone.kind in VOLUME_KINDS:
                out += self._storage_changed(gone)
            else:
                out += self.slots.on_pod(gone, now)
        return out

    def _storage_changed(self, p: ObjectChanged) -> list[Output]:
        """A claim, volume or storage class came, changed or left (``volumes.VolumeBook``): pods kept back by
        their claims are told where to go if they now may be (``Slots.tell_unclaimed``), pod sets' claims are
        judged again, and if a gang with claims waits, every waiting gang may try (a claim created or bound,
        as kube-scheduler's VolumeBinding requeues its pods on those events)."""
        if not self.nodes.volumes.observe(p):
            return []
        self.nodes.volumes_changed()
        out: list[Output] = self.slots.tell_unclaimed() if self.slots.unclaimed else []
        waiting = any(not w.admitted and any(ps.volumes for ps in w.spec.gang.pod_sets)
                      for w in self.workloads.values())
        return [*out, self.signals.changed(released=True, everyone=True)] if waiting else out

    def _on_QueueDefined(self, p: QueueDefined, now: float) -> list[Output]:
        self.preemption.define_queue(p.queue.name, p.queue.min_runtime)
        self.disruptions.define_queue(p.queue.name, p.queue.evicts_stale_gangs)
        self.consolidation.define_queue(p.queue.name, p.queue.consolidates)
        return []

    def _on_QueueRemoved(self, p: QueueRemoved, now: float) -> list[Output]:
        self.preemption.define_queue(p.name, None)
        self.disruptions.define_queue(p.name, False)
        self.consolidation.define_queue(p.name, False)
        return []

    # ------------------------------------------------------------------ nodes and capacity
    def _node_changed(self, p: ObjectChanged) -> list[Output]:
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
                    self.slots.displaced[wrec.key] = None
        pending = self.signals.take_pending()
        released = change.grew or change.constraints or pending
        out: list[Output] = lost + [self.signals.changed(released, everyone=bool(change.grew or change.constraints))]
        return out + self.slots.retry_displaced() if released else out

    def _on_TimerFired(self, p: TimerFired, now: float) -> list[Output]:
        """A timer set for ``due`` fired, handled at ``now`` (later, when inputs stamped after ``due``
        were handled first)."""
        key, due = p.key, p.due(now)
        if key == DISRUPTION_TIMER:
            return [*self.disruptions.judge(now, self.workloads)]
        if key == STALE_TIMER:
            return self.lifecycle.evict_stale(self.disruptions.stale_due(due, self.workloads), now)
        if key == RIPEN_TIMER:
            return [self.signals.ripened(due)]
        if key != CAPACITY_TIMER:
            return []
        events, released = self.signals.fired(due)
        out: list[Output] = [*events]
        return out + self.slots.retry_displaced() if released else out

    # ------------------------------------------------------------------ gangs
    def _begin(self, p: Dequeued | ReclaimRequested) -> tuple[list[Output], WorkloadRecord | None]:
        """The start of every placement request. A redelivered request for an admitted gang repeats its
        GangPlaced (record None); otherwise gangs that lost pods are re-placed first (they hold their
        quota already), then the request gets a fresh record."""
        current = self.workloads.get(p.key)
        if current is not None and current.admitted:
            return [gang_placed_of(current, self.nodes.names)], None
        if any(ps.inter_pod for ps in p.workload.gang.pod_sets):
            interpod.activate(self.nodes, self.ledger.pods.values(), self.workloads.values())
        restored = self.slots.retry_displaced()
        self.signals.stop_waiting(p.key)
        spec = interpod.marked_spec(p.workload) if self.nodes.marking else p.workload
        rec = WorkloadRecord(spec=spec, queue=p.queue)
        self.workloads[p.key] = rec
        # Every pod set's demand is made here, mixing or not: it names the table's resource columns in the
        # order gangs arrive, which ``totals()`` (CapacityChanged) keeps; logs made before must verify.
        shapes = [(pod_demand(self.nodes, ps).shape, ps.count) for ps in p.workload.gang.pod_sets]
        # A gpu-memory pod's share is each node's own: it has no one shape in the mix, and is left out.
        shapes = [shape for shape, ps in zip(shapes, p.workload.gang.pod_sets) if not ps.gpu_memory]
        if self._mixing:
            self.nodes.mix.observe(p.key, shapes)
        return restored, rec

    def _on_Dequeued(self, p: Dequeued, now: float) -> list[Output]:
        """Place the whole gang; else move fractional pods so that it fits; else preempt lower priorities of
        its queue; else explain."""
        restored, rec = self._begin(p)
        if rec is None:
            return restored
        strategy = self.policy.placement_for(p.queue)
        stmt, attempt = trial(self.nodes, self.ledger, rec.spec.gang, strategy, [], [], explain=True)
        if attempt.ok:
            stmt.commit()
            return restored + self._admit(rec, attempt, now, placed_reason(attempt, strategy))
        stmt.rollback()
        moved = self._consolidate(rec, strategy, now)
        if moved is not None:
            return restored + moved
        min_runtime = self.preemption.min_runtime(rec.queue, self.policy)
        candidates = self.preemption.candidates(rec, now, min_runtime)
        pods, victims = self.preemption.choose(rec, candidates, strategy,
                                               self.preemption.partly_pinned(rec, now, min_runtime))
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

    def _on_ReclaimRequested(self, p: ReclaimRequested, now: float) -> list[Output]:
        """The queue named victims: in other queues (reclaim) or in the workload's own queue, whose limit
        blocked it (in-queue preemption for quota). Place the gang as if they were gone, or fail."""
        restored, rec = self._begin(p)
        if rec is None:
            return restored
        victims, pods, offered = named_victims(p, self.slots.admitted)
        why, verb = reclaim_words(rec, victims, pods)
        strategy = self.policy.placement_for(p.queue)
        out = self._place_over(rec, victims, why, verb, strategy, now, pods)
        if out is not None:
            return restored + out
        chosen = self.preemption.on_nodes(rec, offered, p.offer, strategy) if p.offer is not None and offered else None
        if chosen is not None:
            out = self._place_over(rec, chosen, why, verb, strategy, now)
            assert out is not None  # on_nodes placed it with exactly these victims gone
            return restored + out
        stmt, attempt = trial(self.nodes, self.ledger, rec.spec.gang, strategy, victims, pods, explain=True)
        stmt.rollback()
        reason = attempt.reason
        if offered:
            reason += (f" No set of the {len(offered)} workload(s) the quota rules let it reclaim makes room on"
                       " the nodes it can use.")
        # nothing is evicted, and it is not tried again until a release could hold it
        room_key = self.signals.wait_for_room(rec, strategy) if attempt.capacity_short and offered else ""
        return restored + [PlacementFailed(key=rec.key, queue=rec.queue, reason=reason,
                                           capacity_short=attempt.capacity_short, room_key=room_key)]

    def _on_WorkloadWithdrawn(self, p: WorkloadWithdrawn, now: float) -> list[Output]:
        return self.lifecycle.withdraw(p.key)

    def _on_WorkloadUpdated(self, p: WorkloadUpdated, now: float) -> list[Output]:
        return self.lifecycle.edit(p.workload.key, p.workload.gang, now)

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
        out: list[Output] = [self.lifecycle.evict(victim, rec, why) for victim in victims]
        out += self.elastic.evict(pods, why)
        reason = placed_reason(attempt, strategy)
        if victims or pods:
            named = [v.key for v in victims] + [f"{n} elastic pod(s) of {key} ({pod_set})"
                                                 for (key, pod_set), n in elastic.counts(pods).items()]
            reason += f" after {verb} {', '.join(named)}"
        return out + self._admit(rec, attempt, now, reason)

    def _consolidate(self, rec: WorkloadRecord, strategy: str, now: float) -> list[Output] | None:
        """Move the fewest running fractional pods so that the gang fits (``Consolidation``), and admit it;
        None when no move makes room with every moved pod placed again (nothing changed then)."""
        moves = self.consolidation.choose(rec, strategy, self.workloads, now)
        if moves is None:
            return None
        out, attempt, reason = self.consolidation.commit(rec, strategy, moves, self.slots)
        return out + self._admit(rec, attempt, now, reason)

    def _on_ElasticGranted(self, p: ElasticGranted, now: float) -> list[Output]:
        """Granted elastic pods get slots (``ElasticPods.grant``); each placed one may take a waiting pod."""
        wrec = self.slots.admitted(p.key)
        if wrec is None:
            return [ElasticReleased(key=p.key, pod_set=p.pod_set, count=p.count, admission=p.admission,
                                    reason="not admitted any more")]
        waiting = self.slots.waiting(wrec, p.pod_set) if wrec.spec.gang.interchangeable else None
        back, placed = self.elastic.grant(wrec, p, self.policy.placement_for(wrec.queue), waiting)
        out: list[Output] = [*back]
        for _ in range(placed):
            out += self.slots.assign_waiting(wrec, p.pod_set)
        return out

    def _admit(self, rec: WorkloadRecord, attempt: GangAttempt, now: float, reason: str) -> list[Output]:
        """Turn the committed placements into slots; hand existing pods their slots in observed order."""
        self._admissions += 1
        rec.admitted, rec.admitted_seq = True, self._admissions
        self.preemption.hold(rec)
        rec.running, rec.started_at = False, None
        rec.spec = attempt.placed_spec(rec.spec)  # a pod group's other members may have stood in
        rec.slots = [Slot(p.pod_set.name, p.index, p.node, p.devices, p.demand, p.pod_set.in_gang)
                     for p in attempt.placements]
        rec.reason = reason
        return [gang_placed_of(rec, self.nodes.names), *self.slots.hand_out(rec, now)]
