"""shared/kernel/victims.py: the one in-queue victim order, as placement and the queue each read it
from their own records (``services/placement/preemption.py``, ``services/queue/preemption.py``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.placement import preemption as placement
from services.placement.workloads import WorkloadRecord
from services.queue import preemption as queue
from shared.kernel.events import GivingQueue, LevelNeed, OfferedVictim, ReclaimOffer
from shared.kernel.victims import offer_allows, parts_then_wholes
from tests.builders import workload


def placed(key: str, priority: int, admitted: int, started_at: float | None) -> WorkloadRecord:
    """Placement's record of a workload it admitted ``admitted``-th, Running since ``started_at``."""
    return WorkloadRecord(spec=workload(key, queue="team-a", priority=priority), queue="team-a", admitted=True,
                          admitted_seq=admitted, started_at=started_at, running=started_at is not None)


def held(key: str, priority: int, admitted: int, started_at: float | None) -> queue.Holder:
    """The queue's view of the same workload."""
    return queue.Holder(key=key, priority=priority, preemptible=True, started_at=started_at, admitted_seq=admitted,
                        demand={"cpu": 1000})


def both(*rows: tuple[str, int, int, float | None]) -> tuple[list[str], list[str]]:
    """The victim order of ``(key, priority, admission order, started at)`` rows, by placement and by the queue."""
    return ([w.key for w in placement.victim_order([placed(*row) for row in rows])],
            [h.key for h in queue.victim_order([held(*row) for row in rows])])


def test_one_not_started_goes_before_one_that_started_after_it_was_admitted():
    """ns/running was admitted first and started at 5 s; ns/waiting was admitted after it (2 s) and has
    not started. Evicting ns/waiting loses no work, so it goes first, in placement as in the queue
    (placement once took ns/running, whose start is later than ns/waiting's admission)."""
    by_placement, by_queue = both(("ns/running", 10, 1, 5.0), ("ns/waiting", 10, 2, None))
    assert by_placement == by_queue == ["ns/waiting", "ns/running"]


def test_lowest_priority_first_then_latest_start_then_last_admitted_then_key():
    rows = [("ns/high", 20, 1, None), ("ns/old", 10, 2, 1.0), ("ns/new", 10, 3, 9.0), ("ns/same-b", 10, 5, 4.0),
            ("ns/same-a", 10, 4, 4.0), ("ns/idle", 10, 6, None)]
    by_placement, by_queue = both(*rows)
    assert by_placement == by_queue == ["ns/idle", "ns/new", "ns/same-b", "ns/same-a", "ns/old", "ns/high"]


_rows = st.lists(st.tuples(st.integers(0, 2), st.one_of(st.none(), st.integers(0, 5).map(float))), max_size=8)


@given(_rows)
def test_placement_and_the_queue_always_name_victims_in_the_same_order(rows):
    named = [(f"ns/w{i}", priority, i + 1, started) for i, (priority, started) in enumerate(rows)]
    by_placement, by_queue = both(*named)
    assert by_placement == by_queue


# ---------------------------------------------------------------------- parts_then_wholes
SIZES = {"old": 4, "new": 4, "big": 9}
"""What each whole workload frees; each elastic part frees 1 and belongs to ``old``."""


def _pick(need: int, parts: list[str], wholes: list[str]):
    def fits(ps: list[str], ws: list[str]) -> bool:
        return len(ps) + sum(SIZES[w] for w in ws) >= need

    return parts_then_wholes(parts, wholes, owner=lambda p: "old", key=lambda w: w, fits=fits)


def test_parts_alone_when_they_suffice():
    assert _pick(2, ["p1", "p2", "p3"], ["new", "old"]) == (["p1", "p2"], [])


def test_parts_and_a_whole_together_where_neither_alone_suffices():
    assert _pick(6, ["p1", "p2"], ["new", "old"]) == (["p1", "p2"], ["new"])


def test_a_part_of_a_workload_taken_whole_is_not_counted_twice():
    # old whole (4) + new (4) are needed; old's parts are inside old and are no victims of their own
    assert _pick(8, ["p1", "p2"], ["new", "old"]) == ([], ["new", "old"])


def test_none_when_even_everything_does_not_suffice():
    assert _pick(99, ["p1"], ["new", "old"]) is None


# ---------------------------------------------------------------------- offer_allows
def _offer(*, floor: dict | None = None, above: dict | None = None, needs: tuple = ()) -> ReclaimOffer:
    """Queue a uses 6 CPU (thresholds: ``above``, default its share of 4) and offers a1..a3 of 2 CPU each."""
    victims = tuple(OfferedVictim(key=f"ns/a{i}", queue="a", demand={"cpu": 2000}) for i in (1, 2, 3))
    giving = GivingQueue(name="a", usage={"cpu": 6000}, above={"cpu": 4000} if above is None else above,
                         floor=floor or {}, levels=("a", "p"))
    return ReclaimOffer(victims=victims, queues=(giving,), needs=needs)


def test_a_queue_gives_one_victim_while_above_its_share_and_not_two():
    offer = _offer()
    assert offer_allows(offer, ["ns/a1"]) and offer_allows(offer, ["ns/a3"])
    assert not offer_allows(offer, ["ns/a1", "ns/a2"])  # after one it sits at its share of 4
    assert offer_allows(offer, [])


def test_the_floor_keeps_a_guarantee_and_a_level_needs_what_it_lacks():
    assert not offer_allows(_offer(floor={"cpu": 5000}), ["ns/a1"])
    needs = (LevelNeed(level="p", resource="cpu", amount=3000),)
    assert not offer_allows(_offer(above={"cpu": 0}, needs=needs), ["ns/a1"])
    assert offer_allows(_offer(above={"cpu": 0}, needs=needs), ["ns/a1", "ns/a2"])
    assert not offer_allows(_offer(above={"cpu": 0}, needs=(LevelNeed(level="q", resource="cpu", amount=1),)),
                            ["ns/a1"])


def test_the_reclaimers_own_queue_gives_whatever_its_usage():
    offer = _offer().model_copy(update={"queues": (_offer().queues[0].model_copy(update={"above": None}),)})
    assert offer_allows(offer, ["ns/a1", "ns/a2", "ns/a3"])


def test_a_victim_of_a_queue_the_offer_does_not_name_is_never_allowed():
    offer = _offer().model_copy(update={"queues": ()})
    assert not offer_allows(offer, ["ns/a1"])
