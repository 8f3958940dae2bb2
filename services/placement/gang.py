"""Place one gang: every pod of every pod set, or report how many could not be placed and why.

Like Armada's gang scheduler this knows nothing of queues, priorities or workloads' history: it
gets a node table, a statement to write into and a strategy. Order: the head first, then worker
groups in the order the gang lists them, then pods outside the gang (a RayJob's submitter).

An interchangeable gang (a pod group) is satisfied by any of its pods that fit together: when some
of the pods counted first find no node, other members take their places (``substitute``), each
task's own minimum first, as Volcano's allocate goes on with the tasks of other roles while the job
can still reach minAvailable (``JobInfo.NeedContinueAllocating``) and coscheduling permits any
``minMember`` pods that got a node.

One pod set is placed with one vectorised filter pass over all nodes and one score pass over those
that fit; after each pod only the chosen node is re-evaluated (same numpy code on a one-node slice,
so floats and ties match).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from services.placement import interpod, reasons
from services.placement.gpu import GpuCharge
from services.placement.nodes import FRAGMENTATION, Demand, NodeTable
from services.placement.statement import Statement
from shared.kernel import quantity as q
from shared.kernel.model import Gang, PodSet, WorkloadSpec, as_placed


@dataclass
class Placement:
    """One pod's planned node (and GPU devices); reserved in the statement that made it."""

    pod_set: PodSet
    index: int
    node: int
    devices: GpuCharge
    demand: Demand


@dataclass
class GangAttempt:
    """What one try produced: the placements made (in the statement) and, if short, how short and why."""

    gang: Gang
    placements: list[Placement] = field(default_factory=list)
    failed: int = 0
    total: int = 0
    fit_error: str = ""
    """kube-scheduler's histogram for the first pod that did not fit ("" unless explained)."""
    capacity_short: bool = True
    never: str = ""
    """Why no node of the cluster as it is could hold it, even empty ("" unless explained and that is so)."""

    @property
    def ok(self) -> bool:
        return self.failed == 0

    @property
    def reason(self) -> str:
        return reasons.gang_failure(self.gang, self.failed, self.total, self.fit_error, self.never)

    def placed_spec(self, spec: WorkloadSpec) -> WorkloadSpec:
        """``spec`` with the gang as placed (``as_placed``): itself unless other members stood in."""
        gang = as_placed(spec.gang, (p.pod_set.name for p in self.placements))
        return spec if gang is spec.gang else spec.model_copy(update={"gang": gang})


def ordered_pod_sets(gang: Gang) -> list[PodSet]:
    """Head first, workers in the gang's order, then pods outside the gang (the submitter)."""
    def rank(ps: PodSet) -> int:
        if ps.name == "head":
            return 0
        return 2 if ps.name == "submitter" or not ps.in_gang else 1
    return sorted(gang.pod_sets, key=rank)


def pod_demand(table: NodeTable, pod_set: PodSet) -> Demand:
    """What one pod of the set asks of a node, and, once the inter-pod index is on, the mark it shows there."""
    mark = interpod.pod_set_mark(pod_set) if table.marking else None
    return table.demand({**pod_set.resources, q.PODS: 1000}, pod_set.gpu_share, pod_set.gpu_memory, mark,
                        pod_set.host_ports)


def place_pods(table: NodeTable, stmt: Statement, pod_set: PodSet, demand: Demand, count: int,
               strategy: str, first_index: int = 0) -> list[Placement]:
    """Place up to ``count`` identical pods one by one on the best node; stops at the first misfit."""
    n = table.n
    placed: list[Placement] = []
    if count <= 0 or n == 0:
        return placed
    if interpod.active(table, pod_set):
        return _place_constrained(table, stmt, pod_set, demand, count, strategy, first_index)
    scores = table.scores(demand, pod_set, strategy)
    static = table.static_mask(pod_set)
    prefer = table.preference(pod_set)
    while len(placed) < count:
        node = int(scores.argmax())
        if scores[node] == -np.inf:
            break
        devices = table.devices_for(node, demand, strategy)
        if devices is None:  # cannot happen after filtering; never trust it blindly
            scores[node] = -np.inf
            table.touch(node)
            continue
        stmt.charge(node, demand, devices)
        placed.append(Placement(pod_set, first_index + len(placed), node, devices, demand))
        if len(placed) == count:
            break
        if strategy == FRAGMENTATION:
            one = slice(node, node + 1)
            scores[node] = table.score(demand, strategy, one, prefer)[0] if table.feasible(demand, static, one)[0] \
                else -np.inf
        else:
            scores[node] = table.fit_score(demand, static, strategy, node, prefer)
    return placed


def _place_constrained(table: NodeTable, stmt: Statement, pod_set: PodSet, demand: Demand, count: int,
                       strategy: str, first_index: int) -> list[Placement]:
    """``place_pods`` for a pod set that other pods' places constrain (``interpod``): every pod is filtered
    and scored again over all nodes, since one placed pod changes the counts of its whole topology domain.
    The best soft score (preferred terms, ``ScheduleAnyway``) comes first, the strategy's score breaks ties.
    Works on a copy of the kept score vector (rows it charges are recomputed when next asked)."""
    scores = table.scores(demand, pod_set, strategy).copy()
    static = table.static_mask(pod_set)
    placed: list[Placement] = []
    while len(placed) < count:
        fits = np.isfinite(scores)
        verdict = interpod.evaluate(table, pod_set, fits)
        fits &= verdict.ok
        if not fits.any():
            break
        best = verdict.soft[fits].max()
        node = int(np.where(fits & (verdict.soft == best), scores, -np.inf).argmax())
        devices = table.devices_for(node, demand, strategy)
        if devices is None:
            scores[node] = -np.inf
            continue
        stmt.charge(node, demand, devices)
        placed.append(Placement(pod_set, first_index + len(placed), node, devices, demand))
        if strategy == FRAGMENTATION:
            one = slice(node, node + 1)
            scores[node] = table.score(demand, strategy, one)[0] if table.feasible(demand, static, one)[0] else -np.inf
        else:
            scores[node] = table.fit_score(demand, static, strategy, node)
    return placed


def place_gang(table: NodeTable, stmt: Statement, gang: Gang, strategy: str, *, explain: bool) -> GangAttempt:
    """Try every pod into ``stmt``; the caller commits or rolls back.

    ``explain``: keep going after the first misfit to count every pod that cannot be placed and
    keep the node histogram of the first one; without it (preemption trials) stop at once.
    """
    attempt = GangAttempt(total=gang.pod_count, gang=gang)
    for pod_set in ordered_pod_sets(gang):
        demand = pod_demand(table, pod_set)
        placed = place_pods(table, stmt, pod_set, demand, pod_set.count, strategy)
        attempt.placements.extend(placed)
        missing = pod_set.count - len(placed)
        if not missing:
            continue
        if attempt.failed == 0 and explain:
            attempt.fit_error, attempt.capacity_short = reasons.fit_error(
                table, pod_set, demand, table.static_mask(pod_set))
        attempt.failed += missing
        if not explain and not gang.interchangeable:
            return attempt
    if attempt.failed and gang.interchangeable:
        substitute(table, stmt, gang, strategy, attempt)
    if attempt.failed and table.schedulable_count() and not _has_stand_ins(gang):
        # no node at all: the histogram's "0/0" says it; with members that may stand in for the first
        # ones, that these could never fit says nothing sure of the gang
        attempt.never = beyond_cluster(table, gang)
    return attempt


def _has_stand_ins(gang: Gang) -> bool:
    """An interchangeable gang with more members than its minimum: another composition may fit."""
    return gang.interchangeable and any(ps.desired > ps.count for ps in gang.pod_sets)


def beyond_cluster(table: NodeTable, gang: Gang) -> str:
    """Why ``gang`` can never fit the nodes as they are, used by nothing ("" when it might): a pod larger
    than every node it may use, else the gang larger than all nodes together. Only what is sure is said:
    pods of other schedulers and how pods pack are left out, so a gang this says nothing of may still
    never fit. Nodes can join, so it waits all the same (as Volcano and KAI leave such a job pending)."""
    needs: dict[int, int] = {}
    for pod_set in ordered_pod_sets(gang):
        if pod_set.count <= 0:
            continue
        demand = pod_demand(table, pod_set)
        why = reasons.larger_than_nodes(table, pod_set, demand, table.static_mask(pod_set))
        if why:
            return why
        for c, amount in demand.filter:
            needs[c] = needs.get(c, 0) + amount * pod_set.count
    return reasons.larger_than_cluster(table, needs)


def substitute(table: NodeTable, stmt: Statement, gang: Gang, strategy: str, attempt: GangAttempt) -> None:
    """Other members of an interchangeable gang take the places of its first pods that found no node.

    First each task short of its ``minTaskMember`` takes pods of its own pod sets, then any pod set
    fills what the minimum still lacks, pod sets in the gang's order, each up to the pods its owner
    wants; a pod set whose pod does not fit makes way for the next one (Volcano skips a role whose
    task failed its predicates). A stand-in never makes the gang charge more of any resource than
    the composition its queue reserved quota for (``Gang.quota_demand``): the queue's limits hold
    whichever members run. ``attempt.failed`` ends as the pods still missing; the placements made
    stay in ``stmt`` for the caller to commit or roll back.
    """
    members = [ps for ps in ordered_pod_sets(gang) if ps.in_gang]
    placed = {ps.name: 0 for ps in gang.pod_sets}
    budget = gang.quota_demand
    for p in attempt.placements:
        placed[p.pod_set.name] += 1
        budget = q.sub(budget, p.pod_set.pod_demand)

    def take(candidates: list[PodSet], need: int) -> None:
        nonlocal budget
        for ps in candidates:
            n = min(need, ps.desired - placed[ps.name], _affordable(budget, ps.pod_demand))
            if n <= 0:
                continue
            got = place_pods(table, stmt, ps, pod_demand(table, ps), n, strategy, first_index=placed[ps.name])
            attempt.placements.extend(got)
            placed[ps.name] += len(got)
            budget = q.sub(budget, q.add({}, ps.pod_demand, len(got)))
            need -= len(got)

    def short_of(task: str, minimum: int) -> int:
        return max(0, minimum - sum(placed[ps.name] for ps in members if ps.task == task))

    for task, minimum in gang.task_minimums:
        take([ps for ps in members if ps.task == task], short_of(task, minimum))
    wanted = sum(ps.count for ps in members)
    take(members, wanted - sum(placed[ps.name] for ps in members))
    outside = sum(ps.count - placed[ps.name] for ps in gang.pod_sets if not ps.in_gang)
    tasks_short = sum(short_of(task, minimum) for task, minimum in gang.task_minimums)
    attempt.failed = max(tasks_short, wanted - sum(placed[ps.name] for ps in members)) + outside


def _affordable(budget: dict[str, int], demand: dict[str, int]) -> int:
    """How many pods of ``demand`` the quota left in ``budget`` pays for (any number when it charges nothing)."""
    counts = [budget.get(name, 0) // amount for name, amount in demand.items() if amount > 0]
    return max(0, min(counts)) if counts else 1 << 31
