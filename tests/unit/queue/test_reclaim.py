"""Reclaim: only within fair share, only when free capacity does not suffice, from the right victims."""

from __future__ import annotations

import pytest

from services.queue.core import QueueCore
from services.queue.reclaim import CLUSTER, Running, choose_victims, within_guarantee
from services.queue.victims import Victims
from shared.kernel.events import Dequeued, ReclaimRequested
from shared.kernel.policy import Policy
from tests.builders import queue_spec
from tests.builders.queue import QueueDriver, capacity, cpu_gang, defined, job, placed, running, submitted, unlimited

GPU = {"nvidia.com/gpu": "1"}


def _gpu_job(key: str, queue: str, at: float, priority: int = 0, preemptible: bool | None = None):
    return job(key, queue, at=at, priority=priority, preemptible=preemptible, gang_=cpu_gang("1", **GPU))


def _pick(short: dict, *args, **kw):
    """The victims ``choose_victims`` names for a cluster shortage of ``short`` (None: no reclaim)."""
    return choose_victims({CLUSTER: short}, *args, **kw).victims


def _cluster(gpus: int, *queues, **policy) -> QueueDriver:
    d = QueueDriver(Policy(**policy))
    d.step(capacity(cpu="100", memory="1Ti", **{"nvidia.com/gpu": str(gpus)}), 0.0)
    for spec in queues or (queue_spec("a"), queue_spec("b"), queue_spec("c")):
        d.step(defined(spec))
    return d


def _run(d: QueueDriver, queue: str, count: int, start: float = 1.0, priorities: dict | None = None) -> None:
    """``count`` one-GPU jobs ``<queue>1..N`` in ``queue``, started at start, start+1, ..."""
    for i in range(1, count + 1):
        key = f"ns/{queue}{i}"
        at = start + i - 1
        d.step(submitted(_gpu_job(key, queue, at, priority=(priorities or {}).get(i, 0))), at)
        d.step(placed(key, queue))
        d.step(running(key))


def _ask(d: QueueDriver, key: str, queue: str, gpus: int, at: float = 100.0):
    gang = cpu_gang("1", **{"nvidia.com/gpu": str(gpus)})
    return [x for x in d.step(submitted(job(key, queue, at=at, gang_=gang)), at)
            if isinstance(x, (Dequeued, ReclaimRequested))]


def test_a_queue_within_its_share_reclaims_lowest_priority_then_newest_from_the_queue_over_share():
    d = _cluster(8, queue_spec("a"), queue_spec("b"))
    _run(d, "a", 8, priorities={8: 5})  # a8 is newest but has higher priority
    out = _ask(d, "ns/b1", "b", 2)
    assert len(out) == 1 and isinstance(out[0], ReclaimRequested)
    assert out[0].victims == ("ns/a7", "ns/a6")
    assert out[0].reason == ("quota reserved in queue b (cpu 1, nvidia.com/gpu 2); "
                             "reclaiming ns/a7, ns/a6 from queues over their fair share")


def test_the_queue_furthest_above_its_share_gives_first_and_ranks_are_re_evaluated():
    d = _cluster(13)
    _run(d, "a", 7)
    _run(d, "b", 6, start=20.0)
    # shares: c 3, a 5, b 5 -> a 7/5 = 1.4, b 6/5 = 1.2; after a7 both 1.2: tied, the newer of their next
    # victims goes (b6 started at 25, a6 at 6), then a (6/5) is furthest above again
    out = _ask(d, "ns/c1", "c", 3)
    assert out[0].victims == ("ns/a7", "ns/b6", "ns/a6")


def test_queues_tied_on_share_give_their_lowest_priority_then_newest_not_by_name():
    d = _cluster(8)
    _run(d, "a", 4, start=20.0)                    # a1..a4 started at 20..23, priority 0
    _run(d, "b", 4, priorities={1: 0, 2: 5, 3: 5, 4: 5})  # b1 (priority 0, started 1) is the only low one
    # shares a 3, b 3, c 2: a and b tie at 4/3. Lowest priority first: a4 (started 23) before b1 (started 1)
    assert _ask(d, "ns/c1", "c", 1)[0].victims == ("ns/a4",)
    d = _cluster(8)
    _run(d, "a", 4, start=20.0, priorities={1: 5, 2: 5, 3: 5, 4: 5})
    _run(d, "b", 4, priorities={1: 0, 2: 5, 3: 5, 4: 5})
    assert _ask(d, "ns/c1", "c", 1)[0].victims == ("ns/b1",)  # b1's priority is the lowest, though b is older


def test_a_volcano_requester_takes_from_the_lowest_priority_queue_before_the_one_furthest_above_its_share():
    gpu = "nvidia.com/gpu"
    low = Running(key="ns/low1", queue="low", priority=0, preemptible=True, started_at=10.0, min_runtime=0.0,
                  demand={gpu: 1000})
    high = Running(key="ns/high1", queue="high", priority=0, preemptible=True, started_at=10.0, min_runtime=0.0,
                   demand={gpu: 1000})
    queues = {"low": queue_spec("low", priority=5), "high": queue_spec("high", priority=10)}
    usage = {"low": {gpu: 2000}, "high": {gpu: 3000}}
    shares = {"low": {gpu: 1500}, "high": {gpu: 1000}}  # high is further above its share (3 against 1.33)
    kw = dict(running=[low, high], queues=queues, usage=usage, shares=shares, requester="r", now=100.0)
    assert _pick({gpu: 1000}, **kw) == ("ns/high1",)
    assert _pick({gpu: 1000}, **kw, by_queue_priority=True) == ("ns/low1",)
    # share still decides between queues of one priority
    even = {"low": queue_spec("low", priority=10), "high": queue_spec("high", priority=10)}
    assert _pick({gpu: 1000}, **{**kw, "queues": even}, by_queue_priority=True) == ("ns/high1",)


def test_the_volcano_dialect_orders_victim_queues_by_priority_and_the_others_by_share():
    gpu = "nvidia.com/gpu"

    def ask(dialect: str):
        d = _cluster(4, queue_spec("a", priority=5, dialect=dialect, deserved={gpu: 1500}),
                     queue_spec("b", priority=10, dialect=dialect, deserved={gpu: 1500}),
                     queue_spec("c", priority=1, dialect=dialect, deserved={gpu: 1000}))
        _run(d, "a", 2)              # a1, a2 started at 1, 2
        _run(d, "b", 2, start=3.0)   # b1, b2 started at 3, 4: a and b tie at 2 against a share of 1.5
        return _ask(d, "ns/c1", "c", 1)[0].victims
    assert ask("volcano") == ("ns/a2",)  # a's priority 5 is below b's 10
    assert ask("kai") == ("ns/b2",)      # tied on share: the newest


def test_never_one_that_would_bring_its_queue_below_guarantee():
    big = Running(key="ns/a-big", queue="a", priority=0, preemptible=True, started_at=20.0, min_runtime=0.0,
                  demand={"nvidia.com/gpu": 2000})
    small = Running(key="ns/a-small", queue="a", priority=0, preemptible=True, started_at=10.0, min_runtime=0.0,
                    demand={"nvidia.com/gpu": 1000})
    kw = dict(running=[big, small], usage={"a": {"nvidia.com/gpu": 5000}},
              shares={"a": {"nvidia.com/gpu": 4000}}, requester="c", now=100.0)
    # newest first would be a-big, but 5 - 2 < guarantee 4: the older a-small (5 - 1 = 4) goes
    guarded = {"a": queue_spec("a", guarantee={"nvidia.com/gpu": "4"})}
    assert _pick({"nvidia.com/gpu": 1000}, queues=guarded, **kw) == ("ns/a-small",)
    assert _pick({"nvidia.com/gpu": 1000}, queues={"a": queue_spec("a")}, **kw) == ("ns/a-big",)
    # needing 2 cannot be reached without going below the guarantee: no reclaim at all
    assert _pick({"nvidia.com/gpu": 2000}, queues=guarded, **kw) is None


def test_volcano_deserved_lends_above_it_and_the_guarantee_stays_the_floor():
    """Capacity plugin: a queue above its deserved gives (starved reclaim), within it keeps; the victim's
    queue still never goes below its guarantee."""
    gpu = "nvidia.com/gpu"
    old = Running(key="ns/a1", queue="a", priority=0, preemptible=True, started_at=10.0, min_runtime=0.0,
                  demand={gpu: 2000})
    kw = dict(running=[old], usage={"a": {gpu: 6000}}, shares={"a": {gpu: 6000}}, requester="c", now=100.0,
              starved=True)
    assert _pick({gpu: 2000}, queues={"a": queue_spec("a", deserved={gpu: 4000})}, **kw) == ("ns/a1",)
    assert _pick({gpu: 2000}, queues={"a": queue_spec("a", deserved={gpu: 6000})}, **kw) is None
    floor = queue_spec("a", guarantee={gpu: "5"}, deserved={gpu: 4000})
    assert _pick({gpu: 2000}, queues={"a": floor}, **kw) is None


def test_a_volcano_queue_within_its_deserved_is_starved():
    gpu = "nvidia.com/gpu"
    spec = queue_spec("c", deserved={gpu: 4000})
    assert within_guarantee({gpu: 1000}, {gpu: 3000}, spec, [gpu])
    assert not within_guarantee({gpu: 2000}, {gpu: 3000}, spec, [gpu])


def test_a_queue_that_is_not_reclaimable_keeps_its_workloads():
    for reclaimable, victim in ((True, "ns/a7"), (False, "ns/b7")):
        d = _cluster(14, queue_spec("a", reclaimable=reclaimable), queue_spec("b"), queue_spec("c"))
        _run(d, "b", 7)
        _run(d, "a", 7, start=20.0)
        out = _ask(d, "ns/c1", "c", 1)  # shares c 1, a 6.5, b 6.5: both over, a's a7 is the newest
        assert out[0].victims == (victim,)


def test_non_preemptible_and_not_yet_running_workloads_are_never_victims():
    d = _cluster(4, queue_spec("a"), queue_spec("b"))
    d.step(submitted(_gpu_job("ns/keep", "a", 1.0, priority=100)), 1.0)
    d.step(placed("ns/keep", "a"))
    d.step(running("ns/keep"))
    d.step(submitted(_gpu_job("ns/placed-only", "a", 2.0)), 2.0)
    d.step(placed("ns/placed-only", "a"))
    _run(d, "a", 2, start=3.0)
    out = _ask(d, "ns/b1", "b", 1)
    assert out[0].victims == ("ns/a2",)


def test_min_runtime_protects_young_workloads_and_without_enough_victims_there_is_no_reclaim():
    d = _cluster(8, queue_spec("a"), queue_spec("b"), min_runtime_seconds=60)
    _run(d, "a", 8)  # started at 1..8
    out = _ask(d, "ns/b1", "b", 2, at=67.5)  # a8 (started at 8) has run 59.5s: newest eligible first
    assert out[0].victims == ("ns/a7", "ns/a6")
    d2 = _cluster(8, queue_spec("a", min_runtime=300.0), queue_spec("b"))
    _run(d2, "a", 8)
    out2 = _ask(d2, "ns/b1", "b", 2, at=100.0)
    assert isinstance(out2[0], Dequeued)  # nobody may be reclaimed: dequeue and let placement decide


def test_no_reclaim_when_free_capacity_suffices_or_beyond_the_requesting_queues_share():
    d = _cluster(10, queue_spec("a"), queue_spec("b"))
    _run(d, "a", 7)
    for i in (1, 2, 3):
        d.send(submitted(job(f"ns/b{i}", "b", at=100.0, gang_=cpu_gang("1", **{"nvidia.com/gpu": "2"}))), 100.0)
    out = [x for x in d.settle() if isinstance(x, (Dequeued, ReclaimRequested))]
    # shares a 5 / b 5. b1: 3 GPUs free -> Dequeued. b2: 1 free, short 1, b 2+2 <= 5 -> reclaim a7.
    # b3: b 4+2 > 5 -> not entitled to reclaim -> Dequeued (placement decides).
    assert [(x.type, x.key, getattr(x, "victims", ())) for x in out] == [
        ("Dequeued", "ns/b1", ()), ("ReclaimRequested", "ns/b2", ("ns/a7",)), ("Dequeued", "ns/b3", ())]


def test_a_victim_is_promised_once_and_counts_as_freed_within_the_cycle():
    d = _cluster(10, queue_spec("a"), queue_spec("b"))
    _run(d, "a", 10)
    d.send(submitted(_gpu_job("ns/b1", "b", 100.0)), 100.0)
    d.send(submitted(_gpu_job("ns/b2", "b", 100.0)))
    out = [x for x in d.settle() if isinstance(x, ReclaimRequested)]
    assert [(x.key, x.victims) for x in out] == [("ns/b1", ("ns/a10",)), ("ns/b2", ("ns/a9",))]


def test_a_queue_at_or_below_its_share_gives_nothing():
    w = Running(key="ns/a1", queue="a", priority=0, preemptible=True, started_at=0.0, min_runtime=0.0,
                demand={"nvidia.com/gpu": 1000})
    kw = dict(running=[w], queues={"a": queue_spec("a")}, requester="b", now=100.0)
    at_share = dict(usage={"a": {"nvidia.com/gpu": 4000}}, shares={"a": {"nvidia.com/gpu": 4000}})
    above = dict(usage={"a": {"nvidia.com/gpu": 4001}}, shares={"a": {"nvidia.com/gpu": 4000}})
    assert _pick({"nvidia.com/gpu": 1000}, **at_share, **kw) is None
    assert _pick({"nvidia.com/gpu": 1000}, **above, **kw) == ("ns/a1",)


def test_started_at_the_same_instant_the_last_admitted_is_the_newest():
    d = _cluster(4, queue_spec("a"), queue_spec("b"))
    for i in (1, 2, 3, 4):
        d.send(submitted(_gpu_job(f"ns/a{i}", "a", 1.0)), 1.0)
    d.settle()
    for i in (1, 2, 3, 4):
        d.step(placed(f"ns/a{i}", "a"))
    for i in (1, 2, 3, 4):
        d.step(running(f"ns/a{i}"), 3.0)
    out = _ask(d, "ns/b1", "b", 2)
    assert out[0].victims == ("ns/a4", "ns/a3")


def test_the_guarantee_floor_counts_on_reclaimed_resources_only_and_unlimited_protects_fully():
    w = Running(key="ns/a1", queue="a", priority=0, preemptible=True, started_at=0.0, min_runtime=0.0,
                demand={"cpu": 4000, "memory": 8000})
    team = unlimited(queue_spec("a", guarantee={"cpu": "4"}, dialect="volcano"), guarantee=("memory",))
    kw = dict(running=[w], queues={"a": team}, requester="b", now=100.0,
              usage={"a": {"cpu": 16000, "memory": 32000}}, shares={"a": {"cpu": 8000, "memory": 32000}})
    assert _pick({"cpu": 4000}, **kw) == ("ns/a1",)  # 16 - 4 >= 4; memory is not contested
    assert _pick({"memory": 8000}, **kw) is None  # memory guarantee is UNLIMITED


def test_a_victim_the_others_cover_for_is_not_evicted():
    """Greedy order takes a small victim from the queue furthest above its share first; when a later,
    larger one covers the shortage alone, the small one stays (it would be re-admitted at once)."""
    def r(key: str, queue: str, cpu: int, started: float) -> Running:
        return Running(key=key, queue=queue, priority=0, preemptible=True, started_at=started, min_runtime=0.0,
                       demand={"cpu": cpu})
    running_ = [r("k1", "keep", 3000, 1.0), r("k2", "keep", 2000, 2.0), r("k3", "keep", 2000, 3.0),
                r("g1", "give", 2000, 1.0), r("g2", "give", 3000, 2.0)]
    queues = {"keep": queue_spec("keep"), "give": queue_spec("give")}
    usage = {"keep": {"cpu": 7000}, "give": {"cpu": 5000}}
    shares = {"keep": {"cpu": 4500}, "give": {"cpu": 4500}, "fresh": {"cpu": 3000}}
    # keep (7/4.5) gives k3 first; then give and keep tie at 5/4.5, and of their next victims (g2, k2: equal
    # priority and start) g2 goes by key; g2 alone covers 3
    assert _pick({"cpu": 3000}, running_, queues, usage, shares, "fresh", 100.0) == ("g2",)
    # when the first victim is needed too, both stay
    assert _pick({"cpu": 4000}, running_, queues, usage, shares, "fresh", 100.0) == ("k3", "g2")


def test_a_reclaim_blocked_by_minimum_runtime_is_retried_when_the_victims_ripen():
    """KAI's reclaimMinRuntime: the requester is told why and tried again when the youngest needed
    victim is old enough, not only when its backoff expires (up to a minute later)."""
    from tests.builders.queue import failed

    d = _cluster(8, queue_spec("a", min_runtime=120.0), queue_spec("b"), backoff_max_seconds=60)
    _run(d, "a", 8)  # started at 1..8
    out = _ask(d, "ns/b1", "b", 2, at=30.0)
    assert isinstance(out[0], Dequeued)  # nobody may be reclaimed yet: placement decides
    assert 128.0 in d.timers  # both victims needed (a8, a7) are old enough at 128
    backed = [x for x in d.step(failed("ns/b1", "b", "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."))
              if x.type == "BackedOff"]
    assert backed[0].reason == ("0/1 nodes are available: 1 Insufficient nvidia.com/gpu. Reclaiming ns/a8, ns/a7 waits "
                                "for the minimum runtime of queue a (until 128s).")
    for at in (31.0, 33.0, 37.0, 45.0, 61.0, 93.0):  # backoff retries: each fails again
        for x in d.settle(at):
            if isinstance(x, Dequeued):
                d.step(failed("ns/b1", "b"))
    out = [x for x in d.settle(128.0) if isinstance(x, ReclaimRequested)]
    assert [(x.key, x.victims) for x in out] == [("ns/b1", ("ns/a8", "ns/a7"))]


def test_no_minimum_runtime_note_when_age_is_not_what_blocks_reclaim():
    d = _cluster(8, queue_spec("a", min_runtime=120.0), queue_spec("b"))
    _run(d, "a", 8)
    out = _ask(d, "ns/b1", "b", 6, at=30.0)  # beyond b's share (4): not entitled to reclaim at all
    assert isinstance(out[0], Dequeued)
    assert d.core._workloads["ns/b1"].reclaim_note == ("Reclaim refused: queue b would go over its fair share "
                                                       "nvidia.com/gpu 4 (used 0, requested 6).")
    assert not any(t > 100.0 for t in d.timers)  # no wake-up for victims that would not be taken anyway


class _Viewing(Victims):
    """The queue core's victim choices, noting which queues' running workloads reclaim viewed."""

    def __init__(self, core: QueueCore) -> None:
        super().__init__(core)
        self.viewed: set[str] = set()

    def _candidates(self, snap, names):
        self.viewed.update(names)
        return super()._candidates(snap, names)


class _ViewingAll(_Viewing):
    """Reclaim viewing every other queue's running workloads, as it did before the views were gated."""

    def _giving_queues(self, requester, names, snap, contested, starved):
        return [name for name in names if name != requester]


@pytest.mark.parametrize("a_reclaimable", [True, False])
def test_reclaim_views_only_queues_that_may_give_and_chooses_as_if_it_viewed_every_queue(a_reclaimable):
    """Shares a 6, b 4, c 1, d 2 GPUs: a is above its share, b at it but above its guarantee (d, within
    its own guarantee, is starved, so b gives too), c at both its share and its guarantee: it never gives,
    so its running workloads need no view; the choice, refusals included, is the one over every queue."""
    gpu = "nvidia.com/gpu"
    outs = []
    for viewing in (_Viewing, _ViewingAll):
        d = QueueDriver(Policy())
        d.core = QueueCore(d.policy)
        d.core.victims = viewing(d.core)
        d.step(capacity(cpu="100", memory="1Ti", **{gpu: "13"}), 0.0)
        for spec in (queue_spec("a", reclaimable=a_reclaimable), queue_spec("b", guarantee={gpu: "2"}),
                     queue_spec("c", guarantee={gpu: "1"}), queue_spec("d", guarantee={gpu: "4"})):
            d.step(defined(spec))
        _run(d, "a", 8)
        _run(d, "b", 4, start=20.0)
        _run(d, "c", 1, start=30.0)
        outs.append((_ask(d, "ns/d1", "d", 2), d.core.victims.viewed))
    (gated, viewed), (full, every) = outs
    assert gated == full
    assert gated[0].victims == (("ns/a8", "ns/a7") if a_reclaimable else ("ns/b4", "ns/b3"))
    assert viewed == {"a", "b"} and every == {"a", "b", "c"}


# --------------------------------------------------------------------------- the offer placement may combine
def test_the_offer_names_the_chosen_victims_first_then_what_the_same_rules_allow():
    """a runs 6 of a fair share of 4; the cluster lacks 2: a's newest (a-new) is chosen, and the offer
    adds a-mid and a-old, which queue a could give instead (placement judges which suits the nodes)."""
    gpu = "nvidia.com/gpu"
    runs = [Running(key=f"ns/a-{n}", queue="a", priority=0, preemptible=True, started_at=t, min_runtime=0.0,
                    demand={gpu: 2000}) for n, t in (("old", 1.0), ("mid", 2.0), ("new", 3.0))]
    choice = choose_victims({CLUSTER: {gpu: 2000}}, runs, {"a": queue_spec("a")}, {"a": {gpu: 6000}},
                            {"a": {gpu: 4000}}, "b", 100.0)
    assert choice.victims == ("ns/a-new",)
    assert choice.offer is not None
    assert [v.key for v in choice.offer.victims] == ["ns/a-new", "ns/a-mid", "ns/a-old"]
    (giving,) = choice.offer.queues
    assert (giving.name, giving.usage, giving.above[gpu]) == ("a", {gpu: 6000}, 4000)
    assert choice.offer.needs == ()  # only the cluster lacked room: the nodes judge it


def test_a_queue_at_its_share_offers_nothing_and_a_level_limit_is_a_need_of_the_offer():
    gpu = "nvidia.com/gpu"
    a = Running(key="ns/a1", queue="a", priority=0, preemptible=True, started_at=1.0, min_runtime=0.0,
                demand={gpu: 2000})
    c = Running(key="ns/c1", queue="c", priority=0, preemptible=True, started_at=1.0, min_runtime=0.0,
                demand={gpu: 2000})
    choice = choose_victims({"p": {gpu: 2000}}, [a, c], {"a": queue_spec("a"), "c": queue_spec("c")},
                            {"a": {gpu: 4000}, "c": {gpu: 2000}}, {"a": {gpu: 2000}, "c": {gpu: 2000}}, "b", 100.0,
                            scopes={"a": frozenset({"a", "p"}), "c": frozenset({"c", "p"})})
    assert choice.victims == ("ns/a1",)
    assert choice.offer is not None
    assert [v.key for v in choice.offer.victims] == ["ns/a1"]  # c sits at its share: it gives nothing
    assert [(n.level, n.resource, n.amount) for n in choice.offer.needs] == [("p", gpu, 2000)]
