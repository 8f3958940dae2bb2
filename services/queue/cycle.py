"""The admission cycle: one per instant, after every inbox is drained (Kueue's scheduler cycle).

1. hold: pending workloads of queues that take none (missing, Closed/Closing, not a
   leaf), and workloads admission says cannot start yet (``WorkloadSpec.not_ready``: a pod group with
   fewer valid pods than its minimum), are told why and skip the cycle; those taken again are told so;
2. heads: per leaf queue, its pending workloads in order (priority desc, submitted_at,
   key); backing-off ones are skipped (BestEffortFIFO) or stop the queue (StrictFIFO);
3. snapshot: usage rolled up the tree, non-preemptible usage, cluster free, fair shares;
4. iterate: serve queues by (queue priority desc, dominant share asc, name), one head at
   a time, re-ranking the served queue after each decision;
5. quota: (in a queue that gates like Volcano's enqueue action, ``enqueue.py``, a head whose minimum does
   not fit its queue's room or the cluster's overcommitted idle waits first, and nobody is evicted for it)
   leaf and every ancestor within limit (and guarantee if non-preemptible where the
   dialect caps them), and out of the room siblings' guarantees hold where their dialect reserves
   them (Volcano: ``tree.reserved_block``, then only in-queue preemption may help); else, when an ancestor's limit blocks, queues above their share or
   guarantee under it give back (reclaim across the tree, ``victims.py``/reclaim.py); else
   lower-priority preemptible holders of the same leaf queue that would make it fit are named in
   ReclaimRequested (in-queue preemption, preemption.py); else BackedOff with the gang line;
   StrictFIFO stops that queue, BestEffortFIFO moves on. A demand that alone breaks a limit (or
   the guarantee cap) waits for its queue to change, told "can never fit in queue Q as it is";
6. admit: Dequeued when free capacity covers the demand or no reclaim is possible, else
   ReclaimRequested(victims); both reserve quota in the snapshot for the next heads. Every
   reclaim and preemption names elastic pods alone first (elastic.py), whole gangs only when
   those do not cover;
7. elastic pods of holders, one at a time (``grants.py``).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Sequence

from services.queue import backoff, elastic
from services.queue.enqueue import CAPACITY_NOTE, capacity_block, overcommit_block
from services.queue.ordering import ORDER, blocks, serve_key
from services.queue.reclaim import CLUSTER, Choice, shortage
from services.queue.snapshot import Snapshot
from services.queue.room import as_it_is
from services.queue.tree import cap_failure, never_fits, over_limits, quota_block, reserved_block
from services.queue.workload import Tracked
from shared.kernel.events import Dequeued, ReclaimRequested
from shared.kernel.reasons import amounts, gang_line

if TYPE_CHECKING:
    from services.queue.core import Out, QueueCore


class AdmissionCycle:
    """Steps 1-6 of one core's cycle (``core`` owns the books; ``core.victims`` chooses victims)."""

    def __init__(self, core: QueueCore) -> None:
        self.core = core

    def run(self, now: float, out: Out) -> None:
        """One scheduling cycle (the module's steps 1-7)."""
        core = self.core
        heads = self._heads(now, out)
        if not heads and not core.grants.growing:
            return
        snap = self.snapshot()
        ranking = [(self.rank(name, snap), name) for name in heads]
        heapq.heapify(ranking)
        cursor = {name: 0 for name in heads}
        while ranking:
            _, name = heapq.heappop(ranking)
            w = heads[name][cursor[name]]
            cursor[name] += 1
            went = self._try(w, snap, now, out)
            if not went and blocks(core.policy.queueing_for(name)):
                continue
            if cursor[name] < len(heads[name]):
                heapq.heappush(ranking, (self.rank(name, snap), name))
        core.grants.grant(snap, out)

    def _heads(self, now: float, out: Out) -> dict[str, list[Tracked]]:
        """Steps 1-2: per leaf queue that takes workloads, the ordered candidates of this cycle."""
        core = self.core
        ledger = core._ledger
        heads: dict[str, list[Tracked]] = {}
        for name in sorted(ledger.pending):
            members = ledger.pending[name].values()
            why = core.tree.wait_reason(name)
            for w in sorted((w for w in members if why is not None or w.held or not w.last_reason
                             or w.spec.not_ready), key=ORDER):
                core.tell_where(w, why if why is not None else (w.spec.not_ready or None), out)
            if why is not None:
                continue
            ready = [w for w in members if not _resting(w, now) and not w.spec.not_ready]
            if blocks(core.policy.queueing_for(name)):
                resting = [w.order for w in members if _resting(w, now)]
                resting += [w.order for w in ledger.parked.get(name, {}).values()]
                if resting:  # StrictFIFO: nothing passes a head that is backing off
                    first = min(resting)
                    ready = [w for w in ready if w.order < first]
            if ready:
                heads[name] = sorted(ready, key=ORDER)
        return heads

    def rank(self, name: str, snap: Snapshot) -> tuple[int, float, str]:
        spec = self.core.tree.get(name)
        return serve_key(spec.priority if spec else 0, snap.dominant(name), name)

    def snapshot(self) -> Snapshot:
        core = self.core
        return Snapshot.take(core.tree, core._ledger, core._capacity, core.promises.reclaims())

    def _try(self, w: Tracked, snap: Snapshot, now: float, out: Out) -> bool:
        """Steps 5-6 for one head; True when it took quota."""
        core = self.core
        block = quota_block(core.tree, w.queue, w.demand, snap.usage, snap.protected, w.spec.preemptible)
        short = shortage(w.demand, snap.free)
        if block is not None:
            never = never_fits(core.tree, w.queue, w.demand, w.spec.preemptible)
            if never is not None:  # no victim can make room for it: it waits for its queue to change
                core._quota.park(w, as_it_is(never[0]))
                core.back_off(w, now, w.reason(gang_line(w.spec.gang) + never[1]), out, arm=False)
                return False
        reserved = reserved_block(core.tree, w.queue, w.demand, snap.usage, snap.capacity) if block is None else None
        gated = False  # Volcano would keep it Pending (enqueue.py): placed nowhere, evicting nobody
        if (block is not None or reserved is not None or short) and self._gates(w):
            why = overcommit_block(w.demand, snap.capacity, core._ledger.in_use, core.policy.overcommit_factor)
            held = capacity_block(core.tree, w, snap.usage, snap.protected, snap.capacity, core._ledger.running_elastic)
            gated = held is not None
            if held == CAPACITY_NOTE and (block is not None or reserved is not None):
                why = None  # told after the quota line below, where it waits for quota as before
            elif why is None:
                why = held  # the cluster itself is the queue's room: there is no quota line to add it to
            if why is not None:
                core.back_off(w, now, w.reason(gang_line(w.spec.gang) + why), out)
                return False
        if block is not None:
            if gated:  # not enqueued (Volcano's capacity plugin): no reclaim, no preemption
                return self._preempt_for_quota(w, block[1], snap, now, out, self._gate_note(w), block[0], gated=True)
            return self._over_quota(w, block, short, snap, now, out)
        if reserved is not None:  # only its own queue's lower priorities could make room: no reclaim, and no
            return self._preempt_for_quota(w, reserved[1], snap, now, out,  # parking (nodes joining widen it)
                                           self._gate_note(w) if gated else "", gated=gated)
        choice, pods = core.victims.reclaim(w, {CLUSTER: short}, snap, now) if short else (Choice(None), [])
        if short and choice.victims is None:
            w.reclaim_note = (core.victims.ripening_reclaim(w, {CLUSTER: short}, snap, now, out)
                              or _refused(choice.refusal))
        else:
            w.reclaim_note = ""
        self._reserve(w, choice.victims or (), snap, pods)
        if choice.victims is not None:
            self._ask_reclaim(w, choice, pods, "", out)
        else:
            w.last_reason = w.reason(f"quota reserved in queue {w.queue} ({amounts(w.demand)})")
            out.append(Dequeued(key=w.key, queue=w.queue, workload=w.spec, reason=w.last_reason,
                                gpu_memory=w.gpu_memory))
        return True

    def _gates(self, w: Tracked) -> bool:
        """Whether ``w``'s queue keeps workloads Pending until Volcano's enqueue action would take them
        (``QueueSpec.gates_enqueue``, ``enqueue.py``)."""
        spec = self.core.tree.get(w.queue)
        return spec is not None and spec.gates_enqueue

    def _gate_note(self, w: Tracked) -> str:
        """``CAPACITY_NOTE`` when the gate is what keeps ``w`` from preempting: lower priorities of its queue hold
        quota it could otherwise take; "" when nobody could give it any (the quota line says it all)."""
        yielding = self.core._ledger.yielding.get(w.queue, {})
        lower = w.spec.preempts and any(p < w.spec.priority and any(v > 0 for v in amounts.values())
                                        for p, amounts in yielding.items())
        return CAPACITY_NOTE if lower else ""

    def _over_quota(self, w: Tracked, block: tuple[str, str], short: dict[str, int], snap: Snapshot, now: float,
                    out: Out) -> bool:
        """Step 5 failed on a limit. When that limit is an ancestor's (shared with other queues), queues
        using more than their share under it give the quota back first (reclaim across the tree, what
        the ACK doc calls reclaiming a quota's minimum from quotas above theirs; their elastic pods before
        any whole gang); else lower priorities of ``w``'s own queue (in-queue preemption for quota); else
        ``BackedOff`` saying why."""
        core = self.core
        level, failure = block
        needs = over_limits(core.tree, w.queue, w.demand, snap.usage)
        note = ""
        if needs and w.queue not in needs and cap_failure(core.tree, w.queue, w.demand, snap.protected,
                                                          w.spec.preemptible) is None:
            if short:
                needs[CLUSTER] = short
            choice, pods = core.victims.reclaim(w, needs, snap, now)
            if choice.victims is not None:
                w.reclaim_note = ""
                self._reserve(w, choice.victims, snap, pods)
                self._ask_reclaim(w, choice, pods, f" to stay within {failure}", out)
                return True
            note = core.victims.ripening_reclaim(w, needs, snap, now, out) or _refused(choice.refusal)
        return self._preempt_for_quota(w, failure, snap, now, out, note, level)

    def _ask_reclaim(self, w: Tracked, choice: Choice, pods: list[elastic.ElasticPod], within: str, out: Out) -> None:
        """``ReclaimRequested`` for a reservation that takes back what other queues hold."""
        named = _elastic_text(pods) if pods else ", ".join(choice.victims or ())
        w.last_reason = w.reason(f"quota reserved in queue {w.queue} ({amounts(w.demand)}); "
                                 f"reclaiming {named} from {_givers(choice)}{within}")
        out.append(ReclaimRequested(key=w.key, queue=w.queue, workload=w.spec, victims=w.victims,
                                    elastic_victims=w.elastic_victims, reason=w.last_reason, gpu_memory=w.gpu_memory,
                                    offer=None if pods else choice.offer))

    def _reserve(self, w: Tracked, victims: tuple[str, ...], snap: Snapshot,
                 pods: Sequence[elastic.ElasticPod] = ()) -> None:
        """``w`` takes its quota (ledger and snapshot). What its victims free (whole workloads, or elastic
        pods) counts as free nodes for the rest of the cycle (placement is the judge of capacity), but
        their quota stays held until placement evicts them: if placement fails nothing was given back, so
        no later head of the cycle may be admitted against quota a victim still holds. Only where ``w``
        and a victim share a level (a common parent) does that level count the larger of the two
        (``Snapshot.credit``)."""
        core = self.core
        with core._ledger.moving(w):
            w.state = "reserved"
        w.requeue_at, w.held = None, ""
        w.reserved_seq = core.next_seq()
        core.promises.promise(w, victims, pods)
        freed = core.promises.freed_by(w)
        snap.charge(core.tree, w, freed)
        if victims or pods:
            for _, demand in freed:
                snap.free_capacity_of(demand)
            snap.candidates, snap.candidate_queues = None, None  # promises changed

    def _preempt_for_quota(self, w: Tracked, failure: str, snap: Snapshot, now: float, out: Out,
                           refused: str = "", level: str = "", gated: bool = False) -> bool:
        """Lower priorities of ``w``'s own leaf queue may give their quota back (preemption.py), their
        elastic pods before any whole gang (elastic.py). Then ``ReclaimRequested`` naming them (placement
        places ``w`` over them and evicts them as in-queue preemption), else ``BackedOff`` with the quota
        reason (and ``refused``: why no reclaim): waiting for quota under ``level`` (``room.py``), or, when
        only victims' minimum runtime stands in the way, for a time. ``gated``: Volcano never enqueued it,
        so nobody is asked (``refused`` says so)."""
        core = self.core
        chosen, note = (None, "") if gated else core.victims.quota_victims(w, snap, now, out)
        if chosen is None:
            tail = " ".join(part for part in (note, refused) if part)
            parks = bool(level) and not note
            if parks:
                core._quota.park(w, level)
            core.back_off(w, now, w.reason(gang_line(w.spec.gang) + failure + (f". {tail}" if tail else "")), out,
                          arm=not parks)
            return False
        pods, victims = chosen
        keys = tuple(h.key for h in victims)
        offer = None if pods else core.victims.quota_offer(w, snap, now, victims)  # before w is charged
        w.reclaim_note = ""
        self._reserve(w, keys, snap, pods)
        named = ", ".join([*(f"{h.key} (priority {h.priority})" for h in victims), *([_elastic_text(pods)] if pods else [])])
        w.last_reason = w.reason(f"quota reserved in queue {w.queue} ({amounts(w.demand)}); "
                                 f"preempting {named} to stay within {failure}")
        out.append(ReclaimRequested(key=w.key, queue=w.queue, workload=w.spec, victims=keys,
                                    elastic_victims=w.elastic_victims, reason=w.last_reason,
                                    gpu_memory=w.gpu_memory, offer=offer))
        return True


def _resting(w: Tracked, now: float) -> bool:
    """Not a head now: backing off, or waiting for room a release has not named yet."""
    return bool(w.room_key or w.quota_key) or backoff.backing_off(w.requeue_at, now)


def _elastic_text(pods: Sequence[elastic.ElasticPod]) -> str:
    """``2 elastic pod(s) of ns/a (worker), 1 elastic pod(s) of ns/b (small)`` for a reason."""
    return ", ".join(f"{v.count} elastic pod(s) of {v.key} ({v.pod_set})" for v in elastic.as_victims(pods))


def _refused(refusal: str) -> str:
    return f"Reclaim refused: {refusal}." if refusal else ""


def _givers(choice: Choice) -> str:
    return "queues over their guarantee" if choice.by_guarantee else "queues over their fair share"
