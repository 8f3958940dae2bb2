"""Preemption, finish, updates, timers and the status view."""

from __future__ import annotations

from shared.kernel.events import Dequeued, Enqueued, GangEvicted, TimerSet, WorkloadRejected, WorkloadWithdrawn
from tests.builders import queue_spec, workload
from tests.builders.queue import (
    QueueDriver, capacity, defined, failed, finished, job, placed, preempted, ray_gang, running, submitted,
    unlimited, updated,
)

PREFIX = "preempted by default/build-cluster (priority 100)"


def _kai_preemption() -> QueueDriver:
    """One GPU; train (50) runs in team-a, build (100) is admitted and placement preempts train."""
    d = QueueDriver()
    team = unlimited(queue_spec("team-a", dialect="kai"), guarantee=("cpu", "memory", "nvidia.com/gpu"),
                     limit=("cpu", "memory", "nvidia.com/gpu"))
    d.step(capacity(cpu="8", memory="32Gi", **{"nvidia.com/gpu": "1"}), 0.0)
    d.step(defined(team))
    g = ray_gang(head_cpu="1", head_memory="2Gi", workers=1, worker_cpu="1", worker_memory="4Gi", gpu="1")
    d.step(submitted(workload("default/train-cluster", queue="team-a", priority=50, gang_=g, submitted_at=1.0)), 1.0)
    d.step(placed("default/train-cluster", "team-a"))
    d.step(running("default/train-cluster"), 3.0)
    d.step(submitted(workload("default/build-cluster", queue="team-a", priority=100, gang_=g, submitted_at=30.0)), 30.0)
    return d


def test_a_non_preemptible_workload_is_dequeued_when_no_other_queue_can_give_back():
    d = _kai_preemption()
    assert [x.key for x in d.of(Dequeued)] == ["default/train-cluster", "default/build-cluster"]


def test_preempted_workload_is_requeued_and_every_later_reason_names_its_preemptor():
    d = _kai_preemption()
    d.send(preempted("default/train-cluster", "default/build-cluster"), 30.0)
    d.send(placed("default/build-cluster", "team-a"))
    out = d.settle()
    assert out[0] == Dequeued(key="default/train-cluster", queue="team-a", workload=out[0].workload,
                              reason=f"{PREFIX}: quota reserved in queue team-a (cpu 2, memory 6Gi, nvidia.com/gpu 1)")
    assert d.of(Enqueued, "default/train-cluster")[-1].reason == f"{PREFIX}; waiting in queue team-a"
    out = d.step(failed("default/train-cluster", "team-a", reason="0/1 nodes are available: 1 Insufficient nvidia.com/gpu"))
    assert [x.reason for x in out] == [f"{PREFIX}: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu"]
    assert d.core.status()["team-a"]["backoff"] == [{"workload": "default/train-cluster", "requeue_at": 31.0}]
    retry = d.settle(31.0)
    assert [(x.type, x.reason.startswith(PREFIX + ": ")) for x in retry] == [("Dequeued", True)]


def test_a_stale_gang_evicted_waits_in_its_queue_again_saying_why_and_its_quota_goes_back():
    d = QueueDriver()
    d.step(capacity(cpu="8", memory="32Gi"), 0.0)
    d.step(defined(queue_spec("team", dialect="kai", limit={"cpu": "2"})))
    d.step(submitted(job("default/rc", "team", cpu="2", at=1.0)), 1.0)
    d.step(placed("default/rc", "team"))
    d.step(running("default/rc"), 3.0)
    d.step(submitted(job("default/next", "team", cpu="2", at=10.0)), 10.0)      # waits: the limit is rc's
    why = "stale gang evicted: 0 pods are active, minMember is 1, for 60s (its queue's staleness grace period)"
    out = d.step(GangEvicted(key="default/rc", kind="RayCluster", gate="pods", pods=(), reason=why), 70.0)
    assert out[0] == Enqueued(key="default/rc", queue="team", reason=f"{why}; waiting in queue team")
    first = [x for x in out if isinstance(x, Dequeued)]   # its quota went back; it keeps its place in line
    assert [x.key for x in first] == ["default/rc"] and first[0].reason.startswith(f"{why}: quota reserved")
    out = d.step(failed("default/rc", "team"))           # no room for its whole gang: the next one's turn
    assert [x.key for x in out if isinstance(x, Dequeued)] == ["default/next"]


def test_the_prefix_goes_when_readmitted_and_never_stacks():
    d = _kai_preemption()
    d.step(preempted("default/train-cluster", "default/build-cluster"), 30.0)
    d.step(placed("default/train-cluster", "team-a"), 40.0)  # admitted again
    d.step(running("default/train-cluster"))
    d.step(submitted(job("default/other", "team-a", priority=70, at=50.0)), 50.0)
    out = d.step(preempted("default/train-cluster", "default/other", priority=70), 50.0)
    assert out[0] == Enqueued(key="default/train-cluster", queue="team-a",
                              reason="preempted by default/other (priority 70); waiting in queue team-a")
    assert out[1].reason.startswith("preempted by default/other (priority 70): quota reserved")
    assert "build-cluster" not in out[1].reason


def test_the_preemptor_priority_comes_from_the_event_even_for_a_stranger():
    d = QueueDriver()
    d.step(submitted(job("ns/v", at=0.0)), 0.0)
    d.step(placed("ns/v"))
    out = d.send(preempted("ns/v", "ns/stranger", priority=7))
    assert out[0].reason == "preempted by ns/stranger (priority 7); waiting in queue default"


def test_a_reclaimed_workload_says_which_queue_took_it_back():
    d = QueueDriver()
    d.step(submitted(job("ns/v", at=0.0)), 0.0)
    d.step(placed("ns/v"))
    d.step(defined(queue_spec("other")), 1.0)
    d.step(submitted(job("ns/taker", "other", at=1.0)), 1.0)
    out = d.send(preempted("ns/v", "ns/taker", priority=0, reclaim=True))
    assert out[0].reason == "reclaimed by ns/taker (priority 0) for queue other; waiting in queue default"


def test_finished_workload_is_withdrawn_and_forgotten_duplicates_change_nothing():
    d = QueueDriver()
    d.step(submitted(job("ns/a", at=0.0)), 0.0)
    d.step(placed("ns/a"))
    assert d.step(finished("ns/a", "Failed"), 5.0) == [WorkloadWithdrawn(key="ns/a", reason="job failed")]
    assert d.step(finished("ns/a"), 5.0) == []
    assert d.step(placed("ns/a")) == []
    assert d.core.status()["default"]["active"] == []


def test_duplicate_submission_and_placement_are_no_ops():
    d = QueueDriver()
    d.step(submitted(job("ns/a", at=0.0)), 0.0)
    assert d.step(submitted(job("ns/a", at=0.0))) == []
    d.step(placed("ns/a"))
    assert d.step(placed("ns/a")) == []
    assert d.step(failed("ns/a")) == []  # an admitted workload cannot fail placement any more


def test_update_replaces_the_spec_while_pending_and_is_ignored_once_it_holds_quota():
    d = QueueDriver()
    d.step(defined(queue_spec("q", limit={"cpu": "1"})), 0.0)
    d.step(defined(queue_spec("r")))
    d.step(submitted(job("ns/a", "q", cpu="2", at=0.0)))
    out = d.step(updated(job("ns/a", "r", cpu="2", at=0.0)), 0.5)
    assert [(x.type, x.queue) for x in out] == [("Enqueued", "r"), ("Dequeued", "r")]
    assert d.step(updated(job("ns/a", "q", cpu="9", at=0.0)), 1.0) == []
    assert d.core.status()["r"]["usage"] == {"cpu": 2000}


def test_timers_are_deduplicated_per_instant():
    d = QueueDriver()
    d.send(defined(queue_spec("q")), 0.0)
    for key in ("ns/a", "ns/b", "ns/c"):
        d.send(submitted(job(key, "q", cpu="2", at=0.0)))
    d.send(capacity(cpu="8"))
    d.settle()
    for key in ("ns/a", "ns/b", "ns/c"):
        d.send(failed(key, "q"), 0.0)
    d.settle()
    # one cycle now; three failures: all three back off to 1.0 (one timer for that instant) and their
    # reservations come back now (one more cycle now, not three)
    assert [x.at for x in d.of(TimerSet)] == [0.0, 1.0, 0.0]


def test_status_view_lists_active_in_admission_order_pending_positions_and_backoff():
    d = QueueDriver()
    d.step(defined(queue_spec("root", limit={"cpu": "10"}, guarantee={"cpu": "4"})), 0.0)
    d.step(defined(queue_spec("leaf", parent="root", limit={"cpu": "3"})))
    d.step(capacity(cpu="8"))
    d.step(submitted(job("ns/z", "leaf", cpu="1", at=0.0, priority=1)))
    d.step(submitted(job("ns/y", "leaf", cpu="1", at=0.0)))
    d.step(placed("ns/y", "leaf"), 1.0)
    d.step(submitted(job("ns/big", "leaf", cpu="1", at=2.0)), 2.0)
    d.step(failed("ns/big", "leaf"), 2.0)  # no node for it: backs off until 3
    d.step(defined(queue_spec("leaf", parent="root", limit={"cpu": "3"}, state="Closed")), 2.5)
    d.step(submitted(job("ns/p2", "leaf", cpu="1", at=2.5)), 2.5)
    d.step(submitted(job("ns/p1", "leaf", cpu="1", at=2.5, priority=5)))
    status = d.core.status()
    assert status["leaf"] == {
        "exists": True, "parent": "root", "state": "Closed",
        "usage": {"cpu": 2000}, "guarantee": {}, "limit": {"cpu": 3000},
        "fair_share": {"cpu": 2000},  # a Closed queue's waiting work asks for no share: usage only
        "active": ["ns/z", "ns/y"],
        "pending": [{"workload": "ns/p1", "position": 1}, {"workload": "ns/p2", "position": 2}],
        "backoff": [{"workload": "ns/big", "requeue_at": 3.0}],
    }
    assert status["root"]["usage"] == {"cpu": 2000}
    assert status["root"]["fair_share"] == {"cpu": 2000}
    assert status["root"]["active"] == []


def test_events_of_other_services_are_ignored_quietly():
    d = QueueDriver()
    assert d.send(Enqueued(key="ns/a", queue="q", reason="x"), 0.0) == []


def test_rejected_update_withdraws_a_waiting_workload_but_not_one_holding_quota():
    d = QueueDriver()
    d.step(defined(queue_spec("q", limit={"cpu": "1"})), 0.0)
    d.step(submitted(job("ns/a", "q", cpu="1", at=0.0)), 0.0)
    d.step(placed("ns/a", "q"))
    d.step(submitted(job("ns/b", "q", cpu="1", at=1.0)), 1.0)
    assert [p["workload"] for p in d.core.status()["q"]["pending"] + d.core.status()["q"]["backoff"]] == ["ns/b"]
    bad = WorkloadRejected(key="ns/b", kind="RayCluster", reason="spec...cpu: 'lots' is not a quantity")
    assert d.step(bad, 2.0)[0] == WorkloadWithdrawn(key="ns/b", reason=bad.reason)
    assert d.core.status()["q"]["pending"] == [] and d.core.status()["q"]["backoff"] == []
    assert d.step(WorkloadRejected(key="ns/a", kind="RayCluster", reason="bad edit"), 3.0) == []
    assert d.core.status()["q"]["active"] == ["ns/a"]


def test_a_rejected_claim_of_another_kind_leaves_the_waiting_workload_alone():
    d = QueueDriver()
    d.step(defined(queue_spec("q", limit={"cpu": "1"})), 0.0)
    d.step(submitted(job("ns/a", "q", cpu="1", at=0.0)), 0.0)
    d.step(placed("ns/a", "q"))
    d.step(submitted(job("ns/x", "q", cpu="1", at=1.0)), 1.0)  # a RayCluster, waiting
    clash = WorkloadRejected(key="ns/x", kind="RayJob", reason="default/x is already taken by RayCluster ns/x")
    assert [e for e in d.step(clash, 2.0) if isinstance(e, WorkloadWithdrawn)] == []
    assert [p["workload"] for p in d.core.status()["q"]["pending"] + d.core.status()["q"]["backoff"]] == ["ns/x"]


def test_a_pod_group_short_of_its_pods_waits_with_volcanos_words_until_they_come():
    """Admission says a submitted pod group cannot start (``WorkloadSpec.not_ready``: fewer valid pods than
    its minimum, Volcano's "Not enough valid tasks"): the queue holds it with that reason, reserving
    nothing, and admits it once an update says its pods are back."""
    d = QueueDriver()
    d.step(capacity(cpu="8", memory="32Gi"), 0.0)
    d.step(defined(queue_spec("q")))
    short = "Not enough valid tasks for gang-scheduling, valid: 1, min: 2 (pod group g waits for its pods)"
    out = d.step(submitted(job("ns/g", "q", cpu="1", at=1.0).model_copy(update={"not_ready": short})), 1.0)
    assert [x.type for x in out] == ["Enqueued", "Enqueued"] and out[-1].reason == short  # in line, then held
    assert d.core.status()["q"]["usage"] == {}
    out = d.step(updated(job("ns/g", "q", cpu="1", at=1.0)), 2.0)
    assert [x.type for x in out] == ["Enqueued", "Dequeued"] and out[0].reason == "waiting in queue q"
