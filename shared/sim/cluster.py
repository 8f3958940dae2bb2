"""The simulated API server and the ``SimCluster`` facade the embedded runtime drives.

``ApiServer`` is a plain object store with Kubernetes' bookkeeping (resourceVersion, uid,
generation, owner garbage collection, a watch stream). ``SimCluster`` validates scenario
manifests, applies the reconciler's effects and lets the controllers (KubeRay, kubelet) settle
after every change, in a fixed order, so the same inputs always give the same watch stream.

A stored object is never changed in place: a write stores a new version that shares every part it
did not change with the old one (copy on write), and the watch stream hands out the stored version
itself. So an object in an envelope stays as it was when it was sent, without a deep copy of every
object on every write (that copying was a large part of ``muster simulate``'s time).
"""

from __future__ import annotations

import copy
import hashlib
import uuid
from typing import Any, Callable, Mapping

from shared.kernel import kube, runtimeclass
from shared.kernel.validation import pod_text_problem
from shared.kernel.events import KubeEffect
from shared.sim import ephemeral, kubelet
from shared.sim.batchscheduler import Setting, plugin
from shared.sim.kuberay import KubeRay, sim_duration, sim_outcome, timestamp

CLUSTER_SCOPED = frozenset({
    "Node", "Namespace", "PriorityClass", "Queue", "PersistentVolume", "StorageClass", "ClusterRole",
    "ClusterRoleBinding", "CustomResourceDefinition", "RuntimeClass",
})
"""Kinds with no namespace (Volcano's and KAI's Queue are cluster-scoped too)."""

_SETTLE_LIMIT = 1_000_000
EVENT_TTL = 3600.0
"""Seconds an Event is kept after it was written: kube-apiserver's ``--event-ttl`` default (1h)."""

Key = tuple[str, str, str]
"""(kind, namespace, name); namespace is "" for cluster-scoped kinds."""


class ScenarioError(ValueError):
    """A manifest or step the API server would refuse; the message names the object and the problem."""


def namespace_of(kind: str, namespace: str | None) -> str:
    """Cluster-scoped kinds have none; everything else defaults to ``default`` as kubectl does."""
    return "" if kind in CLUSTER_SCOPED else (namespace or "default")


def key_of(obj: Mapping[str, Any]) -> Key:
    m = kube.meta(obj)
    kind = obj["kind"]
    return kind, namespace_of(kind, m.get("namespace")), m["name"]


def describe(kind: str, namespace: str, name: str) -> str:
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


class ApiServer:
    """Objects by key, with the bookkeeping and watch stream of a real API server."""

    def __init__(self, on_change: Callable[[str, dict, dict | None], None]) -> None:
        self._objects: dict[Key, dict] = {}
        self._by_kind: dict[str, dict[Key, None]] = {}
        self._by_owner: dict[str, dict[Key, None]] = {}
        """Ordered key sets, so listing a kind or an owner's objects does not scan the whole store."""
        self._revision = 0
        self._creations = 0
        self._on_change = on_change
        self.watch: list[tuple[str, dict]] = []
        self.timers: list[tuple[float, str]] = []
        self._timer_keys: set[str] = set()

    # ------------------------------------------------------------------ reads (live objects: do not mutate)
    def obj(self, kind: str, namespace: str | None, name: str) -> dict | None:
        return self._objects.get((kind, namespace_of(kind, namespace), name))

    def objects(self, kind: str, namespace: str | None = None) -> list[dict]:
        """Objects of a kind in creation order, optionally in one namespace."""
        wanted = None if namespace is None else namespace_of(kind, namespace)
        return [self._objects[k] for k in self._by_kind.get(kind, {}) if wanted is None or k[1] == wanted]

    def owned_by(self, uid: str) -> list[dict]:
        """Objects whose ownerReferences name ``uid``, in creation order."""
        return [self._objects[k] for k in self._by_owner.get(uid, {})]

    def admit_pod(self, pod: dict) -> str | None:
        """The API server's RuntimeClass admission of a pod about to be created (``shared.kernel.runtimeclass``):
        its spec gets the class's overhead and scheduling; the refusal's words when it refuses the pod."""
        spec = pod.get("spec")
        if not isinstance(spec, dict) or not spec.get("runtimeClassName"):
            return None
        classes = {kube.meta(rc)["name"]: rc for rc in self.objects("RuntimeClass")}
        try:
            pod["spec"] = dict(runtimeclass.admit(spec, classes))
        except runtimeclass.Refused as exc:
            return str(exc)
        return None

    # ------------------------------------------------------------------ writes
    def create(self, obj: dict, now: float) -> dict:
        """Store a new object (the caller hands ``obj`` over and never changes it again); emits Added."""
        kind, namespace, name = key_of(obj)
        self._creations += 1
        metadata = obj.setdefault("metadata", {})
        if namespace:
            metadata["namespace"] = namespace
        else:
            metadata.pop("namespace", None)
        digest = hashlib.blake2b(f"{kind}\x1f{namespace}\x1f{name}\x1f{self._creations}".encode(), digest_size=16)
        metadata["uid"] = str(uuid.UUID(bytes=digest.digest()))
        metadata["creationTimestamp"] = timestamp(now)
        metadata["generation"] = 1
        _defaults(obj)
        self._stamp(obj)
        key = (kind, namespace, name)
        self._objects[key] = obj
        self._by_kind.setdefault(kind, {})[key] = None
        self._index_owners(key, obj)
        self._emit("Added", obj)
        return obj

    def replace(self, obj: dict) -> bool:
        """Store a new version of an existing object if anything but bookkeeping changed; emits Modified.
        ``obj`` is handed over: its metadata mapping is its own (not the stored version's), the rest
        may be shared with the stored version."""
        key = key_of(obj)
        live = self._objects[key]
        metadata = obj["metadata"]
        if key[1]:  # a manifest applied again without its namespace: stored under the default, as created
            metadata["namespace"] = key[1]
        metadata["resourceVersion"] = kube.meta(live)["resourceVersion"]
        metadata["generation"] = kube.meta(live).get("generation", 1)
        _defaults(obj)
        if obj == live:
            return False
        if obj.get("spec") != live.get("spec"):
            metadata["generation"] += 1
        self._stamp(obj)
        self._unindex_owners(key, live)
        self._objects[key] = obj
        self._index_owners(key, obj)
        self._emit("Modified", obj, live)
        return True

    def patch(self, kind: str, namespace: str | None, name: str, change: Callable[[dict], None]) -> bool:
        """Apply ``change`` to a new version of the object and store it if it differs; False if absent
        or same.

        The new version is the object's mapping and its mappings one level down (metadata, spec,
        status) copied, everything below shared with the stored version: ``change`` may set or
        replace fields on those two levels (``obj["status"] = {...}``, ``obj["spec"]["nodeName"] =
        node``), never change a deeper value in place. Comparing the versions is then cheap too:
        shared parts compare by identity."""
        live = self.obj(kind, namespace, name)
        if live is None:
            return False
        new = {k: dict(v) if type(v) is dict else v for k, v in live.items()}
        change(new)
        return self.replace(new)

    def remove(self, kind: str, namespace: str | None, name: str) -> dict | None:
        """Delete an object and, as the garbage collector would, everything it owns; emits Deleted."""
        key = (kind, namespace_of(kind, namespace), name)
        stored = self._objects.pop(key, None)
        if stored is None:
            return None
        del self._by_kind[kind][key]
        self._unindex_owners(key, stored)
        obj = {**stored, "metadata": dict(stored["metadata"])}  # the Deleted version: its own resourceVersion
        self._stamp(obj)
        self._emit("Deleted", obj)
        uid = kube.meta(obj).get("uid")
        if uid:
            for child in self.owned_by(uid):
                child_kind, child_ns, child_name = key_of(child)
                self.remove(child_kind, child_ns, child_name)
            self._by_owner.pop(uid, None)
        return obj

    def request_timer(self, at: float, key: str) -> None:
        """Ask for ``key`` to fire at ``at``, once while it is pending (a second request is a no-op)."""
        if key not in self._timer_keys:
            self._timer_keys.add(key)
            self.timers.append((at, key))

    def timer_fired(self, key: str) -> None:
        """``key`` fired: it is no longer pending (a long run keeps no key of every pod it started)."""
        self._timer_keys.discard(key)

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _owner_uids(obj: Mapping[str, Any]) -> list[str]:
        refs = kube.meta(obj).get("ownerReferences")
        return [r["uid"] for r in refs if isinstance(r, Mapping) and isinstance(r.get("uid"), str)] \
            if isinstance(refs, list) else []

    def _index_owners(self, key: Key, obj: Mapping[str, Any]) -> None:
        for uid in self._owner_uids(obj):
            self._by_owner.setdefault(uid, {})[key] = None

    def _unindex_owners(self, key: Key, obj: Mapping[str, Any]) -> None:
        for uid in self._owner_uids(obj):
            self._by_owner.get(uid, {}).pop(key, None)

    def _stamp(self, obj: dict) -> None:
        self._revision += 1
        obj["metadata"]["resourceVersion"] = str(self._revision)

    def _emit(self, change: str, obj: dict, previous: dict | None = None) -> None:
        """The stored version itself goes on the watch stream: it is never changed after this.
        ``previous`` is the version a Modified replaced (controllers' watch predicates read it)."""
        self.watch.append((change, obj))
        self._on_change(change, obj, previous)


def _defaults(obj: dict) -> None:
    """What the API server fills in on every write: a pod that names no scheduler gets default-scheduler."""
    if obj["kind"] == "Pod" and isinstance(obj.get("spec"), dict) and not obj["spec"].get("schedulerName"):
        obj["spec"]["schedulerName"] = kube.DEFAULT_SCHEDULER


def _validate(obj: object) -> None:
    """Refuse what the API server would refuse before any controller sees it."""
    if not isinstance(obj, dict):
        raise ScenarioError(f"a manifest must be a mapping, got {type(obj).__name__}")
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    kind = obj.get("kind")
    what = f"{kind if isinstance(kind, str) else 'object'} {name if isinstance(name, str) else '<unnamed>'}"
    for field, value in (("apiVersion", obj.get("apiVersion")), ("kind", kind)):
        if not isinstance(value, str) or not value:
            raise ScenarioError(f"{what}: {field} must be a non-empty string, got {value!r}")
    if not isinstance(metadata, dict):
        raise ScenarioError(f"{what}: metadata must be a mapping, got {metadata!r}")
    if not isinstance(name, str) or not name:
        raise ScenarioError(f"{what}: metadata.name must be a non-empty string, got {name!r}")
    namespace = metadata.get("namespace")
    if namespace is not None and (not isinstance(namespace, str) or not namespace):
        raise ScenarioError(f"{what}: metadata.namespace must be a non-empty string, got {namespace!r}")
    for field in ("labels", "annotations"):
        values = metadata.get(field)
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ScenarioError(f"{what}: metadata.{field} must be a mapping, got {values!r}")
        for k, v in values.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ScenarioError(f"{what}: metadata.{field}.{k} must be a string, got {v!r}")
    spec = obj.get("spec")
    if kind == "Pod" and isinstance(spec, dict):
        problem = pod_text_problem(obj)
        if problem is not None:
            raise ScenarioError(f"{what}: {problem}")
        containers = spec.get("containers")
        for i, container in enumerate(containers if isinstance(containers, list) else []):
            if isinstance(container, dict) and not container.get("image"):
                raise ScenarioError(f"{what}: spec.containers[{i}].image: Required value")
        problem = kube.pod_spec_problem(spec)
        if problem is not None:
            raise ScenarioError(f"{what}: {problem}")
    if kind == "RayJob":
        try:
            sim_duration(obj)
            sim_outcome(obj)
        except ValueError as exc:
            raise ScenarioError(f"{what}: {exc}") from None


class SimCluster:
    """API server + KubeRay + kubelet behind the interface the embedded runtime drives."""

    def __init__(self, *, pod_startup: float = 2.0, batch_scheduler: Setting = "none",
                 annotation_history: bool = True) -> None:
        self.pod_startup = pod_startup
        self.api = ApiServer(self._changed)
        self.kuberay = KubeRay(self.api, plugin(batch_scheduler))
        self.events: list[dict] = []
        """core/v1 Events written by ``event`` effects, in order (not on the watch stream), for
        ``EVENT_TTL`` seconds after they were written, as the API server keeps them."""
        self._events_written = 0
        self.keeps_annotation_history = annotation_history
        """Record every annotation write for ``annotation_history`` (what ``--check``'s
        ``annotations_present`` reads, for the whole run): off, a long run keeps nothing per object gone."""
        self._history: dict[Key, list[tuple[float, dict[str, str]]]] = {}
        self._last_applied_suspend: dict[Key, object] = {}
        self._last_event: dict[tuple[str, str, str, str], tuple[str, str, str]] = {}
        """(kind, namespace, name, uid) -> the last Event said about that object."""
        self._pending: dict[Key, None] = {}
        """Controllers to run (an ordered set): (kind, namespace, name) of RayClusters and RayJobs."""
        self._syncing: tuple[str, str, str | None] | None = None
        """The controller running now (``_settle``)."""
        self._ephemeral: dict[tuple[str, str], None] = {}
        """Pods created with generic ephemeral volumes whose claims the ephemeral volume controller is to make."""

    # ------------------------------------------------------------------ scenario steps
    def apply(self, obj: dict, now: float) -> None:
        """Create or update any object, kubectl-apply style; ``ScenarioError`` for a bad manifest."""
        _validate(obj)
        try:
            manifest = clone(obj)
        except RecursionError:
            raise ScenarioError(f"{describe(*key_of(obj))}: nested too deeply (or a YAML alias that "
                                "contains itself)") from None
        key = key_of(manifest)
        live = self.api.obj(*key)
        spec = manifest.get("spec")
        suspend = spec.get("suspend") if isinstance(spec, dict) else None
        if live is None:
            if manifest["kind"] == "Pod":
                refused = self.api.admit_pod(manifest)
                if refused is not None:
                    raise ScenarioError(f"{describe(*key)}: {refused}")
                status = manifest.get("status")
                manifest["status"] = {"phase": "Pending", **(status if isinstance(status, dict) else {})}
            self.api.create(manifest, now)
        else:
            previous = self._last_applied_suspend.get(key)
            self.api.replace(self._merge(live, manifest, keep_suspend=(suspend == previous)))
        self._last_applied_suspend[key] = suspend
        if manifest["kind"] == "Pod":
            kubelet.admit(self.api, self.api.obj(*key), now, self.pod_startup)
        self._settle(now)

    def delete(self, kind: str, namespace: str | None, name: str, now: float) -> None:
        """Delete an object (and what it owns); ``ScenarioError`` when it does not exist."""
        removed = self.api.remove(kind, namespace, name)
        if removed is None:
            raise ScenarioError(f"{describe(kind, namespace_of(kind, namespace), name)}: cannot delete, it does not exist")
        if kind == "Node":
            kubelet.collect_orphans(self.api, name)
        self._settle(now)

    # ------------------------------------------------------------------ reconciler effects
    def perform(self, effect: KubeEffect, now: float) -> None:
        """Apply one reconciler effect; idempotent; effects on missing objects are ignored."""
        kind = self._resolve(effect.kind, effect.namespace, effect.name)
        if kind is None:
            return
        target = (kind, namespace_of(kind, effect.namespace), effect.name)
        if effect.op in ("suspend", "unsuspend"):
            value = effect.op == "suspend"
            self.api.patch(*target, lambda o: _set_suspend(o, value))
        elif effect.op == "bind":
            if kind == "Pod" and ephemeral.select_node(self.api, target[1], effect.claims, effect.node) and kubelet.bind(self.api, target[1], effect.name, effect.node, effect.annotations,
                                               now, self.pod_startup):
                self._record_annotations(target, now)
        elif effect.op == "annotate":
            if effect.annotations and self.api.patch(*target, lambda o: _merge_annotations(o, effect.annotations)):
                self._record_annotations(target, now)
        elif effect.op == "evict":
            if kind == "Pod":
                self.api.remove(*target)
        elif effect.op == "event":
            self._record_event(target, effect, now)
        elif effect.op == "status":
            live = self.api.obj(*target)
            if live is not None and (not effect.api_version or live.get("apiVersion") == effect.api_version):
                self.api.patch(*target, lambda o: o.__setitem__("status", kube.merge_patch(o.get("status"), effect.status)))
        self._settle(now)

    def fire(self, key: str, now: float) -> None:
        """One of the timers from ``take_timer_requests`` came due."""
        self.api.timer_fired(key)
        if key.startswith(kubelet.TIMER_PREFIX):
            kubelet.fire(self.api, key)
        else:
            self.kuberay.fire(key, now)
        self._settle(now)

    # ------------------------------------------------------------------ reads
    def take_watch_events(self) -> list[tuple[str, dict]]:
        out, self.api.watch = self.api.watch, []
        return out

    def take_timer_requests(self) -> list[tuple[float, str]]:
        out, self.api.timers = self.api.timers, []
        return out

    def get(self, kind: str, namespace: str | None, name: str) -> dict | None:
        obj = self.api.obj(kind, namespace, name)
        return copy.deepcopy(obj) if obj is not None else None

    def annotation_history(self, kind: str, namespace: str | None, name: str) -> list[tuple[float, dict[str, str]]]:
        """(time, all annotations after the write) for every effect that changed the object's annotations."""
        return [(t, dict(a)) for t, a in self._history.get((kind, namespace_of(kind, namespace), name), [])]

    # ------------------------------------------------------------------ internals
    def _resolve(self, kind: str, namespace: str, name: str) -> str | None:
        """The kind to act on: as given if the object exists; for ``""`` the workload of that name."""
        for candidate in ((kind,) if kind else ("RayJob", "RayCluster")):
            if self.api.obj(candidate, namespace, name) is not None:
                return candidate
        return None

    def _record_annotations(self, target: Key, now: float) -> None:
        if not self.keeps_annotation_history:
            return
        obj = self.api.obj(*target)
        if obj is not None:
            self._history.setdefault(target, []).append((now, dict(kube.annotations(obj))))

    def _record_event(self, target: Key, effect: KubeEffect, now: float) -> None:
        """Append a core/v1 Event unless it repeats the last one about the same object."""
        kind, namespace, name = target
        involved = self.api.obj(*target) or {}
        uid = kube.meta(involved).get("uid", "")
        said = (effect.event_type, effect.reason, effect.message)
        if self._last_event.get((*target, uid)) == said:
            return
        self._last_event[(*target, uid)] = said
        self._events_written += 1
        expired = 0
        for event in self.events:  # oldest first: those past the API server's --event-ttl are gone
            if event["simTime"] > now - EVENT_TTL:
                break
            expired += 1
        del self.events[:expired]
        self.events.append({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{name}.{self._events_written:x}", "namespace": namespace or "default"},
            "involvedObject": {"apiVersion": involved.get("apiVersion", ""), "kind": kind, "namespace": namespace,
                               "name": name, "uid": uid},
            "reason": effect.reason, "message": effect.message, "type": effect.event_type,
            "source": {"component": "muster"},
            "firstTimestamp": timestamp(now), "lastTimestamp": timestamp(now), "count": 1,
            "simTime": now,
        })

    def _merge(self, live: dict, manifest: dict, *, keep_suspend: bool) -> dict:
        """kubectl apply, simplified: the manifest (a copy of the caller's) wins, except for fields
        others own, which the new version shares with the stored one."""
        merged = manifest
        metadata = merged["metadata"]
        live_meta = kube.meta(live)
        for field in ("uid", "creationTimestamp", "ownerReferences"):
            if field in live_meta and field not in metadata:
                metadata[field] = live_meta[field]
        if "annotations" in metadata or "annotations" in live_meta:
            metadata["annotations"] = {**kube.annotations(live), **(metadata.get("annotations") or {})}
        if "status" not in merged and "status" in live:
            merged["status"] = live["status"]
        spec, live_spec = merged.get("spec"), live.get("spec")
        if isinstance(spec, dict) and isinstance(live_spec, dict):
            if keep_suspend and "suspend" in live_spec:
                spec["suspend"] = live_spec["suspend"]
            if live["kind"] == "Pod" and live_spec.get("nodeName"):
                spec["nodeName"] = live_spec["nodeName"]
        return merged

    def _changed(self, change: str, obj: dict, previous: dict | None) -> None:
        """Queue the controllers that watch this object (KubeRay watches clusters, jobs and their pods).

        A pod change its owner's controller cannot act on queues nothing, as a controller-runtime
        watch predicate would filter it: a pod the running sync of its own cluster just created (the
        sync counted it), or a pod modified without a new phase or owner (a binding, an annotation:
        the controllers read only which pods exist and their phases). Their syncs would change
        nothing — every sync is level-triggered and writes only real changes — and they were two in
        three of all the simulator's syncs."""
        kind, namespace, name = key_of(obj)
        if change == "Deleted":
            self._forget(kind, namespace, name, str(kube.meta(obj).get("uid") or ""))
        if kind == "Pod" and change == "Added" and ephemeral.has_ephemeral(obj):
            self._ephemeral[(namespace, name)] = None
        if kind == "Pod" and self._unseen_by_controllers(change, obj, previous):
            return
        labels = kube.labels(obj)
        if kind in ("RayCluster", "RayJob"):
            self._pending[(kind, namespace, name)] = None
        if kind == "RuntimeClass":  # a pod create it refused may pass now: KubeRay retries its failed creates
            for owner in ("RayCluster", "RayJob"):
                for o in self.api.objects(owner):
                    m = kube.meta(o)
                    self._pending[(owner, m.get("namespace", ""), m["name"])] = None
        if kind == "Pod" and labels.get(kube.RAY_CLUSTER):
            self._pending[("RayCluster", namespace, labels[kube.RAY_CLUSTER])] = None
        if kind == "RayCluster" and labels.get(kube.RAY_ORIGIN_KIND) == "RayJob" and labels.get(kube.RAY_ORIGIN_NAME):
            self._pending[("RayJob", namespace, labels[kube.RAY_ORIGIN_NAME])] = None
        if kind == "Pod" and labels.get(kube.JOB_NAME):  # a submitter's: its Job is named as the RayJob
            self._pending[("RayJob", namespace, labels[kube.JOB_NAME])] = None

    def _forget(self, kind: str, namespace: str, name: str, uid: str) -> None:
        """What the simulated cluster kept for an object that is gone: nothing reads it again (a
        new object of the same name starts afresh; its pods still get names never used: ``KubeRay``)."""
        key = (kind, namespace, name)
        self._last_applied_suspend.pop(key, None)
        self._last_event.pop((*key, uid), None)
        if not self.keeps_annotation_history:
            self._history.pop(key, None)
        self.kuberay.forget(kind, namespace, name, uid)

    def _unseen_by_controllers(self, change: str, pod: dict, previous: dict | None) -> bool:
        if change == "Added":
            labels = kube.labels(pod)
            return self._syncing == ("RayCluster", kube.meta(pod).get("namespace", ""), labels.get(kube.RAY_CLUSTER))
        if change != "Modified" or previous is None:
            return False
        return kube.meta(pod).get("ownerReferences") == kube.meta(previous).get("ownerReferences") \
            and kube.labels(pod) == kube.labels(previous) and pod.get("status") == previous.get("status")

    def _settle(self, now: float) -> None:
        """Run controllers until nothing changes (each sync writes only real changes, so this ends): the
        ephemeral volume controller first, then KubeRay."""
        for _ in range(_SETTLE_LIMIT):
            while self._ephemeral:  # the ephemeral volume controller: claims for the pods just made
                namespace, name = next(iter(self._ephemeral))
                del self._ephemeral[(namespace, name)]
                ephemeral.make_claims(self.api, namespace, name, now)
            if not self._pending:
                return
            kind, namespace, name = self._syncing = next(iter(self._pending))
            del self._pending[(kind, namespace, name)]
            try:
                if kind == "RayCluster":
                    self.kuberay.sync_cluster(namespace, name, now)
                else:
                    self.kuberay.sync_job(namespace, name, now)
            finally:
                self._syncing = None
        raise RuntimeError("simulated cluster did not settle (a controller keeps changing objects)")


def clone(value: Any) -> Any:
    """A deep copy of YAML/JSON data (mappings, lists, scalars), far cheaper than
    ``copy.deepcopy``: no memo, so parts a YAML alias shared are copied apart (JSON has no sharing),
    and a cycle is a ``RecursionError``."""
    if type(value) is dict:
        return {k: clone(v) for k, v in value.items()}
    if type(value) is list:
        return [clone(v) for v in value]
    return copy.deepcopy(value) if isinstance(value, (dict, list, set)) else value


def _set_suspend(obj: dict, value: bool) -> None:
    if isinstance(obj.get("spec"), dict):
        obj["spec"]["suspend"] = value


def _merge_annotations(obj: dict, values: Mapping[str, str]) -> None:
    metadata = obj.setdefault("metadata", {})
    metadata["annotations"] = {**(metadata.get("annotations") or {}), **values}
