"""Status where kubectl users look: what muster writes into the queue objects and PodGroups users have.

The content is derived from the events the reconciler reads, by the fold the result view uses
(``shared.kernel.projection.ResultProjection``: phases, quota held, waiting positions, backoff), so
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

from shared.kernel import quantity as q
from shared.kernel.events import (
    Envelope, KubeEffect, ObjectChanged, PodAssigned, QueueDefined, QueueRemoved, TimerSet, derive_id, kube_effect,
)
from shared.kernel.model import QueueSource, QueueSpec
from shared.kernel.policy import Policy
from shared.kernel.projection import IN_QUEUE_STATES, NOT_LIVE, QueueSums, ResultProjection, WorkloadView

STATUS_TIMER = "status"
PERIOD = 1.0
"""Seconds of event time between two writes of status (the latest values win)."""

VOLCANO_GROUP = "scheduling.volcano.sh"
VOLCANO_PODGROUP = "scheduling.volcano.sh/v1beta1"
_TALLY: dict[tuple[bool, bool], dict[str, int]] = {
    (True, True): {"running": 1}, (True, False): {"inqueue": 1}, (False, True): {"pending": 1}, (False, False): {}}
"""What one live workload adds to its queue's Volcano counts: by (holds quota, is Running) when it
holds quota, by (False, waits: Queued or Preempted) when it does not. A queue with live workloads is
in ``QueueSums.direct`` whatever they add (its count of contributors says so)."""
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


def pod_group_ref(key: str) -> tuple[str, str]:
    """Namespace and name of the PodGroup written for workload ``key`` (its status, and what is forgotten)."""
    return key.rpartition("/")[0] or "default", pod_group_name(key)


def pod_group_object(key: str) -> str:
    """The object id (as ``effect_object`` names it) of the PodGroup written for workload ``key``: the
    reconciler forgets what it wrote there with the workload (KubeRay makes a new PodGroup for a new
    incarnation, so a status equal to the old one's must be written again)."""
    namespace, name = pod_group_ref(key)
    return f"{VOLCANO_PODGROUP}/PodGroup/{namespace}/{name}"


def queue_object(source: QueueSource) -> str:
    """The object id (as ``effect_object`` names it) of the queue object whose status is written from
    ``source``: forgotten once no queue is defined by it."""
    return f"{source.api_version}/{source.kind}/{source.namespace}/{source.name}"


def effect_object(effect: KubeEffect) -> str:
    """The object a status effect writes, as the reconciler remembers what it wrote."""
    return f"{effect.api_version}/{effect.kind}/{effect.namespace}/{effect.name}"


def _ref(key: str) -> dict[str, str]:
    namespace, _, name = key.rpartition("/")
    return {"name": name, "namespace": namespace or "default"}


class _StatusView(ResultProjection):
    """The result view's fold without its history: status reads workloads and queues, never pods,
    and of a workload's transitions only the last (its PodGroup's condition). A gang that waits or
    runs for months changes reason again and again and sees its pods replaced: the views of each
    would stay with it."""

    def __init__(self) -> None:
        super().__init__()
        self.tally = QueueSums()
        """Per queue, Volcano's counts of its own live workloads (``pending``, ``inqueue``, ``running``),
        kept as each workload changes: a flush reads them, not every workload."""
        self.requested = QueueSums()
        """Per queue, the demand of its own workloads holding quota or waiting: KAI's ``requested``, rolled
        up over the parent links as KAI's ``resource_updater.go`` sums the children."""

    def hold(self, view: WorkloadView) -> None:
        """Take the workload an envelope changed into the queues' counts too (``_count``); a pod's
        bookkeeping alone (PodAssigned) changes no workload, so it is never held."""
        super().hold(view)
        if len(view.transitions) > 1:
            del view.transitions[:-1]
        if len(view.elastic_waiting) > 1:
            del view.elastic_waiting[:-1]
        self._count(view)

    def _count(self, view: WorkloadView) -> None:
        """Take ``view``'s change into the per-queue counts (what ``_volcano``, ``_kai`` and ``_tree`` read)."""
        key, queue = view.key, view.queue
        if view.phase in NOT_LIVE or queue is None:
            self.tally.drop(key)
            self.requested.drop(key)
            return
        holds = view.holds_quota
        self.tally.set(key, queue, _TALLY[holds, view.phase == "Running" if holds else
                                          view.phase in ("Queued", "Preempted")])
        self.requested.set(key, queue if holds or view.queue_state in IN_QUEUE_STATES else None, view.demand)

    def _on_PodAssigned(self, p: PodAssigned, t: float) -> None:
        return None

    def _on_ObjectChanged(self, p: ObjectChanged, t: float) -> None:
        return None


class StatusBook:
    """Folds the reconciler's inbox into the status of queue objects and PodGroups; ``flush`` says
    what to write for what changed since the last flush."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.view = _StatusView()
        self._queues: dict[str, None] = {}
        self._workloads: dict[str, None] = {}
        self._due: float | None = None

    def observe(self, env: Envelope) -> list[TimerSet]:
        """Fold one envelope; a timer for the next flush when something changed and none is set."""
        p = env.payload
        key: str | None = getattr(p, "key", None) or getattr(getattr(p, "workload", None), "key", None)
        fold = self.view
        workloads = fold.workloads  # one dict for the view's life: ``apply`` adds and forgets in it
        before = workloads.get(key) if key else None
        queue_before = before.queue if before is not None else None
        fold.apply(env)
        view = workloads.get(key) if key else None
        if isinstance(p, QueueDefined):
            self._queues[p.queue.name] = None
        elif isinstance(p, QueueRemoved):
            self._queues[p.name] = None
        elif key and view is not None:  # (a view is found only by a key)
            self._workloads[key] = None
            for queue in (queue_before, view.queue):
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
        for queue in queues:
            name: str | None = queue
            seen: list[str] = []
            while name is not None and name not in seen and name in specs:
                seen.append(name)
                touched[name] = None
                name = specs[name].parent
        out: list[KubeEffect] = []
        self._flush_touched(touched, specs, out)
        if self.policy.answers_to("volcano"):
            for key in sorted(workloads):
                effect = self._pod_group(key)
                if effect is not None:
                    out.append(effect)
        self._forget_deleted(workloads)
        return out

    def _flush_touched(self, touched: dict[str, None], specs: dict[str, QueueSpec], out: list[KubeEffect]) -> None:
        # Quota held (and KAI's requested) per queue, rolled up once per flush from the per-queue sums
        # kept as workloads change: a flush costs the queues, not the workloads.
        usage: dict[str, dict[str, int]] | None = None
        requested: dict[str, dict[str, int]] | None = None
        trees: dict[tuple[str, str], None] = {}
        for name in sorted(touched):
            spec = specs[name]
            if spec.source is None:
                continue
            if spec.dialect == "elasticquotatree":
                trees[(spec.source.namespace, spec.source.name)] = None
            elif spec.dialect == "volcano" and self.policy.answers_to("volcano"):
                usage = self.view.queue_usage() if usage is None else usage
                out.append(self._effect(spec, self._volcano(spec, q.format_resources(usage.get(name, {})))))
            elif spec.dialect == "kai" and self.policy.answers_to("kai-scheduler"):
                usage = self.view.queue_usage() if usage is None else usage
                requested = self.view.requested.rolled(specs) if requested is None else requested
                out.append(self._effect(spec, {"allocated": q.format_resources(usage.get(name, {})),
                                               "requested": q.format_resources(requested.get(name, {}))}))
        for namespace, tree in sorted(trees):
            nodes = [s for s in specs.values() if s.source is not None and s.dialect == "elasticquotatree"
                     and (s.source.namespace, s.source.name) == (namespace, tree)]
            out.append(self._tree(nodes))

    def _forget_deleted(self, flushed: dict[str, None]) -> None:
        """A deleted workload's last status is written: its view goes, so the book holds live
        workloads only (a long-running reconciler must not keep every workload it ever saw)."""
        views = self.view.workloads
        for key in flushed:
            view = views.get(key)
            if view is not None and view.phase == "Deleted":
                self.view.forget(key)

    # ------------------------------------------------------------------ per dialect
    def _volcano(self, spec: QueueSpec, allocated: dict[str, str]) -> dict[str, Any]:
        counts = self.view.tally.direct.get(spec.name, {})
        return {"state": spec.state, "pending": counts.get("pending", 0), "inqueue": counts.get("inqueue", 0),
                "running": counts.get("running", 0), "allocated": allocated}

    def _tree(self, nodes: list[QueueSpec]) -> KubeEffect:
        views = self.view.queue_views(s.name for s in nodes)
        queues: dict[str, Any] = {}
        for spec in nodes:
            view = views[spec.name]
            entry: dict[str, Any] = {"used": view["usage"]}
            if view["pending"] or view["backoff"] or spec.name in self.view.tally.direct:
                entry["queueItemDetails"] = {
                    "active": [{**_ref(item["workload"]), "position": item["position"]} for item in view["pending"]],
                    "backoff": [_ref(key) for key in view["backoff"]],
                }
            queues[spec.name] = entry
        return self._effect(nodes[0], {"queues": queues})

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
        namespace, name = pod_group_ref(key)
        return kube_effect(op="status", kind="PodGroup", api_version=VOLCANO_PODGROUP, namespace=namespace,
                           name=name, status={"phase": phase, "conditions": [condition]})

    @staticmethod
    def _effect(spec: QueueSpec, status: dict[str, Any]) -> KubeEffect:
        source = spec.source
        assert source is not None
        return kube_effect(op="status", kind=source.kind, api_version=source.api_version, namespace=source.namespace,
                          name=source.name, status=status)
