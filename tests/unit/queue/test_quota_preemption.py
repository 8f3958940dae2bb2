"""In-queue priority preemption when the queue's own limit (or an ancestor's) blocks a higher priority."""

from __future__ import annotations

from shared.kernel.events import BackedOff, Dequeued, Enqueued, ReclaimRequested
from shared.kernel.policy import Policy
from tests.builders import queue_spec
from tests.builders.queue import (
    QueueDriver, capacity, defined, failed, job, placed, preempted, running, submitted,
)


def _queue(limit: str = "4", *more, **policy) -> QueueDriver:
    d = QueueDriver(Policy(**policy))
    d.step(capacity(cpu="32", memory="64Gi"), 0.0)
    for spec in more or (queue_spec("q", dialect="volcano", limit={"cpu": limit}),):
        d.step(defined(spec))
    return d


def _run(d: QueueDriver, key: str, cpu: str, at: float, queue: str = "q", **kw) -> None:
    d.step(submitted(job(key, queue, cpu=cpu, at=at, **kw)), at)
    d.step(placed(key, queue))
    d.step(running(key))


def _ask(d: QueueDriver, key: str, cpu: str, at: float, queue: str = "q", **kw) -> list:
    return [x for x in d.step(submitted(job(key, queue, cpu=cpu, at=at, **kw)), at)
            if isinstance(x, (Dequeued, ReclaimRequested, BackedOff))]


def test_a_higher_priority_preempts_inside_its_queue_when_the_queue_limit_blocks():
    d = _queue("4")
    _run(d, "ns/low", "3", 1.0, priority=10)
    out = _ask(d, "ns/high", "3", 30.0, priority=90)
    assert len(out) == 1 and isinstance(out[0], ReclaimRequested)
    assert out[0].victims == ("ns/low",) and out[0].queue == "q"
    assert out[0].reason == ("quota reserved in queue q (cpu 3); preempting ns/low (priority 10) "
                             "to stay within queue q capability cpu 4: used 3, requested 3")
    status = d.core.status()["q"]
    assert status["active"] == ["ns/low", "ns/high"] and status["usage"] == {"cpu": 6000}
    # placement evicts the victim (reclaim=False: same queue) and places the preemptor
    out = d.step(preempted("ns/low", "ns/high", priority=90), 30.0)
    assert out[0] == Enqueued(key="ns/low", queue="q", reason="preempted by ns/high (priority 90); waiting in queue q")
    assert "preempted by ns/high (priority 90): " in out[-1].reason and isinstance(out[-1], BackedOff)
    d.step(placed("ns/high", "q"))
    assert d.core.status()["q"]["usage"] == {"cpu": 3000}


def test_victims_lowest_priority_then_newest_and_only_as_many_as_the_limit_needs():
    d = _queue("6")
    _run(d, "ns/old", "1", 1.0, priority=10)
    _run(d, "ns/new", "1", 2.0, priority=10)
    _run(d, "ns/mid", "2", 3.0, priority=20)
    _run(d, "ns/keep", "1", 4.0, priority=30)
    # used 5 of 6, asks 3: 2 must go -> the two priority-10 ones, newest first
    out = _ask(d, "ns/high", "3", 10.0, priority=90)
    assert isinstance(out[0], ReclaimRequested) and out[0].victims == ("ns/new", "ns/old")


def test_victims_the_others_already_cover_for_are_dropped():
    d = _queue("6")
    _run(d, "ns/big", "4", 1.0, priority=20)
    _run(d, "ns/small", "1", 2.0, priority=10)
    # used 5 of 6, asks 4: 3 must go; greedy takes small (1) then big (4); big alone suffices
    out = _ask(d, "ns/high", "4", 10.0, priority=90)
    assert isinstance(out[0], ReclaimRequested) and out[0].victims == ("ns/big",)


def test_never_equal_or_higher_priority_non_preemptible_or_too_young_holders():
    cases = [
        dict(priority=90),                     # equal priority
        dict(priority=95),                     # higher priority
        dict(priority=10, preemptible=False),  # non-preemptible
    ]
    for holder in cases:
        d = _queue("4")
        _run(d, "ns/holder", "3", 1.0, **holder)
        out = _ask(d, "ns/high", "3", 30.0, priority=90)
        assert [x.type for x in out] == ["BackedOff"], holder
        assert out[0].reason.endswith("queue q capability cpu 4: used 3, requested 3")
    d = _queue("4", min_runtime_seconds=60)
    _run(d, "ns/young", "3", 1.0, priority=10)
    out = _ask(d, "ns/high", "3", 30.0, priority=90)
    assert [x.type for x in out] == ["BackedOff"]
    assert out[0].reason.endswith("queue q capability cpu 4: used 3, requested 3. Preempting ns/young waits "
                                  "for the minimum runtime of queue q (until 61s).")
    # it goes when the victim comes of age, not when its backoff would expire
    late = [x for x in d.settle(61.0) if isinstance(x, ReclaimRequested)]
    assert [(x.key, x.victims) for x in late] == [("ns/high", ("ns/young",))]


def test_a_victim_that_has_not_started_yet_is_one_only_without_a_minimum_runtime():
    d = _queue("4")
    d.step(submitted(job("ns/low", "q", cpu="3", at=1.0, priority=10)), 1.0)
    d.step(placed("ns/low", "q"))  # admitted, not Running yet
    out = _ask(d, "ns/high", "3", 2.0, priority=90)
    assert isinstance(out[0], ReclaimRequested) and out[0].victims == ("ns/low",)


def test_beyond_its_share_a_queue_takes_nothing_across_an_ancestor_limit_only_its_own_lower_priorities():
    parent = queue_spec("p", dialect="volcano", limit={"cpu": "4"})
    a = queue_spec("a", parent="p", dialect="volcano")
    b = queue_spec("b", parent="p", dialect="volcano")
    d = _queue("4", parent, a, b)
    _run(d, "ns/low-a", "3", 1.0, queue="a", priority=10)
    out = _ask(d, "ns/high-b", "3", 10.0, queue="b", priority=90)  # shares a 2, b 2: b asks 3
    assert [x.type for x in out] == ["BackedOff"]
    assert out[0].reason.endswith("queue p capability cpu 4: used 3, requested 3. Reclaim refused: queue b would "
                                  "go over its fair share cpu 2 (used 0, requested 3).")
    out = _ask(d, "ns/high-a", "3", 20.0, queue="a", priority=90)
    assert isinstance(out[0], ReclaimRequested) and out[0].victims == ("ns/low-a",)


def test_a_set_that_cannot_make_the_limit_fit_is_not_taken():
    d = _queue("6")
    _run(d, "ns/low", "2", 1.0, priority=10)
    _run(d, "ns/peer", "3", 2.0, priority=90)
    out = _ask(d, "ns/high", "4", 10.0, priority=90)  # would need 3 freed; only low (2) may go
    assert [x.type for x in out] == ["BackedOff"]
    assert d.core.status()["q"]["active"] == ["ns/low", "ns/peer"]


def test_placement_refusing_the_preemption_frees_the_victims_for_later():
    d = _queue("4")
    _run(d, "ns/low", "3", 1.0, priority=10)
    _ask(d, "ns/high", "3", 30.0, priority=90)
    out = d.step(failed("ns/high", "q", reason="0/1 nodes are available: 1 Insufficient cpu"), 30.0)
    assert [x.type for x in out] == ["BackedOff"]
    assert d.core.status()["q"]["active"] == ["ns/low"]
    again = [x for x in d.settle(31.0) if isinstance(x, ReclaimRequested)]
    assert [(x.key, x.victims) for x in again] == [("ns/high", ("ns/low",))]


def test_two_preemptors_under_one_parent_each_take_one_victim_of_their_own_in_one_cycle():
    """The department's limit blocks both; each preemptor's victims come from its own leaf, the first
    one's promised victim counts as freed for the second, and neither takes more than it needs."""
    d = _queue("8", queue_spec("dept", dialect="kai", limit={"cpu": "8"}),
               queue_spec("x", parent="dept", dialect="kai"), queue_spec("y", parent="dept", dialect="kai"))
    for key, queue, at in (("ns/x1", "x", 1.0), ("ns/x2", "x", 2.0), ("ns/y1", "y", 3.0), ("ns/y2", "y", 4.0)):
        _run(d, key, "2", at, queue=queue, priority=10)
    d.send(submitted(job("ns/xh", "x", cpu="2", at=30.0, priority=50)), 30.0)
    d.send(submitted(job("ns/yh", "y", cpu="2", at=30.0, priority=50)), 30.0)
    asked = [x for x in d.settle(30.0) if isinstance(x, (Dequeued, ReclaimRequested, BackedOff))]
    assert [(x.type, x.key, x.victims) for x in asked] == [
        ("ReclaimRequested", "ns/xh", ("ns/x2",)), ("ReclaimRequested", "ns/yh", ("ns/y2",))]
