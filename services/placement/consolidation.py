"""Consolidation (KAI's action of that name): move running fractional pods so that a waiting gang fits.

A gang that the nodes as they are cannot hold may still fit when GPU fractions spread over several
devices are gathered on fewer: KAI's ``consolidation`` action (``pkg/scheduler/actions/consolidation/
consolidation.go``), run after allocate and before reclaim and preempt, evicts running pods and
places them again in the same statement as the pending job, and commits only when every one of them
is placed again (``allPodsReallocated``: no victim task left ``Releasing``, all ``Pipelined``).

Who may wait for it: a gang of a queue that consolidates (``QueueSpec.consolidates``, KAI's), that
is preemptible (KAI consolidates only for preemptible jobs: its job order ``FilterNonPreemptible``)
and asks for GPUs no more than the schedulable nodes have free in all (``IsEnoughGPUsAllocatableForJob``).

Which pods may move (all must hold): a bound pod holding a fraction of one device (``gpu-fraction``),
filling a slot of another admitted workload of a queue that consolidates, whose owner makes it again
once evicted (KubeRay: a RayCluster's or RayJob's pod), preemptible, that has run its queue's minimum
runtime (``preemption.ran``).

Which of them: the trial of a set releases their holdings, places the gang, then each moved pod
again by its own queue's strategy, and holds only when all are placed and each somewhere else than
it was. Candidates are tried device by device, the device with the fewest movable pods first (emptying
it takes the fewest moves), then the least used, ties in the in-queue victim order
(``preemption.victim_order``) and the newest slot first;
added until the trial holds, then every pod the others make unneeded is dropped
(``shared.kernel.victims.minimal_victims``). Only the first ``MAX_MOVED_WORKLOADS`` workloads met are
considered (KAI's ``--max-consolidation-preemptees``), a bound on the trials one attempt makes.
"""

from __future__ import annotations

from services.placement import gpu
from services.placement.elastic import Victim
from services.placement.gang import GangAttempt, Placement, place_gang, place_pods, pod_demand
from services.placement.ledger import PodLedger
from services.placement.nodes import NodeTable
from services.placement.payloads import Output, placed_reason
from services.placement.preemption import Preemption, ran, victim_order
from services.placement.slots import Slots
from services.placement.statement import Statement
from services.placement.workloads import WorkloadRecord
from shared.kernel.events import PodsMoved
from shared.kernel.policy import Policy
from shared.kernel.victims import minimal_victims

MAX_MOVED_WORKLOADS = 16
"""Workloads whose pods one consolidation may consider moving: KAI's ``--max-consolidation-preemptees``
default (``cmd/scheduler/app/options/options.go``)."""

RECREATED_KINDS = frozenset({"RayCluster", "RayJob"})
"""Workload kinds whose evicted pods their owner makes again (KubeRay): the only pods that can be moved,
since a bound pod cannot change its node."""


class Consolidation:
    """Which queues consolidate, which running pods may move for a gang, the fewest of them, and the
    trial that places the gang and every moved pod at once."""

    def __init__(self, policy: Policy, nodes: NodeTable, ledger: PodLedger, preemption: Preemption) -> None:
        self.policy = policy
        self.nodes = nodes
        self.ledger = ledger
        self.preemption = preemption
        self.queues: dict[str, None] = {}
        """Queues whose dialect consolidates (``QueueSpec.consolidates``, KAI's)."""

    def define_queue(self, name: str, consolidates: bool) -> None:
        if consolidates:
            self.queues[name] = None
        else:
            self.queues.pop(name, None)

    def choose(self, rec: WorkloadRecord, strategy: str, workloads: dict[str, WorkloadRecord],
               now: float) -> list[Victim] | None:
        """The fewest pods whose moving lets ``rec``'s gang fit with each of them placed again, or None."""
        if not self._may_wait_for_it(rec):
            return None
        movable = self.movable(rec, workloads, now)
        if not movable:
            return None
        return minimal_victims(movable, lambda moves: self.fits(rec, strategy, moves))

    def _may_wait_for_it(self, rec: WorkloadRecord) -> bool:
        """A preemptible gang of a queue that consolidates, asking for GPUs the nodes have free in all."""
        if rec.queue not in self.queues or not rec.spec.preemptible:
            return False
        need = sum(pod_demand(self.nodes, ps).gpu_need * ps.count for ps in rec.spec.gang.pod_sets)
        return 0 < need <= self.nodes.free_gpu()

    def movable(self, rec: WorkloadRecord, workloads: dict[str, WorkloadRecord], now: float) -> list[Victim]:
        """Pods that may move for ``rec``, in the order they are tried: those of the device holding the fewest
        of them first (the fewest to move to empty it), then of the least used, then in victim order."""
        owners = victim_order(w for w in workloads.values() if w is not rec and self._may_move(w, now))
        rank = {w.key: i for i, w in enumerate(owners)}
        on_device: dict[tuple[int, int], list[Victim]] = {}
        for wrec in owners:
            for slot in wrec.slots:
                if not (slot.filled and slot.pod is not None and slot.pod in self.ledger.pods):
                    continue
                demand = slot.demand
                if not 0 < demand.gpu_share < gpu.FULL or demand.gpu_memory or len(slot.devices) != 1:
                    continue
                if self.ledger.pods[slot.pod].node != slot.node:
                    continue
                on_device.setdefault((slot.node, slot.devices[0][0]), []).append((wrec, slot))
        found: list[tuple[tuple[int, int, int, int, int, int], Victim]] = []
        for (node, device), pods in on_device.items():
            used = self.nodes.device_row(node)[device]
            found += [((len(pods), used, rank[w.key], node, device, -s.index), (w, s)) for w, s in pods]
        found.sort(key=lambda entry: entry[0])
        kept: dict[str, None] = {}
        out: list[Victim] = []
        for _, (wrec, slot) in found:
            if wrec.key not in kept:
                if len(kept) == MAX_MOVED_WORKLOADS:
                    continue
                kept[wrec.key] = None
            out.append((wrec, slot))
        return out

    def _may_move(self, wrec: WorkloadRecord, now: float) -> bool:
        return (wrec.admitted and wrec.queue in self.queues and wrec.spec.preemptible
                and wrec.spec.kind in RECREATED_KINDS
                and ran(wrec, now, self.preemption.min_runtime(wrec.queue, self.policy)))

    def fits(self, rec: WorkloadRecord, strategy: str, moves: list[Victim]) -> bool:
        """Would the gang and every moved pod be placed at once? Always rolled back."""
        stmt, _, placed = self.trial(rec, strategy, moves)
        stmt.rollback()
        return placed is not None

    def trial(self, rec: WorkloadRecord, strategy: str, moves: list[Victim]
              ) -> tuple[Statement, GangAttempt, list[Placement] | None]:
        """Release the moved pods' holdings, place the gang, then each moved pod again (by its own queue's
        strategy, with its own pod set's constraints). The placements of the moved pods, in ``moves``'
        order, or None when the gang or one of them finds no place, or one lands where it was. The
        caller commits or rolls back."""
        stmt = Statement(self.nodes)
        self.ledger.release_slots_into(stmt, moves)
        attempt = place_gang(self.nodes, stmt, rec.spec.gang, strategy, explain=False)
        if not attempt.ok:
            return stmt, attempt, None
        placed: list[Placement] = []
        for wrec, slot in moves:
            pod_set = next((ps for ps in wrec.spec.gang.pod_sets if ps.name == slot.pod_set), None)
            if pod_set is None:
                return stmt, attempt, None
            got = place_pods(self.nodes, stmt, pod_set, slot.demand, 1, self.policy.placement_for(wrec.queue),
                             first_index=slot.index)
            if not got or (got[0].node == slot.node and got[0].devices == slot.devices):
                return stmt, attempt, None
            placed.append(got[0])
        return stmt, attempt, placed

    def commit(self, rec: WorkloadRecord, strategy: str, moves: list[Victim], slots: Slots
               ) -> tuple[list[Output], GangAttempt, str]:
        """Commit the statement that places the gang and every moved pod again (``moves``, as ``choose``
        found them), move their slots, and tell the reconciler to evict the pods (``PodsMoved``, one per
        workload, KAI's ``GetConsolidateMessage``): what that emits, the gang's attempt to admit, and the
        reason it is placed with."""
        stmt, attempt, placed = self.trial(rec, strategy, moves)
        assert placed is not None  # the choice's last trial placed them with exactly these moves
        stmt.commit()
        evicted: dict[str, tuple[WorkloadRecord, list[str]]] = {}
        assigned: list[Output] = []
        for (wrec, slot), to in zip(moves, placed):
            pod, given = slots.move(wrec, slot, to)
            evicted.setdefault(wrec.key, (wrec, []))[1].append(pod)
            assigned += given
        out: list[Output] = []
        for wrec, pods in evicted.values():
            were = "was" if len(pods) == 1 else "were"
            out.append(PodsMoved(key=wrec.key, kind=wrec.spec.kind, preemptor=rec.key, pods=tuple(pods),
                                 reason=f"{'pod' if len(pods) == 1 else 'pods'} {', '.join(pods)} {were} preempted"
                                        f" and rescheduled due to bin packing (resource consolidation) procedure,"
                                        f" to make room for {rec.key}"))
        named = ", ".join(f"{len(pods)} pod(s) of {key}" for key, (_, pods) in evicted.items())
        return out + assigned, attempt, f"{placed_reason(attempt, strategy)} after moving {named} (consolidation)"
