"""Status where kubectl users look: what muster writes into the queue objects and PodGroups users have.

The content is derived from the events the reconciler reads, by the fold the result view uses
(``shared.projection.ResultProjection``: phases, quota held, waiting positions, backoff), so
``kubectl get queue -o yaml`` says what ``muster simulate`` and ``muster queues`` say. Written, as
JSON merge patches of the status subresource holding only muster's fields:

=============================  ==============================================================
object                         status fields (written when)
=============================  ==============================================================
Volcano ``Queue``              ``state``, ``pending``, ``inqueue``, ``running`` (its own gangs by
                               phase: waiting, holding quota, running), ``allocated`` (quota held,
                               children included): when muster answers to ``volcano``, i.e. it
                               is the Volcano scheduler (else Volcano's controllers own them)
KAI ``Queue``                  ``allocated``, ``requested`` (held + waiting), children included:
                               when muster answers to ``kai-scheduler``
``ElasticQuotaTree``           ``queues.<node>.used`` for every node of the tree, and kube-queue's
                               ``queueItemDetails`` (``active``: the waiting workloads with their
                               positions; ``backoff``) for each node that has workloads: always
Volcano ``PodGroup``           ``phase`` (Pending, Inqueue, Running, Completed) and one condition
``ray-<name>-pg`` of a Ray     (``Unschedulable`` with the wait reason, or ``Scheduled``): when muster
workload in a Volcano queue    answers to ``volcano`` (KubeRay with ``--batch-scheduler=volcano``
                               made the PodGroup; a missing one is skipped by the adapter)
=============================  ==============================================================

What changed is written once per second of event time at most (a ``status`` timer), with the
latest values; the cluster adapter also spaces writes to one object (``KubeApplier``).
"""

from __future__ import annotations

from typing import Any

from shared import quantity as q
from shared.events import Envelope, KubeEffect, TimerSet, derive_id
from shared.model import QueueSpec
from shared.policy import Policy
from shared.projection import ResultProjection, WorkloadView

STATUS_TIMER = "status"
PERIOD = 1.0
"""Seconds of event time between two writes of status (the latest values win)."""

VOLCANO_GROUP = "scheduling.volcano.sh"
VOLCANO_PODGROUP = "scheduling.volcano.sh/v1beta1"
_PODGROUP_PHASE = {"Queued": "Pending", "Preempted": "Pending", "Rejected": "Pending", "Admitted": "Inqueue",
                   "Running": "Running", "Succeeded": "Completed", "Failed": "Completed"}


def rfc3339(seconds: float) -> str:
    """Event time (seconds since the epoch) as a Kubernetes timestamp; pure arithmetic (no clock module)."""
    whole = int(seconds // 1)
    days, rest = divmod(whole, 86400)
    z = days + 719468  # civil_from_days (H. Hinnant): proleptic Gregorian calendar
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (1 if month <= 2 else 0)
    return f"{year:04d}-{month:02d}-{day:02d}T{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}Z"


def pod_group_name(workload: str) -> str:
    """KubeRay's name for the Volcano PodGroup of a RayCluster or RayJob (``getAppPodGroupName``)."""
    return f"ray-{workload.rpartition('/')[2]}-pg"


def _ref(key: str) -> dict[str, str]:
    namespace, _, name = key.rpartition("/")
    return {"name": name, "namespace": namespace or "default"}


class StatusBook:
    """Folds the reconciler's inbox into the status of queue objects and PodGroups; ``flush`` says
    what to write for what changed since the last flush."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.view = ResultProjection()
        self._queues: dict[str, None] = {}
        self._workloads: dict[str, None] = {}
        self._due: float | None = None
        self._by_queue: dict[str | None, list[WorkloadView]] | None = None
        """During a ``flush``: the live workloads per queue, in the view's order (one pass, not one per queue)."""

    def observe(self, env: Envelope) -> list[TimerSet]:
        """Fold one envelope; a timer for the next flush when something changed and none is set."""
        p = env.payload
        key = getattr(p, "key", None) or getattr(getattr(p, "workload", None), "key", None)
        before = self.view.workloads.get(key) if key else None
        queue_before = before.queue if before is not None else None
        self.view.apply(env)
        if env.type in ("QueueDefined", "QueueRemoved"):
            self._queues[p.queue.name if env.type == "QueueDefined" else p.name] = None
        elif key and key in self.view.workloads:
            self._workloads[key] = None
            for queue in (queue_before, self.view.workloads[key].queue):
                if queue:
                    self._queues[queue] = None
        else:
            return []
        if self._due is not None:
            return []
        self._due = env.occurred_at + PERIOD
        return [TimerSet(key=STATUS_TIMER, at=self._due)]

    def flush(self) -> list[KubeEffect]:
        """Status effects for every object whose status may have changed (the caller drops repeats)."""
        self._due = None
        queues, self._queues = self._queues, {}
        workloads, self._workloads = self._workloads, {}
        specs = self.view.queues
        touched: dict[str, None] = {}
        for name in queues:
            seen: list[str] = []
            while name is not None and name not in seen and name in specs:
                seen.append(name)
                touched[name] = None
                name = specs[name].parent
        out: list[KubeEffect] = []
        trees: dict[tuple[str, str], list[QueueSpec]] = {}
        self._by_queue = None
        try:
            self._flush_touched(touched, specs, out, trees)
        finally:
            self._by_queue = None
        if self.policy.answers_to("volcano"):
            for key in sorted(workloads):
                effect = self._pod_group(key)
                if effect is not None:
                    out.append(effect)
        self._forget_deleted(workloads)
        return out

    def _flush_touched(self, touched: dict[str, None], specs: dict[str, QueueSpec], out: list[KubeEffect],
                       trees: dict[tuple[str, str], list[QueueSpec]]) -> None:
        # Quota held per queue: all that Volcano's and KAI's status read of ``queue_views`` (its waiting
        # lists and positions, a sort of every workload, are for ElasticQuotaTrees: ``_tree``).
        usage: dict[str, dict[str, int]] | None = None
        for name in sorted(touched):
            spec = specs[name]
            if spec.source is None:
                continue
            if spec.dialect == "elasticquotatree":
                trees.setdefault((spec.source.namespace, spec.source.name), [])
            elif spec.dialect == "volcano" and self.policy.answers_to("volcano"):
                usage = self._usage() if usage is None else usage
                out.append(self._effect(spec, self._volcano(spec, q.format_resources(usage.get(name, {})))))
            elif spec.dialect == "kai" and self.policy.answers_to("kai-scheduler"):
                usage = self._usage() if usage is None else usage
                out.append(self._effect(spec, self._kai(spec, q.format_resources(usage.get(name, {})))))
        for (namespace, tree), _ in sorted(trees.items()):
            nodes = [s for s in specs.values() if s.source is not None and s.dialect == "elasticquotatree"
                     and (s.source.namespace, s.source.name) == (namespace, tree)]
            out.append(self._tree(nodes))

    def _forget_deleted(self, flushed: dict[str, None]) -> None:
        """A deleted workload's last status is written: its view goes, so the book holds live
        workloads only (a long-running reconciler must not keep every workload it ever saw)."""
        views, pods = self.view.workloads, self.view.pods
        for key in flushed:
            view = views.get(key)
            if view is not None and view.phase == "Deleted":
                del views[key]
                pods.pop(key, None)

    def _usage(self) -> dict[str, dict[str, int]]:
        """``ResultProjection.queue_usage`` as the status reads it (by queue, resources sorted there), in one
        pass with ``_members``' index: each workload adds to its own queue, then each queue's sum climbs its
        ancestors once, instead of every workload walking them (a flush reads every live workload)."""
        direct: dict[str, dict[str, int]] = {}
        by_queue: dict[str | None, list[WorkloadView]] = {}
        for v in self.view.workloads.values():
            if v.phase not in (None, "Deleted"):
                by_queue.setdefault(v.queue, []).append(v)
            if v.holds_quota and v.queue is not None:
                held = direct.get(v.queue)
                if held is None:
                    held = direct[v.queue] = {}
                for resource, amount in v.demand.items():
                    held[resource] = held.get(resource, 0) + amount
        if self._by_queue is None:
            self._by_queue = by_queue
        usage: dict[str, dict[str, int]] = {}
        specs = self.view.queues
        for queue, held in direct.items():
            name: str | None = queue
            seen: list[str] = []
            while name is not None and name not in seen:
                seen.append(name)
                total = usage.setdefault(name, {})
                for resource, amount in held.items():
                    total[resource] = total.get(resource, 0) + amount
                spec = specs.get(name)
                name = spec.parent if spec else None
        return usage

    # ------------------------------------------------------------------ per dialect
    def _members(self, queue: str) -> list[WorkloadView]:
        by_queue = self._by_queue
        if by_queue is None:
            by_queue = self._by_queue = {}
            for v in self.view.workloads.values():
                if v.phase not in (None, "Deleted"):
                    by_queue.setdefault(v.queue, []).append(v)
        return by_queue.get(queue, [])

    def _volcano(self, spec: QueueSpec, allocated: dict[str, str]) -> dict[str, Any]:
        members = self._members(spec.name)
        running = sum(1 for v in members if v.holds_quota and v.phase == "Running")
        inqueue = sum(1 for v in members if v.holds_quota and v.phase != "Running")
        pending = sum(1 for v in members if not v.holds_quota and v.phase in ("Queued", "Preempted"))
        return {"state": spec.state, "pending": pending, "inqueue": inqueue, "running": running,
                "allocated": allocated}

    def _kai(self, spec: QueueSpec, allocated: dict[str, str]) -> dict[str, Any]:
        requested: q.Resources = {}
        for name in self._subtree(spec.name):
            for v in self._members(name):
                if v.holds_quota or v.queue_state in ("pending", "backoff"):
                    requested = q.add(requested, v.demand)
        return {"allocated": allocated, "requested": q.format_resources(requested)}

    def _tree(self, nodes: list[QueueSpec]) -> KubeEffect:
        views = self.view.queue_views(s.name for s in nodes)
        queues: dict[str, Any] = {}
        for spec in nodes:
            view = views[spec.name]
            entry: dict[str, Any] = {"used": view["usage"]}
            if view["pending"] or view["backoff"] or self._members(spec.name):
                entry["queueItemDetails"] = {
                    "active": [{**_ref(item["workload"]), "position": item["position"]} for item in view["pending"]],
                    "backoff": [_ref(key) for key in view["backoff"]],
                }
            queues[spec.name] = entry
        return self._effect(nodes[0], {"queues": queues})

    def _subtree(self, name: str) -> list[str]:
        out, todo = [], [name]
        while todo:
            current = todo.pop()
            out.append(current)
            todo += sorted(s.name for s in self.view.queues.values() if s.parent == current and s.name not in out)
        return out

    def _pod_group(self, key: str) -> KubeEffect | None:
        view = self.view.workloads.get(key)
        spec = self.view.queues.get(view.queue or "") if view is not None else None
        if view is None or spec is None or spec.dialect != "volcano" or view.kind not in ("RayCluster", "RayJob"):
            return None
        phase = _PODGROUP_PHASE.get(view.phase or "")
        if phase is None or not view.transitions:
            return None
        last = view.transitions[-1]
        waiting = phase == "Pending"
        condition = {"type": "Unschedulable" if waiting else "Scheduled", "status": "True",
                     "reason": "NotEnoughResources" if waiting else "tasks in gang are ready to be scheduled",
                     "message": last["reason"], "transitionID": derive_id(key, last["t"], last["phase"]),
                     "lastTransitionTime": rfc3339(last["t"])}
        namespace, _, _ = key.rpartition("/")
        return KubeEffect(op="status", kind="PodGroup", api_version=VOLCANO_PODGROUP, namespace=namespace or "default",
                          name=pod_group_name(key), status={"phase": phase, "conditions": [condition]})

    @staticmethod
    def _effect(spec: QueueSpec, status: dict[str, Any]) -> KubeEffect:
        source = spec.source
        assert source is not None
        return KubeEffect(op="status", kind=source.kind, api_version=source.api_version, namespace=source.namespace,
                          name=source.name, status=status)
