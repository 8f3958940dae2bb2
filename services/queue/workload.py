"""The queue's record of one workload: its state here, its backoff data and its sticky reason prefix.

States: ``pending`` (in its queue, maybe backing off), ``reserved`` (Dequeued or ReclaimRequested,
waiting for placement), ``admitted`` (GangPlaced), ``running`` (GangRunning). The last three hold
quota.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from services.queue.ordering import pending_key
from shared.model import WorkloadSpec

State = Literal["pending", "reserved", "admitted", "running"]
HOLDING: tuple[State, ...] = ("reserved", "admitted", "running")


@dataclass
class Tracked:
    spec: WorkloadSpec
    demand: dict[str, int]
    """``spec.gang.quota_demand``, computed once per spec."""
    order: tuple[int, float, str]
    """Its place in its queue (``ordering.pending_key``), computed once per spec."""
    state: State = "pending"
    attempts: int = 0
    requeue_at: float | None = None
    preempted_by: str = ""
    """``preempted by NS/NAME (priority P)`` until admitted again; prefixes every reason."""
    last_reason: str = ""
    reserved_seq: int = 0
    """Admission order (for the status view)."""
    started_at: float | None = None
    victims: tuple[str, ...] = ()
    promised_to: str = ""
    """Key of the workload whose reclaim named this one as a victim (until placement answers)."""
    held: str = ""
    """Why its queue takes no workloads (missing, Closed, not a leaf), as last told; "" when it does."""
    reclaim_note: str = ""
    """Set when it was sent to placement without the reclaim it needs because the victims are too young."""
    latest: WorkloadSpec | None = None
    """The user's latest spec when it differs from ``spec`` (an edit of a holder beyond what was
    admitted); it takes over when the workload goes back to its queue."""

    @classmethod
    def of(cls, spec: WorkloadSpec) -> "Tracked":
        return cls(spec=spec, demand=spec.gang.quota_demand, order=pending_key(spec))

    def respec(self, spec: WorkloadSpec) -> None:
        self.spec = spec
        self.latest = None
        self.demand = spec.gang.quota_demand
        self.order = pending_key(spec)

    @property
    def key(self) -> str:
        return self.spec.key

    @property
    def queue(self) -> str:
        return self.spec.queue

    @property
    def holds_quota(self) -> bool:
        return self.state in HOLDING

    def reason(self, text: str) -> str:
        """``text`` with the sticky preempted-by prefix, if any."""
        return f"{self.preempted_by}: {text}" if self.preempted_by else text


