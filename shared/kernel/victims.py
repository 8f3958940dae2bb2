"""The one way muster picks victims, whoever evicts (in-queue preemption in placement or the queue).

Pure and generic: the caller names each candidate's priority, start, admission and key (``victim_order``)
and says when a set suffices (``minimal_victims``; ``parts_then_wholes`` where elastic pods and whole
workloads may both go); ``offer_allows`` says whether a set a reclaim offered keeps the quota rules.
"""

from __future__ import annotations

from typing import Callable, Collection, Hashable, Iterable, Mapping, Sequence, TypeVar

from shared.kernel.events import GivingQueue, OfferedVictim, ReclaimOffer

V = TypeVar("V")
P = TypeVar("P")
W = TypeVar("W")

Rank = tuple[int, bool, float, int]


def victim_rank(priority: int, started_at: float | None, admitted: int) -> Rank:
    """Where a candidate stands in the in-queue victim order, smallest first: the lowest priority, and
    within it whoever loses the least work when evicted — one not started yet (it loses none), then
    the latest start, then the last admitted (``admitted``: the order the service admitted in).

    Placement (for room) and the queue (for quota) both evict within a queue and must name the same
    victims in the same order, so the rule is written once, here; why this order and not a peer's is
    docs/design/queue.md, "One in-queue victim order"."""
    return (priority, started_at is not None, -(started_at or 0.0), -admitted)


def victim_order(candidates: Iterable[V], *, priority: Callable[[V], int], started_at: Callable[[V], float | None],
                 admitted: Callable[[V], int], key: Callable[[V], str]) -> list[V]:
    """``candidates`` in victim order (``victim_rank``), ties broken by ``key`` so the order never
    depends on the order they came in."""
    return sorted(candidates, key=lambda v: (*victim_rank(priority(v), started_at(v), admitted(v)), key(v)))


def minimal_victims(ordered: Sequence[V], fits: Callable[[list[V]], bool]) -> list[V] | None:
    """Greedy add in order until ``fits``, then drop every victim the others already cover (last taken
    first), so no victim can be spared; None when even all of them do not suffice."""
    chosen: list[V] = []
    for candidate in ordered:
        chosen.append(candidate)
        if fits(chosen):
            break
    else:
        return None
    for candidate in reversed(list(chosen)):
        rest = [v for v in chosen if v is not candidate]
        if fits(rest):
            chosen = rest
    return chosen


def parts_then_wholes(parts: Sequence[P], wholes: Sequence[W], *, owner: Callable[[P], Hashable],
                      key: Callable[[W], Hashable],
                      fits: Callable[[list[P], list[W]], bool]) -> tuple[list[P], list[W]] | None:
    """The fewest victims among elastic ``parts`` (pods above a gang's minimum) and ``wholes`` (whole
    workloads), parts first, as KAI's solver accumulates them: each victim job's tasks above its
    minimum, then, later in the queue, the rest of it. So a set may combine one workload's elastic
    pods with another, newer, whole workload where neither alone makes room, instead of evicting the
    first one whole. A part whose ``owner`` is taken whole is not a victim of its own (``fits`` is
    never asked to free it twice). Where parts alone suffice, the answer is what ``minimal_victims``
    gives over the parts; None when even all of them do not suffice."""
    units = [(False, i) for i in range(len(parts))] + [(True, i) for i in range(len(wholes))]

    def split(chosen: list[tuple[bool, int]]) -> tuple[list[P], list[W]]:
        taken = [wholes[i] for whole, i in chosen if whole]
        gone = {key(w) for w in taken}
        return [parts[i] for whole, i in chosen if not whole and owner(parts[i]) not in gone], taken

    chosen = minimal_victims(units, lambda c: fits(*split(c)))
    return None if chosen is None else split(chosen)


def offer_allows(offer: ReclaimOffer, keys: Collection[str]) -> bool:
    """Whether taking the offered victims ``keys`` keeps every quota rule of the reclaim that offered
    them: each queue keeps its floor on what they free, gave the one taken last while still above its
    threshold with the others gone (the order that allows the most; any earlier one was taken higher
    still), and every level gets back what it needs. Taking fewer never breaks a rule."""
    taken = [v for v in offer.victims if v.key in keys]
    queues = {g.name: g for g in offer.queues}
    by_queue: dict[str, list[OfferedVictim]] = {}
    for v in taken:
        by_queue.setdefault(v.queue, []).append(v)
    for name, members in by_queue.items():
        giving = queues.get(name)
        if giving is None:
            return False
        total: dict[str, int] = {}
        for v in members:
            for r, n in v.demand.items():
                total[r] = total.get(r, 0) + n
        for r, floor in giving.floor.items():
            if total.get(r, 0) > 0 and giving.usage.get(r, 0) - total[r] < floor:
                return False
        if not any(_gives(giving, total, last.demand) for last in members):
            return False
    for need in offer.needs:
        freed = sum(v.demand.get(need.resource, 0) for v in taken if need.level in queues[v.queue].levels)
        if freed < need.amount:
            return False
    return True


def _gives(queue: GivingQueue, total: Mapping[str, int], last: Mapping[str, int]) -> bool:
    """``queue`` is still above its threshold once everything but ``last`` of ``total`` is gone."""
    if queue.above is None:
        return True
    return any(queue.usage.get(r, 0) - total.get(r, 0) + last.get(r, 0) > limit for r, limit in queue.above.items())
