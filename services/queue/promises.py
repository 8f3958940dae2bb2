"""Reclaim promises: which holders a reservation named as victims, until placement answers.

A reservation that reclaims or preempts names its victims (``Tracked.victims``, whole, or
``Tracked.elastic_victims``, elastic pods); each victim is ``promised_to`` it, so no other head may
count on evicting it and it may not grow. Until placement answers, the victims still hold their
quota: ``reclaims`` is what the cycle's snapshot credits for them (``Snapshot.credit``). This module
is the one place that sets, reads and drops those promises.
"""

from __future__ import annotations

from typing import Sequence

from services.queue import elastic
from services.queue.snapshot import Freed
from services.queue.workload import Tracked


class Promises:
    """The promises among ``workloads`` (the core's own table, shared)."""

    def __init__(self, workloads: dict[str, Tracked]) -> None:
        self.workloads = workloads
        self.reclaiming: dict[str, None] = {}
        """Reserved workloads whose named victims may still hold quota (until placement answers)."""

    def promise(self, w: Tracked, victims: tuple[str, ...], pods: Sequence[elastic.ElasticPod]) -> None:
        """``w`` names ``victims`` (whole) and ``pods`` (elastic pods): they are promised to it."""
        w.victims, w.elastic_victims = victims, elastic.as_victims(pods)
        for key in dict.fromkeys([*victims, *(unit.key for unit in w.elastic_victims)]):
            self.workloads[key].promised_to = w.key  # no one else may count on evicting it, nor may it grow
        if victims or pods:
            self.reclaiming[w.key] = None

    def release(self, w: Tracked) -> None:
        """Placement answered ``w``'s reclaim (or ``w`` left): its victims are free to be chosen again."""
        for key in [*w.victims, *(unit.key for unit in w.elastic_victims)]:
            victim = self.workloads.get(key)
            if victim is not None and victim.promised_to == w.key:
                victim.promised_to = ""
        w.victims, w.elastic_victims = (), ()
        w.promised_to = ""
        self.reclaiming.pop(w.key, None)

    def gone(self, w: Tracked) -> None:
        """``w`` left: the reclaim it was promised to no longer names it, and its own promises end."""
        reclaimer = self.workloads.get(w.promised_to) if w.promised_to else None
        if reclaimer is not None:
            reclaimer.victims = tuple(v for v in reclaimer.victims if v != w.key)
            reclaimer.elastic_victims = tuple(v for v in reclaimer.elastic_victims if v.key != w.key)
        self.release(w)

    def reclaims(self) -> list[tuple[Tracked, list[Freed]]]:
        """Reservations whose victims may still hold quota, with what those give back (``Snapshot.credit``)."""
        return [(w, self.freed_by(w)) for w in (self.workloads[k] for k in self.reclaiming)]

    def freed_by(self, w: Tracked) -> list[Freed]:
        """What ``w``'s victims that still hold quota and are still promised to it give back once placement
        evicts them: a whole victim's demand, or the named elastic pods it still holds."""
        out: list[Freed] = []
        for key in w.victims:
            v = self.workloads.get(key)
            if v is not None and v.holds_quota and v.promised_to == w.key:
                out.append((v.queue, v.demand))
        for unit in w.elastic_victims:
            v = self.workloads.get(unit.key)
            if v is not None and v.holds_quota and v.promised_to == w.key:
                demand = v.elastic_demand(unit.pod_set, unit.count)
                if demand:
                    out.append((v.queue, demand))
        return out
