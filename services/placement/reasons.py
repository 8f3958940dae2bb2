"""Why a gang did not fit, in the words Volcano and kube-scheduler users already read.

    3/3 tasks in gang unschedulable: pod group is not ready, 3 Pending, 3 minAvailable;
    1/3 tasks could not be placed: 0/2 nodes are available: 1 Insufficient cpu,
    1 node(s) had untolerated taint(s).

The node histogram is kube-scheduler's ``FitError``: per node the first failing filter (cordon,
taint, selector/affinity, host ports), or every resource it is short of, else the first inter-pod rule it
fails (topology spread, pod affinity, anti-affinity, existing pods' anti-affinity: ``interpod``);
"<count> <reason>" strings sorted as strings and joined with ", ".
"""

from __future__ import annotations

import numpy as np

from services.placement import filters, interpod
from services.placement.nodes import Demand, NodeTable, port_taken
from shared.kernel import gpumemory
from shared.kernel import quantity as q
from shared.kernel.model import Gang, PodSet
from shared.kernel.reasons import gang_line

INSUFFICIENT_GPU = f"Insufficient {q.GPU}"
INSUFFICIENT_GPU_MEMORY = "Insufficient GPU memory"
NO_GPU_MEMORY = f"node(s) were not GPU nodes or had no {gpumemory.LABEL} label"
PORTS = "node(s) didn't have free ports for the requested pod ports"
"""kube-scheduler's NodePorts ``ErrReason``; that filter runs before NodeResourcesFit, so such a node is
not also counted short of a resource."""


def gang_failure(gang: Gang, failed: int, total: int, fit_error: str, never: str = "") -> str:
    """``never``: why no node as the cluster is could ever hold it (``larger_than_nodes``), said after the histogram."""
    tail = f" It can never fit in the cluster as it is: {never} (it waits for nodes to join or change)." if never else ""
    return f"{gang_line(gang)}{failed}/{total} tasks could not be placed: {fit_error}{tail}"


def larger_than_nodes(table: NodeTable, pod_set: PodSet, demand: Demand, static: np.ndarray) -> str:
    """Why one pod of ``pod_set`` fits no node it may use even were that node empty ("" when some node
    is large enough): what it asks of a resource against the most any such node allocates. Nodes its
    constraints rule out are the histogram's to name, so with none left this says nothing."""
    n = table.n
    if not static[:n].any():
        return ""
    for c, amount in demand.filter:
        largest = int(table.alloc[c, :n][static[:n]].max())
        if amount > largest:
            resource = table.resources[c]
            return (f"a {pod_set.name} pod needs {resource} {q.human(resource, amount)}, the largest node "
                    f"it may use has {resource} {q.human(resource, largest)}")
    if demand.gpu_share and not (table.gpu_count[:n][static[:n]] > 0).any():
        return f"a {pod_set.name} pod needs a share of a GPU, no node it may use has one"
    if demand.gpu_memory:  # one device must hold it: the largest GPU memory a node it may use states
        stated = table.gpu_memory[:n][static[:n] & (table.gpu_count[:n] > 0)]
        largest = int(stated.max()) if stated.size else 0
        if largest < demand.gpu_memory:
            asks = f"a {pod_set.name} pod needs {demand.gpu_memory} MiB of one GPU ({gpumemory.ANNOTATION})"
            return (f"{asks}, the largest GPU of a node it may use has {largest} MiB" if largest
                    else f"{asks}, no node it may use states its GPU memory")
    return ""


def larger_than_cluster(table: NodeTable, needs: dict[int, int]) -> str:
    """Why a gang needing ``needs`` (table column -> amount, its pods together) fits no cluster of these
    nodes even empty ("" when their allocatable together holds it)."""
    for c, amount in sorted(needs.items(), key=lambda item: table.resources[item[0]]):
        total = table.total_alloc[c]
        if amount > total:
            resource = table.resources[c]
            return (f"the gang needs {resource} {q.human(resource, amount)}, the nodes have "
                    f"{resource} {q.human(resource, total)} in all")
    return ""


def resource_reason(resource: str) -> str:
    return "Too many pods" if resource == q.PODS else f"Insufficient {resource}"


def _memory_reasons(table: NodeTable, memory: int, static: np.ndarray, counts: dict[str, int]) -> None:
    """Why a ``gpu-memory`` pod fits none of the nodes the static filters let it use: the node states no
    GPU memory (KAI: "node is not a gpu node or the gpu memory count on the node was not synced yet"),
    its devices are smaller than the request (it never fits there, whatever runs), or no device has
    that much free."""
    n = table.n
    known = (table.gpu_memory[:n] > 0) & (table.gpu_count[:n] > 0)
    too_small = known & (table.gpu_memory[:n] < memory)
    busy = known & ~too_small & (table.gpu_room[:n] < table.memory_need(memory, slice(0, n)))
    for reason, rows in ((NO_GPU_MEMORY, ~known), (f"node(s) had GPUs of less than {memory} MiB", too_small),
                         (INSUFFICIENT_GPU_MEMORY, busy)):
        short = int((static & rows).sum())
        if short:
            counts[reason] = counts.get(reason, 0) + short


def _volume_node_reasons(table: NodeTable, demand: Demand, volume: list[str], i: int) -> list[str]:
    """Why a node only the pod's claims rule out is reported: kube-scheduler's NodePorts and NodeResourcesFit
    run before VolumeBinding, so a node they reject is counted under their reasons instead."""
    if demand.ports and i in table.ports and port_taken(table.ports[i], demand.ports):
        return [PORTS]
    short = [resource_reason(table.resources[c]) for c, amount in demand.filter if table.free[c, i] < amount]
    return short or volume or [filters.UNSCHEDULABLE]


def fit_error(table: NodeTable, pod_set: PodSet, demand: Demand, static: np.ndarray) -> tuple[str, bool]:
    """The histogram for one pod that fits nowhere, and whether capacity (not constraints) is short.

    Runs only on failure: a Python loop over the nodes the static filters reject, numpy for the rest.
    """
    n = table.n
    present = table.present[:n]
    total = int(present.sum())
    verdict = table.volumes.verdict(pod_set.volumes) if pod_set.volumes else None
    if verdict is not None and verdict.wait:  # VolumeBinding's PreFilter: one reason for the pod, not per node
        return f"0/{total} nodes are available: {verdict.wait}.", False
    counts: dict[str, int] = {}
    for i in np.flatnonzero(present & ~static).tolist():
        reason = filters.static_failure(table.labels[i], table.taints[i], not table.schedulable[i], pod_set)
        if reason is None and verdict is not None:
            for why in _volume_node_reasons(table, demand, verdict.reasons(table.labels[i], table.names[i]), i):
                counts[why] = counts.get(why, 0) + 1
            continue
        reason = reason or filters.UNSCHEDULABLE
        counts[reason] = counts.get(reason, 0) + 1
    fit = static[:n]
    if demand.ports and table.ports:
        taken = fit & table.port_conflicts(demand.ports)
        if taken.any():
            counts[PORTS] = int(taken.sum())
            fit = fit & ~taken
    for c, amount in demand.filter:
        short = int((fit & (table.free[c, :n] < amount)).sum())
        if short:
            reason = resource_reason(table.resources[c])
            counts[reason] = counts.get(reason, 0) + short
    if demand.gpu_share:
        short = int((fit & (table.gpu_room[:n] < demand.gpu_share)).sum())
        if short:
            counts[INSUFFICIENT_GPU] = counts.get(INSUFFICIENT_GPU, 0) + short
    elif demand.gpu_memory:
        _memory_reasons(table, demand.gpu_memory, fit, counts)
    if interpod.active(table, pod_set):  # nodes that pass every other filter: the first inter-pod rule failed
        fits = table.feasible(demand, static, slice(0, n)) & fit
        rules = interpod.evaluate(table, pod_set, fits)
        for i in np.flatnonzero(fits & ~rules.ok).tolist():
            counts[rules.reason[i]] = counts.get(rules.reason[i], 0) + 1
    if not counts:
        return f"0/{total} nodes are available.", False
    histogram = sorted(f"{count} {reason}" for reason, count in counts.items())
    return f"0/{total} nodes are available: {', '.join(histogram)}.", bool(static.any())
