"""Watch event -> ``ObjectChanged``: a pure translation, so replaying a watch log gives the same inbox.

Ingest is where an object from the cluster enters muster, and it keeps only what scheduling reads
(``kept``): identity, labels, the annotations of the schedulers muster speaks for, the scheduling
fields of pod templates (a container's ``ports`` only where they bind a ``hostPort``, a volume only
where it mounts a claim: its ``persistentVolumeClaim.claimName`` or its ephemeral claim template's
``storageClassName``), node capacity and taints, pod phase and node; of a PersistentVolumeClaim its
``volumeName``, ``storageClassName`` and phase, of a PersistentVolume its ``nodeAffinity`` and
``claimRef`` (namespace, name, uid), of a StorageClass its ``volumeBindingMode`` and
``allowedTopologies`` (placement's volume filter, ``services.placement.volumes``), and the
``volume.kubernetes.io/selected-node`` annotation and controller of a claim. Everything else a manifest
carries (container env values and commands, a RayJob's entrypoint and ``runtimeEnvYAML``,
``last-applied-configuration``, other annotations, managed fields) is dropped here, before anything
reaches Kafka, the history store or an export. An object muster cannot hold (a name the API server
would refuse, text that is not Unicode, nesting or size beyond ``shared.kernel.validation``'s bounds) is
reduced to its identity and marked ``REFUSED`` with the reason, which admission reports as a Rejected.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Callable, Literal, get_args

from shared.kernel import gpumemory, kube
from shared.kernel.events import SCHEMA_VERSION, Envelope, ObjectChanged, ObjectsListed, derive_id
from shared.kernel.fastmodel import built
from shared.kernel.kube import REFUSED, meta
from shared.kernel.validation import (MAX_BYTES, dns1123_subdomain, label_value, object_problem, pod_text_problem,
                                     tree_problem)

Change = Literal["Added", "Modified", "Deleted"]

ANNOTATION_PREFIXES = (
    "muster.dev/", "ray.io/", "volcano.sh/", "scheduling.volcano.sh/", "scheduling.k8s.io/",
    "scheduling.x-k8s.io/", "pod-group.scheduling.sigs.k8s.io/", "kai.scheduler/",
    "quota.scheduling.alibabacloud.com/",
)
"""Annotations of the schedulers and operators whose manifests muster reads (plus KAI's GPU sharing
requests, ``gpu-fraction`` and ``gpu-memory``); any other annotation
(``kubectl.kubernetes.io/last-applied-configuration`` above all, which repeats the whole manifest, env
values included) is not kept."""
ANNOTATIONS = frozenset({kube.GPU_FRACTION, gpumemory.ANNOTATION, "volume.kubernetes.io/selected-node"})
"""Annotations kept besides the prefixes': KAI's GPU sharing requests, and a claim's selected node
(kube-scheduler's ``AnnSelectedNode``: a delayed claim already given a node can only be provisioned there)."""

_METADATA = ("name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
             "deletionTimestamp")
_OWNER = ("apiVersion", "kind", "name", "uid", "controller")
_POD_SPEC = ("nodeSelector", "affinity", "tolerations", "topologySpreadConstraints", "schedulerName",
             "priorityClassName", "priority", "nodeName")
_CONTAINER = ("name", "resources")
_WORKER_GROUP = ("groupName", "replicas", "minReplicas", "maxReplicas", "numOfHosts", "suspend")
_RAY_CLUSTER = ("enableInTreeAutoscaling", "suspend")
_RAY_JOB = ("suspend", "submissionMode", "shutdownAfterJobFinishes", "ttlSecondsAfterFinished", "clusterSelector")
_STATUS: dict[str, tuple[str, ...]] = {
    "Pod": ("phase",), "Node": ("capacity", "allocatable"), "RayCluster": ("state",), "PersistentVolumeClaim": ("phase",),
    "RayJob": ("jobStatus", "jobDeploymentStatus", "message", "reason"),
}
CONFIG_KINDS = frozenset({"Queue", "ElasticQuotaTree", "PriorityClass", "PodGroup"})
"""Scheduling configuration, kept whole but for metadata and status: every field of these is a scheduling
field. Of the status only Volcano's queue ``state`` is read (``_config_status``); the rest is what muster
writes there (``services.reconciler.status``), and keeping it would feed each write back as an input:
a status that grows past a bound would refuse the queue, which changes the status, and so on."""


def _text(value: object) -> str:
    """Manifests are validated downstream (admission rejects with a reason); ingest must not fail."""
    return value if isinstance(value, str) else ""


_DROP = object()
"""What a nested reduction returns for a field that keeps nothing (a container's ports without a host port)."""


def _picker(names: tuple[str, ...], **nested: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A reduction to the named fields of a mapping (``nested`` ones, in order, reduced further), made
    once: every watch event goes through a dozen of them. A value of the wrong shape is kept as
    written: admission refuses it with the reason it gives today, naming the field."""
    inner = tuple(nested.items())

    def pick(value: Any) -> Any:
        if type(value) is not dict and not isinstance(value, Mapping):
            return value
        out = {k: value[k] for k in names if k in value}
        for k, reduce in inner:
            if k in value:
                reduced = reduce(value[k])
                if reduced is not _DROP:
                    out[k] = reduced
        return out

    return pick


def _those(keep: Callable[[Mapping[str, Any]], bool], reduce: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A list reduced to the mappings ``keep`` takes, each reduced (anything not a mapping kept as written,
    for admission to refuse); the field is dropped when nothing is kept."""
    def pick(items: Any) -> Any:
        if not isinstance(items, list):
            return items
        out = [reduce(item) if isinstance(item, Mapping) else item for item in items
               if not isinstance(item, Mapping) or keep(item)]
        return out if out else _DROP

    return pick


def _each(reduce: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda items: [reduce(item) for item in items] if isinstance(items, list) else items


def _annotations(value: Any) -> Any:
    if not isinstance(value, Mapping):
        return value
    return {k: v for k, v in value.items()
            if isinstance(k, str) and (k in ANNOTATIONS or k.startswith(ANNOTATION_PREFIXES))}


_metadata = _picker(_METADATA + ("labels",), annotations=_annotations, ownerReferences=_each(_picker(_OWNER)))
_host_ports = _those(lambda port: port.get("hostPort") is not None, _picker(("hostPort", "hostIP", "protocol")))
_claims = _those(lambda volume: volume.get("persistentVolumeClaim") is not None or volume.get("ephemeral") is not None,
                 _picker(("name",), persistentVolumeClaim=_picker(("claimName",)),
                         ephemeral=_picker((), volumeClaimTemplate=_picker((), spec=_picker(("storageClassName",))))))
_pod_spec = _picker(_POD_SPEC + ("overhead", "runtimeClassName"), containers=_each(_picker(_CONTAINER, ports=_host_ports)),
                    initContainers=_each(_picker(_CONTAINER + ("restartPolicy",), ports=_host_ports)),
                    resources=_picker(("requests",)), volumes=_claims)
_template = _picker((), metadata=_picker(("labels",), annotations=_annotations), spec=_pod_spec)
_ray_cluster_spec = _picker(_RAY_CLUSTER, autoscalerOptions=_picker(("resources",)),
                            headGroupSpec=_picker((), template=_template),
                            workerGroupSpecs=_each(_picker(_WORKER_GROUP, template=_template)))
_ray_job_spec = _picker(_RAY_JOB, rayClusterSpec=_ray_cluster_spec, submitterPodTemplate=_template)
_config_status = _picker(("state",))

_SPEC: dict[str, Callable[[Any], Any]] = {
    "Pod": _pod_spec, "RayCluster": _ray_cluster_spec, "RayJob": _ray_job_spec,
    "Node": _picker(("taints", "unschedulable")),
    "PersistentVolumeClaim": _picker(("volumeName", "storageClassName")),
    "PersistentVolume": _picker(("nodeAffinity",), claimRef=_picker(("namespace", "name", "uid"))),
}
_TOP: dict[str, tuple[str, ...]] = {"StorageClass": ("volumeBindingMode", "allowedTopologies"),
                                    "RuntimeClass": ("overhead", "scheduling")}
"""Kinds whose scheduling fields are not under ``spec`` (a StorageClass and a RuntimeClass have none; of a
RuntimeClass admission reads what the API server gives the pods naming it, not its ``handler``)."""
_STATUS_KEPT: dict[str, Callable[[Any], Any]] = {kind: _picker(names) for kind, names in _STATUS.items()}


def kept(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What muster keeps of a watched object: the fields its cores read, nothing else (see the module)."""
    kind = obj.get("kind")
    if not isinstance(kind, str):
        kind = None  # not a kind muster knows, whatever it is (a mapping cannot even be looked up)
    out: dict[str, Any] = {k: obj[k] for k in ("apiVersion", "kind") if k in obj}
    if "metadata" in obj:
        out["metadata"] = _metadata(obj["metadata"])
    if kind in CONFIG_KINDS:
        out.update({k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")})
        if "status" in obj:
            out["status"] = _config_status(obj["status"])
        return out
    if "spec" in obj and kind in _SPEC:
        out["spec"] = _SPEC[kind](obj["spec"])
    for name in _TOP.get(kind or "", ()):
        if name in obj:
            out[name] = obj[name]
    if "status" in obj and kind in _STATUS:
        out["status"] = _STATUS_KEPT[kind](obj["status"])
    return out


POD_OWNER_LABELS = (kube.RAY_CLUSTER, kube.RAY_NODE_TYPE, kube.RAY_ORIGIN_KIND, kube.RAY_ORIGIN_NAME,
                    *kube.OWNED_LABELS, kube.POD_GROUP_X, kube.POD_GROUP_NAME)
"""Labels that say which workload a pod belongs to: a refused Pod keeps those that are valid, so
admission can reject that workload naming the pod (and routing still knows a KubeRay pod)."""
POD_OWNER_ANNOTATIONS = (kube.VOLCANO_GROUP,)
POD_OWNER_SPEC = ("schedulerName", "nodeName")


def _identity(obj: Mapping[str, Any], reason: str) -> dict[str, Any]:
    """The object reduced to what names it, every text made encodable, with the reason it was refused.

    A Pod also keeps what names its workload (``POD_OWNER_LABELS``, its group annotation, scheduler
    and node), each only when it is a value the API server would take: the rest is lost, the owner is not."""
    metadata = meta(obj)
    ident: dict[str, Any] = {k: _safe(metadata[k]) for k in ("name", "namespace", "uid", "resourceVersion")
                             if isinstance(metadata.get(k), str)}
    annotations = {REFUSED: reason}
    out: dict[str, Any] = {k: _safe(obj[k]) for k in ("apiVersion", "kind") if isinstance(obj.get(k), str)}
    if obj.get("kind") == "Pod":
        labels = {k: v for k, v in kube.labels(obj).items()
                  if k in POD_OWNER_LABELS and isinstance(v, str) and label_value(v) is None}
        if labels:
            ident["labels"] = labels
        annotations.update({k: v for k, v in kube.annotations(obj).items()
                            if k in POD_OWNER_ANNOTATIONS and isinstance(v, str) and dns1123_subdomain(v) is None})
        spec = kube.mapping(obj.get("spec"))
        owned = {k: spec[k] for k in POD_OWNER_SPEC if isinstance(spec.get(k), str) and dns1123_subdomain(spec[k]) is None}
        if owned:
            out["spec"] = owned
    out["metadata"] = {**ident, "annotations": annotations}
    return out


def _safe(text: str) -> str:
    """``text`` with lone surrogates escaped, so that it encodes as UTF-8 (names from a hostile server)."""
    if text.isascii():  # every name a valid object has: nothing to escape
        return text[:253]
    return text.encode("utf-8", "backslashreplace").decode("utf-8")[:253]


def observe(change: Change, obj: Mapping[str, Any]) -> ObjectChanged:
    """Describe one watch event; kind, apiVersion, namespace and name come from the object itself.

    The object is ``kept``, or reduced to its identity when it breaks a bound (``REFUSED``); the
    bounds are checked on what is kept, since that is what travels."""
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    keep = kept(obj)
    problem = tree_problem(keep, max_bytes=MAX_BYTES, finite=True)
    if problem is None and change != "Deleted":  # a deletion of anything is taken: it ends what was known
        problem = object_problem(keep) or pod_text_problem(keep)
    if problem is not None:
        keep = _identity(obj, problem)
    fields = {"type": "ObjectChanged", "change": change, "kind": _safe(_text(obj.get("kind"))),
              "api_version": _safe(_text(obj.get("apiVersion"))),
              "namespace": _safe(_text(metadata.get("namespace"))), "name": _safe(_text(metadata.get("name"))),
              "object": keep}
    if change in _CHANGES and all(type(k) is str for k in keep):  # all validation would do: copy ``keep``
        return built(ObjectChanged, fields)
    return ObjectChanged.model_validate(fields)  # refused or coerced as the fields' own types say


_CHANGES = frozenset(get_args(Change))


def watch_envelope(change: Change, obj: Mapping[str, Any], at: float) -> Envelope:
    """A watch event from a real API server as the envelope admission/placement read.

    The id names the object's version (uid and resourceVersion), not the moment it was seen: a
    watcher that restarts and lists everything again re-sends objects it sent before under the
    same ids, and every consumer drops those copies. A deletion gets its own id, since a watcher
    that missed the Deleted event reports the object's last version as deleted.
    """
    payload = observe(change, obj)
    metadata = meta(payload.object)
    version = (payload.kind, payload.api_version, payload.namespace, payload.name,
               _text(metadata.get("uid")), _text(metadata.get("resourceVersion")))
    event_id = derive_id("ingest", *version, "deleted" if change == "Deleted" else "")
    return Envelope.model_construct(
        id=event_id, type=payload.type, subject=payload.subject, source="ingest", occurred_at=at,
        causation_id=None, correlation_id=event_id, schema_version=SCHEMA_VERSION, trace={}, payload=payload,
    )


LISTING_PART_CHARS = 200_000
"""Characters of keys in one ``ObjectsListed`` part: a list of 50,000 pods is a dozen records, each
far below the broker's ``message.max.bytes`` (``shared.kubernetes.cluster.MAX_RECORD_BYTES``)."""


def listed_key(obj: Mapping[str, Any]) -> str:
    """An object's key in a listing: ``namespace/name`` as ``observe`` names its watch events
    (``shared.kernel.listing.WatchBook`` keys them so)."""
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    return f"{_safe(_text(metadata.get('namespace')))}/{_safe(_text(metadata.get('name')))}"


def listing_envelopes(kind: str, api_version: str, resource_version: str, objects: Iterable[Mapping[str, Any]],
                      at: float, *, part_chars: int = LISTING_PART_CHARS) -> list[Envelope]:
    """The ``ObjectsListed`` parts of one list of a resource: its keys in order, at most
    ``part_chars`` of them a part, at least one part (an empty list says every object is gone).

    Ids name the listing (the resource and the list's resourceVersion, which names the state of the
    whole cluster): listing the same state again gives the same ids, which consumers drop as
    copies. A list that came without a resourceVersion is named by ``at``."""
    keys = sorted({listed_key(obj) for obj in objects})
    parts: list[list[str]] = [[]]
    size = 0
    for key in keys:
        if parts[-1] and size + len(key) > part_chars:
            parts.append([])
            size = 0
        parts[-1].append(key)
        size += len(key) + 1
    version = resource_version or f"unversioned at {at!r}"
    out: list[Envelope] = []
    for index, part in enumerate(parts):
        payload = ObjectsListed(kind=kind, api_version=api_version, resource_version=resource_version, part=index,
                                keys=tuple(part), last=index == len(parts) - 1)
        event_id = derive_id("ingest", "listed", kind, api_version, version, index)
        out.append(Envelope.model_construct(
            id=event_id, type=payload.type, subject=payload.subject, source="ingest", occurred_at=at,
            causation_id=None, correlation_id=event_id, schema_version=SCHEMA_VERSION, trace={}, payload=payload))
    return out
