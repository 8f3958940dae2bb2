"""Backoff as data: ``attempts`` and ``requeue_at`` live on the workload; nothing sleeps.

A failed attempt (quota or placement) waits base x 2^(attempts-1) seconds, capped at the policy
maximum. Released capacity, a finish/delete or a preemption wakes every backing-off workload early.
"""

from __future__ import annotations

from shared.kernel.policy import Policy


def delay(policy: Policy, attempts: int) -> float:
    """Seconds to wait after the ``attempts``-th consecutive failure (attempts >= 1)."""
    exponent = max(attempts, 1) - 1
    if exponent > 62:  # 2**62 x any positive base is already far above any sane maximum
        return policy.backoff_max_seconds
    return min(policy.backoff_base_seconds * (1 << exponent), policy.backoff_max_seconds)  # 1 << e == 2 ** e, an int


def requeue_at(policy: Policy, now: float, attempts: int) -> float:
    return now + delay(policy, attempts)


def backing_off(requeue: float | None, now: float) -> bool:
    """A workload is not a head while its requeue time lies in the future."""
    return requeue is not None and requeue > now
