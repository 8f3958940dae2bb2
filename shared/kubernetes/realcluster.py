"""A scenario on a real cluster: ``muster simulate SCENARIO --cluster KUBECONFIG``.

The same scenario file, the same cores and the same result document as ``muster simulate``, with
the simulated cluster replaced by a real one: the scenario's nodes become KWOK nodes, its steps are
applied (server-side apply, as ``kubectl apply --server-side`` does) and deleted through the API
server at their times, real KubeRay turns RayClusters and RayJobs into pods, KWOK runs what is bound,
and muster reads all of it through the cluster link's own ``Watcher`` and writes its effects through
the link's own ``KubeApplier`` (``shared.kubernetes.kubeapi``, what ``muster run cluster`` runs).

Time stays the scenario's: virtual, as in ``muster simulate``. ``LiveRuntime`` advances it to the
next step or timer only once the cluster has settled — no watch event for ``quiet`` seconds after
the last thing muster or the scenario did to it — so a scenario of 900 s runs in the seconds its
actions take, and everything the real controllers do in reaction to an instant is seen at that
instant. What a kubelet would take (``pod_startup``) KWOK does not: a bound pod runs at once. Hence
``--check`` on a real cluster allows ``TIME_TOLERANCE`` seconds either side of an expectation's time.

The cluster link runs on an asyncio loop in a thread of its own; the runtime, single-threaded as
ever, takes what the watchers saw at each instant (``take_watch_events``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml
import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.config import ConfigException
from kubernetes_asyncio.client.exceptions import ApiException

from services.reconciler.ingest import Change
from shared.kernel import kube
from shared.kernel.events import KubeEffect, derive_id
from shared.kernel.policy import Policy
from shared.kubernetes.kubeapi import KubeApplier, Watcher, connect
from shared.kubernetes.resources import WATCHED, Resource, candidates
from shared.parts import catalog, kwok
from shared.parts.devcluster import SYSTEM_NAMESPACES
from shared.runtime.embedded import EmbeddedRuntime
from shared.runtime.simulate import Run, play
from shared.sim.cluster import ScenarioError, describe, namespace_of
from shared.sim.scenario import Scenario

TIME_TOLERANCE = 5.0
"""Seconds ``--check`` allows either side of an expectation's time on a real cluster: a pod runs
as soon as it is bound (``pod_startup``, 2 s by default, is not simulated), and the real controllers'
reactions land at the instant that caused them, not a few seconds later."""

START_TIMER = "live/pod-start|"
"""Timer key of a held pod's start (``LiveCluster.fire``): ``live/pod-start|<namespace>|<name>``."""

MANAGER = "muster-scenario"
"""The field manager of the scenario's own writes (server-side apply)."""



class ClusterFailed(RuntimeError):
    """The real cluster could not be used (not reachable, a watch that will not start)."""


class LiveCluster:
    """The interface ``EmbeddedRuntime`` drives (``SimCluster``'s), over a real API server."""

    def __init__(self, kubeconfig: Path, *, kubectl: str, quiet: float = 0.5, settle_limit: float = 60.0,
                 pod_startup: float = 0.0) -> None:
        self.kubeconfig = kubeconfig
        self.pod_startup = pod_startup
        """Scenario seconds a bound pod stays Pending before KWOK runs it (``kwok.HOLD``), as the
        simulated kubelet's ``pod_startup``."""
        self._timer_requests: list[tuple[float, str]] = []
        self._seen: dict[tuple[str, str, str, str], int] = {}
        """(group, kind, namespace, name) -> the latest resourceVersion the watch delivered."""
        self._awaited: dict[tuple[str, str, str, str], int] = {}
        """What the scenario wrote that the watch has not yet delivered: its key -> the resourceVersion
        the API server answered the write with (``caught_up``)."""
        self.kubectl_bin = kubectl
        self.quiet = quiet
        self.settle_limit = settle_limit
        self._events: deque[tuple[Change, dict[str, Any]]] = deque()
        self._last_seen = time.monotonic()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="muster-live-cluster", daemon=True)
        self._tasks: list[asyncio.Future[Any]] = []
        self._applied: dict[tuple[str, str, str], str] = {}
        """(kind, namespace, name) -> the apiVersion the scenario applied it with (for its deletion)."""
        self._namespaces: set[str] = set()
        self._history: dict[tuple[str, str, str], list[tuple[float, dict[str, str]]]] = {}
        self._annotations: dict[tuple[str, str, str], dict[str, str]] = {}
        self.now = 0.0
        self.api: Any = None
        self.applier: KubeApplier | None = None
        self.watcher: Watcher | None = None
        self.requests = 0
        """Requests muster's effects made (bench: the API server's requests per workload)."""

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "LiveCluster":
        """Connect, start a watch of every resource muster reads, and wait for every first list."""
        self._thread.start()
        try:
            self._call(self._connect(), timeout=30)
        except ApiException as exc:
            self.close()
            raise ClusterFailed(f"the API server answered {exc.status} {exc.reason}") from None
        except (ConfigException, yaml.YAMLError, aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            self.close()  # no session left open to complain at exit
            raise ClusterFailed(_first_line(exc) or type(exc).__name__) from None
        listed = threading.Event()
        pending = set(WATCHED)

        def done(resource: Resource) -> Callable[[], None]:
            def listed_once() -> None:
                pending.discard(resource)
                if not pending:
                    listed.set()
            return listed_once

        assert self.watcher is not None
        for resource in WATCHED:
            self._tasks.append(asyncio.run_coroutine_threadsafe(
                self.watcher.run(resource, self._sink, done(resource)), self._loop))
        if not listed.wait(60):
            raise ClusterFailed(f"the first list of {', '.join(sorted(r.plural for r in pending))} did not finish in 60 s")
        return self

    async def _connect(self) -> None:
        self.api = await connect(kubeconfig=str(self.kubeconfig))
        self.applier = KubeApplier(self.api, victim_wait=30.0, status_interval=0.0)
        self.watcher = Watcher(self.api, absent_retry=5.0, error_retry=0.5)
        await self.watcher.probe()

    def _call(self, coro: Any, timeout: float = 120.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self.api is not None:
            try:
                self._call(self.api.close(), timeout=10)
            except Exception:  # closing a session that is already broken: nothing left to release
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _sink(self, change: Change, obj: dict[str, Any]) -> None:
        metadata = obj.get("metadata")
        if isinstance(metadata, dict):
            metadata.pop("managedFields", None)  # as the cluster link drops it (field ownership no decision reads)
        version = _version(obj)
        with self._lock:
            self._events.append((change, obj))
            self._last_seen = time.monotonic()
            if version is not None:
                key = _key(obj)
                self._seen[key] = max(version, self._seen.get(key, 0))
        if change == "Deleted" and obj.get("kind") == "Pod" and self.applier is not None:
            # as ``muster run cluster`` tells its applier: a bind waiting for an evicted pod to go
            # goes ahead now, not after ``victim_wait`` (30 s of wall time a preemption)
            gone = kube.meta(obj)
            await self.applier.pod_gone(str(gone.get("namespace") or ""), str(gone.get("name") or ""))

    # ------------------------------------------------------------------ what the runtime calls
    def apply(self, obj: dict[str, Any], now: float) -> None:
        """Server-side apply of a scenario manifest, in its namespace (made if missing)."""
        if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
            raise ScenarioError("a manifest without a kind")
        kind = obj["kind"]
        metadata = kube.meta(obj)
        name = metadata.get("name")
        if not isinstance(name, str) or not name:
            raise ScenarioError(f"{kind} without metadata.name")
        namespace = namespace_of(kind, metadata.get("namespace"))
        if kind == "Node":  # a scenario's node is a KWOK node: KWOK plays its kubelet
            obj = {**obj, "metadata": {**metadata, "annotations": {**(metadata.get("annotations") or {}),
                                                                    kwok.ANNOTATION: "fake"}}}
        if kind == "Pod" and kube.mapping(obj.get("spec")).get("nodeName") and self.pod_startup > 0:
            obj = self._held(obj, namespace, name, now)  # a pod that arrives bound starts as a bound one does
        if namespace and kind != "Namespace":
            self._ensure_namespace(namespace)
        what = f"apply {describe(kind, namespace, name)}"
        written = self._kubectl(["apply", "--server-side", "--force-conflicts", f"--field-manager={MANAGER}",
                                 "-o", "json", "-f", "-"], yaml.safe_dump(obj), what)
        if isinstance(obj.get("status"), dict) and obj["status"]:
            written = self._apply_status(obj, what) or written
        self._await(written)
        self._applied[(kind, namespace, name)] = str(obj.get("apiVersion") or "")
        self._touched()

    def _await(self, answer: str) -> None:
        """Note the object a write answered with, so that ``caught_up`` waits for the watch to deliver it."""
        try:
            written = json.loads(answer)
        except ValueError:
            return
        version = _version(written) if isinstance(written, dict) else None
        if version is None or not any(r.kind == written.get("kind") and r.group == _group(written) for r in WATCHED):
            return  # a kind muster does not watch (a Namespace): nothing will come
        with self._lock:
            self._awaited[_key(written)] = version

    def caught_up(self, timeout: float = 30.0) -> None:
        """Wait until the watch has delivered every object the scenario wrote, at the version written.
        Without this, muster could act on an instant's first objects before its others arrive (the
        watch delivers a moment after the write returns): a RayCluster bound in the default queue
        because the quota tree applied with it had not come through yet."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                self._awaited = {k: v for k, v in self._awaited.items() if self._seen.get(k, 0) < v}
                if not self._awaited:
                    return
                missing = sorted(self._awaited)
            if time.monotonic() > deadline:
                raise ClusterFailed(f"the watch did not deliver {', '.join('/'.join(k[1:]) for k in missing[:5])} "
                                    f"within {timeout:g} s of writing it")
            time.sleep(0.01)

    def _apply_status(self, obj: dict[str, Any], what: str) -> str | None:
        """The manifest's ``status`` through the status subresource: the API server drops status written
        to the main resource of a kind that has the subresource (a Volcano Queue's ``state: Closed``, a
        Node's capacity on a later apply). A kind without it kept the status with the object itself."""
        metadata = kube.meta(obj)
        status = dict(obj["status"])
        if obj["kind"] == "Queue" and str(obj.get("apiVersion", "")).startswith("scheduling.volcano.sh/"):
            status.setdefault("allocated", {})  # Volcano's Queue CRD requires it; its controller fills it
        body = {"apiVersion": obj.get("apiVersion"), "kind": obj["kind"], "status": status,
                "metadata": {k: metadata[k] for k in ("name", "namespace") if metadata.get(k)}}
        done = self._run(["apply", "--server-side", "--force-conflicts", f"--field-manager={MANAGER}",
                          "--subresource=status", "-o", "json", "-f", "-"], yaml.safe_dump(body))
        if done.returncode == 0:
            return done.stdout
        if "NotFound" not in done.stderr and "could not find" not in done.stderr:
            raise ScenarioError(f"{what} (status): the API server refused it: {_one_line(done)}")
        return None

    def delete(self, kind: str, namespace: str | None, name: str, now: float) -> None:
        ns = namespace_of(kind, namespace)
        resource = self._resource_name(kind, ns, name)
        # foreground: the object stays until the garbage collector has deleted what it owns (a RayCluster's
        # pods), and kubectl waits for that; the simulated cluster takes the pods with their owner at the
        # same instant, and a background cascade could outlast the settle window (the run then moved on
        # with a deleted RayCluster's pods still bound)
        args = ["delete", resource, name, "--cascade=foreground", "--wait=true", "--timeout=60s"]
        if ns:
            args += ["-n", ns]
        api_version = self._applied.get((kind, ns, name), "")
        with self._lock:  # taken before: the watch may deliver the deletion before kubectl returns
            before = {key: version for key, version in self._seen.items() if key[1:] == (kind, ns, name)
                      and (not api_version or key[0] == _group({"apiVersion": api_version}))}
        self._kubectl(args, None, f"delete {describe(kind, ns, name)}")
        with self._lock:  # its deletion (or the deletionTimestamp a finalizer holds it with) comes next
            self._awaited.update({key: version + 1 for key, version in before.items()})
        if kind == "Node":
            # kube-controller-manager's pod GC deletes the pods of a node that is gone only after 40 s
            # of wall time (its quarantine); the simulated one at once, and a scenario's instants pass
            # in far less: the pods go now, as the simulated cluster's do
            self._kubectl(["delete", "pods", "--all-namespaces", "--field-selector", f"spec.nodeName={name}",
                           "--force", "--grace-period=0", "--wait=false"], None, f"delete the pods of node {name}")
        self._touched()

    def perform(self, effect: KubeEffect, now: float) -> None:
        """One reconciler effect, through the cluster link's applier (idempotent, as deployed)."""
        assert self.applier is not None
        if effect.op == "bind" and self.pod_startup > 0:
            held = self._hold(effect.namespace, effect.name, now)
            effect = effect.model_copy(update={"annotations": {**effect.annotations, **held}})
        effect_id = derive_id("live", effect.op, effect.kind, effect.namespace, effect.name, effect.node,
                              f"{now:.6f}", effect.reason)
        self.requests += 1
        self._call(self.applier.apply(effect, effect_id))
        self._touched()

    def fire(self, key: str, now: float) -> None:
        """A held pod's ``pod_startup`` is over: its hold is taken away and KWOK runs it."""
        if not key.startswith(START_TIMER):
            return
        namespace, _, name = key[len(START_TIMER):].partition("|")
        self._call(self._release(namespace, name))
        self._touched()

    async def _release(self, namespace: str, name: str) -> None:
        try:
            await client.CoreV1Api(self.api).patch_namespaced_pod(
                name, namespace, {"metadata": {"annotations": {kwok.HOLD: None}}})
        except ApiException as exc:
            if exc.status != 404:  # gone (deleted, its node removed) before it started: nothing to start
                raise ClusterFailed(f"starting pod {namespace}/{name}: {exc.status} {exc.reason}") from None

    def _hold(self, namespace: str, name: str, now: float) -> dict[str, str]:
        """The annotation that keeps a bound pod Pending (``kwok.HOLD``), and the timer that takes it
        away ``pod_startup`` later (``fire``): for a pod muster binds and one a scenario writes bound alike."""
        self._timer_requests.append((now + self.pod_startup, f"{START_TIMER}{namespace}|{name}"))
        return {kwok.HOLD: "pod_startup"}

    def _held(self, pod: dict[str, Any], namespace: str, name: str, now: float) -> dict[str, Any]:
        metadata = kube.meta(pod)
        return {**pod, "metadata": {**metadata, "annotations": {**(metadata.get("annotations") or {}),
                                                                **self._hold(namespace, name, now)}}}

    def take_watch_events(self) -> list[tuple[str, dict[str, Any]]]:
        with self._lock:
            out = list(self._events)
            self._events.clear()
        for change, obj in out:
            self._note_annotations(change, obj)
        return out  # type: ignore[return-value]

    def take_timer_requests(self) -> list[tuple[float, str]]:
        out, self._timer_requests = self._timer_requests, []
        return out

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """One RayCluster or RayJob as the API server has it now (a pod's owner the watch has not shown)."""
        assert self.watcher is not None, "start() first"
        return self._call(self.watcher.get(candidates(kind)[0], namespace_of(kind, namespace), name))

    def annotation_history(self, kind: str, namespace: str | None, name: str) -> list[tuple[float, dict[str, str]]]:
        return [(t, dict(a)) for t, a in self._history.get((kind, namespace_of(kind, namespace), name), [])]

    # ------------------------------------------------------------------ settling
    def settle(self) -> bool:
        """Wait until no watch event has come for ``quiet`` seconds (at most ``settle_limit``);
        whether anything arrived that the runtime has not taken."""
        deadline = time.monotonic() + self.settle_limit
        while True:
            with self._lock:
                idle = time.monotonic() - self._last_seen
                waiting = bool(self._events)
            if idle >= self.quiet or time.monotonic() > deadline:
                return waiting
            time.sleep(min(self.quiet - idle, 0.05) if idle < self.quiet else 0.05)

    def pending(self) -> bool:
        with self._lock:
            return bool(self._events)

    def _touched(self) -> None:
        with self._lock:
            self._last_seen = time.monotonic()

    # ------------------------------------------------------------------ helpers
    def _note_annotations(self, change: str, obj: Mapping[str, Any]) -> None:
        kind = obj.get("kind")
        if kind not in ("RayJob", "RayCluster", "Pod") or change == "Deleted":
            return
        metadata = kube.meta(obj)
        key = (str(kind), namespace_of(str(kind), metadata.get("namespace")), str(metadata.get("name")))
        annotations = {str(k): str(v) for k, v in (metadata.get("annotations") or {}).items()}
        if self._annotations.get(key) != annotations:
            self._annotations[key] = annotations
            self._history.setdefault(key, []).append((self.now, annotations))

    def _ensure_namespace(self, namespace: str) -> None:
        if namespace in self._namespaces or namespace in SYSTEM_NAMESPACES:
            return
        self._kubectl(["apply", "--server-side", f"--field-manager={MANAGER}", "-f", "-"],
                      yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
                      f"create namespace {namespace}")
        self._namespaces.add(namespace)

    def _resource_name(self, kind: str, namespace: str, name: str) -> str:
        """kubectl's fully qualified resource for a kind (``queues.v1beta1.scheduling.volcano.sh``): two
        peers call their kinds ``Queue`` and three ``PodGroup``."""
        api_version = self._applied.get((kind, namespace, name), "")
        for resource in candidates(kind):
            if not api_version or resource.api_version == api_version:
                if not resource.group:
                    return resource.plural
                return f"{resource.plural}.{resource.version}.{resource.group}"
        return kind.lower()

    def _run(self, args: list[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.kubectl_bin, "--kubeconfig", str(self.kubeconfig), *args], input=stdin,
                              capture_output=True, text=True, timeout=120)

    def _kubectl(self, args: list[str], stdin: str | None, what: str) -> str:
        done = self._run(args, stdin)
        if done.returncode != 0:
            raise ScenarioError(f"{what}: the API server refused it: {_one_line(done)}")
        return done.stdout


def _first_line(exc: BaseException) -> str:
    """An exception's message on one line (PyYAML's and kubernetes-asyncio's run over several)."""
    return " ".join(str(exc).split())[:400]


def _group(obj: Mapping[str, Any]) -> str:
    api_version = str(obj.get("apiVersion") or "")
    return api_version.split("/", 1)[0] if "/" in api_version else ""


def _key(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    metadata = kube.meta(obj)
    return (_group(obj), str(obj.get("kind") or ""), str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))


def _version(obj: Mapping[str, Any]) -> int | None:
    """The object's resourceVersion as a number: opaque by contract, etcd's revision in fact, and
    only compared here to tell whether the watch has caught up with a write."""
    try:
        return int(kube.meta(obj).get("resourceVersion") or "")
    except ValueError:
        return None


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    """kubectl's complaint on one line, bounded."""
    return " ".join((done.stderr or done.stdout).split())[:600]


class LiveRuntime(EmbeddedRuntime):
    """The embedded runtime over a ``LiveCluster``: virtual time that moves on once the cluster settles."""

    cluster: LiveCluster  # type: ignore[assignment]

    def _advance(self, t: float) -> None:
        super()._advance(t)
        self.cluster.now = self.now

    def drain(self) -> None:
        """Deliver until every inbox is empty and the cluster has settled with nothing new."""
        self.cluster.caught_up()
        while True:
            super().drain()
            self.cluster.settle()
            if not self.cluster.pending():
                return


def simulate_live(scenario: Scenario, kubeconfig: Path, policy: Policy | None = None, *, traced: bool = False,
                  keep_log: bool = True) -> Run:
    """Run ``scenario`` on the real cluster ``kubeconfig`` reaches: its nodes
    made KWOK nodes, its steps applied through the API server, the cores on virtual time as in
    ``simulate``. The cluster should hold none of the scenario's objects when it starts."""
    effective = scenario.effective_policy(policy)
    cluster = LiveCluster(kubeconfig, kubectl=catalog.binary("kubernetes", "kubectl"),
                          pod_startup=scenario.startup_seconds).start()
    try:
        run = play(scenario, effective, LiveRuntime(effective, cluster, traced=traced,  # type: ignore[arg-type]
                                                    keep_log=keep_log))
    finally:
        cluster.close()
    run.tolerance = TIME_TOLERANCE
    return run
