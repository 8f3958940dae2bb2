"""Guarantees are delivered: a queue below its guarantee takes back from queues above theirs even when an
ancestor's limit (a root max = the cluster's size) is what blocks it, each dialect by its own victim rule."""

from __future__ import annotations

from services.queue.reclaim import CLUSTER, Running, choose_victims
from shared.kernel.events import BackedOff, Dequeued, GangPlaced, ReclaimRequested
from shared.kernel.policy import Policy
from tests.builders import queue_spec
from tests.builders.queue import (
    QueueDriver, capacity, cpu_gang, defined, failed, job, placed, preempted, running, submitted,
)

GPU = "nvidia.com/gpu"


def _tree(dialect: str, *, child_min: str = "4", gpus: int = 8, **policy) -> QueueDriver:
    """root (max = the cluster's GPUs) over a and b, each guaranteed ``child_min`` GPUs, each max = root."""
    d = QueueDriver(Policy(**policy))
    d.step(capacity(cpu="64", memory="256Gi", **{GPU: str(gpus)}), 0.0)
    d.step(defined(queue_spec("root", dialect=dialect, guarantee={GPU: str(gpus)}, limit={GPU: str(gpus)})))
    for name in ("a", "b"):
        d.step(defined(queue_spec(name, parent="root", dialect=dialect, guarantee={GPU: child_min},
                                  limit={GPU: str(gpus)})))
    return d


def _gpu_job(key: str, queue: str, gpus: int, at: float, priority: int = 0, **kw):
    return job(key, queue, at=at, priority=priority, gang_=cpu_gang("1", **{GPU: str(gpus)}), **kw)


def _run(d: QueueDriver, key: str, queue: str, gpus: int, at: float, **kw) -> None:
    d.step(submitted(_gpu_job(key, queue, gpus, at, **kw)), at)
    d.step(placed(key, queue))
    d.step(running(key))


def _ask(d: QueueDriver, key: str, queue: str, gpus: int, at: float, **kw) -> list:
    return [x for x in d.step(submitted(_gpu_job(key, queue, gpus, at, **kw)), at)
            if isinstance(x, (Dequeued, ReclaimRequested, BackedOff))]


def test_a_queue_below_its_min_takes_it_back_from_a_borrower_when_the_root_max_blocks():
    d = _tree("elasticquotatree")
    _run(d, "ns/a1", "a", 4, 1.0)
    _run(d, "ns/a2", "a", 4, 2.0)               # a borrows b's min: root is at its max (8)
    d.step(capacity(released=False, cpu="64", memory="256Gi", **{GPU: "16"}), 3.0)  # nodes are not the problem
    out = _ask(d, "ns/b1", "b", 4, 10.0)
    assert len(out) == 1 and isinstance(out[0], ReclaimRequested)
    assert out[0].victims == ("ns/a2",)         # the newest of the borrower's jobs
    assert out[0].reason == ("quota reserved in queue b (cpu 1, nvidia.com/gpu 4); reclaiming ns/a2 from queues "
                             "over their fair share to stay within queue root max nvidia.com/gpu 8: used 8, "
                             "requested 4")


def test_reclaim_from_borrowers_comes_before_preempting_the_starved_queues_own_lower_priorities():
    d = _tree("volcano")
    _run(d, "ns/b-low", "b", 2, 1.0, priority=1)
    _run(d, "ns/a1", "a", 2, 2.0)
    _run(d, "ns/a2", "a", 2, 3.0)
    _run(d, "ns/a3", "a", 2, 4.0)               # a holds 6 of 8 (guarantee 4), b 2
    out = _ask(d, "ns/b-high", "b", 2, 10.0, priority=50)
    assert isinstance(out[0], ReclaimRequested) and out[0].victims == ("ns/a3",)


def test_beyond_its_guarantee_the_queue_falls_back_to_its_own_lower_priorities():
    d = _tree("volcano")
    _run(d, "ns/b-low", "b", 4, 1.0, priority=1)
    _run(d, "ns/a1", "a", 4, 2.0)               # both at their guarantee: nobody borrows
    out = _ask(d, "ns/b-high", "b", 4, 10.0, priority=50)
    assert isinstance(out[0], ReclaimRequested) and out[0].victims == ("ns/b-low",)
    assert "preempting ns/b-low (priority 1)" in out[0].reason


def test_volcano_never_reclaims_a_queue_below_its_guarantee_and_says_so():
    d = _tree("volcano")
    _run(d, "ns/a-big", "a", 6, 1.0)            # one gang straddles a's guarantee (4)
    out = _ask(d, "ns/b1", "b", 4, 10.0)
    assert [x.type for x in out] == ["BackedOff"]
    assert out[0].reason.endswith("queue root capability nvidia.com/gpu 8: used 6, requested 4. Reclaim refused: "
                                  "queue a would fall below its guarantee nvidia.com/gpu 4 (used 6, ns/a-big holds 6).")


def test_kai_reclaims_a_whole_job_even_when_its_queue_ends_below_its_quota():
    """KAI's reclaim integration test: a queue holding one 2-GPU job over its quota (1) loses it to a
    starved queue (quota 1) with a 1-GPU job, though it ends at 0 (pkg/scheduler/actions/
    integration_tests/reclaim/reclaim_test.go, "1 train job running for queue0 ... - reclaim")."""
    d = QueueDriver()
    d.step(capacity(cpu="16", memory="64Gi", **{GPU: "2"}), 0.0)
    for name in ("queue0", "queue1"):
        d.step(defined(queue_spec(name, dialect="kai", guarantee={GPU: "1"})))
    _run(d, "ns/running-job0", "queue0", 2, 1.0)
    out = _ask(d, "ns/pending-job0", "queue1", 1, 10.0)
    assert isinstance(out[0], ReclaimRequested) and out[0].victims == ("ns/running-job0",)
    v = QueueDriver()                           # the same with Volcano queues: queue0 keeps its guarantee
    v.step(capacity(cpu="16", memory="64Gi", **{GPU: "2"}), 0.0)
    for name in ("queue0", "queue1"):
        v.step(defined(queue_spec(name, dialect="volcano", guarantee={GPU: "1"})))
    _run(v, "ns/running-job0", "queue0", 2, 1.0)
    out = _ask(v, "ns/pending-job0", "queue1", 1, 10.0)
    assert isinstance(out[0], Dequeued)         # no reclaim: placement decides (and fails: no room)
    assert v.core._workloads["ns/pending-job0"].reclaim_note == (
        "Reclaim refused: queue queue0 would fall below its guarantee nvidia.com/gpu 1 (used 2, "
        "ns/running-job0 holds 2).")


def test_a_starved_queue_takes_from_a_queue_above_its_guarantee_though_not_above_its_fair_share():
    """a is above its guarantee (4) but at its fair share (5); c is above its share but not reclaimable.
    b, below its guarantee, still gets its GPU back from a (ACK: from quotas whose usage exceeds their min)."""
    d = QueueDriver()
    d.step(capacity(cpu="64", memory="256Gi", **{GPU: "8"}), 0.0)
    d.step(defined(queue_spec("root", guarantee={GPU: "8"}, limit={GPU: "8"})))
    d.step(defined(queue_spec("a", parent="root", guarantee={GPU: "4"}, weight=3000)))
    d.step(defined(queue_spec("b", parent="root", guarantee={GPU: "2"})))
    d.step(defined(queue_spec("c", parent="root", reclaimable=False)))
    _run(d, "ns/a1", "a", 4, 1.0)
    _run(d, "ns/a2", "a", 1, 2.0)
    _run(d, "ns/c1", "c", 2, 3.0)
    _run(d, "ns/b1", "b", 1, 4.0)                # the root is full: 5 + 2 + 1
    # shares: floors a 4, b 2, c 0; the spare 2 by weight 3:1 -> a 5 (its demand), c 1
    out = _ask(d, "ns/b2", "b", 1, 10.0)
    assert isinstance(out[0], ReclaimRequested) and out[0].victims == ("ns/a2",)
    assert "from queues over their guarantee" in out[0].reason


def test_two_reclaims_under_one_parent_in_one_instant_evict_no_more_than_each_needs():
    d = _tree("elasticquotatree")
    for i in range(1, 5):
        _run(d, f"ns/a{i}", "a", 2, float(i))   # a holds the whole root max (8) in four 2-GPU jobs
    d.send(submitted(_gpu_job("ns/b1", "b", 2, 10.0)), 10.0)
    d.send(submitted(_gpu_job("ns/b2", "b", 2, 10.0)))
    out = [x for x in d.settle() if isinstance(x, (ReclaimRequested, BackedOff, Dequeued))]
    # b1 frees a4; root counts max(b1, a4), so b2 needs one more victim (a3), not two
    assert [(x.type, x.key, getattr(x, "victims", ())) for x in out] == [
        ("ReclaimRequested", "ns/b1", ("ns/a4",)), ("ReclaimRequested", "ns/b2", ("ns/a3",))]


def test_two_in_queue_preemptions_in_one_instant_evict_no_more_than_each_needs():
    d = QueueDriver()
    d.step(capacity(cpu="32", memory="64Gi"), 0.0)
    d.step(defined(queue_spec("q", limit={"cpu": "4"})))
    for i in range(1, 5):
        d.step(submitted(job(f"ns/low{i}", "q", cpu="1", at=float(i), priority=1)), float(i))
        d.step(placed(f"ns/low{i}", "q"))
        d.step(running(f"ns/low{i}"))
    d.send(submitted(job("ns/hi1", "q", cpu="1", at=10.0, priority=50)), 10.0)
    d.send(submitted(job("ns/hi2", "q", cpu="1", at=10.0, priority=50)))
    out = [x for x in d.settle() if isinstance(x, ReclaimRequested)]
    assert [(x.key, x.victims) for x in out] == [("ns/hi1", ("ns/low4",)), ("ns/hi2", ("ns/low3",))]


def test_a_failed_placement_leaves_the_parent_counting_the_victim_again():
    d = _tree("elasticquotatree")
    _run(d, "ns/a1", "a", 4, 1.0)
    _run(d, "ns/a2", "a", 4, 2.0)
    out = _ask(d, "ns/b1", "b", 4, 10.0)
    assert out[0].victims == ("ns/a2",)
    out = [x for x in d.step(failed("ns/b1", "b"), 10.0) if isinstance(x, BackedOff)]
    assert out and "Insufficient" in out[0].reason
    assert d.core.status()["root"]["usage"][GPU] == 8000  # b1's reservation went back, a2 still holds its 4


def test_the_reclaim_takes_effect_when_placement_answers():
    d = _tree("elasticquotatree")
    _run(d, "ns/a1", "a", 4, 1.0)
    _run(d, "ns/a2", "a", 4, 2.0)
    _ask(d, "ns/b1", "b", 4, 10.0)
    d.step(preempted("ns/a2", "ns/b1", priority=0, reclaim=True), 10.0)
    assert [x.type for x in d.step(placed("ns/b1", "b"), 10.0) if isinstance(x, GangPlaced)] == []
    status = d.core.status()
    assert (status["a"]["usage"][GPU], status["b"]["usage"][GPU], status["root"]["usage"][GPU]) == (4000, 4000, 8000)
    assert status["a"]["pending"] == [{"workload": "ns/a2", "position": 1}] or status["a"]["backoff"]


def test_a_non_preemptible_kai_workload_above_its_quota_cannot_reclaim_its_way_in():
    d = _tree("kai")
    _run(d, "ns/b1", "b", 4, 1.0, preemptible=False)
    _run(d, "ns/a1", "a", 4, 2.0)
    out = _ask(d, "ns/b2", "b", 2, 10.0, preemptible=False)
    assert [x.type for x in out] == ["BackedOff"]
    assert "queue b quota nvidia.com/gpu 4: non-preemptible used 4, requested 2" in out[0].reason


# --------------------------------------------------------------------------- choose_victims, scopes
def _r(key: str, queue: str, gpus: int, started: float, priority: int = 0) -> Running:
    return Running(key=key, queue=queue, priority=priority, preemptible=True, started_at=started, min_runtime=0.0,
                   demand={GPU: gpus * 1000})


def test_only_victims_under_the_blocking_ancestor_give_its_quota_back():
    running = [_r("ns/x1", "x", 4, 1.0), _r("ns/a1", "a", 4, 2.0)]
    queues = {"x": queue_spec("x"), "a": queue_spec("a", parent="p")}
    usage = {"x": {GPU: 4000}, "a": {GPU: 4000}}
    shares = {"x": {GPU: 2000}, "a": {GPU: 2000}}
    scopes = {"x": frozenset({"x"}), "a": frozenset({"a", "p"})}
    kw = dict(running=running, queues=queues, usage=usage, shares=shares, requester="b", now=10.0, scopes=scopes)
    # x is further above its share (2.0 each, x1 older): under p only a1 counts
    assert choose_victims({"p": {GPU: 2000}}, **kw).victims == ("ns/a1",)
    # with a cluster shortage too, one victim under p covers both
    assert choose_victims({"p": {GPU: 2000}, CLUSTER: {GPU: 4000}}, **kw).victims == ("ns/a1",)
    # nothing under the requester's own leaf can be reclaimed from others
    assert choose_victims({"b": {GPU: 2000}}, **kw).victims is None


def test_a_refusal_names_a_queue_above_its_share_that_is_not_reclaimable_or_not_preemptible():
    running = [_r("ns/x1", "x", 4, 1.0)]
    usage, shares = {"x": {GPU: 4000}}, {"x": {GPU: 2000}}
    kw = dict(usage=usage, shares=shares, requester="b", now=10.0)
    kept = choose_victims({CLUSTER: {GPU: 2000}}, running, {"x": queue_spec("x", reclaimable=False)}, **kw)
    assert (kept.victims, kept.refusal) == (None, "queue x is above its share but not reclaimable")
    pinned = [Running(key="ns/x1", queue="x", priority=0, preemptible=False, started_at=1.0, min_runtime=0.0,
                      demand={GPU: 4000})]
    kept = choose_victims({CLUSTER: {GPU: 2000}}, pinned, {"x": queue_spec("x")}, **kw)
    assert kept.refusal == "queue x is above its share but its work is not preemptible"
