"""Reclaim: taking back resources from other queues for a queue still within its share.

What must be freed (``needs``): per scope, per resource. Scope ``CLUSTER`` is what the cluster's
free capacity lacks (any victim's nodes help); a queue name is a level of the requester's chain whose
limit the demand breaks (the usual tree whose root max is the cluster's size): only victims in that
level's subtree give its quota back.

Rules, in the order they are applied:
- the requesting queue must stay within its fair share: usage + demand <= share, every resource
  (the caller checks that);
- victims are running, preemptible workloads of *other* leaf queues that are ``reclaimable``,
  have run their minimum runtime, are not already promised to another reclaim and free something a
  scope they belong to needs;
- a queue gives while it is above its fair share (dominant share > 1), or, when the requester stays
  within its own guarantee (``starved``), while it is above its guarantee on a needed resource (where
  a Volcano queue has ``deserved``, that amount stands for the guarantee in both places, as in
  Volcano's capacity plugin: reclaim up to deserved, lend above it; the floor below stays ``guarantee``) (ACK:
  "reclaims resources from other quotas whose actual usage exceeds their minimum"; KAI's
  GuaranteeDeservedQuota strategy). Re-evaluated after every victim taken;
- the queue furthest above its share gives first; queues tied on share, and the victims within a
  queue, go lowest priority first, then newest (started_at desc, then admitted last), then key. Where
  the requester's dialect says so (``QueueSpec.victim_queues_by_priority``, Volcano), the queue of the
  lowest ``priority`` gives before any of a higher one, and share decides only among equals;
- a victim never takes its queue below its guarantee on a resource being reclaimed (an UNLIMITED
  guarantee protects it fully; Volcano's capacity plugin, ElasticQuotaTree ``min``), unless the
  queue's dialect reclaims below it (``QueueSpec.reclaim_below_guarantee``, KAI: a whole job of a
  queue over its share goes even if the queue ends below its quota);
- victims are added until every need is covered; if that cannot be reached, none (and ``refusal``
  says which queue and which rule stood in the way, with the numbers);
- then victims the others already cover for are dropped again (the last taken first), so no
  workload is evicted only to be admitted again in the same cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Iterable, Mapping, NamedTuple

from services.queue.fairshare import DRF_RESOURCES, dominant_share
from shared.kernel import quantity as q
from shared.kernel.events import GivingQueue, LevelNeed, OfferedVictim, ReclaimOffer
from shared.kernel.model import QueueSpec

Resources = dict[str, int]
CLUSTER = ""
"""The scope of what the cluster's free capacity lacks."""


class Running(NamedTuple):
    """What reclaim needs to know about one running workload. A named tuple, not a frozen dataclass:
    a cycle that reclaims views every running workload so (``QueueCore._candidates``), thousands of
    them when the cluster is contended, and a tuple is made far more cheaply than a frozen dataclass,
    which sets its fields one by one through ``object.__setattr__``."""

    key: str
    queue: str
    priority: int
    preemptible: bool
    started_at: float
    min_runtime: float
    demand: Resources
    admitted_seq: int = 0
    """Admission order: breaks started_at ties (newest admitted goes first)."""
    promised: bool = False
    """Already named as a victim of a reclaim that placement has not answered yet."""

    @property
    def order(self) -> tuple[int, float, int, str]:
        """Who goes first: lowest priority, then newest (latest start, admitted last), then key."""
        return (self.priority, -self.started_at, -self.admitted_seq, self.key)


_order = attrgetter("order")


@dataclass(frozen=True)
class Choice:
    victims: tuple[str, ...] | None
    """None: no reclaim."""
    refusal: str = ""
    """Why not, when a queue above its share held work a rule kept from being taken ("" otherwise)."""
    by_guarantee: bool = False
    """Some victim's queue gave while at or below its fair share, being above its guarantee."""
    offer: ReclaimOffer | None = None
    """``victims`` and the others the same rules allow, for placement to combine where ``victims`` free
    room on nodes the gang cannot use."""


def within_share(usage: Mapping[str, int], demand: Mapping[str, int], share: Mapping[str, int]) -> bool:
    """A queue may reclaim only for a workload that keeps it within its fair share."""
    return all(usage.get(r, 0) + v <= share.get(r, 0) for r, v in demand.items() if v > 0)


def within_guarantee(usage: Mapping[str, int], demand: Mapping[str, int], queue: QueueSpec | None,
                     contested: Iterable[str]) -> bool:
    """The demand keeps its queue within its guarantee (or Volcano ``deserved``: ``QueueSpec.entitled_of``)
    on every ``contested`` resource (what reclaim must free): a starved queue asks for what it was
    promised. Resources nobody lacks do not count."""
    if queue is None:
        return False
    for r in contested:
        entitled = queue.entitled_of(r)
        if demand.get(r, 0) > 0 and entitled is not None and usage.get(r, 0) + demand[r] > entitled:
            return False
    return True


def shortage(demand: Mapping[str, int], free: Mapping[str, int]) -> Resources:
    """What the cluster lacks for ``demand`` (positive amounts only)."""
    return {r: v - free.get(r, 0) for r, v in sorted(demand.items()) if v > 0 and v > free.get(r, 0)}


def _eligible(w: Running, requester: str, queue: QueueSpec | None, now: float) -> bool:
    if w.queue == requester or w.promised or not w.preemptible:
        return False
    if queue is not None and not queue.reclaimable:
        return False
    return now - w.started_at >= w.min_runtime


def _floor_kept(usage: Mapping[str, int], demand: Mapping[str, int], queue: QueueSpec | None,
                need: Mapping[str, int]) -> bool:
    """Taking ``demand`` away leaves the queue at or above its guarantee on what is reclaimed.

    Only the resources the reclaimer needs count: what the victim frees besides them is not
    contested, so its owner can have it back at once.
    """
    if queue is None or queue.reclaim_below_guarantee:
        return True
    for r, v in demand.items():
        if v <= 0 or r not in need:
            continue
        guarantee = queue.guarantee_of(r)
        if guarantee is None or usage.get(r, 0) - v < guarantee:
            return False
    return True


def above_guarantee(usage: Mapping[str, int], queue: QueueSpec | None, need: Iterable[str]) -> bool:
    """Above its guarantee, or its Volcano ``deserved`` where it has one, on a needed resource: it lends."""
    if queue is None:
        return False
    for r in need:
        entitled = queue.entitled_of(r)
        if entitled is not None and usage.get(r, 0) > entitled:
            return True
    return False


class _Needs:
    """What is still to be freed, per scope; which scopes a victim's queue belongs to."""

    def __init__(self, needs: Mapping[str, Mapping[str, int]], scopes: Mapping[str, frozenset[str]]) -> None:
        self.left = {s: {r: v for r, v in amounts.items() if v > 0} for s, amounts in needs.items()}
        self.left = {s: a for s, a in self.left.items() if a}
        self.original = {s: dict(a) for s, a in self.left.items()}
        self.scopes = scopes

    def touched(self, queue: str) -> list[str]:
        mine = self.scopes.get(queue, frozenset((queue,)))
        return [s for s in self.left if s == CLUSTER or s in mine]

    def wanted(self, queue: str) -> Resources:
        """Per resource, the most any scope this queue can help still needs."""
        out: Resources = {}
        for s in self.touched(queue):
            for r, v in self.left[s].items():
                out[r] = max(out.get(r, 0), v)
        return out

    def wanted_at_first(self, queue: str) -> Resources:
        """``wanted`` before any victim was taken."""
        mine = self.scopes.get(queue, frozenset((queue,)))
        out: Resources = {}
        for s, amounts in self.original.items():
            if s == CLUSTER or s in mine:
                for r, v in amounts.items():
                    out[r] = max(out.get(r, 0), v)
        return out

    def take(self, victim: Running) -> None:
        for s in self.touched(victim.queue):
            rest = {r: v - victim.demand.get(r, 0) for r, v in self.left[s].items()}
            self.left[s] = {r: v for r, v in rest.items() if v > 0}
        self.left = {s: a for s, a in self.left.items() if a}

    def covered_by(self, victims: list[Running]) -> bool:
        for s, amounts in self.original.items():
            inside = [w for w in victims if s == CLUSTER or s in self.scopes.get(w.queue, frozenset((w.queue,)))]
            if any(sum(w.demand.get(r, 0) for w in inside) < v for r, v in amounts.items()):
                return False
        return True


def choose_victims(needs: Mapping[str, Mapping[str, int]], running: list[Running],
                   queues: Mapping[str, QueueSpec | None], usage: Mapping[str, Mapping[str, int]],
                   shares: Mapping[str, Mapping[str, int]], requester: str, now: float, *,
                   scopes: Mapping[str, frozenset[str]] | None = None, starved: bool = False,
                   by_queue_priority: bool = False) -> Choice:
    """Victims whose release covers every need, furthest-above-share queue first; else why not. With
    them, what placement may take instead where they free room on the wrong nodes (``Choice.offer``).

    ``scopes``: per candidate queue, the names of its chain (which level's quota a victim gives back);
    ``starved``: the requester stays within its guarantee, so queues above theirs give too;
    ``by_queue_priority``: the requester's dialect takes from the lowest-priority queue first
    (``QueueSpec.victim_queues_by_priority``), share deciding only among queues of one priority.
    """
    need = _Needs(needs, scopes or {})
    pool: dict[str, list[Running]] = {}
    for w in sorted([w for w in running if _eligible(w, requester, queues.get(w.queue), now)], key=_order):
        pool.setdefault(w.queue, []).append(w)  # only the eligible are sorted: the same pools, in the same order
    offered = {name: list(members) for name, members in pool.items()}
    left = {name: dict(usage.get(name, {})) for name in pool}
    taken: list[Running] = []
    refusal = ""
    by_guarantee = False
    while need.left:
        best, refusal = _next_victim(pool, left, need, queues, shares, starved, refusal, by_queue_priority)
        if best is None:
            return Choice(None, refusal or _kept_back(running, queues, usage, shares, requester, need, set(pool)))
        by_guarantee = by_guarantee or dominant_share(left[best.queue], shares.get(best.queue, {})) <= 1
        _take(best, pool, left, need)
        taken.append(best)
    chosen = _without_needless(taken, need)
    return Choice(tuple(w.key for w in chosen), by_guarantee=by_guarantee,
                  offer=_offer(need, offered, usage, shares, queues, starved, chosen, by_queue_priority))


MAX_OFFERED = 64
"""How many victims a reclaim offers placement at most: each may cost it a trial placement when the
victims chosen by quota free room on nodes the gang cannot use."""

_UNBOUNDED = 1 << 62


def _next_victim(pool: dict[str, list[Running]], left: dict[str, Resources], need: _Needs,
                 queues: Mapping[str, QueueSpec | None], shares: Mapping[str, Mapping[str, int]], starved: bool,
                 refusal: str, by_queue_priority: bool = False) -> tuple[Running | None, str]:
    """The next victim the rules allow (the queue furthest above its share first — the lowest queue
    priority before that, ``by_queue_priority`` — then the victim order), or None; with the first
    refusal met on the way (a floor that kept a victim)."""
    best: tuple[tuple[int, float, int, float, int, str], Running] | None = None  # (rank, victim)
    for name in sorted(pool):
        wanted = need.wanted(name)
        if not wanted:
            continue
        share = dominant_share(left[name], shares.get(name, {}))
        spec = queues.get(name)
        level = spec.priority if by_queue_priority and spec is not None else 0
        if share <= 1 and not (starved and above_guarantee(left[name], spec, wanted)):
            continue
        for w in pool[name]:
            if not any(w.demand.get(r, 0) > 0 for r in wanted):
                continue
            if _floor_kept(left[name], w.demand, spec, wanted):
                rank = (level, -share, *w.order)
                if best is None or rank < best[0]:
                    best = (rank, w)
                break
            refusal = refusal or _below_floor(spec, name, left[name], w, wanted)
    return (best[1] if best is not None else None), refusal


def _take(victim: Running, pool: dict[str, list[Running]], left: dict[str, Resources], need: _Needs) -> None:
    pool[victim.queue].remove(victim)
    left[victim.queue] = q.sub(left[victim.queue], victim.demand)
    need.take(victim)


def _offer(need: _Needs, pool: Mapping[str, list[Running]], usage: Mapping[str, Mapping[str, int]],
           shares: Mapping[str, Mapping[str, int]], queues: Mapping[str, QueueSpec | None], starved: bool,
           chosen: list[Running], by_queue_priority: bool = False) -> ReclaimOffer:
    """The chosen victims and the others the same rules allow, as placement may combine them (the rules
    above, stated per queue: ``shared.kernel.victims.offer_allows``); the cluster's own shortage is not
    among the needs: placement judges that on the nodes."""
    giving: dict[str, GivingQueue] = {}
    ranked: list[tuple[tuple[int, float], tuple[int, float, int, str], Running]] = []
    for name in sorted(pool):
        wanted = set(need.wanted_at_first(name))
        spec = queues.get(name)
        used = usage.get(name, {})
        above = {r: max(shares.get(name, {}).get(r, 0), 0) for r in DRF_RESOURCES}
        if starved and spec is not None:
            for r in wanted:
                entitled = spec.entitled_of(r)
                if entitled is not None:
                    above[r] = min(above.get(r, entitled), entitled)
        if not wanted or not any(used.get(r, 0) > v for r, v in above.items()):
            continue  # it gives nothing now, so it gives nothing in any set
        floor: Resources = {}
        if spec is not None and not spec.reclaim_below_guarantee:
            floor = {r: _UNBOUNDED if (g := spec.guarantee_of(r)) is None else g for r in sorted(wanted)}
        giving[name] = GivingQueue(name=name, usage=dict(used), above=above, floor=floor,
                                   levels=tuple(sorted(need.scopes.get(name, frozenset((name,))))))
        share = dominant_share(used, shares.get(name, {}))
        level = spec.priority if by_queue_priority and spec is not None else 0
        ranked += [((level, -share), w.order, w) for w in pool[name] if any(w.demand.get(r, 0) > 0 for r in wanted)]
    keys = {w.key for w in chosen}
    others = [w for _, _, w in sorted(ranked, key=lambda x: (x[0], x[1])) if w.key not in keys]
    victims = [*chosen, *others][:max(MAX_OFFERED, len(chosen))]
    needs = tuple(LevelNeed(level=s, resource=r, amount=v) for s, amounts in sorted(need.original.items())
                  if s != CLUSTER for r, v in sorted(amounts.items()))
    return ReclaimOffer(victims=tuple(OfferedVictim(key=w.key, queue=w.queue, demand=dict(w.demand)) for w in victims),
                        queues=tuple(giving[name] for name in dict.fromkeys(w.queue for w in victims) if name in giving),
                        needs=needs)


def _below_floor(spec: QueueSpec | None, name: str, usage: Mapping[str, int], victim: Running,
                 wanted: Mapping[str, int]) -> str:
    """``queue a would fall below its guarantee nvidia.com/gpu 4 (used 6, ns/a1 holds 4)``."""
    word = spec.guarantee_word if spec is not None else "guarantee"
    for r in sorted(wanted):
        v = victim.demand.get(r, 0)
        guarantee = spec.guarantee_of(r) if spec is not None else 0
        if v > 0 and (guarantee is None or usage.get(r, 0) - v < guarantee):
            amount = "unlimited" if guarantee is None else q.human(r, guarantee)
            return (f"queue {name} would fall below its {word} {r} {amount} "
                    f"(used {q.human(r, usage.get(r, 0))}, {victim.key} holds {q.human(r, v)})")
    return ""


def _kept_back(running: list[Running], queues: Mapping[str, QueueSpec | None],
               usage: Mapping[str, Mapping[str, int]], shares: Mapping[str, Mapping[str, int]], requester: str,
               need: _Needs, weighed: set[str]) -> str:
    """A queue above its share whose work that would help is all protected: not reclaimable, or not
    preemptible (``weighed``: queues whose candidates the search already judged)."""
    for name in sorted({w.queue for w in running if w.queue != requester and w.queue not in weighed}):
        wanted = need.wanted(name)
        helpful = [w for w in running if w.queue == name and any(w.demand.get(r, 0) > 0 for r in wanted)]
        if not helpful or dominant_share(usage.get(name, {}), shares.get(name, {})) <= 1:
            continue
        spec = queues.get(name)
        if spec is not None and not spec.reclaimable:
            return f"queue {name} is above its share but not reclaimable"
        if not any(w.preemptible for w in helpful):
            return f"queue {name} is above its share but its work is not preemptible"
    return ""


def _without_needless(taken: list[Running], need: _Needs) -> list[Running]:
    """Drop every victim the others already cover for, the last taken first.

    Greedy order may take a small victim from the queue furthest above its share before a larger
    one that alone covers the shortage; evicting the small one would only see it admitted again
    in the same cycle (its room is not needed), so it stays.
    """
    chosen = list(taken)
    for victim in reversed(taken):
        rest = [w for w in chosen if w is not victim]
        if need.covered_by(rest):
            chosen = rest
    return chosen
