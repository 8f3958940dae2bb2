"""Reason fragments every service writes, so one wait reads the same whoever explains it."""

from __future__ import annotations

from typing import Mapping

from shared.kernel import quantity as q
from shared.kernel.model import Gang


def gang_line(gang: Gang) -> str:
    """Volcano's pod-group line that opens every "cannot go" reason (ends with ``; ``)."""
    tasks = sum(ps.count for ps in gang.pod_sets if ps.in_gang)
    return (f"{tasks}/{tasks} tasks in gang unschedulable: pod group is not ready, "
            f"{tasks} Pending, {gang.min_member} minAvailable; ")


def amounts(res: Mapping[str, int]) -> str:
    """``cpu 3, memory 4Gi`` for a reason."""
    return ", ".join(f"{name} {q.human(name, res[name])}" for name in sorted(res) if res[name])
