"""What a core's failure on one envelope becomes: a rejection a user can act on, never a stop.

A core raises only on a bug or on an input shape nobody anticipated; either way the same envelope
would make it raise again after every restart (a poison pill). ``shared.runtime.service.Service`` catches
the exception, and both runtimes go on with the next envelope: the failure is a ``Fault`` (the
Kafka worker dead-letters the record it came in, the embedded runtime keeps it in a list and logs
it), and the object the envelope concerns is rejected (``rejections``): a RayCluster, RayJob, pod
gang or workload event gets ``WorkloadRejected``, a queue object or queue event ``QueueRejected``.
The queue drops a rejected workload that waits (one holding quota keeps running on its last spec,
as after a refused edit); the reconciler writes the reason onto the object and as a Warning event.

The reason names the service and the exception (type and first line, no addresses), so it is the
same on every runtime and in every replay: parity and golden replays hold with a failing core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from shared.kernel.events import (
    Envelope,
    ObjectChanged,
    QueueDefined,
    QueueRejected,
    QueueRemoved,
    WorkloadRejected,
    WorkloadSubmitted,
    WorkloadUpdated,
)
from shared.kernel.kube import watched_namespace
from shared.kernel.validation import printable

WORKLOAD_KINDS = ("RayCluster", "RayJob", "PodGroup")
QUEUE_KINDS = ("Queue", "ElasticQuotaTree")
ERROR_CHARS = 300
"""How much of an exception's message a reason quotes (its first line, at most this long)."""
GROUP_LABELS = ("scheduling.x-k8s.io/pod-group", "pod-group.scheduling.sigs.k8s.io/name")
"""Labels that put a plain pod into a gang (``services.admission.podgangs``): its failure rejects the gang."""


@dataclass(frozen=True)
class Fault:
    """A core raised on ``envelope``: ``error`` says which service and what, in one line."""

    service: str
    envelope: Envelope
    error: str


def describe(service: str, env: Envelope, exc: BaseException) -> str:
    """One line, the same on every runtime: the service, the event and the exception."""
    text = str(exc).strip().splitlines()
    message = printable(text[0][:ERROR_CHARS]) if text else ""  # logged as it is: no control characters
    return f"{service} failed on {env.type} {env.subject}: {type(exc).__name__}" + (f": {message}" if message else "")


def rejections(service: str, env: Envelope, error: str) -> list[Any]:
    """The rejection of what ``env`` is about, with a reason a user can act on; [] when it is about
    no workload or queue (a node, a PriorityClass, a timer, an effect) or is a rejection itself
    (answering one with another could go round in circles)."""
    p = env.payload
    if isinstance(p, (WorkloadRejected, QueueRejected)):
        return []
    reason = (f"muster could not handle this object and set the event aside ({error}); check the object for "
              "values out of the ordinary and apply it again, and report the error if it looks right")
    if isinstance(p, ObjectChanged):
        return _object_rejections(p, reason)
    if isinstance(p, (WorkloadSubmitted, WorkloadUpdated)):
        return [WorkloadRejected(key=p.workload.key, kind=p.workload.kind, reason=reason)]
    if isinstance(p, QueueDefined):
        return [QueueRejected(name=p.queue.name, kind=p.queue.kind, reason=reason)]
    if isinstance(p, QueueRemoved):
        return []  # the queue is gone: nothing left to write a rejection onto
    key, kind = getattr(p, "key", None), getattr(p, "kind", None) or _workload_kind(p)
    if isinstance(key, str) and isinstance(kind, str) and kind:
        return [WorkloadRejected(key=key, kind=kind, reason=reason)]
    return []


def _workload_kind(p: Any) -> str | None:
    spec = getattr(p, "workload", None)
    kind = getattr(spec, "kind", None)
    return kind if isinstance(kind, str) else None


def _object_rejections(p: ObjectChanged, reason: str) -> list[Any]:
    if p.change == "Deleted":
        return []  # the object is gone: the failure is dead-lettered, nothing to write onto
    namespace = watched_namespace(p.namespace, p.object)
    if p.kind in WORKLOAD_KINDS:
        return [WorkloadRejected(key=f"{namespace}/{p.name}", kind=p.kind, reason=reason)]
    if p.kind in QUEUE_KINDS:
        return [QueueRejected(name=p.name, kind=p.kind, reason=reason, object_namespace=p.namespace,
                              object_name=p.name if p.namespace else "")]
    if p.kind == "Pod":
        group = _group(p.object)
        if group is not None:
            return [WorkloadRejected(key=f"{namespace}/{group}", kind="PodGroup", reason=reason)]
    return []


def _group(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(labels, Mapping):
        return None
    for label in GROUP_LABELS:
        value = labels.get(label)
        if isinstance(value, str) and value:
            return value
    return None
