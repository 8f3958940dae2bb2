"""Hierarchical quota: limits over the leaf and every ancestor, guarantees for non-preemptible work."""

from __future__ import annotations

from shared.kernel.events import BackedOff, CapacityChanged, Dequeued, Enqueued, QueueRejected
from shared.kernel.quantity import MAX_MILLI
from services.queue.tree import QueueTree, reserved_block
from tests.builders import queue_spec, workload
from tests.builders.queue import (
    QueueDriver, capacity, cpu_gang, defined, deleted, job, names, placed, ray_gang, removed, submitted, unlimited, updated,
)

GANG_LINE = "3/3 tasks in gang unschedulable: pod group is not ready, 3 Pending, 3 minAvailable; "


def _kube_queue_tree(d: QueueDriver) -> None:
    """The ACK ElasticQuotaTree: root 100 cpu, algorithm max 80, video max 14 (namespace video)."""
    eqt = {"dialect": "elasticquotatree"}
    d.send(defined(queue_spec("root", guarantee={"cpu": "100", "memory": "50Gi", "nvidia.com/gpu": "16"},
                              limit={"cpu": "100", "memory": "50Gi", "nvidia.com/gpu": "16"}, **eqt)), 0.0)
    d.send(defined(queue_spec("algorithm", parent="root", guarantee={"cpu": "50", "memory": "25Gi", "nvidia.com/gpu": "10"},
                              limit={"cpu": "80", "memory": "50Gi", "nvidia.com/gpu": "14"}, **eqt)))
    d.send(defined(queue_spec("video", parent="algorithm", guarantee={"cpu": "12", "memory": "12Gi", "nvidia.com/gpu": "2"},
                              limit={"cpu": "14", "memory": "14Gi", "nvidia.com/gpu": "4"}, namespaces=("video",), **eqt)))
    d.settle()


def _video_job(name: str, at: float):
    """12 CPU of Ray pods (head 4 + 2 workers x 4) plus the 500m submitter: 12.5 CPU of quota."""
    g = ray_gang(head_cpu="4", head_memory="4G", workers=2, worker_cpu="4", worker_memory="4G", submitter=True)
    return workload(f"video/{name}", queue="video", kind="RayJob", gate="suspend", submitted_at=at, gang_=g)


def test_kube_queue_tree_second_rayjob_waits_on_the_video_leaf_max_with_the_exact_reason():
    d = QueueDriver()
    _kube_queue_tree(d)
    first = d.step(submitted(_video_job("rayjob-video-a", 5.0)), 5.0)
    assert names(first) == [("Enqueued", "video/rayjob-video-a"), ("Dequeued", "video/rayjob-video-a")]
    d.step(placed("video/rayjob-video-a", "video"))
    second = d.step(submitted(_video_job("rayjob-video-b", 6.0)), 6.0)
    assert second[1] == BackedOff(
        key="video/rayjob-video-b", queue="video", requeue_at=6.0, attempts=1,  # waits for quota, no timer
        reason=GANG_LINE + "queue video max cpu 14: used 12500m, requested 12500m")
    status = d.core.status()
    assert status["video"]["usage"]["cpu"] == 12500
    assert status["algorithm"]["usage"]["cpu"] == 12500  # rolled up to every ancestor
    assert status["root"]["usage"]["cpu"] == 12500
    assert status["video"]["active"] == ["video/rayjob-video-a"]


def test_an_ancestors_limit_binds_its_whole_subtree():
    d = QueueDriver()
    _kube_queue_tree(d)
    d.send(defined(queue_spec("text", parent="algorithm", limit={"cpu": "70"}, dialect="elasticquotatree")), 1.0)
    d.step(submitted(job("text/big", "text", cpu="70", at=1.0)))
    d.step(submitted(job("video/small", "video", cpu="11", at=2.0)), 2.0)
    out = d.of(BackedOff, "video/small")
    assert out[0].reason == ("1/1 tasks in gang unschedulable: pod group is not ready, 1 Pending, 1 minAvailable; "
                             "queue algorithm max cpu 80: used 70, requested 11")


def test_volcano_capability_reason_names_the_queue_and_the_first_resource_that_does_not_fit():
    d = QueueDriver()
    d.step(defined(queue_spec("kuberay-test-queue", limit={"cpu": "4", "memory": "6Gi"})), 0.0)
    d.step(submitted(workload("default/test-cluster-0", queue="kuberay-test-queue", gang_=ray_gang(), submitted_at=1.0)), 1.0)
    d.step(placed("default/test-cluster-0", "kuberay-test-queue"))
    out = d.step(submitted(workload("default/test-cluster-1", queue="kuberay-test-queue", gang_=ray_gang(),
                                    submitted_at=10.0)), 10.0)
    assert out[1].reason == GANG_LINE + "queue kuberay-test-queue capability cpu 4: used 3, requested 3"
    # it waits for quota in line (no backoff time: only a release in the queue wakes it)
    assert d.core.status()["kuberay-test-queue"]["pending"] == [{"workload": "default/test-cluster-1", "position": 1}]
    assert d.core.status()["kuberay-test-queue"]["backoff"] == []


def test_the_first_offending_resource_is_by_name_when_several_do_not_fit():
    d = QueueDriver()
    d.step(defined(queue_spec("q", limit={"memory": "1Gi", "cpu": "1"})), 0.0)
    d.step(submitted(job("ns/a", "q", gang_=cpu_gang("500m", memory="512Mi"), at=0.0)))
    out = d.step(submitted(job("ns/w", "q", gang_=cpu_gang("1", memory="1Gi"), at=0.0)))
    assert out[1].reason.endswith("queue q capability cpu 1: used 500m, requested 1")


def test_non_preemptible_workload_must_stay_within_guarantee_preemptible_may_go_beyond():
    d = QueueDriver()
    d.step(defined(queue_spec("team", guarantee={"cpu": "4"}, dialect="kai")), 0.0)
    d.step(submitted(job("ns/build-1", "team", cpu="3", priority=100, at=0.0)))
    d.step(submitted(job("ns/build-2", "team", cpu="2", priority=100, at=1.0)), 1.0)
    d.step(submitted(job("ns/train", "team", cpu="2", priority=50, at=2.0)), 2.0)
    assert [x.key for x in d.of(Dequeued)] == ["ns/build-1", "ns/train"]
    assert d.of(BackedOff, "ns/build-2")[0].reason == (
        "1/1 tasks in gang unschedulable: pod group is not ready, 1 Pending, 1 minAvailable; "
        "queue team quota cpu 4: non-preemptible used 3, requested 2")


def test_unlimited_or_undeclared_guarantee_does_not_hold_back_non_preemptible_work():
    d = QueueDriver()
    d.step(defined(unlimited(queue_spec("kai", dialect="kai"), guarantee=("cpu",))), 0.0)
    d.step(defined(queue_spec("plain")))
    d.step(submitted(job("ns/a", "kai", cpu="64", priority=100, at=0.0)))
    d.step(submitted(job("ns/b", "plain", cpu="64", priority=100, at=0.0)))
    d.step(submitted(job("ns/c", "default", cpu="64", priority=125, at=0.0)))
    assert [x.key for x in d.of(Dequeued)] == ["ns/a", "ns/b", "ns/c"]


# --------------------------------------------------------------------------- larger than the queue: it waits
def test_a_gang_larger_than_its_queue_waits_for_the_queue_to_change_not_for_a_release():
    """Volcano (``queue resource quota insufficient``), KAI (``OverLimit``) and Kueue (``ExceedsMaxQuota``)
    keep such a job pending: no holder leaving lets it in, a bigger capability does."""
    d = QueueDriver()
    d.step(defined(queue_spec("q", limit={"cpu": "4"})), 0.0)
    d.step(submitted(job("ns/small", "q", cpu="1", at=0.0)))
    out = d.step(submitted(job("ns/big", "q", cpu="6", at=1.0)), 1.0)
    assert out[1] == BackedOff(key="ns/big", queue="q", requeue_at=1.0, attempts=1,  # parked: no timer
                               reason="1/1 tasks in gang unschedulable: pod group is not ready, 1 Pending, "
                                      "1 minAvailable; can never fit in queue q as it is: capability cpu 4, "
                                      "requested cpu 6")
    assert d.timers == []
    d.step(placed("ns/small", "q"))
    assert names(d.step(deleted("ns/small"), 2.0)) == [("WorkloadWithdrawn", "ns/small")]  # not woken by it
    out = d.step(defined(queue_spec("q", limit={"cpu": "6"})), 3.0)
    assert names(out) == [("Dequeued", "ns/big")]


def test_a_gang_larger_than_its_queue_is_not_woken_by_a_lower_priority_it_could_never_preempt_its_way_past():
    d = QueueDriver()
    d.step(defined(queue_spec("q", limit={"cpu": "4"})), 0.0)
    d.step(submitted(job("ns/big", "q", cpu="6", priority=100, at=0.0)))
    d.step(submitted(job("ns/low", "q", cpu="1", priority=1, at=1.0)), 1.0)
    d.step(placed("ns/low", "q"), 2.0)
    assert len(d.of(BackedOff, "ns/big")) == 1  # told once, not again for each lower priority admitted


def test_a_gang_larger_than_an_ancestor_names_it_and_asks_no_reclaim():
    d = QueueDriver()
    d.step(defined(queue_spec("dept", limit={"cpu": "4"})), 0.0)
    d.step(defined(queue_spec("a", parent="dept")))
    d.step(defined(queue_spec("b", parent="dept")))
    d.step(capacity(cpu="16"))
    d.step(submitted(job("ns/b1", "b", cpu="4", at=0.0)))
    d.step(placed("ns/b1", "b"))
    out = d.step(submitted(job("ns/a1", "a", cpu="5", at=1.0)), 1.0)
    assert names(out) == [("Enqueued", "ns/a1"), ("BackedOff", "ns/a1")]
    assert out[1].reason.endswith("can never fit in queue dept as it is: capability cpu 4, requested cpu 5")


def test_a_non_preemptible_gang_above_its_kai_quota_waits_with_the_cap_and_goes_when_the_quota_grows():
    """KAI's ``NonPreemptibleOverQuota`` (its e2e "Non preemptible Jobs over quota"): pending, not refused."""
    d = QueueDriver()
    d.step(defined(queue_spec("team", guarantee={"nvidia.com/gpu": "2"}, dialect="kai")), 0.0)
    big = workload("ns/build", queue="team", preemptible=False, submitted_at=0.0,
                   gang_=ray_gang(workers=4, gpu="1"))
    out = d.step(submitted(big))
    assert out[1].reason.endswith("can never fit in queue team as it is: quota nvidia.com/gpu 2 caps "
                                  "non-preemptible workloads, requested nvidia.com/gpu 4 (a preemptible "
                                  "workload may go above the quota)")
    preemptible = d.step(updated(big.model_copy(update={"preemptible": True})), 1.0)
    assert names(preemptible) == [("Dequeued", "ns/build")]


def test_a_gang_too_big_for_its_queue_blocks_a_strict_fifo_queue_as_kueue_does():
    d = QueueDriver(queueing="StrictFIFO")
    d.step(defined(queue_spec("q", limit={"cpu": "4"})), 0.0)
    d.step(submitted(job("ns/big", "q", cpu="6", at=0.0)))
    assert names(d.step(submitted(job("ns/next", "q", cpu="1", at=1.0)), 1.0)) == [("Enqueued", "ns/next")]
    out = d.step(defined(queue_spec("q", limit={"cpu": "8"})), 2.0)
    assert names(out) == [("Dequeued", "ns/big"), ("Dequeued", "ns/next")]


def test_closed_queue_keeps_workloads_waiting_with_a_reason_told_once_until_it_opens():
    d = QueueDriver()
    d.step(defined(queue_spec("q", state="Closed")), 0.0)
    out = d.step(submitted(job("ns/w", "q", at=1.0)), 1.0)
    assert [(x.type, x.reason) for x in out] == [("Enqueued", "queue q is Closed; workloads wait until it is Open")]
    assert d.step(submitted(job("ns/other", at=2.0)), 2.0)[-1].type == "Dequeued"  # a cycle: nothing new for w
    assert len(d.of(Enqueued, "ns/w")) == 1
    out = d.step(defined(queue_spec("q")), 3.0)
    assert [(x.type, x.reason) for x in out] == [("Enqueued", "waiting in queue q"),
                                                 ("Dequeued", "quota reserved in queue q (cpu 1)")]


def test_unknown_queue_waits_until_defined():
    d = QueueDriver()
    out = d.step(submitted(job("ns/w", "nope", at=0.0)), 0.0)
    assert [(x.type, x.reason) for x in out] == [("Enqueued", "queue nope does not exist")]
    out = d.step(defined(queue_spec("nope")), 5.0)
    assert names(out) == [("Enqueued", "ns/w"), ("Dequeued", "ns/w")]


def test_an_unknown_queue_names_the_queues_that_come_close_and_nothing_falls_into_the_default_queue():
    """Kueue's "LocalQueue X doesn't exist", with the likeliest fix: a typo of a queue that exists."""
    d = QueueDriver()
    d.step(defined(queue_spec("team-a")), 0.0)
    d.step(defined(queue_spec("team-b")))
    out = d.step(submitted(job("ns/w", "team_a", at=1.0)), 1.0)
    assert [(x.type, x.reason) for x in out] == [("Enqueued", "queue team_a does not exist; did you mean team-a or team-b?")]
    assert d.core.status()["default"]["active"] == []
    far = d.step(submitted(job("ns/x", "research", at=2.0)), 2.0)
    assert [(x.type, x.reason) for x in far] == [("Enqueued", "queue research does not exist")]
    out = d.step(defined(queue_spec("team_a")), 3.0)
    assert names(out) == [("Enqueued", "ns/w"), ("Dequeued", "ns/w")]


def test_removed_queue_keeps_its_waiting_workloads_with_that_reason_and_lets_holders_finish():
    d = QueueDriver()
    d.step(defined(queue_spec("q", limit={"cpu": "1"})), 0.0)
    d.step(submitted(job("ns/run", "q", cpu="1", at=0.0)))
    d.step(placed("ns/run", "q"))
    d.step(submitted(job("ns/wait", "q", cpu="1", at=1.0)), 1.0)
    out = d.step(removed("q"), 1.5)
    assert [(x.type, x.key, x.reason) for x in out] == [("Enqueued", "ns/wait", "queue q does not exist")]
    assert d.core.status()["q"]["exists"] is False
    out = d.step(deleted("ns/run"), 2.0)
    assert names(out) == [("WorkloadWithdrawn", "ns/run")]
    assert d.core.status()["q"]["active"] == []


def test_a_queue_with_children_takes_no_workloads():
    d = QueueDriver()
    d.step(defined(queue_spec("parent")), 0.0)
    d.step(defined(queue_spec("child", parent="parent")))
    out = d.step(submitted(job("ns/w", "parent", at=1.0)), 1.0)
    assert out[-1].reason == "queue parent is not a leaf queue (children: child); workloads go to leaf queues"
    assert not d.of(Dequeued)


def test_the_implicit_default_queue_is_unlimited_until_defined():
    d = QueueDriver()
    d.step(submitted(job("ns/a", cpu="1000", at=0.0)), 0.0)
    d.step(defined(queue_spec("default", limit={"cpu": "1"})), 1.0)
    d.step(submitted(job("ns/b", cpu="1", at=1.0)), 1.0)
    assert [x.key for x in d.of(Dequeued)] == ["ns/a"]
    assert d.of(BackedOff, "ns/b")[0].reason.endswith("queue default capability cpu 1: used 1000, requested 1")


def test_a_parent_that_would_make_a_cycle_is_rejected_not_raised():
    d = QueueDriver()
    d.step(defined(queue_spec("a")), 0.0)
    d.step(defined(queue_spec("b", parent="a")))
    out = d.send(defined(queue_spec("a", parent="b")))
    assert out == [QueueRejected(name="a", kind="Queue", reason="spec.parent: 'b' would make a cycle (a -> b -> a)")]
    assert d.core.status()["a"]["parent"] is None


def test_a_queue_sum_beyond_64_bits_waits_with_the_bound_named_instead_of_overflowing():
    """Each workload's demand is bounded at the edge (admission); a queue's usage summed over many is
    bounded here, at the leaf and every ancestor, even where no limit is set (the store's BIGINT)."""
    d = QueueDriver()
    d.step(CapacityChanged(total={"cpu": 4 * MAX_MILLI}, nodes=4, released=True), 0.0)  # four huge nodes
    d.step(defined(queue_spec("root")), 0.0)
    d.step(defined(queue_spec("a", parent="root")), 0.0)
    d.step(defined(queue_spec("b", parent="root")), 0.0)
    first = d.step(submitted(job("ns/first", "a", cpu="5e15", at=1.0)), 1.0)
    assert names(first)[-1] == ("Dequeued", "ns/first")
    d.step(placed("ns/first", "a"))
    second = d.step(submitted(job("ns/second", "b", cpu="5e15", at=2.0)), 2.0)
    assert second[1].reason == ("1/1 tasks in gang unschedulable: pod group is not ready, 1 Pending, 1 minAvailable; "
                                "queue root cpu: used 5000000000000000, requested 5000000000000000: together more "
                                "than muster holds (9223372036854775 units, 2**63-1 milli-units)")
    assert d.core.status()["root"]["usage"]["cpu"] == 5 * 10**18 <= MAX_MILLI
    d.step(deleted("ns/first"), 3.0)
    d.settle(10.0)
    assert [e.key for e in d.of(Dequeued)] == ["ns/first", "ns/second"]  # room again once the first is gone


def _cohort_of_two(d: QueueDriver) -> None:
    """A cohort of 4 CPU over leaves ``a`` and ``b``; ``a`` holds all 4 (1 + 3, not preemptible), ``b`` waits:
    ``b/big`` (3 CPU), then ``b/s1`` and ``b/s2`` (1 CPU each), all parked on the cohort's max."""
    d.step(defined(queue_spec("cohort", limit={"cpu": "4"})), 0.0)
    d.step(defined(queue_spec("a", parent="cohort")))
    d.step(defined(queue_spec("b", parent="cohort")))
    for key, cpu in (("a/h1", "1"), ("a/h3", "3")):
        d.step(submitted(job(key, "a", cpu=cpu, preemptible=False)))
        d.step(placed(key, "a"))
    for at, (key, cpu) in enumerate((("b/big", "3"), ("b/s1", "1"), ("b/s2", "1")), start=1):
        d.step(submitted(job(key, "b", cpu=cpu, at=float(at))), float(at))
    assert [x.key for x in d.of(BackedOff)] == ["b/big", "b/s1", "b/s2"]


def test_a_release_of_quota_wakes_the_leafs_head_and_whom_the_freed_quota_holds_not_every_waiter():
    d = QueueDriver()
    _cohort_of_two(d)
    out = d.step(deleted("a/h1"), 10.0)  # 1 CPU back: b/big (the head) tries and fails, b/s1 fits, b/s2 sleeps on
    assert names([x for x in out if isinstance(x, (Dequeued, BackedOff))]) == [("BackedOff", "b/big"), ("Dequeued", "b/s1")]
    out = d.step(deleted("a/h3"), 11.0)  # 3 CPU back: b/big fits them all, so b/s2 is not woken to fail
    assert names([x for x in out if isinstance(x, (Dequeued, BackedOff))]) == [("Dequeued", "b/big")]
    assert len(d.of(BackedOff, "b/s2")) == 1


# --------------------------------------------------------------------------- Volcano: guarantees are reserved
def _reserving_tree(dialect: str = "volcano") -> QueueTree:
    tree = QueueTree("default")
    tree.define(queue_spec("q1", guarantee={"cpu": "1"}, dialect=dialect))
    tree.define(queue_spec("q2", dialect=dialect))
    tree.define(queue_spec("parent", guarantee={"cpu": "4"}, limit={"cpu": "6"}, dialect=dialect))
    tree.define(queue_spec("a", parent="parent", guarantee={"cpu": "3"}, dialect=dialect))
    tree.define(queue_spec("b", parent="parent", dialect=dialect))
    return tree


def test_a_queue_never_grows_into_a_siblings_reserved_guarantee_but_its_owner_may():
    tree = _reserving_tree()
    cluster = {"cpu": 10000}
    usage = {"q2": {"cpu": 4000}}
    # q2 may use 10 - 1 (q1) - 4 (parent) = 5
    assert reserved_block(tree, "q2", {"cpu": 1000}, usage, cluster) is None
    assert reserved_block(tree, "q2", {"cpu": 1500}, usage, cluster) == (
        "q2", "queue q2 cpu: used 4, requested 1500m; the cluster's cpu 10 holds cpu 5 reserved for "
              "the guarantees of queues parent, q1")
    # the owner's own guarantee is added back: q1 may use 10 - 4 = 6
    assert reserved_block(tree, "q1", {"cpu": 6000}, {}, cluster) is None
    assert reserved_block(tree, "q1", {"cpu": 6500}, {}, cluster) is not None
    # nothing reserved on resources the cluster does not name yet, nor on what no guarantee holds
    assert reserved_block(tree, "q2", {"cpu": 9000}, {}, {}) is None
    assert reserved_block(tree, "q2", {"memory": 10**15}, {}, {"memory": 10**12, "cpu": 10000}) is None


def test_the_room_of_a_child_is_its_parents_less_its_siblings_guarantees_leaf_first():
    tree = _reserving_tree()
    cluster = {"cpu": 10000}
    # parent's room: min(limit 6, 10 - 1 - 4 + 4 = 9) = 6; b's: 6 - 3 (a) = 3
    assert reserved_block(tree, "b", {"cpu": 3000}, {}, cluster) is None
    level, reason = reserved_block(tree, "b", {"cpu": 3500}, {}, cluster)
    assert (level, reason) == ("b", "queue b cpu: used 0, requested 3500m; queue parent's cpu 6 holds cpu 3 "
                                    "reserved for queue a's guarantee")
    # a guarantee above its parent's room leaves its owner that guarantee (ExceededPart is never negative)
    assert reserved_block(tree, "a", {"cpu": 6000}, {}, cluster) is None


def test_only_a_dialect_that_reserves_guarantees_holds_them():
    tree = _reserving_tree("kai")
    assert reserved_block(tree, "q2", {"cpu": 9000}, {}, {"cpu": 10000}) is None


def test_a_volcano_workload_waits_out_of_anothers_guarantee_while_the_node_has_room():
    d = QueueDriver()
    d.step(capacity(cpu="2", memory="2Gi"), 0.0)
    d.step(defined(queue_spec("queue1", guarantee={"cpu": "1"})))
    d.step(defined(queue_spec("queue2")))
    out = d.step(submitted(job("ns/big", "queue2", cpu="1500m", at=1.0)), 1.0)
    [wait] = [x for x in out if isinstance(x, BackedOff)]
    assert wait.reason.endswith("queue queue2 cpu: used 0, requested 1500m; the cluster's cpu 2 holds cpu 1 "
                                "reserved for queue queue1's guarantee")
    assert wait.requeue_at > 1.0  # no quota release lifts it, nodes joining may: it backs off, it does not park
    assert names(d.step(submitted(job("ns/small", "queue2", cpu="1", at=2.0)), 2.0))[-1] == ("Dequeued", "ns/small")
