"""Backoff as data: doubling, cap, early wake on released capacity / finish / delete / preemption."""

from __future__ import annotations

import pytest

from services.queue import backoff
from shared.kernel.events import BackedOff, Dequeued, TimerSet
from shared.kernel.policy import Policy
from tests.builders import queue_spec
from tests.builders.queue import (
    QueueDriver, capacity, defined, deleted, failed, finished, job, names, placed, preempted, running, submitted,
)


@pytest.mark.parametrize("attempts, expected", [(1, 2.0), (2, 4.0), (3, 8.0), (4, 10.0), (9, 10.0), (500, 10.0)])
def test_delay_doubles_from_base_and_is_capped(attempts, expected):
    assert backoff.delay(Policy(backoff_base_seconds=2, backoff_max_seconds=10), attempts) == expected


def _quota_blocked(**policy) -> QueueDriver:
    """q (capability 1 cpu) runs ns/run; ns/w (1 cpu) cannot go until ns/run leaves."""
    d = QueueDriver(Policy(**policy))
    d.step(defined(queue_spec("q", limit={"cpu": "1"})), 0.0)
    d.step(submitted(job("ns/run", "q", cpu="1", at=0.0)))
    d.step(placed("ns/run", "q"))
    d.step(running("ns/run"))
    d.step(submitted(job("ns/w", "q", cpu="1", at=10.0)), 10.0)
    return d


def test_quota_failures_wait_for_quota_without_a_timer_and_are_not_retried_until_it_comes_back():
    """Kueue's inadmissible workloads: nothing under q's limit changed, so no attempt repeats the same
    quota check; ns/w waits in line (no backoff time) with the reason that names the shortfall."""
    d = _quota_blocked()
    d.settle(200.0)
    assert [(x.requeue_at, x.attempts, x.reason) for x in d.of(BackedOff, "ns/w")] == [
        (10.0, 1, "1/1 tasks in gang unschedulable: pod group is not ready, 1 Pending, 1 minAvailable; "
                  "queue q capability cpu 1: used 1, requested 1")]
    assert [x.at for x in d.of(TimerSet) if x.at > 10.0] == []
    assert d.core.status()["q"]["pending"] == [{"workload": "ns/w", "position": 1}]


def test_finish_of_a_holder_wakes_backing_off_workloads_at_once():
    d = _quota_blocked()
    d.settle(100.0)  # ns/w backs off until 133
    out = d.step(finished("ns/run"), 120.0)
    assert names(out) == [("WorkloadWithdrawn", "ns/run"), ("Dequeued", "ns/w")]


def test_delete_of_a_holder_wakes_too():
    d = _quota_blocked()
    d.settle(100.0)
    assert names(d.step(deleted("ns/run"), 120.0)) == [("WorkloadWithdrawn", "ns/run"), ("Dequeued", "ns/w")]


def test_delete_of_a_waiting_workload_withdraws_it_without_waking_others():
    d = _quota_blocked()
    d.step(submitted(job("ns/w2", "q", cpu="1", at=11.0)), 11.0)  # backs off until 12; ns/w retries at 11
    d.settle(14.0)
    before = len(d.of(BackedOff))
    out = d.step(deleted("ns/w2"), 14.5)
    assert names(out) == [("WorkloadWithdrawn", "ns/w2")]
    assert len(d.of(BackedOff)) == before


def _placement_blocked() -> QueueDriver:
    """ns/w failed placement three times: it backs off until 10 + 1 + 2 + 4."""
    d = QueueDriver()
    d.step(submitted(job("ns/w", at=10.0)), 10.0)
    for at in (10.0, 11.0, 13.0):
        d.settle(at)
        d.step(failed("ns/w"), at)
    return d


def test_placement_failure_releases_the_reservation_and_backs_off_with_placements_reason():
    d = _placement_blocked()
    assert [(x.requeue_at, x.attempts, x.reason) for x in d.of(BackedOff, "ns/w")] == [
        (11.0, 1, "0/1 nodes are available: 1 Insufficient cpu"),
        (13.0, 2, "0/1 nodes are available: 1 Insufficient cpu"),
        (17.0, 3, "0/1 nodes are available: 1 Insufficient cpu")]
    assert d.core.status()["default"]["active"] == []
    assert len(d.of(Dequeued, "ns/w")) == 3


def test_released_capacity_wakes_early_but_capacity_that_shrank_does_not():
    d = _placement_blocked()
    assert d.step(capacity(released=False, cpu="8"), 14.0) == []
    assert names(d.step(capacity(released=True, cpu="16"), 15.0)) == [("Dequeued", "ns/w")]


def test_preemption_of_a_holder_wakes_backing_off_workloads():
    d = _placement_blocked()
    d.step(submitted(job("ns/v", at=14.0)), 14.0)
    d.step(placed("ns/v"))
    d.step(running("ns/v"))
    out = d.step(preempted("ns/v", "ns/x"), 15.0)
    # both wait in default with priority 0: ns/w was submitted first (10 < 14)
    assert [x.key for x in out if isinstance(x, Dequeued)] == ["ns/w", "ns/v"]


def test_admission_resets_attempts():
    d = _placement_blocked()
    d.settle(17.0)
    d.step(placed("ns/w"), 17.0)
    d.step(running("ns/w"))
    d.step(preempted("ns/w", "ns/boss"), 20.0)
    d.step(failed("ns/w"), 20.0)
    assert d.of(BackedOff, "ns/w")[-1].attempts == 1
    assert d.of(BackedOff, "ns/w")[-1].requeue_at == 21.0
