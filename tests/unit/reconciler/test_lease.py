"""The leader election's settings (shared/kubernetes/lease.py), without a server: kubernetes-asyncio's
own bounds, refused as one ValueError naming what was given (``muster run cluster`` prints it)."""

from __future__ import annotations

import pytest

from shared.kubernetes.lease import LeaseElector


@pytest.mark.parametrize("durations", [(10, 10, 2), (15, 10, 10), (15, 10, 0.5), (15, 2, 2)])
def test_the_durations_must_nest(durations):
    with pytest.raises(ValueError, match="got lease duration"):
        LeaseElector("ns", "l", "me", lease_duration=durations[0], renew_deadline=durations[1],
                     retry_period=durations[2])


def test_the_deployments_durations_are_taken():
    elector = LeaseElector("muster-system", "muster-cluster", "me", lease_duration=15, renew_deadline=10,
                           retry_period=2)
    assert elector.where == "muster-system/muster-cluster" and elector.holder == ""


def test_a_lease_duration_in_fractions_is_written_as_whole_seconds():
    """The client writes int(str(duration)): the CLI's float 15.0 broke the first write (ValueError)."""
    from kubernetes_asyncio.leaderelection.leaderelectionrecord import LeaderElectionRecord
    from shared.kubernetes.lease import _Lock

    elector = LeaseElector("ns", "l", "me", lease_duration=4.5, renew_deadline=3.0, retry_period=1.0)
    duration = elector._election.election_config.lease_duration
    record = LeaderElectionRecord("me", str(duration), "2026-01-01 00:00:00.000001", "2026-01-01 00:00:00.000001")
    assert _Lock("l", "ns", "me").update_lease(record).lease_duration_seconds == 5
