"""Whether an admitted gang runs: GangRunning once every gang pod is bound and Running, GangDisrupted
when a running gang stays short of one past a grace (the ``disruption`` timer), and, in a queue that
evicts stale gangs (KAI's), which disrupted gangs are still below their minimum when their queue's
staleness grace period is over (the ``stale`` timer: ``Lifecycle.evict_stale`` evicts them)."""

from __future__ import annotations

from services.placement.ledger import PodLedger
from services.placement.workloads import WorkloadRecord
from shared.kernel.events import GangDisrupted, GangRunning, TimerSet
from shared.kernel.policy import Policy

DISRUPTION_TIMER = "disruption"
"""Fires ``DISRUPTION_GRACE`` after a running gang lost a pod: by then a deletion or finish of the
workload has arrived, so only a gang that is still wanted is called disrupted."""
DISRUPTION_GRACE = 2.0
"""Seconds of event time between a running gang's loss of a pod and the judgement. A workload's
deletion reaches placement through admission and the queue (``WorkloadWithdrawn``), while the
garbage collector's deletions of its pods come straight from the watch, often first: on a deployment
they arrive tens to hundreds of milliseconds apart, and after a relist in any order. The embedded
runtime's instants have a quiescence, a deployment none; the grace stands in for it in both alike."""
STALE_TIMER = "stale"
"""Fires when a disrupted gang of a queue that evicts stale gangs has been below its minimum for the
queue's staleness grace period, counted from the loss (KAI stamps a job stale when a session first
sees it so, and evicts it once the grace has passed: ``stalegangeviction.handleStaleJob``)."""


class Disruptions:
    def __init__(self, ledger: PodLedger, policy: Policy) -> None:
        self.ledger = ledger
        self.policy = policy
        self.suspects: dict[str, tuple[str, bool, float]] = {}
        """Running gangs that lost a pod: workload key -> (pod, whether its node went away, when it was lost)."""
        self.timer_at: float | None = None
        self.stale_queues: dict[str, None] = {}
        """Queues whose dialect evicts stale gangs (``QueueSpec.evicts_stale_gangs``, KAI's)."""
        self.stale: dict[str, tuple[float, float]] = {}
        """Disrupted gangs of such queues: workload key -> (since when below its minimum, when to evict)."""
        self.stale_timers: dict[float, None] = {}
        """Instants a ``stale`` timer is set for (one per instant)."""

    def define_queue(self, name: str, evicts_stale_gangs: bool) -> None:
        if evicts_stale_gangs:
            self.stale_queues[name] = None
        else:
            self.stale_queues.pop(name, None)

    def forget(self, key: str) -> None:
        """The workload is no longer wanted (withdrawn, preempted, evicted): nothing to judge."""
        self.suspects.pop(key, None)
        self.stale.pop(key, None)

    def suspect(self, wrec: WorkloadRecord, pod: str, lost_node: bool, now: float) -> list[TimerSet]:
        """A running gang lost a pod: judge after the grace, once we know whether the workload is still wanted."""
        if wrec.key in self.suspects:
            return []
        due = now + DISRUPTION_GRACE
        self.suspects[wrec.key] = (pod, lost_node, now)
        if self.timer_at == due:
            return []
        self.timer_at = due
        return [TimerSet(key=DISRUPTION_TIMER, at=due)]

    def judge(self, now: float, workloads: dict[str, WorkloadRecord]) -> list[GangDisrupted | TimerSet]:
        """Gangs still admitted and still short of a bound, Running member are disrupted until whole
        again; in a queue that evicts stale gangs, each is also watched for its staleness grace period."""
        out: list[GangDisrupted | TimerSet] = []
        due = [(key, pod, lost_node, lost_at) for key, (pod, lost_node, lost_at) in self.suspects.items()
               if lost_at + DISRUPTION_GRACE <= now]
        for key, pod, lost_node, lost_at in due:
            del self.suspects[key]
            wrec = workloads.get(key)
            if wrec is None or not wrec.admitted or not wrec.running:
                continue
            gang = [s for s in wrec.slots if s.in_gang]
            whole = sum(1 for s in gang
                        if s.filled and s.pod is not None and self.ledger.pods[s.pod].facts.phase == "Running")
            if whole == len(gang):
                continue
            wrec.running = False
            why = "lost its node" if lost_node else "went away"
            out.append(GangDisrupted(key=key, reason=f"{whole}/{len(gang)} gang pods Running: pod {pod} {why};"
                                                     f" waiting for its replacement to be bound and Running"))
            out += self._watch(wrec, lost_at, now)
        return out

    def _watch(self, wrec: WorkloadRecord, since: float, now: float) -> list[TimerSet]:
        """A disrupted gang of a queue that evicts stale gangs: its eviction is due when the queue's grace
        period has passed since it fell below its minimum (never when the grace is negative)."""
        grace = self.policy.staleness_grace_period_for(wrec.queue)
        if wrec.queue not in self.stale_queues or grace is None or wrec.key in self.stale:
            return []
        at = max(now, since + grace)
        self.stale[wrec.key] = (since, at)
        if at in self.stale_timers:
            return []
        self.stale_timers[at] = None
        return [TimerSet(key=STALE_TIMER, at=at)]

    def stale_due(self, due: float, workloads: dict[str, WorkloadRecord]) -> list[tuple[WorkloadRecord, str]]:
        """The ``stale`` timer set for ``due`` fired: the gangs still below their minimum, each with the
        reason it is evicted in KAI's words (``recordStaleJobEvent``). A gang counts the pods that hold its
        slots, bound or being bound (KAI's active pods); one that has them all again, or whose pod
        Succeeded (KAI never calls a job with a Succeeded pod stale), is left alone."""
        self.stale_timers.pop(due, None)
        out: list[tuple[WorkloadRecord, str]] = []
        for key, (since, at) in list(self.stale.items()):
            if at > due:
                continue
            del self.stale[key]
            wrec = workloads.get(key)
            if wrec is None or not wrec.admitted:
                continue
            gang = [s for s in wrec.slots if s.in_gang and not s.elastic]
            if any(s.done for s in gang):
                continue
            active = sum(1 for s in gang if s.pod is not None and s.pod in self.ledger.pods
                         and self.ledger.pods[s.pod].facts.live)
            if active >= len(gang):
                continue
            out.append((wrec, f"stale gang evicted: {active} pods are active, minMember is {len(gang)}, "
                              f"for {at - since:g}s (its queue's staleness grace period)"))
        return out

    def check_running(self, wrec: WorkloadRecord, now: float) -> list[GangRunning]:
        """GangRunning once per admission, when every in-gang slot holds a bound, Running pod."""
        if wrec.running:
            return []
        gang = [s for s in wrec.slots if s.in_gang]
        if not gang:
            return []
        for slot in gang:
            if not slot.filled or slot.pod is None or self.ledger.pods[slot.pod].facts.phase != "Running":
                return []
        restarted = wrec.started_at is not None
        wrec.running = True
        self.stale.pop(wrec.key, None)  # whole again: a later loss starts a new grace
        if not restarted:
            wrec.started_at = now
        return [GangRunning(key=wrec.key, reason=f"{len(gang)}/{len(gang)} gang pods bound and Running"
                                                  + (" again" if restarted else ""))]
