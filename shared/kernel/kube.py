"""Kubernetes object conventions shared by admission, placement and the simulated cluster.

Pure helpers over plain dicts as the API server returns them: labels KubeRay puts on pods, the
pod-resource arithmetic Kubernetes and KubeRay use, and how a pod maps back to its workload.
"""

import copy
from collections.abc import Mapping as AbcMapping
from typing import Any, Mapping

from shared.kernel import quantity as q
from shared.kernel.validation import quoted

# Labels KubeRay writes on the pods it creates.
RAY_CLUSTER = "ray.io/cluster"
RAY_NODE_TYPE = "ray.io/node-type"          # head | worker
RAY_GROUP = "ray.io/group"                  # worker group name ("headgroup" for the head)
RAY_ORIGIN_KIND = "ray.io/originated-from-crd"      # on a RayJob's RayCluster (and Job): RayJob
RAY_ORIGIN_NAME = "ray.io/originated-from-cr-name"  # ... and the RayJob's name
JOB_NAME = "batch.kubernetes.io/job-name"           # on a Job's pods (a RayJob's submitter is a Job)

# Labels ingest writes on a pod (``services.reconciler.owners``), never the cluster: real KubeRay labels
# a pod with its RayCluster only, so which RayJob a pod serves is found from the RayCluster or Job it
# belongs to. Any value a pod arrives with is replaced.
OWNER_JOB = "muster.dev/rayjob"             # the RayJob whose cluster (or submitter) the pod is
SUBMITTER_LABEL = "muster.dev/pod-set"      # SUBMITTER on a RayJob's submitter pod
SUBMITTER = "submitter"                     # the pod set of a RayJob's submitter
OWNED_LABELS = (OWNER_JOB, SUBMITTER_LABEL)

# Plain pod gangs (coscheduling labels; Volcano's annotations).
POD_GROUP_X = "scheduling.x-k8s.io/pod-group"
POD_GROUP_NAME = "pod-group.scheduling.sigs.k8s.io/name"
POD_GROUP_MIN = "pod-group.scheduling.sigs.k8s.io/min-available"
VOLCANO_GROUP = "scheduling.k8s.io/group-name"
"""Volcano's pod annotation naming its PodGroup (KubeRay's volcano batch scheduler writes it too)."""
VOLCANO_TASK = "volcano.sh/task-spec"
"""Volcano's pod annotation naming its task (role): a PodGroup's ``minTaskMember`` counts per task."""

GPU_FRACTION = "gpu-fraction"
GPU_DEVICES = "muster.dev/gpu-devices"
"""The devices muster bound a GPU pod to (its own annotation, written by the reconciler)."""

REFUSED = "muster.dev/ingest-refused"
"""Annotation ingest puts on an object it reduced to its identity (``services.reconciler.ingest``):
why the object cannot be taken. Admission rejects the workload or queue with it."""

DEFAULT_SCHEDULER = "default-scheduler"
"""What the API server writes into a pod's ``spec.schedulerName`` when the pod names none."""


def mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else empty: objects from users may have any shape."""
    if type(value) is dict:  # the common case, checked first: this sits on every pod event's path
        return value
    return value if value is not None and isinstance(value, AbcMapping) else {}  # None: no ABC frame


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping(mapping(obj).get("metadata"))


def labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return mapping(meta(obj).get("labels"))


def annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return mapping(meta(obj).get("annotations"))


def refused(obj: Mapping[str, Any]) -> str | None:
    """Why ingest refused ``obj`` (``REFUSED``), or None. Asked of every watch event a core reads,
    so the usual shape (plain dicts all the way) is read without a call per level."""
    meta = obj.get("metadata") if type(obj) is dict else mapping(obj).get("metadata")
    notes = meta.get("annotations") if type(meta) is dict else mapping(meta).get("annotations")
    reason = notes.get(REFUSED) if type(notes) is dict else mapping(notes).get(REFUSED)
    return reason if isinstance(reason, str) else None


def ray_labelled(pod_labels: Mapping[str, Any]) -> bool:
    """Labels of a pod KubeRay made (head, worker or a RayJob's submitter: any of its labels says so)."""
    return bool(pod_labels.get(RAY_NODE_TYPE) or pod_labels.get(RAY_CLUSTER) or pod_labels.get(OWNER_JOB)
                or pod_labels.get(RAY_ORIGIN_KIND))


def is_ray_pod(pod: Mapping[str, Any]) -> bool:
    """A pod KubeRay made: its RayCluster or RayJob is the workload (``ray_labelled``). Asked of every
    pod watch event admission reads, so plain dicts are read without a call per level."""
    meta = pod.get("metadata") if type(pod) is dict else mapping(pod).get("metadata")
    pod_labels = meta.get("labels") if type(meta) is dict else mapping(meta).get("labels")
    return ray_labelled(pod_labels if type(pod_labels) is dict else mapping(pod_labels))


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge key by key, ``None`` removes, anything else replaces
    (what the API server does with ``application/merge-patch+json``)."""
    if not isinstance(patch, AbcMapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, AbcMapping) else {}
    for name, value in patch.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = merge_patch(out.get(name), value)
    return out


def key(obj: Mapping[str, Any]) -> str:
    m = meta(obj)
    return f"{m.get('namespace') or 'default'}/{m.get('name', '')}"


def container_requests(container: Mapping[str, Any], where: str) -> q.Resources:
    """A container's requests with limits filling any missing request (as the API server defaults)."""
    res = container.get("resources") or {}
    if type(res) is not dict and not isinstance(res, AbcMapping):  # dict first: no ABC frame
        raise q.QuantityError(f"{where}.resources must be a mapping")
    requests = q.parse_resources(res.get("requests"), where=f"{where}.resources.requests")
    limits = q.parse_resources(res.get("limits"), where=f"{where}.resources.limits")
    for name, value in limits.items():
        requests.setdefault(name, value)
    return requests


def overcommit_allowed(name: str) -> bool:
    """Whether a container may request less of ``name`` than its limit: a native resource (no domain, or
    kubernetes.io's) other than hugepages (``helper.IsOvercommitAllowed``, pkg/apis/core/helper)."""
    return ("/" not in name or "kubernetes.io/" in name) and not name.startswith("hugepages-")


def requirements_problem(container: Mapping[str, Any], where: str) -> str | None:
    """What the API server refuses in a container's requests and limits, in its words, or None
    (``validateResourceRequirements``, pkg/apis/core/validation): a request of a resource that cannot
    be overcommitted (an extended one, ``nvidia.com/gpu``) with no limit or another limit, a request
    above its limit. Such a pod is never created: KubeRay's create fails and it tries again for ever."""
    res = mapping(container.get("resources"))
    try:
        requests = q.parse_resources(res.get("requests"), where=f"{where}.resources.requests")
        limits = q.parse_resources(res.get("limits"), where=f"{where}.resources.limits")
    except q.QuantityError:
        return None  # a quantity that does not parse: said where quantities are read
    for name, value in requests.items():
        if name not in limits:
            if not overcommit_allowed(name):
                return (f"{where}.resources.limits: Required value: Limit must be set for non overcommitable "
                        f"resources ({name} is requested)")
        elif value != limits[name] and not overcommit_allowed(name):
            return (f"{where}.resources.requests: Invalid value: must be equal to {name} limit of "
                    f"{q.format_quantity(name, limits[name])}")
        elif value > limits[name]:
            return (f"{where}.resources.requests: Invalid value: must be less than or equal to {name} limit "
                    f"of {q.format_quantity(name, limits[name])}")
    return None


def pod_spec_problem(pod_spec: Mapping[str, Any], where: str = "spec") -> str | None:
    """``requirements_problem`` of the first container (regular or init) the API server would refuse, or
    an ``overhead`` with no RuntimeClass to define it, which its RuntimeClass admission plugin refuses
    (``validateOverhead``, plugin/pkg/admission/runtimeclass/admission.go): a pod's overhead is its
    RuntimeClass's, set by the API server."""
    if pod_spec.get("overhead") and not pod_spec.get("runtimeClassName"):
        return f"{where}.overhead: pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead"
    for field in ("initContainers", "containers"):
        containers = pod_spec.get(field)
        for i, container in enumerate(containers if isinstance(containers, list) else []):
            if isinstance(container, AbcMapping):
                problem = requirements_problem(container, f"{where}.{field}[{i}]")
                if problem is not None:
                    return problem
    return None


def pod_requests(pod_spec: Mapping[str, Any], where: str = "spec") -> q.Resources:
    """Sum over regular containers (KubeRay's arithmetic); raises ``QuantityError`` naming the field."""
    total: q.Resources = {}
    for i, container in enumerate(pod_spec.get("containers") or []):
        name = container.get("name") or str(i)
        total = q.add(total, container_requests(container, f"{where}.containers[{name}]"))
    return {k: v for k, v in total.items() if v}


POD_LEVEL = (q.CPU, q.MEMORY)
"""What pod-level ``spec.resources`` may set (and ``hugepages-*``), which then stands for the containers'."""


def effective_requests(pod_spec: Mapping[str, Any], where: str = "spec") -> q.Resources:
    """What a pod asks of a node, as kube-scheduler counts it (``PodRequests`` of
    ``k8s.io/component-helpers/resource``): the regular containers and the restartable (sidecar) init
    containers add up; an ordinary init container runs alone beside the sidecars started before it, so
    the pod needs at least the largest of those; pod-level requests replace the containers' for cpu,
    memory and hugepages; ``spec.overhead`` (its RuntimeClass's) comes on top. Raises
    ``QuantityError`` naming the field."""
    total = pod_requests(pod_spec, where)
    sidecars: q.Resources = {}
    floor: q.Resources = {}
    for i, container in enumerate(pod_spec.get("initContainers") or []):
        name = container.get("name") or str(i)
        asks = container_requests(container, f"{where}.initContainers[{name}]")
        if container.get("restartPolicy") == "Always":
            total = q.add(total, asks)
            sidecars = q.add(sidecars, asks)
            asks = sidecars
        else:
            asks = q.add(asks, sidecars)
        floor = {r: max(floor.get(r, 0), asks.get(r, 0)) for r in {*floor, *asks}}
    total = {r: max(total.get(r, 0), floor.get(r, 0)) for r in {*total, *floor}}
    pod_level = pod_spec.get("resources")
    if isinstance(pod_level, AbcMapping) and pod_level.get("requests"):
        asked = q.parse_resources(pod_level.get("requests"), where=f"{where}.resources.requests")
        total.update({r: v for r, v in asked.items() if r in POD_LEVEL or r.startswith("hugepages-")})
    if pod_spec.get("overhead"):
        total = q.add(total, q.parse_resources(pod_spec.get("overhead"), where=f"{where}.overhead"))
    return {k: v for k, v in sorted(total.items()) if v}


AUTOSCALER_CONTAINER = "autoscaler"
AUTOSCALER_RESOURCES: dict[str, dict[str, str]] = {"requests": {"cpu": "500m", "memory": "512Mi"},
                                                  "limits": {"cpu": "500m", "memory": "512Mi"}}
"""What KubeRay gives the autoscaler container it adds to a head pod, unless ``autoscalerOptions.resources``
says otherwise (``BuildAutoscalerContainer``, ray-operator/controllers/ray/common/pod.go)."""


def autoscaler_container(cluster_spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """The container KubeRay adds to the head pod of a RayCluster with in-tree autoscaling, as far as
    scheduling reads it (its resources), or None: a head pod asks for its own containers and this one.
    ``autoscalerOptions.resources`` replaces the defaults whole (``mergeAutoscalerOverrides``)."""
    if cluster_spec.get("enableInTreeAutoscaling") is not True:
        return None
    options = cluster_spec.get("autoscalerOptions")
    resources = options.get("resources") if isinstance(options, AbcMapping) else None
    return {"name": AUTOSCALER_CONTAINER,
            "resources": resources if resources is not None else copy.deepcopy(AUTOSCALER_RESOURCES)}


def _origin(lab: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the RayJob or RayCluster a KubeRay pod's labels name: ingest's ``OWNER_JOB``, or
    the ``ray.io/originated-from-*`` pair the pods of logs recorded before ingest resolved owners carry."""
    job = lab.get(OWNER_JOB)
    if job:
        return "RayJob", str(job)
    origin, name = lab.get(RAY_ORIGIN_KIND), lab.get(RAY_ORIGIN_NAME)
    if origin in ("RayJob", "RayCluster") and name:
        return str(origin), str(name)
    return None


def workload_key_of_pod(pod: Mapping[str, Any]) -> str | None:
    """The ``namespace/name`` of the user's workload a pod belongs to, or None for unmanaged pods."""
    lab = labels(pod)
    ns = meta(pod).get("namespace") or "default"
    origin = _origin(lab)
    if origin is not None:
        return f"{ns}/{origin[1]}"
    if lab.get(RAY_CLUSTER):
        return f"{ns}/{lab[RAY_CLUSTER]}"
    group = pod_group_of(pod)
    if group:
        return f"{ns}/{group}"
    return None


def rayjob_of_cluster(cluster: Mapping[str, Any]) -> str:
    """The RayJob a RayCluster was made for (KubeRay's origin label, else its owner), "" if none."""
    m = meta(cluster)
    name = labels(cluster).get(RAY_ORIGIN_NAME) if labels(cluster).get(RAY_ORIGIN_KIND, "RayJob") == "RayJob" else None
    if isinstance(name, str) and name:
        return name
    owners = m.get("ownerReferences")
    for owner in owners if isinstance(owners, list) else []:
        job = owner.get("name") if isinstance(owner, AbcMapping) and owner.get("kind") == "RayJob" else None
        if isinstance(job, str):
            return job
    return ""


def controller_of(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the object's controlling owner (``ownerReferences[].controller``), if any."""
    owners = meta(obj).get("ownerReferences")
    for owner in owners if isinstance(owners, list) else []:
        if isinstance(owner, AbcMapping) and owner.get("controller") is True \
                and isinstance(owner.get("kind"), str) and isinstance(owner.get("name"), str):
            return owner["kind"], owner["name"]
    return None


def pod_group_of(pod: Mapping[str, Any]) -> str | None:
    """The plain pod group a (non-KubeRay) pod names: coscheduling's label, else Volcano's annotation."""
    lab = labels(pod)
    group = lab.get(POD_GROUP_X) or lab.get(POD_GROUP_NAME) or annotations(pod).get(VOLCANO_GROUP)
    return group if isinstance(group, str) and group else None


def workload_kind_of_pod(pod: Mapping[str, Any]) -> str | None:
    """Kind of the user's object the pod comes from (RayJob, RayCluster, PodGroup), None if unmanaged.

    Two objects of different kinds may share a name; their pods share ``workload_key_of_pod``.
    """
    lab = labels(pod)
    origin = _origin(lab)
    if origin is not None:
        return origin[0]
    if lab.get(RAY_CLUSTER):
        return "RayCluster"
    if pod_group_of(pod):
        return "PodGroup"
    return None


def pod_set_of_pod(pod: Mapping[str, Any]) -> str:
    """``head``, the worker group name, ``submitter``, or ``pods`` for a plain pod gang."""
    lab = labels(pod)
    if lab.get(SUBMITTER_LABEL):
        return lab[SUBMITTER_LABEL]
    if lab.get(RAY_NODE_TYPE) == "head":
        return "head"
    if lab.get(RAY_NODE_TYPE) == "worker":
        return lab.get(RAY_GROUP, "worker")
    return "pods"


def gpu_share(annotations_: Mapping[str, str], where: str) -> int:
    """``gpu-fraction`` annotation in thousandths of a device; 0 when absent. Raises on bad values.

    KAI takes a fraction strictly between 0 and 1 (``validateGpuFractionAnnotation``,
    ``pkg/binder/plugins/gpusharing/gpu-request/gpu_request_validator.go``): whole GPUs are asked with
    ``nvidia.com/gpu``. A ``"1"`` beside muster's own ``GPU_DEVICES`` is the mark an earlier muster
    wrote on a whole-GPU pod it bound, not a request: it reads as none."""
    raw = annotations_.get(GPU_FRACTION)
    if raw is None:
        return 0
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise q.QuantityError(f"{where}.annotations.{GPU_FRACTION}: {quoted(raw)} is not a number") from None
    if value == 1 and GPU_DEVICES in annotations_:
        return 0
    if not 0 < value < 1:
        raise q.QuantityError(f"{where}.annotations.{GPU_FRACTION}: {quoted(raw)} must be a number between 0 and 1 "
                              f"(whole GPUs are asked with nvidia.com/gpu)")
    share = round(value * 1000)
    if share == 0:
        raise q.QuantityError(f"{where}.annotations.{GPU_FRACTION}: {quoted(raw)} is below the smallest share, 0.001")
    return share


def short_hash(*parts: object, length: int = 5) -> str:
    """A deterministic stand-in for KubeRay's random 5-character suffixes."""
    import hashlib

    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    alphabet = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet of k8s.io/apimachinery rand.String
    n = int.from_bytes(digest, "big")
    out = []
    for _ in range(length):
        n, r = divmod(n, len(alphabet))
        out.append(alphabet[r])
    return "".join(out)


def rayjob_cluster_name(rayjob_name: str) -> str:
    """The RayCluster a RayJob creates (KubeRay appends a random suffix; ours is a hash)."""
    return f"{rayjob_name}-{short_hash('rayjob', rayjob_name)}"


def watched_namespace(event_namespace: str, obj: Mapping[str, Any]) -> str:
    """The namespace of a watched object as admission reads it (and a rejection names it): the watch
    event's, else the object's, else ``default``."""
    if event_namespace:
        return event_namespace
    meta = obj.get("metadata")
    namespace = meta.get("namespace") if type(meta) is dict or isinstance(meta, AbcMapping) else None
    return namespace if isinstance(namespace, str) and namespace else "default"
