"""Which RayJob a pod serves, found at the edge: real KubeRay does not say so on the pod.

KubeRay labels every pod it makes with its RayCluster alone (``labelPod`` in
ray-operator/controllers/ray/common/pod.go: ``ray.io/cluster``, node type, group); a RayJob's own
RayCluster is named ``<rayjob>-<5 random characters>`` and carries the ``ray.io/originated-from-*``
labels and the RayJob as its controller (``constructRayClusterForRayJob``), and its submitter is a
batch/v1 Job named as the RayJob (``createNewK8sJob``) whose pods the Job controller labels with
``batch.kubernetes.io/job-name``. KAI's pod-grouper climbs the same owner chain to a pod's top owner
with a client that reads the API server (``GetPodOwners`` in pkg/podgrouper/pod_controller.go; the
RayJob plugin then names the cluster from ``status.rayClusterName``) and annotates the pod with its
PodGroup. muster climbs it once, here, and writes what it found on the pod as labels of its own
(``kube.OWNER_JOB``, ``kube.SUBMITTER_LABEL``) before the event is logged, so that every core, the
history store, the traces and a replay read the same answer from the log, with no write to the pod.

``Owners`` learns RayClusters and RayJobs from the watch itself. A pod whose RayCluster (or whose
Job's RayJob) it has not seen — the watches of different resources are not ordered, a restarted link
lists pods before clusters — names the object to ``look up``: the caller asks the API server (or
the simulated one) and hands the answer to ``learn``, an absent object included. What it learned of a
deleted object is kept for ``remembered`` deletions, as the deletion events of its pods follow it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Mapping

from shared.kernel import kube

Key = tuple[str, str, str]
"""(kind, namespace, name) of a RayCluster or RayJob to look up."""


class Owners:
    """RayCluster -> its RayJob, RayJob names that exist; pods stamped from them (see the module)."""

    def __init__(self, remembered: int = 4096) -> None:
        self.remembered = remembered
        self._clusters: dict[tuple[str, str], str] = {}
        """(namespace, RayCluster) -> the RayJob it was made for, "" for a RayCluster of its own."""
        self._jobs: dict[tuple[str, str], bool] = {}
        """(namespace, name) -> whether a RayJob of that name exists (or existed: see ``_gone``)."""
        self._gone: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        """Entries of objects deleted or absent, oldest first: forgotten past ``remembered``."""
        self.lookups = 0

    # ------------------------------------------------------------------ what the watch shows
    def stamped(self, change: str, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        """``obj`` as ingest should read it: a RayCluster or RayJob is learned from; a pod gets the
        owner labels (a new mapping when they change, ``obj`` itself otherwise)."""
        kind = obj.get("kind")
        if kind == "Pod":
            return self._stamp(obj)
        if kind == "RayCluster":
            self._note("RayCluster", obj, kube.rayjob_of_cluster(obj), change == "Deleted")
        elif kind == "RayJob":
            self._note("RayJob", obj, True, change == "Deleted")
        return obj

    def look_up(self, obj: Mapping[str, Any]) -> Key | None:
        """The object a pod's owner depends on that has not been seen yet, or None."""
        key = _named(obj) if obj.get("kind") == "Pod" else None
        return key if key is not None and key[1:] not in self._table(key[0]) else None

    def learn(self, key: Key, found: Mapping[str, Any] | None) -> None:
        """What the API server answered for ``key`` (None: no such object)."""
        self.lookups += 1
        kind, namespace, name = key
        if found is not None:
            self.stamped("Added", found)
        else:  # no such object: a cluster of nobody's RayJob, or a Job that is no RayJob's
            self._set(kind, namespace, name, "" if kind == "RayCluster" else False, gone=True)

    # ------------------------------------------------------------------ internals
    def _note(self, kind: str, obj: Mapping[str, Any], value: Any, deleted: bool) -> None:
        m = kube.meta(obj)
        name = m.get("name")
        if isinstance(name, str) and name:
            self._set(kind, str(m.get("namespace") or "default"), name, value, gone=deleted)

    def _set(self, kind: str, namespace: str, name: str, value: Any, *, gone: bool) -> None:
        self._table(kind)[(namespace, name)] = value
        mark = (kind, namespace, name)
        self._gone.pop(mark, None)
        if not gone:
            return
        self._gone[mark] = None
        while len(self._gone) > self.remembered:
            (old_kind, old_ns, old_name), _ = self._gone.popitem(last=False)
            self._table(old_kind).pop((old_ns, old_name), None)

    def _table(self, kind: str) -> dict[tuple[str, str], Any]:
        return self._clusters if kind == "RayCluster" else self._jobs

    def _stamp(self, pod: Mapping[str, Any]) -> Mapping[str, Any]:
        labels = kube.labels(pod)
        key = _named(pod)
        wanted: dict[str, str] = {}
        if key is not None and key[0] == "RayCluster":
            job = self._clusters.get(key[1:])
            if job:
                wanted[kube.OWNER_JOB] = job
        elif key is not None and self._jobs.get(key[1:]):
            wanted = {kube.OWNER_JOB: key[2], kube.SUBMITTER_LABEL: kube.SUBMITTER}
        if all(labels.get(k) == wanted.get(k) for k in kube.OWNED_LABELS):
            return pod
        new_labels = {k: v for k, v in labels.items() if k not in kube.OWNED_LABELS}
        new_labels.update(wanted)
        return {**pod, "metadata": {**kube.meta(pod), "labels": new_labels}}


def _named(pod: Mapping[str, Any]) -> Key | None:
    """What a pod's owner is read from: its RayCluster (``ray.io/cluster``), else the RayJob named as the
    Job that controls it (a RayJob's submitter Job shares its name), else nothing."""
    namespace = str(kube.meta(pod).get("namespace") or "default")
    cluster = kube.labels(pod).get(kube.RAY_CLUSTER)
    if isinstance(cluster, str) and cluster:
        return "RayCluster", namespace, cluster
    owner = kube.controller_of(pod)
    return ("RayJob", namespace, owner[1]) if owner is not None and owner[0] == "Job" else None
