"""The Kubernetes resources muster reads and writes: which API path holds each kind.

Pure data, shared by the watcher (what to list and watch) and the applier (where an effect's
object lives). A kind may live in more than one API group (Volcano's and KAI's ``Queue``, two
coscheduling ``PodGroup`` groups): the applier tries them in the order given here. An effect with
``kind=""`` means "the workload of that namespace/name" and resolves to RayJob, then RayCluster
(see ``services.reconciler.core``).
"""

from __future__ import annotations

import functools
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
PERSISTENT_VOLUME_CLAIM = Resource("PersistentVolumeClaim", "", "v1", "persistentvolumeclaims", namespaced=True)
PERSISTENT_VOLUME = Resource("PersistentVolume", "", "v1", "persistentvolumes", namespaced=False)
STORAGE_CLASS = Resource("StorageClass", "storage.k8s.io", "v1", "storageclasses", namespaced=False)
PRIORITY_CLASS = Resource("PriorityClass", "scheduling.k8s.io", "v1", "priorityclasses", namespaced=False)
RUNTIME_CLASS = Resource("RuntimeClass", "node.k8s.io", "v1", "runtimeclasses", namespaced=False)
RAY_JOB = Resource("RayJob", "ray.io", "v1", "rayjobs", namespaced=True)
RAY_CLUSTER = Resource("RayCluster", "ray.io", "v1", "rayclusters", namespaced=True)
VOLCANO_QUEUE = Resource("Queue", "scheduling.volcano.sh", "v1beta1", "queues", namespaced=False)
KAI_QUEUE = Resource("Queue", "scheduling.run.ai", "v2", "queues", namespaced=False)
ELASTIC_QUOTA_TREE = Resource("ElasticQuotaTree", "scheduling.sigs.k8s.io", "v1beta1", "elasticquotatrees",
                              namespaced=True)
POD_GROUP = Resource("PodGroup", "scheduling.x-k8s.io", "v1alpha1", "podgroups", namespaced=True)
POD_GROUP_LEGACY = Resource("PodGroup", "scheduling.sigs.k8s.io", "v1alpha1", "podgroups", namespaced=True)
VOLCANO_POD_GROUP = Resource("PodGroup", "scheduling.volcano.sh", "v1beta1", "podgroups", namespaced=True)

LEASE = Resource("Lease", "coordination.k8s.io", "v1", "leases", namespaced=True)
"""The lock that makes one ``muster run cluster`` the applier (``shared.kubernetes.lease``)."""
EVENT = Resource("Event", "", "v1", "events", namespaced=True)

WATCHED: tuple[Resource, ...] = (
    NODE, STORAGE_CLASS, PERSISTENT_VOLUME, PERSISTENT_VOLUME_CLAIM, PRIORITY_CLASS, RUNTIME_CLASS, VOLCANO_QUEUE, KAI_QUEUE,
    ELASTIC_QUOTA_TREE, RAY_CLUSTER, RAY_JOB, POD_GROUP, POD_GROUP_LEGACY, VOLCANO_POD_GROUP, POD,
)
"""Everything admission and placement read (``shared.kernel.topology``: ADMISSION_KINDS, PLACEMENT_KINDS).
Queues, priorities and RuntimeClasses come first so a restarted watcher tells admission about them
before the workloads that name them, and storage before the workloads whose pods mount it (order across
resources is otherwise not guaranteed)."""

WORKLOAD_KINDS = (RAY_JOB, RAY_CLUSTER)

WRITTEN_ONLY: tuple[Resource, ...] = ()
"""Resources muster writes without watching them (none now: the Volcano PodGroups whose status it
writes are watched too, admission reads the ones KubeRay makes)."""


@functools.cache  # a handful of kinds, asked for on every write
def candidates(kind: str) -> tuple[Resource, ...]:
    """Where an object of ``kind`` may live, in the order to try; empty for a kind muster never writes."""
    if kind == "":
        return WORKLOAD_KINDS
    return tuple(r for r in (*WATCHED, *WRITTEN_ONLY) if r.kind == kind)


@functools.cache
def located(kind: str, api_version: str = "") -> tuple[Resource, ...]:
    """``candidates``, narrowed to one API group and version when the effect names it."""
    found = candidates(kind)
    return tuple(r for r in found if r.api_version == api_version) if api_version else found


@dataclass(frozen=True)
class Access:
    """One permission ``muster run cluster`` needs, and the call that needs it: the RBAC in
    deploy/k8s/base/rbac.yaml is exactly these (tests/integration/test_deploy.py checks it)."""

    resource: Resource
    verbs: tuple[str, ...]
    why: str
    subresource: str = ""

    @property
    def rule_resource(self) -> str:
        return f"{self.resource.plural}/{self.subresource}" if self.subresource else self.resource.plural


def access() -> tuple[Access, ...]:
    """Every permission the cluster adapter uses (``kubeapi``, ``lease``), with its reason."""
    watched = [Access(r, ("list", "watch"), "Watcher: list, then watch from the list's version") for r in WATCHED]
    return (*watched,
            Access(POD, ("get",), "KubeApplier: read a pod before evicting it, and after a 409 on its binding"),
            Access(POD, ("create",), "KubeApplier: bind (POST pods/NAME/binding)", "binding"),
            Access(POD, ("create",), "KubeApplier: evict (POST pods/NAME/eviction)", "eviction"),
            Access(PERSISTENT_VOLUME_CLAIM, ("get", "patch"), "KubeApplier: before a bind, read the pod's "
                   "WaitForFirstConsumer claims and write volume.kubernetes.io/selected-node on them"),
            *(Access(r, ("get",), "Watcher: a pod's RayCluster or RayJob the watch has not shown yet "
                                  "(services/reconciler/owners.py)") for r in (RAY_CLUSTER, RAY_JOB)),
            Access(RAY_JOB, ("patch",), "KubeApplier: spec.suspend and muster.dev/* annotations"),
            Access(RAY_CLUSTER, ("patch",), "KubeApplier: spec.suspend and muster.dev/* annotations"),
            *(Access(r, ("patch",), "KubeApplier: annotate a refused queue definition; status where the CRD "
                                    "has no status subresource") for r in (VOLCANO_QUEUE, KAI_QUEUE, ELASTIC_QUOTA_TREE)),
            *(Access(r, ("patch",), "KubeApplier: queue status (services/reconciler/status.py)", "status")
              for r in (VOLCANO_QUEUE, KAI_QUEUE, ELASTIC_QUOTA_TREE)),
            Access(VOLCANO_POD_GROUP, ("patch",), "KubeApplier: a Volcano gang's PodGroup phase and conditions "
                                                  "(Volcano's CRD has no status subresource: status is a field)"),
            Access(EVENT, ("create",), "KubeApplier: an Event named after its effect"),
            Access(LEASE, ("get", "create", "update"), "LeaseElector: read, create and renew the one-applier Lease"))
