"""Reason texts shared by several decisions, in Volcano's words plus numbers."""

from __future__ import annotations

def preempted_by(preemptor: str, priority: int, reclaimed_for: str | None = None) -> str:
    """``preempted by NS/NAME (priority P)`` or ``reclaimed by NS/NAME (priority P) for queue Q``.

    Sticks to every reason of the victim until it is admitted again: the answer to "who took it".
    """
    if reclaimed_for:
        return f"reclaimed by {preemptor} (priority {priority}) for queue {reclaimed_for}"
    return f"preempted by {preemptor} (priority {priority})"

def waiting(queue: str) -> str:
    return f"waiting in queue {queue}"
