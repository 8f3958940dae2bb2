"""Reason texts shared by several decisions, in Volcano's words plus numbers."""

from __future__ import annotations

def preempted_by(preemptor: str, priority: int | None) -> str:
    """``preempted by NS/NAME (priority P)``; sticks to every reason until re-admitted."""
    return f"preempted by {preemptor}" + ("" if priority is None else f" (priority {priority})")

def waiting(queue: str) -> str:
    return f"waiting in queue {queue}"
