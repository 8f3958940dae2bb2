"""Who reads what: the one place that says which inbox each event type is written to.

Services: admission, queue, placement, reconciler. ``cluster`` is the Kubernetes side (the
reconciler's apply adapter, or the simulated cluster); ``clock`` answers ``TimerSet``.
"""

from __future__ import annotations

from typing import Any

from shared.kernel.events import Envelope, ObjectChanged, ObjectsListed
from shared.kernel.kube import REFUSED, ray_labelled

SERVICES = ("admission", "queue", "placement", "reconciler")

ADMISSION_KINDS = frozenset({
    "RayCluster", "RayJob", "PodGroup", "Queue", "ElasticQuotaTree", "PriorityClass", "RuntimeClass",
})
VOLUME_KINDS = frozenset({"PersistentVolumeClaim", "PersistentVolume", "StorageClass"})
"""What placement's volume filter reads (``services.placement.volumes``): to placement alone."""
PLACEMENT_KINDS = frozenset({"Node", "Pod"}) | VOLUME_KINDS
WATCHED_KINDS = ADMISSION_KINDS | PLACEMENT_KINDS
"""Every kind the cluster link watches (``shared.kubernetes.resources.WATCHED``)."""

ROUTES: dict[str, tuple[str, ...]] = {
    "QueueDefined": ("queue", "placement", "reconciler"),
    "QueueRemoved": ("queue", "placement", "reconciler"),
    "QueueRejected": ("reconciler",),
    "WorkloadSubmitted": ("queue", "reconciler"),
    "WorkloadUpdated": ("queue", "placement", "reconciler"),
    "WorkloadRejected": ("queue", "reconciler"),
    "WorkloadWarned": ("reconciler",),
    "WorkloadFinished": ("queue", "reconciler"),
    "WorkloadDeleted": ("queue", "reconciler"),
    "Enqueued": ("reconciler",),
    "BackedOff": ("reconciler",),
    "Dequeued": ("placement", "reconciler"),
    "ReclaimRequested": ("placement", "reconciler"),
    "WorkloadWithdrawn": ("placement", "reconciler"),
    "ElasticGranted": ("placement", "reconciler"),
    "ElasticReleased": ("queue", "reconciler"),
    "ElasticWaiting": ("reconciler",),
    "GangPlaced": ("queue", "reconciler"),
    "PlacementFailed": ("queue", "reconciler"),
    "PodAssigned": ("reconciler",),
    "GangRunning": ("queue", "reconciler"),
    "GangDisrupted": ("reconciler",),
    "GangEvicted": ("queue", "reconciler"),
    "PodsMoved": ("reconciler",),
    "PreemptionRequested": ("queue", "reconciler"),
    "CapacityChanged": ("queue",),
    "KubeEffect": ("cluster",),
    "TimerSet": ("clock",),
    "PolicyApplied": (),  # a fact for the log and its readers: no core reads it
}


_POD_GONE = ("admission", "placement", "reconciler")
"""A pod's deletion: the reconciler too forgets what it wrote on the pod (what it keeps per pod follows
the pods that exist, not every pod a long-lived workload ever had)."""


def admission_reads_pod(obj: dict[str, Any], change: str = "Added") -> bool:
    """Every pod but KubeRay's: a plain pod may be a gang member or a gang of one (admission decides by
    its labels and ``spec.schedulerName``); KubeRay's pods belong to their RayCluster / RayJob. Of
    those, admission reads the ones ingest refused (it rejects their workload naming the pod) and
    deletions (a refused pod that is gone no longer holds its workload back)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return True
    labels = meta.get("labels")
    if not (isinstance(labels, dict) and ray_labelled(labels)):
        return True
    annotations = meta.get("annotations")
    return change == "Deleted" or (isinstance(annotations, dict) and REFUSED in annotations)


def destinations(env: Envelope) -> tuple[str, ...]:
    """Inboxes an envelope goes to. Most types route by type alone (``ROUTES``, looked up first: every
    decision and timer request of a log is one); watch events split by kind; plain pods (not KubeRay's)
    go to both, and a listing of pods to both (each core judges only the pods it was told of); a pod's
    deletion to the reconciler as well. A ``TimerFired`` has no route of its own: the clock delivers
    it to the service whose timer it is."""
    kind = env.type
    targets = ROUTES.get(kind)
    if targets is not None:
        return targets
    p = env.payload
    if isinstance(p, ObjectChanged):  # its type is "ObjectChanged": the envelope agrees with its payload
        if p.kind == "Node" or p.kind in VOLUME_KINDS:
            return _PLACEMENT
        if p.kind != "Pod":
            return _ADMISSION
        if p.change == "Deleted":
            return _POD_GONE
        return _BOTH if admission_reads_pod(p.object, p.change) else _PLACEMENT
    if isinstance(p, ObjectsListed):  # a listing: to every core holding that kind (``shared.kernel.listing``)
        return _PLACEMENT if p.kind == "Node" or p.kind in VOLUME_KINDS else _BOTH if p.kind == "Pod" else _ADMISSION
    if kind == "TimerFired":
        return ()
    raise KeyError(kind)


_PLACEMENT, _ADMISSION, _BOTH = ("placement",), ("admission",), ("admission", "placement")
