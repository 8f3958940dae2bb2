"""A small Kubernetes API server for the cluster adapter's tests: real HTTP, in memory.

kubernetes-asyncio talks to it exactly as to a cluster: the same paths, verbs, content types and
status codes. What it implements is what muster uses, with the API server's semantics:

- objects under ``/api/v1/...`` and ``/apis/GROUP/VERSION/...``, namespaced or cluster-scoped, for
  the resources it ``serves`` (any other resource is a 404, as for a CRD that is not installed);
- create (409 when the name is taken), get, list (items without kind/apiVersion for built-in
  kinds, as the real server sends them), merge patch (RFC 7386; strategic merge is treated the
  same: muster only patches maps), replace (PUT; 409 Conflict when the body names a
  ``resourceVersion`` that is not the current one, as for a Lease two candidates write), delete;
- one global ``resourceVersion`` counter, ``uid``s, and watches that resume after a version,
  start with the current objects when given none, and end after ``timeoutSeconds`` (a version the
  server no longer holds, 410 Gone, is the real server's: tests/realcluster/test_watch_expiry.py);
- a ``status`` subresource for every custom resource but Volcano's PodGroup (whose real CRD has none),
  listed by discovery (``GET /apis/GROUP/VERSION``): a merge patch there changes only ``status``,
  and ``status`` in a patch of the object itself is ignored, as for CRDs that declare the subresource;
- a bearer token when asked (``require_token``): a request without it is 401. No RBAC: the real
  authorizer judges muster's roles (tests/realcluster/test_rbac.py, test_leader.py), and an
  evaluation of our own could only agree with our reading of it;
- ``pods/NAME/binding`` (sets ``spec.nodeName`` and copies the Binding's annotations onto the pod;
  409 when the pod is bound already; 400 for a Binding naming another pod, 500 for one without a
  node, as the API server answers them: tests/realcluster/test_api.py) and ``pods/NAME/eviction`` (deletes the pod, or with
  ``graceful`` marks it terminating until the test deletes it).

It runs on a thread with its own event loop, so synchronous tests drive it with plain calls.

It serves the fast tests of the cluster link's own logic (the order of its effects, its two processes,
faults injected on demand, the deployment's processes end to end); what the real API server answers to
muster's requests is tested against one (tests/realcluster/), and where the two disagreed the emulator
was changed or its feature cut (docs/design/runtime.md, "What the real API server taught us").
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pydantic_core
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from shared.kernel.kube import merge_patch
from shared.kubernetes.kubeapi import checked
from shared.kubernetes.resources import EVENT, LEASE, WATCHED, WRITTEN_ONLY, Resource
from shared.parts.localbroker import free_port


_NODE = {"apiVersion": "v1", "kind": "Node", "name": "n1"}
MALFORMED_BINDINGS: tuple[tuple[dict[str, Any], int], ...] = (
    ({"kind": "Binding", "metadata": {"name": "q"}, "target": _NODE}, 400),  # another pod's
    ({"kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Pod", "name": "n1"}}, 500),
    ({"kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node"}}, 500),  # no node
    ({"kind": "Eviction", "metadata": {"name": "p"}, "target": _NODE}, 400),
    ({"kind": "Binding", "metadata": {"name": "p", "annotations": {"a": 1}}, "target": _NODE}, 400),
)
"""Bindings of pod ``p`` (to node ``n1``) the API server refuses, with its codes: the real server's
(tests/realcluster/test_api.py), which the emulator gives too (tests/integration/test_kubeapi.py)."""


async def post_binding(api: Any, namespace: str, body: dict[str, Any]) -> int:
    """POST ``body`` as pod ``p``'s binding through kubernetes-asyncio; the answer's status code."""
    try:
        await checked(client.CoreV1Api(api).create_namespaced_pod_binding("p", namespace, body,
                                                                           _preload_content=False))
        return 201
    except ApiException as exc:
        return int(exc.status)


def _json(value: Any) -> bytes:
    """``value`` as JSON, written by pydantic-core (far less CPU than the json module's: the emulator
    answers every bind and writes every watch event, and in the benchmarks its process shares the
    machine with the services); text UTF-8 cannot hold (half a surrogate pair, which a test may
    send on purpose) goes through ``json.dumps``, which escapes it, as before."""
    try:
        return pydantic_core.to_json(value, inf_nan_mode="constants")  # NaN as json.dumps writes it
    except pydantic_core.PydanticSerializationError:
        return json.dumps(value).encode()


def _json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=_json(body), status=status, content_type="application/json")


CORE_EXTRA = (EVENT, LEASE)
DEFAULT_SERVES = WATCHED + WRITTEN_ONLY + CORE_EXTRA
"""What muster reads and writes: the emulator serves these unless told otherwise."""


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure" if code >= 400 else "Success",
            "message": message, "reason": reason, "code": code}
    return _json_response(body, status=code)


def _status_subresource(resource: Resource) -> bool:
    """Custom resources have a status subresource, but Volcano's PodGroup, whose CRD declares none (as
    the real one: status is a field there)."""
    return bool(resource.group) and (resource.group, resource.plural) != ("scheduling.volcano.sh", "podgroups")


@dataclass
class _Change:
    version: int
    resource: Resource
    type: str
    obj: dict[str, Any]


@dataclass
class _State:
    objects: dict[tuple[Resource, str, str], dict[str, Any]] = field(default_factory=dict)
    changes: list[_Change] = field(default_factory=list)
    version: int = 0
    requests: list[tuple[str, str]] = field(default_factory=list)
    writes: list[tuple[float, str, str, str]] = field(default_factory=list)
    """(monotonic time, method, path, User-Agent) of every write request the server took."""
    failures: list[tuple[str, int, str]] = field(default_factory=list)
    """Statuses the next requests get instead of an answer (``KubeApiEmulator.fail``)."""
    bound_at: dict[tuple[str, str], float] = field(default_factory=dict)
    """(namespace, pod) -> ``time.monotonic()`` when its binding was taken (the benchmarks' finish line)."""


class KubeApiEmulator:
    """Start with ``start()`` (or as a context manager); ``url`` is what a client connects to."""

    def __init__(self, serves: tuple[Resource, ...] = DEFAULT_SERVES, *, graceful: bool = False) -> None:
        self.serves = serves
        self.graceful = graceful
        """Evicted pods only get a ``deletionTimestamp``: they are gone when the test deletes them
        (the kubelet's part), as pods with a termination grace period are."""
        self.state = _State()
        self._lock: asyncio.Lock | None = None
        """The lock every change is made under."""
        self._wakers: dict[Resource, set[asyncio.Event]] = {}
        """Per resource, the open watches' wake-ups: a change wakes only the watches of its resource."""
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="kube-emulator", daemon=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._runner: web.AppRunner | None = None
        self._closing = False
        self._token: str | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "KubeApiEmulator":
        self._thread.start()
        self._call(self._start())
        return self

    def stop(self) -> None:
        if self._runner is not None:
            self._call(self._shutdown(), timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> "KubeApiEmulator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _start(self) -> None:
        self._lock = asyncio.Lock()
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _shutdown(self) -> None:
        """End open watches first: the server waits for its handlers before it stops."""
        assert self._lock is not None and self._runner is not None
        async with self._lock:
            self._closing = True
            self._wake_all()
        await self._runner.cleanup()

    def _call(self, coro: Any, timeout: float = 10) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    # ------------------------------------------------------------------ the test's side
    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create ``obj`` (kind and apiVersion say where) as a user's ``kubectl create`` would."""
        resource = self.resource_of(obj["kind"], obj.get("apiVersion", "v1"))
        namespace = (obj.get("metadata") or {}).get("namespace") or ("default" if resource.namespaced else "")
        return copy.deepcopy(self._call(self._locked(self._create, resource, namespace, copy.deepcopy(obj))))

    def create_many(self, objs: list[dict[str, Any]]) -> None:
        """Create every object of ``objs`` at one instant (one lock, one wake-up of the watches)."""
        placed = []
        for obj in objs:
            resource = self.resource_of(obj["kind"], obj.get("apiVersion", "v1"))
            namespace = (obj.get("metadata") or {}).get("namespace") or ("default" if resource.namespaced else "")
            placed.append((resource, namespace, copy.deepcopy(obj)))

        def create_all() -> None:
            for resource, namespace, obj in placed:
                self._create(resource, namespace, obj)
        self._call(self._locked(create_all))

    def patch(self, kind: str, api_version: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        resource = self.resource_of(kind, api_version)
        return copy.deepcopy(self._call(self._locked(self._patch, resource, namespace, name, patch)))

    def delete(self, kind: str, api_version: str, namespace: str, name: str) -> None:
        resource = self.resource_of(kind, api_version)
        self._call(self._locked(self._delete, resource, namespace, name))

    def get(self, kind: str, api_version: str, namespace: str, name: str) -> dict[str, Any] | None:
        resource = self.resource_of(kind, api_version)
        obj = self.state.objects.get((resource, namespace if resource.namespaced else "", name))
        return copy.deepcopy(obj) if obj is not None else None

    def items(self, kind: str, api_version: str = "v1") -> list[dict[str, Any]]:
        resource = self.resource_of(kind, api_version)
        return [copy.deepcopy(o) for (r, _, _), o in list(self.state.objects.items()) if r == resource]

    def fail(self, code: int, reason: str, *, method: str = "", times: int = 1) -> None:
        """Answer the next ``times`` requests (of ``method``, if given) with ``code``: a refusal,
        throttling, an outage."""
        self.state.failures.extend([(method, code, reason)] * times)

    def resource_of(self, kind: str, api_version: str) -> Resource:
        for resource in self.serves:
            if resource.kind == kind and resource.api_version == api_version:
                return resource
        raise KeyError(f"{api_version} {kind} is not served")

    async def _locked(self, fn: Any, *args: Any) -> Any:
        assert self._lock is not None
        async with self._lock:
            return fn(*args)

    def _wake_all(self) -> None:
        for wakers in self._wakers.values():
            for wake in wakers:
                wake.set()

    # ------------------------------------------------------------------ storage
    # A stored object is never changed in place: a change makes a new top-level dict (and new dicts
    # along the patched path, ``merge_patch``) and shares the rest, so the change log can hold the
    # objects themselves instead of a deep copy per change.
    def _bump(self, resource: Resource, change: str, obj: dict[str, Any]) -> dict[str, Any]:
        """``obj`` at the next resourceVersion (a new dict), recorded as a change; wakes its watches."""
        self.state.version += 1
        obj = {**obj, "metadata": {**(obj.get("metadata") or {}), "resourceVersion": str(self.state.version)}}
        self.state.changes.append(_Change(self.state.version, resource, change, obj))
        for wake in self._wakers.get(resource, ()):
            wake.set()
        return obj

    def _create(self, resource: Resource, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        metadata = obj.setdefault("metadata", {})
        key = (resource, namespace, metadata.get("name", ""))
        if key in self.state.objects:
            raise _Failure(409, "AlreadyExists", f'{resource.plural} "{key[2]}" already exists')
        obj["kind"], obj["apiVersion"] = resource.kind, resource.api_version
        if resource.namespaced:
            metadata["namespace"] = namespace
        metadata["uid"] = str(uuid.uuid4())
        metadata.setdefault("creationTimestamp", "2026-11-23T00:00:00Z")
        obj = self.state.objects[key] = self._bump(resource, "ADDED", obj)
        return obj

    def _replace(self, resource: Resource, namespace: str, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        key = (resource, namespace, name)
        before = self.state.objects.get(key)
        if before is None:
            raise _Failure(404, "NotFound", f'{resource.plural} "{name}" not found')
        metadata = obj.setdefault("metadata", {})
        wanted = metadata.get("resourceVersion")
        if wanted and wanted != before["metadata"]["resourceVersion"]:
            raise _Failure(409, "Conflict", f'Operation cannot be fulfilled on {resource.plural} "{name}": the object '
                                            "has been modified; please apply your changes to the latest version and "
                                            "try again")
        obj["kind"], obj["apiVersion"] = resource.kind, resource.api_version
        for kept in ("uid", "creationTimestamp", "namespace"):
            if kept in before["metadata"]:
                metadata[kept] = before["metadata"][kept]
        metadata["name"] = name
        metadata["resourceVersion"] = before["metadata"]["resourceVersion"]
        if obj == before:
            return before
        obj = self.state.objects[key] = self._bump(resource, "MODIFIED", obj)
        return obj

    def _patch(self, resource: Resource, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        key = (resource, namespace, name)
        if key not in self.state.objects:
            raise _Failure(404, "NotFound", f'{resource.plural} "{name}" not found')
        before = self.state.objects[key]
        after = merge_patch(before, patch)
        after["metadata"] = {**after.get("metadata", {}), "uid": before["metadata"]["uid"]}
        if after == before:
            return before  # a no-op patch does not bump the version, as on a real server
        after = self.state.objects[key] = self._bump(resource, "MODIFIED", after)
        return after

    def _delete(self, resource: Resource, namespace: str, name: str) -> dict[str, Any]:
        obj = self.state.objects.pop((resource, namespace, name), None)
        if obj is None:
            raise _Failure(404, "NotFound", f'{resource.plural} "{name}" not found')
        return self._bump(resource, "DELETED", obj)

    # ------------------------------------------------------------------ HTTP
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.state.requests.append((request.method, request.path))
        failure = next((f for f in self.state.failures if f[0] in ("", request.method)), None)
        if failure is not None:
            self.state.failures.remove(failure)
            return _status(failure[1], failure[2], f"{failure[2]} (injected by the test)")
        if self._token is not None and request.headers.get("Authorization") != f"Bearer {self._token}":
            return _status(401, "Unauthorized", "Unauthorized")
        try:
            parts = [p for p in request.path.split("/") if p]
            if request.method == "GET" and len(parts) == 3 and parts[0] == "apis":
                return self._discovery(parts[1], parts[2])
            resource, namespace, name, sub = self._route(request.path)
            if request.method == "GET" and name is None:
                if request.query.get("watch", "").lower() in ("true", "1"):
                    return await self._watch(request, resource, namespace)
                return self._list(resource, namespace)
            body = await request.json() if request.can_read_body else None
            response = await self._locked_response(request.method, resource, namespace, name, sub, body)
            if request.method != "GET" and response.status < 300:
                self.state.writes.append((self.loop.time(), request.method, request.path,
                                          request.headers.get("User-Agent", "")))
            return response
        except _Failure as exc:
            return _status(exc.code, exc.reason, exc.message)

    def require_token(self, token: str) -> None:
        """From now on every request must carry ``Authorization: Bearer <token>`` (else 401), as a
        service account's requests do."""
        self._token = token

    def _discovery(self, group: str, version: str) -> web.Response:
        """``GET /apis/GROUP/VERSION``: the resources served there, with ``plural/status`` where the
        status is a subresource (the applier asks before writing status: ``KubeApplier._serves_status``)."""
        served = [r for r in self.serves if (r.group, r.version) == (group, version)]
        if not served:
            raise _Failure(404, "NotFound", f"no group {group}/{version}")
        resources = [{"name": r.plural, "namespaced": r.namespaced, "kind": r.kind} for r in served]
        resources += [{"name": f"{r.plural}/status", "namespaced": r.namespaced, "kind": r.kind} for r in served
                      if _status_subresource(r)]
        return _json_response({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}",
                               "resources": resources})

    def _route(self, path: str) -> tuple[Resource, str | None, str | None, str | None]:
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise _Failure(404, "NotFound", f"no route {path}")
        namespace = None
        if len(rest) >= 2 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest:
            raise _Failure(404, "NotFound", f"no route {path}")
        plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)
        for resource in self.serves:
            if (resource.group, resource.version, resource.plural) == (group, version, plural):
                return resource, namespace, name, sub
        raise _Failure(404, "NotFound", f"the server could not find the requested resource ({path})")

    def _list(self, resource: Resource, namespace: str | None) -> web.Response:
        items = []
        for (r, ns, _), obj in self.state.objects.items():
            if r == resource and (namespace is None or ns == namespace):
                item = copy.deepcopy(obj)
                if not resource.group:  # built-in kinds: list items carry no kind/apiVersion
                    item.pop("kind", None)
                    item.pop("apiVersion", None)
                items.append(item)
        return _json_response({"kind": f"{resource.kind}List", "apiVersion": resource.api_version,
                                  "metadata": {"resourceVersion": str(self.state.version)}, "items": items})

    async def _locked_response(self, method: str, resource: Resource, namespace: str | None, name: str | None,
                               sub: str | None, body: Any) -> web.Response:
        assert self._lock is not None
        ns = namespace or ""
        async with self._lock:
            if method == "POST" and name is None:
                obj = self._create(resource, ns, body)
                out = _json_response(obj, status=201)
            elif method == "POST" and resource.kind == "Pod" and sub == "binding":
                out = self._bind(ns, name or "", body)
            elif method == "POST" and resource.kind == "Pod" and sub == "eviction":
                if self.graceful:
                    self._patch(resource, ns, name or "", {"metadata": {"deletionTimestamp": "2026-11-23T00:00:00Z"}})
                else:
                    self._delete(resource, ns, name or "")
                out = _status(201, "", "")
            elif method == "PATCH" and sub == "status" and _status_subresource(resource):
                status = body.get("status") if isinstance(body, dict) else None
                out = _json_response(self._patch(resource, ns, name or "", {"status": status}))
            elif sub is not None:
                raise _Failure(404, "NotFound", f"no subresource {sub}")
            elif method == "GET":
                obj = self.state.objects.get((resource, ns, name or ""))
                if obj is None:
                    raise _Failure(404, "NotFound", f'{resource.plural} "{name}" not found')
                out = _json_response(obj)
            elif method == "PATCH":
                if _status_subresource(resource) and isinstance(body, dict):  # with a status subresource,
                    body = {k: v for k, v in body.items() if k != "status"}  # status goes through it only
                out = _json_response(self._patch(resource, ns, name or "", body))
            elif method == "PUT":
                out = _json_response(self._replace(resource, ns, name or "", body))
            elif method == "DELETE":
                out = _json_response(self._delete(resource, ns, name or ""))
            else:
                raise _Failure(405, "MethodNotAllowed", method)
            return out

    def _bind(self, namespace: str, name: str, binding: Any) -> web.Response:
        """As the API server's BindingREST: the Binding must name the pod of the URL and a node."""
        if not isinstance(binding, dict):
            raise _Failure(400, "BadRequest", "the body of a binding must be a Binding object")
        metadata = binding.get("metadata") if isinstance(binding.get("metadata"), dict) else {}
        if binding.get("kind", "Binding") != "Binding" or binding.get("apiVersion", "v1") != "v1":
            raise _Failure(400, "BadRequest", f"a binding must be a v1 Binding, not {binding.get('kind')!r}")
        if metadata.get("name", name) != name or metadata.get("namespace", namespace) != namespace:
            raise _Failure(400, "BadRequest", "name in URL does not match name in Binding object")
        target = binding.get("target") if isinstance(binding.get("target"), dict) else {}
        # the real server's validation errors of a Binding are an aggregate, not a Status: a 500
        if target.get("kind", "Node") not in ("", "Node"):
            raise _Failure(500, "InternalError", f'target.kind: Unsupported value: {target.get("kind")!r}: '
                                                 'supported values: "Node"')
        if not isinstance(target.get("name"), str) or not target["name"]:
            raise _Failure(500, "InternalError", "target.name: Required value")
        annotations = metadata.get("annotations") or {}
        if not isinstance(annotations, dict) or not all(isinstance(v, str) for v in annotations.values()):
            raise _Failure(400, "BadRequest", "metadata.annotations must map strings to strings")
        pod_resource = self.resource_of("Pod", "v1")
        pod = self.state.objects.get((pod_resource, namespace, name))
        if pod is None:
            raise _Failure(404, "NotFound", f'pods "{name}" not found')
        if (pod.get("spec") or {}).get("nodeName"):
            raise _Failure(409, "Conflict", f"pod {name} is already assigned to node {pod['spec']['nodeName']!r}")
        patch: dict[str, Any] = {"spec": {"nodeName": binding["target"]["name"]}}
        if annotations:
            patch["metadata"] = {"annotations": annotations}
        self._patch(pod_resource, namespace, name, patch)
        self.state.bound_at[(namespace, name)] = time.monotonic()
        return _status(201, "", "")

    async def _watch(self, request: web.Request, resource: Resource, namespace: str | None) -> web.StreamResponse:
        assert self._lock is not None
        since = request.query.get("resourceVersion", "")
        timeout = float(request.query.get("timeoutSeconds", "0") or 0) or None
        response = web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(request)

        async def send(event: dict[str, Any]) -> None:
            await response.write(_json(event) + b"\n")

        async with self._lock:
            if since in ("", "0"):
                start = self.state.version
                initial = [o for (r, ns, _), o in self.state.objects.items()
                           if r == resource and (namespace is None or ns == namespace)]
            else:
                start, initial = int(since), []
        try:
            await self._follow(response, send, resource, namespace, initial, start, timeout)
        except ConnectionError:
            pass  # the client went away (a watcher cancelled or restarted)
        return response

    async def _follow(self, response: web.StreamResponse, send: Any, resource: Resource, namespace: str | None,
                      initial: list[dict[str, Any]], start: int, timeout: float | None) -> None:
        assert self._lock is not None
        wake = asyncio.Event()  # set by every change of ``resource`` (``_bump``), and to end the watches
        self._wakers.setdefault(resource, set()).add(wake)
        try:
            for obj in initial:
                await send({"type": "ADDED", "object": obj})
            deadline = None if timeout is None else self.loop.time() + timeout
            position = start
            while True:
                async with self._lock:
                    if self._closing:
                        break
                    wake.clear()  # under the lock: a change after this look sets it again
                    # changes are in version order: look only past the last one looked at
                    fresh = self.state.changes[bisect.bisect_right(self.state.changes, position, key=_version_of):]
                    pending = [c for c in fresh if c.resource == resource
                               and (namespace is None or c.obj["metadata"].get("namespace") == namespace)]
                    position = fresh[-1].version if fresh else position
                if not pending:
                    remaining = None if deadline is None else deadline - self.loop.time()
                    if remaining is not None and remaining <= 0:
                        break
                    try:
                        await asyncio.wait_for(wake.wait(), remaining)
                    except asyncio.TimeoutError:
                        break
                    continue
                # one write for all that is pending: a write per event costs a chunk and a system call each
                await response.write(b"".join(_json({"type": change.type, "object": change.obj}) + b"\n"
                                              for change in pending))
        finally:
            self._wakers[resource].discard(wake)
        await response.write_eof()


def _version_of(change: _Change) -> int:
    return change.version


class _Failure(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
