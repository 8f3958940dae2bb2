"""Elastic pods in the queue: who may grow, and which elastic pods go first when others need the room.

A workload's gang is its minimum; the pods its owner wants beyond it (``PodSet.elastic``, an edit
asking for more pods of an admitted pod set) are elastic. Rules, in the order they apply:

- Who may grow: a workload holding quota as admitted or running (placement has its slots), not
  named as anyone's victim, for its admitted pod sets, up to what the owner wants now
  (``shared.kernel.model.elastic_wanted``), and not while placement found no node for its last grant
  (until capacity is released).
- When: after the cycle's gangs, so a waiting gang's minimum goes before anyone's elastic pods
  (Volcano's gang plugin orders jobs that are not ready first; KAI's elastic plugin orders jobs
  below their minimum first).
- How: one pod at a time, queues served as for gangs (queue priority, then the lowest dominant
  share), within a queue its holders in queue order, round robin (KAI orders a job exactly at its
  minimum before one above it); each pod must pass the quota check of its queue and every
  ancestor and fit the cluster's free capacity. Granted pods are charged from then on, one pod's
  demand each, until placement releases them.
- As victims: elastic pods are taken before any whole gang, by reclaim and by in-queue preemption
  alike (Volcano's gang plugin lets only tasks beyond minAvailable be preempted or reclaimed; KAI
  evicts one task of a subgroup above its minimum before a whole job). The eligibility rules of
  the caller apply to each pod as to its workload, but a pod set pinned alone keeps its pods while
  the others' go (``WorkloadSpec.elastic_preemptible``, Volcano's per-pod ``volcano.sh/preemptable``);
  the order is the in-queue victim order of their workloads (``shared.kernel.victims.victim_rank``), each one's later pod sets first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from services.queue.preemption import Holder
from services.queue.reclaim import Running
from services.queue.workload import Tracked
from shared.kernel.events import ElasticVictim
from shared.kernel.model import elastic_wanted
from shared.kernel.victims import victim_rank

Resources = dict[str, int]


def goal(w: Tracked) -> dict[str, int]:
    """Elastic pods the owner wants per admitted pod set (granted or not); empty unless it holds slots."""
    if w.state not in ("admitted", "running"):
        return {}
    return elastic_wanted(w.spec.gang, (w.latest or w.spec).gang)


def still_wanted(w: Tracked) -> list[tuple[str, int]]:
    """(pod set, pods not granted yet), in gang order."""
    out = []
    for name, total in w.elastic_goal.items():
        missing = total - w.elastic.get(name, 0)
        if missing > 0:
            out.append((name, missing))
    return out


@dataclass(frozen=True)
class ElasticPod:
    """One granted elastic pod as a would-be victim: its workload's facts, one pod's demand."""

    holder: Holder
    queue: str
    pod_set: str

    @property
    def key(self) -> str:
        return self.holder.key

    @property
    def demand(self) -> Resources:
        return self.holder.demand


def elastic_pods(holders: Iterable[Tracked]) -> list[ElasticPod]:
    """Every granted elastic pod of these holders, one entry each, in victim order."""
    pods = []
    for w in holders:
        for index, ps in enumerate(w.spec.gang.pod_sets):
            holder = Holder(key=w.key, priority=w.spec.priority, preemptible=w.spec.elastic_preemptible(ps.name),
                            started_at=w.started_at, admitted_seq=w.reserved_seq, demand=w.pod_demand(ps),
                            promised=bool(w.promised_to))
            for _ in range(w.elastic.get(ps.name, 0)):
                pods.append((index, ElasticPod(holder=holder, queue=w.queue, pod_set=ps.name)))
    pods.sort(key=lambda item: (*victim_rank(item[1].holder.priority, item[1].holder.started_at,
                                             item[1].holder.admitted_seq), item[1].key, -item[0]))
    return [pod for _, pod in pods]


def as_running(pods: list[ElasticPod], min_runtime_of: Callable[[str], float]) -> dict[str, tuple[Running, ElasticPod]]:
    """The pods as reclaim's candidates (``reclaim.choose_victims``), each under a key of its own that
    keeps their victim order among a workload's pods (the holder's key, then the pod's place here)."""
    out: dict[str, tuple[Running, ElasticPod]] = {}
    for i, pod in enumerate(pods):
        h = pod.holder
        key = f"{h.key}\x1f{i:08d}"
        out[key] = (Running(key=key, queue=pod.queue, priority=h.priority, preemptible=h.preemptible,
                            started_at=h.started_at or 0.0, min_runtime=min_runtime_of(pod.queue), demand=h.demand,
                            admitted_seq=h.admitted_seq, promised=h.promised), pod)
    return out


def as_victims(pods: Iterable[ElasticPod]) -> tuple[ElasticVictim, ...]:
    """Chosen pods per (workload, pod set), in the order first chosen."""
    counts: dict[tuple[str, str], int] = {}
    for pod in pods:
        counts[(pod.key, pod.pod_set)] = counts.get((pod.key, pod.pod_set), 0) + 1
    return tuple(ElasticVictim(key=key, pod_set=pod_set, count=n) for (key, pod_set), n in counts.items())
