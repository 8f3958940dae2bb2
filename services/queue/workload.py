"""The queue's record of one workload: its state here, its backoff data and its sticky reason prefix.

States: ``pending`` (in its queue, maybe backing off), ``reserved`` (Dequeued or ReclaimRequested,
waiting for placement), ``admitted`` (GangPlaced), ``running`` (GangRunning). The last three hold
quota: the gang's minimum, plus the elastic pods granted since (``elastic``), one pod's demand each.

A pod asking for GPU memory (KAI's ``gpu-memory``) is charged its share of a device of ``gpu_memory``
MiB: while it waits, the least memory per device any node states (placement's
``CapacityChanged.gpu_memory``, KAI's ``MinNodeGPUMemory``: the largest share it may take), from its
reservation on the value it was reserved at (``Dequeued.gpu_memory``), and once placed, what its gang
pods hold on the devices they got (``gpu_held``, from ``GangPlaced``), as KAI charges an allocated pod.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from services.queue.ordering import pending_key
from shared.kernel import quantity as q
from shared.kernel.events import ElasticVictim
from shared.kernel.model import Gang, PodSet, WorkloadSpec, still_held

State = Literal["pending", "reserved", "admitted", "running"]
HOLDING: tuple[State, ...] = ("reserved", "admitted", "running")


@dataclass
class Tracked:
    spec: WorkloadSpec
    demand: dict[str, int]
    """What it charges while it holds quota: its gang's minimum (``quota_demand_at`` its ``gpu_memory``)
    plus its granted elastic pods; computed once per change."""
    order: tuple[int, float, str]
    """Its place in its queue (``ordering.pending_key``), computed once per spec."""
    state: State = "pending"
    attempts: int = 0
    requeue_at: float | None = None
    preempted_by: str = ""
    """``preempted by NS/NAME (priority P)``, or why it was evicted as a stale gang, until admitted
    again; prefixes every reason."""
    last_reason: str = ""
    reserved_seq: int = 0
    """Admission order (for the status view)."""
    started_at: float | None = None
    victims: tuple[str, ...] = ()
    """Workloads its reclaim or preemption named as victims, whole (until placement answers)."""
    elastic_victims: tuple[ElasticVictim, ...] = ()
    """Elastic pods of holders it named as victims instead (until placement answers)."""
    promised_to: str = ""
    """Key of the workload whose reclaim named this one as a victim (until placement answers)."""
    held: str = ""
    """Why its queue takes no workloads (missing, Closed, not a leaf), as last told; "" when it does."""
    reclaim_note: str = ""
    """Set when it was sent to placement without the reclaim it needs because the victims are too young."""
    latest: WorkloadSpec | None = None
    """The user's latest spec when it differs from ``spec`` (an edit of a holder beyond what was
    admitted); it takes over when the workload goes back to its queue."""
    elastic: dict[str, int] = field(default_factory=dict)
    """Elastic pods granted per pod set of the admitted gang (charged until placement releases them)."""
    elastic_waits: bool = False
    """Placement found no node for a grant: no further grant until capacity is released."""
    elastic_told: str = ""
    """The last ``ElasticWaiting`` reason told for it ("" after a grant: a new wait is told again)."""
    elastic_goal: dict[str, int] = field(default_factory=dict)
    """Elastic pods the owner wants per admitted pod set (``elastic.goal``), kept current on every change."""
    room_key: str = ""
    """Set while it waits for room placement reported no node and no victim for (``room.RoomWaits``):
    no head of a cycle until a release names room for this key."""
    quota_key: str = ""
    """Set while it waits for quota: the queue (its leaf or an ancestor) whose limit or guarantee cap
    blocked it with nothing to reclaim or preempt (``room.RoomWaits``); no head of a cycle until usage
    under that queue drops."""
    gpu_memory: int = 0
    """MiB per GPU device its ``gpu-memory`` pods are charged at (0: none known, they charge nothing)."""
    gpu_held: dict[str, int] = field(default_factory=dict)
    """Per pod set asking for GPU memory, the GPU its placed gang pods hold (``GangPlaced.gpu_memory_held``):
    charged instead of the estimate while it holds quota."""

    @classmethod
    def of(cls, spec: WorkloadSpec, gpu_memory: int = 0) -> "Tracked":
        return cls(spec=spec, demand=spec.gang.quota_demand_at(gpu_memory), order=pending_key(spec),
                   gpu_memory=gpu_memory)

    def respec(self, spec: WorkloadSpec) -> None:
        if self.gpu_held:
            self.gpu_held = still_held(self.gpu_held, self.spec.gang, spec.gang)
        self.spec = spec
        self.latest = None
        self.order = pending_key(spec)
        self._charge()

    def placed_as(self, gang: Gang) -> None:
        """Placement placed the gang with other members of a pod group standing in (``as_placed``): it
        charges what runs, never more than it reserved; call inside ``Ledger.moving``."""
        if gang is not self.spec.gang:
            self.spec = self.spec.model_copy(update={"gang": gang})
            self._charge()

    def set_elastic(self, pod_set: str, count: int) -> None:
        """Granted elastic pods of a pod set (0 forgets it); call inside ``Ledger.moving``."""
        if count > 0:
            self.elastic[pod_set] = count
        else:
            self.elastic.pop(pod_set, None)
        self._charge()

    def drop_elastic(self, gpu_memory: int) -> None:
        """The admission ended (preempted, placement failed): no elastic pod holds quota any more, and its
        ``gpu-memory`` pods are charged at ``gpu_memory`` again, as every waiting workload's."""
        self.elastic, self.elastic_waits, self.elastic_told = {}, False, ""
        self.gpu_memory, self.gpu_held = gpu_memory, {}
        self._charge()

    def hold_gpu(self, held: dict[str, int]) -> None:
        """Placement placed its gang: its ``gpu-memory`` pods are charged what they hold (call inside
        ``Ledger.moving``)."""
        self.gpu_held = held
        self._charge()

    def charge_at(self, gpu_memory: int) -> None:
        """Its ``gpu-memory`` pods are charged at ``gpu_memory`` MiB per device from now (call inside
        ``Ledger.moving``)."""
        self.gpu_memory = gpu_memory
        self._charge()

    def pod_demand(self, ps: PodSet) -> dict[str, int]:
        """What one pod of ``ps`` charges (``PodSet.pod_demand_at`` its device memory)."""
        return ps.pod_demand_at(self.gpu_memory)

    def elastic_demand(self, pod_set: str, count: int) -> dict[str, int]:
        """What ``count`` of its granted elastic pods of ``pod_set`` charge (never more than it was granted)."""
        ps = next((p for p in self.spec.gang.pod_sets if p.name == pod_set), None)
        n = min(count, self.elastic.get(pod_set, 0))
        return q.add({}, self.pod_demand(ps), n) if ps is not None and n > 0 else {}

    def _charge(self) -> None:
        demand = self.spec.gang.quota_demand_at(self.gpu_memory, self.gpu_held)
        for ps in self.spec.gang.pod_sets:
            if self.elastic.get(ps.name):
                demand = q.add(demand, self.pod_demand(ps), self.elastic[ps.name])
        self.demand = demand

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


