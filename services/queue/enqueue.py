"""Volcano's enqueue gate: whether a waiting workload of a gating queue (``QueueSpec.gates_enqueue``) is
considered at all, or stays Pending as Volcano keeps its PodGroup.

Volcano's enqueue action moves a Pending PodGroup to Inqueue only when every plugin's ``JobEnqueueable``
permits (volcano-sh/volcano v1.10.0 ``pkg/scheduler/actions/enqueue/enqueue.go``), and allocate, reclaim
and preempt skip a job that is still Pending (``if job.IsPending() { continue }`` in
``actions/allocate/allocate.go``, ``actions/reclaim/reclaim.go``, ``actions/preempt/preempt.go``): a job
that is not enqueued is placed nowhere and evicts nobody. The installer's plugins gate so:

- overcommit (``plugins/overcommit/overcommit.go``): idle = total × ``overcommit-factor`` (1.2) − used on
  the nodes; the job is permitted while what Inqueue jobs ask for (their minimum; a Running job's
  minimum less what it was allocated) plus its own minimum stays within idle, in every resource its
  minimum names (``LessEqualWithDimension``). muster counts what every workload holds or has reserved
  (the queue's ledger ``in_use``, elastic pods included): used and in queue together, never more than
  the cluster (a gang that lost its node still holds its quota, but no node holds its pods);
- capacity (``plugins/capacity/capacity.go`` ``jobEnqueueable``): minimum + the queue's allocated and
  inqueue, less its jobs' elastic part (allocated beyond their minimum), within its ``realCapability``.
  muster's quota check (``tree.quota_block``) and the reserved guarantees of other queues
  (``tree.reserved_block``) on the queue's usage less its granted elastic pods are that check, and so
  is the cluster itself: ``realCapability`` is the cluster less the others' guarantees when the queue
  names no capability (``buildQueueAttrs``), so a queue holding the whole cluster enqueues nothing more
  (``capacity_block``); a workload it refuses asks no victims in a gating queue (``cycle.py``). The
  elastic pods subtracted are the leaf's own at every level of its chain.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Mapping

from services.queue.tree import QueueTree, quota_block, reserved_block
from services.queue.workload import Tracked
from shared.kernel import quantity as q

SOURCE = "Volcano's overcommit"


def overcommit_block(demand: Mapping[str, int], capacity: Mapping[str, int], in_use: Mapping[str, int],
                     factor: float) -> str | None:
    """Why ``demand`` (a workload's minimum) is not enqueued by the overcommit plugin, or None.

    ``capacity``: the cluster's schedulable totals; ``in_use``: what every workload holds or has reserved.
    Before the cluster is known (no capacity) nothing is gated. Resources by name; the first that does not
    fit is the one named. Amounts are integers, so ``in_use + demand <= floor(factor × total)`` is exactly
    Volcano's float comparison.
    """
    if not capacity:
        return None
    for resource in sorted(r for r, v in demand.items() if v > 0):
        total = capacity.get(resource, 0)
        room = math.floor(Decimal(repr(factor)) * total)  # 1.15 × 1000 is 1150, not 1149.99…
        held = min(in_use.get(resource, 0), total)  # what nodes hold never exceeds them (quota of a gang whose
        # node left is on none): Volcano's ``used`` is the nodes' own
        if held + demand[resource] > room:
            return (f"not enqueued: its minimum {resource} {_show(resource, demand[resource])} does not fit the "
                    f"cluster's overcommitted idle {resource} {_show(resource, room - held)} ({factor:g} × "
                    f"{_show(resource, total)} less {_show(resource, held)} in use or in queue; "
                    f"{SOURCE}, factor {factor:g})")
    return None


def capacity_block(tree: QueueTree, w: Tracked, usage: Mapping[str, Mapping[str, int]],
                   protected: Mapping[str, Mapping[str, int]], capacity: Mapping[str, int],
                   running_elastic: Mapping[str, Tracked]) -> str | None:
    """Why the capacity plugin would not enqueue ``w``, or None: its minimum with its queue's usage, the elastic
    pods its queue's workloads were granted not counted (``attr.elastic``), must fit its queue's limits and
    room (``CAPACITY_NOTE``), and the cluster itself: a queue's ``realCapability`` is at most the cluster less
    the other queues' guarantees, so a queue that holds the whole cluster enqueues nothing more."""
    elastic: dict[str, int] = {}
    for x in running_elastic.values():
        if x.queue == w.queue:
            for pod_set, count in x.elastic.items():
                elastic = q.add(elastic, x.elastic_demand(pod_set, count))
    levels = {spec.name: q.sub(dict(usage.get(spec.name, {})), elastic) for spec in tree.ancestry(w.queue)}
    lowered = {**usage, **levels}
    if (quota_block(tree, w.queue, w.demand, lowered, protected, w.spec.preemptible) is not None
            or reserved_block(tree, w.queue, w.demand, lowered, capacity) is not None):
        return CAPACITY_NOTE
    used = lowered.get(w.queue, {})
    for resource in sorted(r for r, v in w.demand.items() if v > 0 and r in capacity):
        if used.get(resource, 0) + w.demand[resource] > capacity[resource]:
            return (f"not enqueued: queue {w.queue} would hold {resource} "
                    f"{_show(resource, used.get(resource, 0) + w.demand[resource])} of the cluster's "
                    f"{_show(resource, capacity[resource])} (its minimum {_show(resource, w.demand[resource])} with "
                    f"{_show(resource, used.get(resource, 0))} in use or in queue; Volcano's capacity plugin: a queue's "
                    f"realCapability is at most the cluster)")
    return None


def _show(resource: str, milli: int) -> str:
    """As reasons show amounts, but a fraction of a GPU as ``1.6``, not ``1600m`` (cpu keeps millicores)."""
    text = q.human(resource, milli)
    return f"{milli / 1000:g}" if text.endswith("m") and resource != "cpu" and milli % 1000 else text


CAPACITY_NOTE = ("Not enqueued: its minimum does not fit its queue's room (Volcano's capacity plugin), so it "
                 "preempts and reclaims nothing.")
"""What a gating queue's workload that its queue's room blocks is told after the quota line."""
