"""The queue tree: which queues exist, who their parents are, usage roll-up and quota checks.

Every quota decision the queue core makes goes through ``quota_failure`` here: a workload fits
when, at its leaf and at every ancestor, usage + demand stays within the limit (a parent's limit
binds its whole subtree) and within the signed 64 bits a usage is held in (``quantity.MAX_MILLI``:
each workload's demand is bounded at the edge, a queue's sum over many is bounded here, so the
history's ``BIGINT`` usage columns never overflow) and, for a non-preemptible workload of a queue
whose dialect caps them (KAI), within the guarantee. ``over_limits`` says by how much each level is exceeded (what reclaim
across the tree must free there); ``never_fits`` whether the demand alone breaks a level, which only a change
of the queue can mend; ``reserved_block`` whether it grows into room a sibling's guarantee holds (Volcano).
"""

from __future__ import annotations

from typing import Mapping

from shared.kernel import quantity as q
from shared.kernel.model import QueueSpec, UNLIMITED
from shared.kernel.reasons import close_names, did_you_mean

Resources = dict[str, int]

_IMPLICIT: dict[str, QueueSpec] = {}


def _implicit(name: str) -> QueueSpec:
    """The implicit default queue's spec, made once per name (frozen, so one serves every reader): the
    fair share asks for it on every queue cycle."""
    spec = _IMPLICIT.get(name)
    if spec is None:
        spec = _IMPLICIT[name] = QueueSpec(name=name)
    return spec

class QueueTree:
    """QueueSpecs by name plus the implicit, unlimited default queue (until one is defined)."""

    def __init__(self, default_queue: str) -> None:
        self.default_queue = default_queue
        self._specs: dict[str, QueueSpec] = {}
        self._children: dict[str | None, list[str]] | None = None
        self._missing: dict[str, str] = {}
        """Name of a queue that does not exist -> why its workloads wait, with the names that come close:
        asked for every cycle, worked out once per change of the tree."""

    # ------------------------------------------------------------------ membership
    def define(self, spec: QueueSpec) -> str | None:
        """Add or replace a queue; returns a rejection reason instead when the parent makes a cycle."""
        if spec.parent is not None and spec.parent == spec.name:
            return f"spec.parent: {spec.parent!r} is the queue itself"
        name: str | None = spec.parent if spec.name in self._specs else None  # a new queue makes no cycle
        path: list[str] = []
        seen: set[str] = set()  # beside the path: a 10,000-deep chain is walked in linear time
        while name is not None and name in self._specs and name not in seen:
            if name == spec.name:
                return f"spec.parent: {spec.parent!r} would make a cycle ({' -> '.join([spec.name, *path, name])})"
            path.append(name)
            seen.add(name)
            name = self._specs[name].parent
        self._specs[spec.name] = spec
        self._children = None
        self._missing.clear()
        return None

    def remove(self, name: str) -> bool:
        """Forget a queue; the default queue falls back to its implicit form."""
        if self._specs.pop(name, None) is None:
            return False
        self._children = None
        self._missing.clear()
        return True

    def get(self, name: str) -> QueueSpec | None:
        spec = self._specs.get(name)
        if spec is None and name == self.default_queue:
            return _implicit(name)
        return spec

    def exists(self, name: str) -> bool:
        return name in self._specs or name == self.default_queue

    def names(self) -> list[str]:
        """Every existing queue, implicit default included, sorted."""
        names = list(self._specs)
        if self.default_queue not in self._specs:
            names.append(self.default_queue)
        return sorted(names)

    # ------------------------------------------------------------------ shape
    def parent_of(self, name: str) -> str | None:
        """The effective parent: None when the declared parent is not (or no longer) defined."""
        spec = self.get(name)
        if spec is None or spec.parent is None or not self.exists(spec.parent):
            return None
        return spec.parent

    def children(self, name: str | None) -> list[str]:
        """Child queue names, sorted; ``None`` asks for the top level."""
        if self._children is None:
            table: dict[str | None, list[str]] = {}
            for child in self.names():
                table.setdefault(self.parent_of(child), []).append(child)
            self._children = table
        return self._children.get(name, [])

    def is_leaf(self, name: str) -> bool:
        return not self.children(name)

    def ancestry(self, name: str) -> list[QueueSpec]:
        """The queue itself, then its parent, up to the top (leaf first); safe against cycles."""
        chain: list[QueueSpec] = []
        seen: set[str] = set()
        current: str | None = name
        while current is not None and current not in seen:
            spec = self.get(current)
            if spec is None:
                break
            chain.append(spec)
            seen.add(current)
            current = self.parent_of(current)
        return chain

    def wait_reason(self, name: str) -> str | None:
        """Why a workload of this queue cannot be considered at all (None: the queue takes workloads)."""
        spec = self.get(name)
        if spec is None:
            why = self._missing.get(name)
            if why is None:  # a typo of a queue that exists is the likeliest cause: name those that come close
                why = self._missing[name] = f"queue {name} does not exist{did_you_mean(close_names(name, self.names()))}"
            return why
        if spec.state != "Open":
            return f"queue {name} is {spec.state}; workloads wait until it is Open"
        kids = self.children(name)
        if kids:
            return f"queue {name} is not a leaf queue (children: {', '.join(kids)}); workloads go to leaf queues"
        return None

    # ------------------------------------------------------------------ usage
    def roll_up(self, direct: Mapping[str, Mapping[str, int]]) -> dict[str, Resources]:
        """Usage per queue including every descendant's (``direct`` is what each queue holds itself)."""
        total: dict[str, Resources] = {}
        for name in sorted(direct):
            for spec in self.ancestry(name) or [QueueSpec(name=name)]:
                total[spec.name] = q.add(total.get(spec.name, {}), direct[name])
        return total


def quota_failure(tree: QueueTree, queue: str, demand: Mapping[str, int], usage: Mapping[str, Mapping[str, int]],
                  protected: Mapping[str, Mapping[str, int]], preemptible: bool) -> str | None:
    """The first quota a demand breaks, as a reason line, or None when it fits (``quota_block``)."""
    block = quota_block(tree, queue, demand, usage, protected, preemptible)
    return block[1] if block is not None else None


def quota_block(tree: QueueTree, queue: str, demand: Mapping[str, int], usage: Mapping[str, Mapping[str, int]],
                protected: Mapping[str, Mapping[str, int]], preemptible: bool) -> tuple[str, str] | None:
    """The first quota a demand breaks: (the queue whose limit or cap it is, the reason line), or None.

    Levels leaf first, resources by name: ``queue Q <limit_word> cpu 4: used 3, requested 3``.
    ``usage`` is rolled-up usage of quota holders; ``protected`` the same for non-preemptible
    ones. Where the queue's dialect says so (``guarantee_caps_non_preemptible``, KAI), a
    non-preemptible workload may only use what its queues guarantee (resources a queue names in its
    guarantee), since nobody could take it back later. The queue named is what a workload waiting
    for quota waits on: only usage under it dropping can lift this block.
    """
    wanted = sorted(r for r, v in demand.items() if v > 0)
    for spec in tree.ancestry(queue):
        failure = level_failure(spec, wanted, demand, usage.get(spec.name, {}), protected, preemptible)
        if failure is not None:
            return spec.name, failure
    return None


def level_failure(spec: QueueSpec, wanted: list[str], demand: Mapping[str, int], used: Mapping[str, int],
                  protected: Mapping[str, Mapping[str, int]], preemptible: bool) -> str | None:
    """``quota_block`` at one level (``used``: its rolled-up usage; ``wanted``: the demanded resources, sorted);
    also what a release under that level asks of a workload waiting for quota there (``QuotaWaits``)."""
    for resource in wanted:
        limit = spec.limit_of(resource)
        held = used.get(resource, 0)
        if limit is not None and held + demand[resource] > limit:
            return (f"queue {spec.name} {spec.limit_word} {resource} {q.human(resource, limit)}: "
                    f"used {q.human(resource, held)}, requested {q.human(resource, demand[resource])}")
        if held + demand[resource] > q.MAX_MILLI:
            return (f"queue {spec.name} {resource}: used {q.human(resource, held)}, requested "
                    f"{q.human(resource, demand[resource])}: together more than muster holds "
                    f"({q.MAX_MILLI // 1000} units, 2**63-1 milli-units)")
    return _guarantee_cap(spec, wanted, demand, protected, preemptible)


def reserved_block(tree: QueueTree, queue: str, demand: Mapping[str, int], usage: Mapping[str, Mapping[str, int]],
                   capacity: Mapping[str, int]) -> tuple[str, str] | None:
    """(the level, the reason) when ``demand`` would take ``queue`` or an ancestor into room another queue's
    guarantee holds (``QueueSpec.reserves_guarantee``, Volcano), else None.

    Volcano's capacity plugin gives each queue ``realCapability`` = its parent's (the cluster's at the top)
    less the guarantees of every child of that parent, its own added back (``ExceededPart(parent,
    Σ guarantee) + guarantee``, capped by its capability): a queue never grows into a sibling's guarantee,
    used or not. Only guarantees of queues that reserve them count, and only resources ``capacity`` names
    (before the cluster is known nothing is reserved). Levels leaf first, resources by name, as
    ``quota_block``; the limits themselves are ``quota_block``'s to judge.
    """
    wanted = sorted(r for r, v in demand.items() if v > 0 and r in capacity)
    if not wanted:
        return None
    room: dict[str, int] = {r: capacity[r] for r in wanted}
    failure: tuple[str, str] | None = None
    for spec in reversed(tree.ancestry(queue)):  # top down: each level's room is its parent's less reservations
        parent = tree.parent_of(spec.name)
        siblings = [s for s in (tree.get(n) for n in tree.children(parent) if n != spec.name)
                    if s is not None and s.reserves_guarantee]
        level: str | None = None
        for r in wanted:
            held_for = [(s, s.guarantee_of(r) or 0) for s in siblings]
            held_for = [(s, g) for s, g in held_for if g > 0]
            others = sum(g for _, g in held_for)
            own = (spec.guarantee_of(r) or 0) if spec.reserves_guarantee else 0
            mine = max(0, room[r] - others - own) + own
            used = usage.get(spec.name, {}).get(r, 0)
            if others and level is None and used + demand[r] > mine:
                where = "the cluster's" if parent is None else f"queue {parent}'s"
                word = held_for[0][0].guarantee_word
                owners = (f"queue {held_for[0][0].name}'s {word}" if len(held_for) == 1 else
                          f"the {word}s of queues {', '.join(s.name for s, _ in held_for)}")
                level = (f"queue {spec.name} {r}: used {q.human(r, used)}, requested {q.human(r, demand[r])}; "
                         f"{where} {r} {q.human(r, room[r])} holds {r} {q.human(r, others)} reserved for {owners}")
            limit = spec.limit_of(r)
            room[r] = mine if limit is None else min(limit, mine)
        if level is not None:
            failure = (spec.name, level)  # a deeper level's reason replaces its ancestor's: leaf first
    return failure


def never_fits(tree: QueueTree, queue: str, demand: Mapping[str, int], preemptible: bool) -> tuple[str, str] | None:
    """(the queue, the reason) when ``demand`` alone breaks a limit of ``queue`` or an ancestor, or the guarantee
    cap a non-preemptible workload has there (KAI): nothing that runs or leaves can let it in, only a change
    of the queue can, so it waits for that (``QuotaWaits``), as Volcano, KAI, Kueue and kube-queue keep such a
    job pending rather than refuse it. Levels leaf first, resources by name, as ``quota_block``."""
    wanted = sorted(r for r, v in demand.items() if v > 0)
    for spec in tree.ancestry(queue):
        for resource in wanted:
            limit = spec.limit_of(resource)
            if limit is not None and demand[resource] > limit:
                return spec.name, (f"can never fit in queue {spec.name} as it is: {spec.limit_word} {resource} "
                                   f"{q.human(resource, limit)}, requested {resource} "
                                   f"{q.human(resource, demand[resource])}")
        if preemptible or not spec.guarantee_caps_non_preemptible:
            continue
        for resource in wanted:
            guarantee = spec.guarantee.get(resource)
            if guarantee is not None and guarantee != UNLIMITED and demand[resource] > guarantee:
                return spec.name, (f"can never fit in queue {spec.name} as it is: {spec.guarantee_word} {resource} "
                                   f"{q.human(resource, guarantee)} caps non-preemptible workloads, requested "
                                   f"{resource} {q.human(resource, demand[resource])} (a preemptible workload may go "
                                   f"above the {spec.guarantee_word})")
    return None


def cap_failure(tree: QueueTree, queue: str, demand: Mapping[str, int], protected: Mapping[str, Mapping[str, int]],
                preemptible: bool) -> str | None:
    """The guarantee cap a non-preemptible demand breaks (only its own queue's kind can give that back)."""
    wanted = sorted(r for r, v in demand.items() if v > 0)
    for spec in tree.ancestry(queue):
        capped = _guarantee_cap(spec, wanted, demand, protected, preemptible)
        if capped is not None:
            return capped
    return None


def _guarantee_cap(spec: QueueSpec, wanted: list[str], demand: Mapping[str, int],
                   protected: Mapping[str, Mapping[str, int]], preemptible: bool) -> str | None:
    if preemptible or not spec.guarantee_caps_non_preemptible:
        return None
    held = protected.get(spec.name, {})
    for resource in wanted:
        if resource not in spec.guarantee or spec.guarantee[resource] == UNLIMITED:
            continue
        guarantee = spec.guarantee[resource]
        if held.get(resource, 0) + demand[resource] > guarantee:
            return (f"queue {spec.name} {spec.guarantee_word} {resource} {q.human(resource, guarantee)}: "
                    f"non-preemptible used {q.human(resource, held.get(resource, 0))}, "
                    f"requested {q.human(resource, demand[resource])}")
    return None


def over_limits(tree: QueueTree, queue: str, demand: Mapping[str, int],
                usage: Mapping[str, Mapping[str, int]]) -> dict[str, Resources]:
    """Per level of ``queue``'s chain whose limit ``demand`` breaks: by how much, per resource (leaf first).

    What reclaim must free inside that level's subtree for the demand to pass the limit check.
    """
    out: dict[str, Resources] = {}
    for spec in tree.ancestry(queue):
        used = usage.get(spec.name, {})
        for resource, amount in sorted(demand.items()):
            limit = spec.limit_of(resource)
            if amount > 0 and limit is not None and used.get(resource, 0) + amount > limit:
                out.setdefault(spec.name, {})[resource] = used.get(resource, 0) + amount - limit
    return out
