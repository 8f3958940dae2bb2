"""Whether an admitted gang runs: GangRunning once every gang pod is bound and Running, GangDisrupted
when a running gang stays short of one past a grace (the ``disruption`` timer)."""

from __future__ import annotations

from services.placement.ledger import PodLedger
from services.placement.workloads import WorkloadRecord
from shared.kernel.events import GangDisrupted, GangRunning, TimerSet

DISRUPTION_TIMER = "disruption"
"""Fires ``DISRUPTION_GRACE`` after a running gang lost a pod: by then a deletion or finish of the
workload has arrived, so only a gang that is still wanted is called disrupted."""
DISRUPTION_GRACE = 2.0
"""Seconds of event time between a running gang's loss of a pod and the judgement. A workload's
deletion reaches placement through admission and the queue (``WorkloadWithdrawn``), while the
garbage collector's deletions of its pods come straight from the watch, often first: on a deployment
they arrive tens to hundreds of milliseconds apart, and after a relist in any order. The embedded
runtime's instants have a quiescence, a deployment none; the grace stands in for it in both alike."""


class Disruptions:
    def __init__(self, ledger: PodLedger) -> None:
        self.ledger = ledger
        self.suspects: dict[str, tuple[str, bool, float]] = {}
        """Running gangs that lost a pod: workload key -> (pod, whether its node went away, when to judge)."""
        self.timer_at: float | None = None

    def forget(self, key: str) -> None:
        """The workload is no longer wanted (withdrawn, preempted): nothing to judge."""
        self.suspects.pop(key, None)

    def suspect(self, wrec: WorkloadRecord, pod: str, lost_node: bool, now: float) -> list[TimerSet]:
        """A running gang lost a pod: judge after the grace, once we know whether the workload is still wanted."""
        if wrec.key in self.suspects:
            return []
        due = now + DISRUPTION_GRACE
        self.suspects[wrec.key] = (pod, lost_node, due)
        if self.timer_at == due:
            return []
        self.timer_at = due
        return [TimerSet(key=DISRUPTION_TIMER, at=due)]

    def judge(self, now: float, workloads: dict[str, WorkloadRecord]) -> list[GangDisrupted]:
        """Gangs still admitted and still short of a bound, Running member are disrupted until whole again."""
        out: list[GangDisrupted] = []
        due = [(key, pod, lost_node) for key, (pod, lost_node, at) in self.suspects.items() if at <= now]
        for key, pod, lost_node in due:
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
        if not restarted:
            wrec.started_at = now
        return [GangRunning(key=wrec.key, reason=f"{len(gang)}/{len(gang)} gang pods bound and Running"
                                                  + (" again" if restarted else ""))]
