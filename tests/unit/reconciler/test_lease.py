"""The leader-election rule (services/reconciler/lease.py), without a server: who may hold the Lease."""

from __future__ import annotations

import pytest

from services.reconciler.lease import LeaseElector, Observed, decide, micro_time


def seen(holder: str, at: float, duration: float = 15.0) -> Observed:
    return Observed(holder=holder, duration=duration, record=(holder, "t"), changed_at=at)


def test_no_lease_is_created():
    assert decide("me", None, 0.0) == "create"


def test_the_holder_renews():
    assert decide("me", seen("me", 0.0), 100.0) == "renew"


def test_another_holder_is_waited_for_until_its_record_has_been_still_for_the_lease_duration():
    lease = seen("other", 10.0)
    assert decide("me", lease, 10.0) == "wait"
    assert decide("me", lease, 24.9) == "wait"
    assert decide("me", lease, 25.0) == "take"


def test_a_released_lease_is_taken_at_once():
    assert decide("me", seen("", 10.0), 10.0) == "take"


def test_the_holders_own_duration_counts():
    assert decide("me", seen("other", 0.0, duration=40.0), 30.0) == "wait"


@pytest.mark.parametrize("durations", [(10, 10, 2), (15, 10, 10), (15, 10, 0)])
def test_the_durations_must_nest(durations):
    with pytest.raises(ValueError):
        LeaseElector("ns", "l", "me", lease_duration=durations[0], renew_deadline=durations[1],
                     retry_period=durations[2])


def test_lease_times_are_micro_times_in_utc():
    assert micro_time(0.5) == "1970-01-01T00:00:00.500000Z"
