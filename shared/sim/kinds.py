"""Which kinds the simulated API server serves: a typo is refused, an unknown API group reported.

A real API server refuses a manifest whose kind it does not serve ("no matches for kind ..."). The
simulated one serves Kubernetes' own groups and the CRDs muster reads; a kind missing from one of
those groups (``RayClustr`` in ``ray.io/v1``) or a version the group does not have is surely a
mistake, and the scenario is refused with the closest names. A kind of an API group it does not know
at all (another operator's CRD) is kept, as before, but reported: it plays no part in the run.
"""

from __future__ import annotations

import difflib
from typing import Any, Mapping

SERVED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # group: (versions, kinds)
    "": (("v1",), ("Pod", "Node", "Namespace", "ConfigMap", "Secret", "Service", "ServiceAccount", "Endpoints",
                   "Event", "LimitRange", "ResourceQuota", "PersistentVolume", "PersistentVolumeClaim",
                   "ReplicationController", "PodTemplate", "Binding", "ComponentStatus")),
    "apps": (("v1",), ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "ControllerRevision")),
    "batch": (("v1",), ("Job", "CronJob")),
    "policy": (("v1",), ("PodDisruptionBudget", "Eviction")),
    "rbac.authorization.k8s.io": (("v1",), ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")),
    "networking.k8s.io": (("v1",), ("NetworkPolicy", "Ingress", "IngressClass")),
    "storage.k8s.io": (("v1",), ("StorageClass", "CSIDriver", "CSINode", "VolumeAttachment", "CSIStorageCapacity")),
    "coordination.k8s.io": (("v1",), ("Lease",)),
    "apiextensions.k8s.io": (("v1",), ("CustomResourceDefinition",)),
    "autoscaling": (("v1", "v2"), ("HorizontalPodAutoscaler",)),
    "node.k8s.io": (("v1",), ("RuntimeClass",)),
    "discovery.k8s.io": (("v1",), ("EndpointSlice",)),
    "events.k8s.io": (("v1",), ("Event",)),
    "scheduling.k8s.io": (("v1",), ("PriorityClass",)),
    # the CRDs muster reads (deploy/k8s/crds for clusters that lack them) and KubeRay's own
    "ray.io": (("v1", "v1alpha1"), ("RayCluster", "RayJob", "RayService")),
    "scheduling.volcano.sh": (("v1beta1",), ("Queue", "PodGroup")),
    "scheduling.run.ai": (("v2", "v2alpha2"), ("Queue", "PodGroup")),
    "scheduling.sigs.k8s.io": (("v1alpha1", "v1beta1"), ("ElasticQuotaTree", "ElasticQuota", "PodGroup")),
    "scheduling.x-k8s.io": (("v1alpha1",), ("PodGroup", "ElasticQuota")),
}


class UnknownKind(ValueError):
    """A kind or version a served API group does not have."""


def check(obj: Mapping[str, Any]) -> str | None:
    """None for a served kind; a note for a kind of an API group the simulated cluster does not know;
    ``UnknownKind`` for a kind or version missing from a group it serves."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not api_version or not isinstance(kind, str) or not kind:
        return None  # the API server's own validation names what is missing
    group, _, version = api_version.rpartition("/")
    served = SERVED.get(group)
    if served is None:
        return f"{api_version} {kind} is not served by the simulated cluster (no such API group): ignored"
    versions, kinds = served
    if kind not in kinds:
        close = difflib.get_close_matches(kind, kinds, n=1, cutoff=0.6) or \
            [k for k in kinds if k.lower() == kind.lower()]
        hint = f"; did you mean {close[0]}?" if close else f" (it serves {', '.join(kinds)})"
        raise UnknownKind(f"no kind {kind!r} in {group or 'the core API'}{hint}")
    if version not in versions:
        raise UnknownKind(f"no version {version!r} of {group or 'the core API'} for {kind} "
                          f"(served: {', '.join(f'{group}/{v}' if group else v for v in versions)})")
    return None
