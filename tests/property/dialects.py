"""The dialect invariants of issue 11, judged from the event log and the manifests alone.

- ``protected``: a pod no dialect lets anyone evict: ``volcano.sh/preemptable: "false"`` (annotation,
  else label) on the workload, one of its pod templates or the pod itself (in a Volcano queue, for an
  elastic pod, only the workload, its own pod set's template and itself count: Volcano reads the
  opt-out per pod); KAI's non-preemptible
  (priority 100 and above in a KAI queue, unless ``kai.scheduler/preemptibility: preemptible``; or that
  label saying ``non-preemptible``).
- ``starving``: a waiting workload muster could start by evicting one running gang under its queue's
  rules, yet has not for longer than ``GRACE``. Two rules:
  * Volcano in-queue: a lower-priority, preemptible gang of the same Volcano queue whose nodes (with
    what is free) hold the whole waiting gang and whose quota keeps the queue within its capability;
  * guarantees: the waiting workload fits its queue's guarantee (the queue is below it) while another
    queue is above its own guarantee on a resource that is short, and one of that queue's running,
    preemptible gangs would make room (nodes and every limit of the waiting queue's chain) without
    taking its queue below its guarantee (KAI may take it below). Judged only where the guarantees
    can all be delivered at once (no level promises more than its parent or the cluster has).
  A gang "makes room" when one node, with the gang's pods gone, holds the whole waiting gang: then
  any pod-by-pod placement succeeds, so muster's placement heuristics cannot be the reason it waits.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from shared.kernel import kube
from shared.kernel import quantity as q
from shared.kernel.model import UNLIMITED, QueueSpec

GRACE = 62.0
"""The longest backoff (60 s) plus a retry: muster must have acted by then (no minimum runtime here)."""
PREEMPTABLE = "volcano.sh/preemptable"
KAI_LABEL = "kai.scheduler/preemptibility"
SHAPE = (q.CPU, q.MEMORY, q.GPU)


def _pinned_meta(meta: object) -> bool:
    """Volcano's reading: the annotation, else the label; anything but true-ish pins (``strconv.ParseBool``)."""
    if not isinstance(meta, Mapping):
        return False
    for part in ("annotations", "labels"):
        values = meta.get(part)
        if isinstance(values, Mapping) and PREEMPTABLE in values:
            return str(values[PREEMPTABLE]) not in ("1", "t", "T", "TRUE", "true", "True")
    return False


def _templates(obj: Mapping[str, Any]) -> Iterable[object]:
    spec = obj.get("spec") or {}
    cluster = spec.get("rayClusterSpec", spec) if obj.get("kind") == "RayJob" else spec
    yield (spec.get("submitterPodTemplate") or {}).get("metadata")
    yield ((cluster.get("headGroupSpec") or {}).get("template") or {}).get("metadata")
    for group in cluster.get("workerGroupSpecs") or []:
        yield (group.get("template") or {}).get("metadata")


def _template_of(obj: Mapping[str, Any], pod_set: str) -> object:
    spec = obj.get("spec") or {}
    if pod_set == "submitter":
        return (spec.get("submitterPodTemplate") or {}).get("metadata")
    cluster = spec.get("rayClusterSpec", spec) if obj.get("kind") == "RayJob" else spec
    if pod_set == "head":
        return ((cluster.get("headGroupSpec") or {}).get("template") or {}).get("metadata")
    for group in cluster.get("workerGroupSpecs") or []:
        if group.get("groupName") == pod_set:
            return (group.get("template") or {}).get("metadata")
    return None


def protected(view: Any, manifest: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]],
              queue: QueueSpec | None, pod_set: str | None = None) -> str | None:
    """Why no dialect lets anyone evict this workload (None: it may be evicted); ``pod_set``: only the
    elastic ``pods`` of that pod set are evicted."""
    per_pod = pod_set is not None and queue is not None and queue.dialect == "volcano"
    if per_pod and manifest:
        metas = [manifest.get("metadata"), _template_of(manifest, pod_set or "")]
    else:
        metas = [manifest.get("metadata")] + list(_templates(manifest)) if manifest else []
    metas += [pod.get("metadata") for pod in pods]
    if any(_pinned_meta(meta) for meta in metas):
        return f"{PREEMPTABLE}: \"false\""
    labels = kube.labels(manifest) if manifest else next((kube.labels(p) for p in pods), {})
    if labels.get(KAI_LABEL) == "non-preemptible":
        return f"{KAI_LABEL}: non-preemptible"
    if queue is not None and queue.dialect == "kai" and view.priority >= 100 and labels.get(KAI_LABEL) != "preemptible":
        return f"priority {view.priority} in KAI queue {queue.name}"
    return None


class Cluster:
    """Per node: what is free, and what each running gang holds there (bound pods only)."""

    def __init__(self, nodes: Mapping[str, Mapping[str, int]], pods: Mapping[str, Mapping[str, Any]],
                 gpu: Mapping[str, Any], kind_of: Any) -> None:
        self.free: dict[str, dict[str, int]] = {n: {r: alloc.get(r, 0) for r in SHAPE} for n, alloc in nodes.items()}
        self.held: dict[tuple[str, str], dict[str, dict[str, int]]] = {}
        self.shared: dict[tuple[str, int], set[tuple[str, str]]] = {}
        """GPU devices carrying fractions, and the gangs whose pods use them."""
        for name, pod in pods.items():
            node = (pod.get("spec") or {}).get("nodeName")
            if node not in self.free:
                continue
            req = kube.effective_requests(pod["spec"])
            owner = (kind_of(pod), kube.workload_key_of_pod(pod) or name)
            for r in SHAPE:
                self.free[node][r] -= req.get(r, 0)
            mine = self.held.setdefault(owner, {}).setdefault(node, {r: 0 for r in SHAPE})
            for r in SHAPE:
                mine[r] += req.get(r, 0)
            share = gpu.get(name)
            if share is not None and share.fraction < 1:
                for d in share.devices:
                    self.shared.setdefault((node, d), set()).add(owner)
        for (node, _), users in self.shared.items():
            self.free[node][q.GPU] -= 1000

    def reserve(self, by_node: Mapping[str, Mapping[str, int]]) -> None:
        """Slots placement reserved that no bound pod fills yet."""
        for node, amounts in by_node.items():
            if node in self.free:
                for r in SHAPE:
                    self.free[node][r] -= amounts.get(r, 0)

    def room_without(self, owner: tuple[str, str], need: Mapping[str, int]) -> bool:
        """One node holds all of ``need`` once ``owner``'s pods are gone."""
        for node, free in self.free.items():
            held = self.held.get(owner, {}).get(node, {})
            devices = sum(1000 for (n, _), users in self.shared.items() if n == node and users == {owner})
            room = {r: free[r] + held.get(r, 0) for r in SHAPE}
            room[q.GPU] += devices
            if all(need.get(r, 0) <= room[r] for r in SHAPE):
                return True
        return False


def _guarantee(spec: QueueSpec | None, r: str) -> int | None:
    """None: unlimited (KAI -1); a missing entry is 0."""
    if spec is None:
        return 0
    value = spec.guarantee.get(r, 0)
    return None if value == UNLIMITED else value


def deliverable(queues: Mapping[str, QueueSpec], r: str, capacity: int) -> bool:
    """Every level promises no more of ``r`` than its parent (or the cluster) has to give."""
    children: dict[str | None, list[QueueSpec]] = {}
    for spec in queues.values():
        parent = spec.parent if spec.parent in queues else None
        children.setdefault(parent, []).append(spec)

    def promised(spec: QueueSpec) -> int | None:
        own = _guarantee(spec, r)
        kids = children.get(spec.name, [])
        if not kids:
            return own
        inner = [promised(k) for k in kids]
        if any(v is None for v in inner):
            return None
        total = sum(v for v in inner if v is not None)
        if own is not None and total > own:
            return None
        limit = spec.limit.get(r)
        if limit is not None and limit != UNLIMITED and total > limit:
            return None
        return own if own is not None else total

    top = [promised(s) for s in children.get(None, [])]
    return all(v is not None for v in top) and sum(v for v in top if v is not None) <= capacity


def chain(queues: Mapping[str, QueueSpec], name: str) -> list[QueueSpec]:
    out: list[QueueSpec] = []
    while name in queues and all(s.name != name for s in out):
        out.append(queues[name])
        name = queues[name].parent or ""
    return out


def fits_limits(levels: list[QueueSpec], usage: Mapping[str, Mapping[str, int]], demand: Mapping[str, int],
                freed: Mapping[str, int], freed_under: set[str]) -> bool:
    for spec in levels:
        used = usage.get(spec.name, {})
        for r, v in demand.items():
            limit = spec.limit.get(r)
            if v <= 0 or limit is None or limit == UNLIMITED:
                continue
            back = freed.get(r, 0) if spec.name in freed_under else 0
            if used.get(r, 0) - back + v > limit:
                return False
    return True
