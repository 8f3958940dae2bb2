"""Who reads what: the one place that says which inbox each event type is written to.

Services: admission, queue, placement, reconciler. ``cluster`` is the Kubernetes side (the
reconciler's apply adapter, or the simulated cluster); ``clock`` answers ``TimerSet``.
"""

from __future__ import annotations

from shared.events import Envelope

SERVICES = ("admission", "queue", "placement", "reconciler")

ADMISSION_KINDS = frozenset({
    "RayCluster", "RayJob", "PodGroup", "Queue", "ElasticQuotaTree", "PriorityClass",
})
PLACEMENT_KINDS = frozenset({"Node", "Pod"})

ROUTES: dict[str, tuple[str, ...]] = {
    "QueueDefined": ("queue", "placement", "reconciler"),
    "QueueRemoved": ("queue", "placement", "reconciler"),
    "QueueRejected": ("reconciler",),
    "WorkloadSubmitted": ("queue", "reconciler"),
    "WorkloadUpdated": ("queue", "placement", "reconciler"),
    "WorkloadRejected": ("queue", "reconciler"),
    "WorkloadFinished": ("queue", "reconciler"),
    "WorkloadDeleted": ("queue", "reconciler"),
    "Enqueued": ("reconciler",),
    "BackedOff": ("reconciler",),
    "Dequeued": ("placement", "reconciler"),
    "ReclaimRequested": ("placement", "reconciler"),
    "WorkloadWithdrawn": ("placement", "reconciler"),
    "GangPlaced": ("queue", "reconciler"),
    "PlacementFailed": ("queue", "reconciler"),
    "PodAssigned": ("reconciler",),
    "GangRunning": ("queue", "reconciler"),
    "GangDisrupted": ("reconciler",),
    "PreemptionRequested": ("queue", "reconciler"),
    "CapacityChanged": ("queue",),
    "KubeEffect": ("cluster",),
    "TimerSet": ("clock",),
}


def is_pod_gang_member(obj: dict) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return "scheduling.x-k8s.io/pod-group" in labels or "pod-group.scheduling.sigs.k8s.io/name" in labels


def destinations(env: Envelope) -> tuple[str, ...]:
    """Inboxes an envelope goes to. Watch events split by kind; pods of plain pod gangs go to both."""
    if env.type == "ObjectChanged":
        kind = env.payload.kind
        if kind == "Pod":
            return ("admission", "placement") if is_pod_gang_member(env.payload.object) else ("placement",)
        if kind == "Node":
            return ("placement",)
        return ("admission",)
    if env.type == "TimerFired":
        return ()
    return ROUTES[env.type]
