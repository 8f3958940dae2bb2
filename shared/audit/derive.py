"""A scenario from a log: the cluster's nodes over time, every object as users applied it and when,
each RayJob's observed run time — so the history can be run again through the simulator, under the
policy it was made with (which must give the log's decisions back exactly) or under another.

What users did is told apart from what the cluster did by who owns an object and what changed:

- objects with an owner (pods KubeRay made, a RayJob's RayCluster) are the simulator's to make again;
- an object's first watch event is an ``apply`` step of it as it was (without what the API server
  stamps on it: uid, resourceVersion, creationTimestamp, generation, managedFields);
- a later change is a user's edit when it changes what a user writes: anything but the status of
  a RayJob, RayCluster or Pod (KubeRay's and the kubelet's), ``spec.suspend`` of a RayJob/RayCluster
  (muster's gate), a pod's ``spec.nodeName`` (muster binds), the ``selected-node`` a bind wrote on a
  claim, and the annotations and status fields muster's effects wrote (``KubeEffect`` in the log names each; a status field counts as muster's
  while it holds the value muster wrote); the step applies the object as the edit left it;
- a deletion is the user's unless muster evicted the pod (an ``evict`` effect) or the node it was
  bound to went away at that instant (the pod garbage collector);
- what happened at one instant with no decision in between is one step (the simulator settles and
  the services decide after each step, so the grouping is what reproduces the log).

KubeRay's ``--batch-scheduler`` is read off the pods it made (their ``schedulerName``), so the
simulated KubeRay names the same schedulers and makes the same PodGroups.

A RayJob that finished without ``muster.dev/sim-duration`` gets its observed run time (its last
run, from its status turning Running to Complete/Failed) and outcome, so the simulated job takes
as long as the real one did. Pods start as long after binding as the log shows most often.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any, Iterable

import yaml

from shared.kernel import kube
from shared.kernel.events import Envelope
from shared.kernel.topology import SERVICES
from shared.sim.batchscheduler import PLUGINS
from shared.sim.ephemeral import SELECTED_NODE
from shared.sim.kuberay import DURATION, OUTCOME

_STAMPED = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "deletionTimestamp")
_GATED = ("RayJob", "RayCluster")
_CONTROLLED = ("RayJob", "RayCluster", "Pod")
"""Kinds whose status a controller writes (KubeRay, the kubelet), never a user."""


IMAGE = "registry.k8s.io/pause:3.10"
"""The image a derived Pod's containers get: ingest keeps no image (``services.reconciler.ingest``),
and the API server refuses a container without one."""


def manifest(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as applied again: without what the API server stamps on it. Its status stays: a
    Node's is its capacity, a Volcano Queue's its state, and a workload's or pod's is what the
    object had at that moment anyway (applying it changes nothing the controllers would not)."""
    out = copy.deepcopy(obj)
    meta = out.get("metadata")
    if isinstance(meta, dict):
        for name in _STAMPED:
            meta.pop(name, None)
    spec = out.get("spec")
    if out.get("kind") == "Pod" and isinstance(spec, dict) and isinstance(spec.get("containers"), list):
        for container in spec["containers"]:
            if isinstance(container, dict):
                container.setdefault("image", IMAGE)
    return out


def _owned(obj: dict[str, Any]) -> bool:
    return bool(kube.meta(obj).get("ownerReferences"))


def user_view(obj: dict[str, Any], muster_keys: set[str], muster_status: dict[str, Any] | None = None) -> Any:
    """What a user's edit changes (see the module docstring)."""
    view = manifest(obj)
    if view.get("kind") in _CONTROLLED:
        view.pop("status", None)
    status = view.get("status")
    if muster_status and isinstance(status, dict):
        for name, value in muster_status.items():
            if status.get(name) == value:
                del status[name]
        if not status:
            del view["status"]
    meta = view.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("annotations"), dict):
        meta["annotations"] = {k: v for k, v in meta["annotations"].items() if k not in muster_keys}
        if not meta["annotations"]:
            del meta["annotations"]
    spec = view.get("spec")
    if isinstance(spec, dict):
        if view.get("kind") in _GATED:
            spec.pop("suspend", None)
        if view.get("kind") == "Pod":
            spec.pop("nodeName", None)
    return view


def _without_annotations(view: Any, keys: set[str]) -> Any:
    """``view`` without the annotations ``keys`` (a shallow copy where it differs)."""
    meta = view.get("metadata") if isinstance(view, dict) else None
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    if not isinstance(annotations, dict) or not keys & annotations.keys():
        return view
    kept = {k: v for k, v in annotations.items() if k not in keys}
    meta = {k: v for k, v in meta.items() if k != "annotations"} | ({"annotations": kept} if kept else {})
    return {**view, "metadata": meta}


def _ref(kind: str, namespace: str, name: str) -> tuple[str, str, str]:
    return kind, namespace, name


class Deriver:
    """Folds a log into the scenario's steps (``add`` each envelope, then ``scenario``)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        """The ``apply`` step still taking documents (until a decision or a delete)."""
        self._seen: dict[tuple[str, str, str], Any] = {}
        self._muster_keys: dict[tuple[str, str, str], set[str]] = {}
        self._muster_status: dict[tuple[str, str, str], dict[str, Any]] = {}
        """The status fields muster last wrote on an object (a ``status`` effect), by object."""
        self.batch_scheduler: str | None = None
        self._evicted: set[tuple[str, str]] = set()
        self._gone_nodes: tuple[float, set[str]] = (-1.0, set())
        self._bound_at: dict[tuple[str, str], float] = {}
        self.startups: Counter[float] = Counter()
        self._job_started: dict[tuple[str, str], float] = {}
        self.job_runs: dict[tuple[str, str], tuple[float, str]] = {}
        self.last_at = 0.0

    def add(self, env: Envelope) -> None:
        self.last_at = max(self.last_at, env.occurred_at)
        if env.type == "PolicyApplied":
            return  # the policy a service took: no decision, no object
        if env.source in SERVICES:
            self._open = None  # a decision ends the step: the services decided on what came before
            if env.type == "KubeEffect":
                self._effect(env.payload)
            return
        if env.type == "ObjectChanged":
            self._changed(env.payload, env.occurred_at)

    def _effect(self, effect: Any) -> None:
        key = (effect.kind, effect.namespace if effect.kind != "Node" else "", effect.name)
        if effect.annotations:
            for kind in ((effect.kind,) if effect.kind else _GATED):
                self._muster_keys.setdefault((kind, key[1], key[2]), set()).update(effect.annotations)
        for claim in effect.claims:  # a bind wrote the node on the pod's delayed claims first
            self._muster_keys.setdefault(("PersistentVolumeClaim", key[1], claim), set()).add(SELECTED_NODE)
        if effect.op == "evict":
            self._evicted.add((effect.namespace, effect.name))
        if effect.op == "status":
            self._muster_status.setdefault(key, {}).update(effect.status)

    def _changed(self, p: Any, t: float) -> None:
        obj = p.object
        ref = _ref(p.kind, p.namespace, p.name)
        self._observe(p, obj, t)
        if _owned(obj):
            return
        if p.change == "Deleted":
            if p.kind == "Node":
                at, names = self._gone_nodes
                self._gone_nodes = (t, names | {p.name} if at == t else {p.name})
            if self._seen.pop(ref, None) is None or self._not_users_delete(p, obj, t):
                return
            self._open = None  # a delete is a step of its own
            self.steps.append({"at": t, "delete": {"kind": p.kind, "name": p.name,
                                                   **({"namespace": p.namespace} if p.namespace else {})}})
            return
        keys = self._muster_keys.get(ref, set())
        view = user_view(obj, keys, self._muster_status.get(ref))
        seen = self._seen.get(ref)
        # The view seen before may hold a key muster has written since with the user's own value (the
        # binder writes a pod's gpu-fraction again): compared without it, that is no edit.
        if seen is not None and _without_annotations(seen, keys) == view:
            return
        self._seen[ref] = view
        self._step(t).append(manifest(obj))

    def _not_users_delete(self, p: Any, obj: dict[str, Any], t: float) -> bool:
        if p.kind != "Pod":
            return False
        if (p.namespace, p.name) in self._evicted:
            return True
        node = kube.mapping(obj.get("spec")).get("nodeName")
        at, names = self._gone_nodes
        return at == t and node in names

    def _step(self, t: float) -> list[dict[str, Any]]:
        """The documents of the ``apply`` step open at ``t``."""
        if self._open is None or self._open["at"] != t:
            self._open = {"at": t, "apply": []}
            self.steps.append(self._open)
        return self._open["apply"]

    def _observe(self, p: Any, obj: dict[str, Any], t: float) -> None:
        """Pod start-up times and RayJob run times, as the watch shows them."""
        status = kube.mapping(obj.get("status"))
        if p.kind == "Pod" and self.batch_scheduler is None and kube.is_ray_pod(obj):
            self.batch_scheduler = setting_of(kube.mapping(obj.get("spec")).get("schedulerName"))
        if p.kind == "Pod" and p.change != "Deleted":
            key = (p.namespace, p.name)
            if kube.mapping(obj.get("spec")).get("nodeName") and key not in self._bound_at:
                self._bound_at[key] = t
            if status.get("phase") == "Running" and key in self._bound_at:
                self.startups[round(t - self._bound_at.pop(key), 6)] += 1
        elif p.kind == "RayJob":
            key = (p.namespace, p.name)
            state = status.get("jobDeploymentStatus")
            if state == "Running" and key not in self._job_started:
                self._job_started[key] = t
            elif state in ("Complete", "Failed") and key in self._job_started:
                self.job_runs[key] = (round(t - self._job_started.pop(key), 6),
                                      "Failed" if state == "Failed" else "Succeeded")
            elif state not in ("Running", "Complete", "Failed"):
                self._job_started.pop(key, None)

    def scenario(self, name: str, until: float | None) -> dict[str, Any]:
        """The scenario document (``shared.sim.scenario`` format)."""
        steps = [step if "delete" in step else
                 {"at": step["at"], "apply": yaml.safe_dump_all([self._timed(d) for d in step["apply"]], sort_keys=False)}
                 for step in self.steps]
        startup = self.startups.most_common(1)[0][0] if self.startups else 2.0
        cluster: dict[str, Any] = {"nodes": [], "pod_startup": startup}
        if self.batch_scheduler is not None:
            cluster["kuberay"] = {"batch_scheduler": self.batch_scheduler}
        return {"name": name, "description": "derived from an event log by muster replay --what-if",
                "cluster": cluster, "steps": steps,
                "until": until if until is not None else self.last_at}

    def _timed(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A RayJob that ran without a simulated run time gets the one the log observed."""
        if doc.get("kind") != "RayJob":
            return doc
        meta = doc.setdefault("metadata", {})
        annotations = meta.get("annotations") or {}
        run = self.job_runs.get((meta.get("namespace", "default"), meta.get("name", "")))
        if run is None or DURATION in annotations:
            return doc
        meta["annotations"] = {**annotations, DURATION: f"{run[0]:g}s",
                               **({OUTCOME: run[1]} if run[1] == "Failed" else {})}
        return doc


def setting_of(scheduler_name: object) -> str:
    """The ``--batch-scheduler`` that gives KubeRay's pods this ``schedulerName`` (``none`` for any other)."""
    for setting, plugin in PLUGINS.items():
        if setting != "none" and plugin.pod_scheduler == scheduler_name:
            return setting
    return "none"


def derive(envelopes: Iterable[Envelope], *, name: str, until: float | None) -> dict[str, Any]:
    deriver = Deriver()
    for env in envelopes:
        deriver.add(env)
    return deriver.scenario(name, until)
