"""The Kubernetes resources muster reads and writes: which API path holds each kind.

Pure data, shared by the watcher (what to list and watch) and the applier (where an effect's
object lives). A kind may live in more than one API group (Volcano's and KAI's ``Queue``, two
coscheduling ``PodGroup`` groups): the applier tries them in the order given here. An effect with
``kind=""`` means "the workload of that namespace/name" and resolves to RayJob, then RayCluster
(see ``services.reconciler.core``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resource:
    kind: str
    group: str
    """``""`` for the core API (``/api/v1``)."""
    version: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The REST path of the collection (across namespaces when ``namespace`` is None) or one object."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name is not None else base


NODE = Resource("Node", "", "v1", "nodes", namespaced=False)
POD = Resource("Pod", "", "v1", "pods", namespaced=True)
PRIORITY_CLASS = Resource("PriorityClass", "scheduling.k8s.io", "v1", "priorityclasses", namespaced=False)
RAY_JOB = Resource("RayJob", "ray.io", "v1", "rayjobs", namespaced=True)
RAY_CLUSTER = Resource("RayCluster", "ray.io", "v1", "rayclusters", namespaced=True)
VOLCANO_QUEUE = Resource("Queue", "scheduling.volcano.sh", "v1beta1", "queues", namespaced=False)
KAI_QUEUE = Resource("Queue", "scheduling.run.ai", "v2", "queues", namespaced=False)
ELASTIC_QUOTA_TREE = Resource("ElasticQuotaTree", "scheduling.sigs.k8s.io", "v1beta1", "elasticquotatrees",
                              namespaced=True)
POD_GROUP = Resource("PodGroup", "scheduling.x-k8s.io", "v1alpha1", "podgroups", namespaced=True)
POD_GROUP_LEGACY = Resource("PodGroup", "scheduling.sigs.k8s.io", "v1alpha1", "podgroups", namespaced=True)
VOLCANO_POD_GROUP = Resource("PodGroup", "scheduling.volcano.sh", "v1beta1", "podgroups", namespaced=True)

WATCHED: tuple[Resource, ...] = (
    NODE, PRIORITY_CLASS, VOLCANO_QUEUE, KAI_QUEUE, ELASTIC_QUOTA_TREE,
    RAY_CLUSTER, RAY_JOB, POD_GROUP, POD_GROUP_LEGACY, VOLCANO_POD_GROUP, POD,
)
"""Everything admission and placement read (``shared.topology``: ADMISSION_KINDS, PLACEMENT_KINDS).
Queues and priorities come first so a restarted watcher tells admission about queues before the
workloads that name them (order across resources is otherwise not guaranteed)."""

WORKLOAD_KINDS = (RAY_JOB, RAY_CLUSTER)


def candidates(kind: str) -> tuple[Resource, ...]:
    """Where an object of ``kind`` may live, in the order to try; empty for a kind muster never writes."""
    if kind == "":
        return WORKLOAD_KINDS
    return tuple(r for r in (*WATCHED,) if r.kind == kind)
