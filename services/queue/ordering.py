"""Who goes first: pending order inside a queue, and the order queues are served in a cycle.

Inside a queue: priority desc, submitted_at asc, key asc (never message order). Across queues:
queue priority desc, dominant share of usage over fair share asc, name. StrictFIFO stops a queue
at its first head that cannot go; BestEffortFIFO skips it. A blocked queue never blocks another.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Literal

from shared.kernel.model import WorkloadSpec

Queueing = Literal["StrictFIFO", "BestEffortFIFO"]

ORDER = attrgetter("order")
"""Sort key of a tracked workload (``Tracked.order``, its ``pending_key``)."""


def pending_key(spec: WorkloadSpec) -> tuple[int, float, str]:
    """Sort key of a pending workload within its queue."""
    return (-spec.priority, spec.submitted_at, spec.key)


def serve_key(priority: int, dominant_share: float, name: str) -> tuple[int, float, str]:
    """Sort key of a queue in the cycle: the most important, least served queue goes next."""
    return (-priority, dominant_share, name)


def blocks(queueing: Queueing) -> bool:
    """Whether a head that cannot go (or is backing off) holds back everything behind it."""
    return queueing == "StrictFIFO"
