"""The reconciler's hands and eyes on a real cluster: kubernetes-asyncio over HTTP.

``KubeApplier`` performs one ``KubeEffect`` (decided by ``core.py``; nothing is decided here; its
writes are the client's own calls: ``CoreV1Api``, ``CustomObjectsApi``) and
``Watcher`` lists and watches the resources admission and placement read (``resources.WATCHED``).
``shared.kubernetes.cluster`` wires both to Kafka (``muster run cluster``).

Applying an effect twice changes nothing, so at-least-once delivery of effects is safe:

=============  ================================================  ===================================
op             request                                           when it was done before / is moot
=============  ================================================  ===================================
suspend,       merge-patch ``spec.suspend`` on the RayJob or     the same value again; a missing
unsuspend      RayCluster                                        object is ``absent``
annotate       merge-patch ``metadata.annotations``              the same values again
bind           POST ``pods/NAME/binding`` (target node, the      409 with the pod on that node is
               GPU annotations on the Binding, which the API     ``unchanged``; on another node it is
               server copies onto the pod)                       a ``conflict`` (logged, not retried)
               first, each of the effect's ``claims`` not       a claim given that node already is
               given the node yet: merge-patch its               left as it is; a claim gone, or
               ``volume.kubernetes.io/selected-node`` under      given another node, is a
               its ``resourceVersion`` (a 409 reads it again)    ``conflict``: the pod is not bound
evict          POST ``pods/NAME/eviction`` (respects PDBs); a    404: the pod is gone already
               later bind to its node waits until the watch
               has seen it go (at most ``victim_wait``)
event          POST a core/v1 Event named after the effect's     409: that Event exists
               envelope id
status         merge-patch the ``status`` subresource with only  the same values again; a CRD served
               muster's fields (a queue's counts, a PodGroup's   without a status subresource is
               phase); writes to one object at least             patched on the object itself
               ``status_interval`` apart (later, never dropped)
=============  ================================================  ===================================

Errors: 404 on every place a kind may live is ``absent`` (the object was deleted since: nothing to
do); 429, 5xx and connection errors are ``Transient`` (the caller retries and does not commit), but an
eviction a PodDisruptionBudget refuses (429 with a ``DisruptionBudget`` cause) is ``Refused``;
any other 4xx is ``Refused`` (the caller dead-letters the effect with the API server's message).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
import time
import urllib.parse
import urllib.request
from collections import OrderedDict
from typing import Any, Awaitable, Callable, Literal

import aiohttp
from kubernetes_asyncio import client, config as kube_config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from services.reconciler.ingest import Change
from shared.kernel.dedupe import forget_before
from shared.kernel.events import KubeEffect
from shared.kubernetes.resources import NODE, Resource, candidates, located

log = logging.getLogger("muster.cluster")

Outcome = Literal["applied", "unchanged", "absent", "conflict"]
MERGE_PATCH = "application/merge-patch+json"
COMPONENT = "muster"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
"""``AnnSelectedNode``: the node a ``WaitForFirstConsumer`` claim is provisioned for (written before a bind)."""
_CLAIM_TRIES = 5
"""Reads of a claim that changed under a write of its node before the bind is retried as an outage."""


class Transient(Exception):
    """The API server could not take the request now (throttled, unavailable): try again later."""


class Refused(Exception):
    """The API server refused the request for good (forbidden, invalid): retrying cannot help."""


def server_message(exc: ApiException) -> str:
    """The ``message`` of the Status the API server answered with, on one line ("" when there is none)."""
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        said = json.loads(body).get("message") if body else ""
    except (ValueError, AttributeError):
        said = ""
    return " ".join(str(said or "").split())[:500]


def _failure(exc: ApiException, what: str) -> Exception:
    """``Transient`` or ``Refused``, in one line with the API server's own message: a real server's 422
    names the field it refused (``status.allocated: Required value``), its 403 the verb and resource."""
    message = f"{what}: {exc.status} {exc.reason}"
    said = server_message(exc)
    if said:
        message += f": {said}"
    if exc.status == 429 or (exc.status or 0) >= 500:
        return Transient(message)
    return Refused(message)


async def connect(url: str | None = None, kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """An API client: a plain URL (``kubectl proxy``, tests), else the pod's service account when
    running in a cluster, else a kubeconfig file (``$KUBECONFIG`` or ``~/.kube/config``)."""
    if url:
        configuration = client.Configuration(host=url.rstrip("/"))
    else:
        configuration = client.Configuration()
        if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
            kube_config.load_incluster_config(client_configuration=configuration)
        else:
            await kube_config.load_kube_config(config_file=kubeconfig, context=context,
                                               client_configuration=configuration)
    return _without_env_lookups(client.ApiClient(configuration))


def _without_env_lookups(api: client.ApiClient) -> client.ApiClient:
    """kubernetes-asyncio's session trusts the environment, so aiohttp reads ``~/.netrc`` and the
    proxy variables on a worker thread for every request: two thread hand-offs a request, a large
    part of a bind's CPU against the real API server (docs/benchmarks.md, "A bind's CPU"). The proxy is decided once here instead, from the same
    variables (``HTTPS_PROXY``, ``NO_PROXY``, ...), unless the kubeconfig names one; credentials
    come from the kubeconfig or the service account, never from ``.netrc``."""
    rest = api.rest_client
    trusting = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(connector=trusting.connector, trust_env=False,
                                              read_bufsize=2**21)  # as kubernetes-asyncio's: large watch events
    trusting.detach()  # the connector (pool and TLS settings) now belongs to the new session
    if not api.configuration.proxy:
        parts = urllib.parse.urlsplit(api.configuration.host)
        proxy = urllib.request.getproxies().get(parts.scheme)
        if proxy and not urllib.request.proxy_bypass(parts.netloc):
            rest.proxy = proxy
    return api


async def checked(call: Awaitable[Any]) -> dict[str, Any]:
    """The body of a request made with ``_preload_content=False``, which the client does not check:
    ``ApiException`` for a status that is not 2xx, as the client raises for the others."""
    response = await call
    try:
        body = await response.read()
    finally:
        response.release()
    if not 200 <= response.status <= 299:
        raise _answer(response.status, response.reason, body)
    return json.loads(body) if body else {}


def _budget_refused(exc: ApiException) -> bool:
    """The eviction was refused for a PodDisruptionBudget: 429 with a ``DisruptionBudget`` cause (no
    disruption allowed now, or the budget not yet observed by its controller), or 500 for a pod under
    more than one budget (k8s.io/kubernetes pkg/registry/core/pod/storage/eviction.go). An effect
    whose eviction waited for the budget would hold back every effect read after it (an eviction is
    a barrier, ``shared.kubernetes.cluster``): it is dead-lettered with the budget's reason instead."""
    if exc.status == 500:
        return "more than one PodDisruptionBudget" in server_message(exc)
    return exc.status == 429 and "DisruptionBudget" in _causes(exc)


def _causes(exc: ApiException) -> str:
    """The ``details.causes`` of the answer's Status, as ``(type: message)`` parts."""
    try:
        details = json.loads(exc.body or "{}").get("details") or {}
    except (ValueError, AttributeError):
        return ""
    return " ".join(f"({c.get('reason') or c.get('type')}: {c.get('message')})" for c in details.get("causes") or [])


def _answer(status: int, reason: str | None, body: bytes) -> ApiException:
    """The ``ApiException`` the client raises for an answer that is not 2xx, with the server's Status body."""
    exc = ApiException(status=status, reason=reason)
    exc.body = body.decode("utf-8", "replace")
    return exc


# --------------------------------------------------------------------------- effects
class KubeApplier:
    """Performs ``KubeEffect``s; see the module docstring for each op's request."""

    def __init__(self, api: client.ApiClient, *, victim_wait: float = 120.0, status_interval: float = 1.0) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.victim_wait = victim_wait
        self.status_interval = status_interval
        self._status_served: dict[Resource, bool | None] = {}
        """Per custom resource: whether its status is a subresource (``_serves_status``)."""
        self._status_written: OrderedDict[tuple[str, str, str, str], float] = OrderedDict()
        """(apiVersion, kind, namespace, name) -> when its status was last written (monotonic), oldest
        first; a write older than ``status_interval`` spaces nothing, so it is forgotten (``_written``)."""
        self.leaving: dict[str, set[tuple[str, str]]] = {}
        """node -> pods evicted from it that have not yet gone (a bind there waits for them)."""
        self._gone = asyncio.Condition()

    async def pod_gone(self, namespace: str, name: str) -> None:
        """The watch saw a pod deleted: binds waiting for its node may go ahead."""
        async with self._gone:
            for node in [n for n, pods in self.leaving.items() if (namespace, name) in pods]:
                self.leaving[node].discard((namespace, name))
                if not self.leaving[node]:
                    del self.leaving[node]
            self._gone.notify_all()

    async def pods_listed(self) -> None:
        """After a list of every pod: an evicted pod may have gone while no watch saw it go (a watcher
        started again lists only what exists), so the API server is asked after each one and those it
        no longer has are gone: ``leaving`` holds pods that exist, not every deletion missed. Asked, not
        read from the list: the list is the watching process's, and a pod may have been made and evicted
        after it was taken. An answer the server cannot give now leaves the pod to the next list or bind."""
        for namespace, name in sorted({pod for node in self.leaving.values() for pod in node}):
            try:
                if await self._read_pod(namespace, name) is None:
                    await self.pod_gone(namespace, name)
            except (Transient, Refused, aiohttp.ClientError, asyncio.TimeoutError) as exc:
                log.info("evicted pod %s/%s not in the list; asking the API server failed: %s", namespace, name, exc)

    async def apply(self, effect: KubeEffect, effect_id: str) -> Outcome:
        try:
            if effect.op in ("suspend", "unsuspend"):
                return await self._patch(effect, {"spec": {"suspend": effect.op == "suspend"}})
            if effect.op == "annotate":
                return await self._patch(effect, {"metadata": {"annotations": dict(effect.annotations)}})
            if effect.op == "bind":
                return await self._bind(effect)
            if effect.op == "evict":
                return await self._evict(effect)
            if effect.op == "status":
                return await self._status(effect)
            return await self._event(effect, effect_id)
        except aiohttp.ClientError as exc:
            raise Transient(f"{effect.op} {effect.subject}: {exc}") from exc

    async def _patch(self, effect: KubeEffect, body: dict[str, Any]) -> Outcome:
        for resource in candidates(effect.kind):
            try:
                await checked(self._merge_patch(resource, effect.namespace, effect.name, body))
                return "applied"
            except ApiException as exc:
                if exc.status != 404:
                    raise _failure(exc, f"{effect.op} {resource.kind} {effect.namespace}/{effect.name}") from None
        return "absent"

    async def _status(self, effect: KubeEffect) -> Outcome:
        """Merge-patch the status subresource with muster's fields only, never faster than one write
        per object per ``status_interval`` (a write that comes sooner waits for its turn)."""
        target = (effect.api_version, effect.kind, effect.namespace, effect.name)
        last = self._status_written.get(target)
        if last is not None and (wait := last + self.status_interval - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        body = {"status": dict(effect.status)}
        for resource in located(effect.kind, effect.api_version):
            namespace = effect.namespace if resource.namespaced else None
            served = await self._serves_status(resource)
            if served is None:
                continue  # the group/version is not served here: the object cannot be there
            try:
                await self._patch_status(resource, namespace, effect.name, body, subresource=served)
            except ApiException as exc:
                if exc.status != 404:
                    raise _failure(exc, f"status of {resource.kind} {effect.namespace}/{effect.name}") from None
                self._status_served.pop(resource, None)  # gone, or its CRD changed: asked again next time
                continue
            self._written(target)
            return "applied"
        return "absent"

    async def _serves_status(self, resource: Resource) -> bool | None:
        """Whether the API server serves ``resource``'s status subresource (its discovery document lists
        ``plural/status``), None when it does not serve the group/version at all; asked once per resource.

        Volcano's own PodGroup CRD declares no status subresource (Kubeflow's PodGroup does): there
        ``status`` is a field of the object, and a PATCH of ``.../status`` is a 404 like that of a missing
        object. Asking discovery sends each write where it belongs, one request, where trying the
        subresource first cost two for every Volcano PodGroup."""
        known = self._status_served.get(resource, ...)
        if known is not ...:
            return known  # type: ignore[return-value]
        try:
            listing = await checked(client.CustomObjectsApi(self.core.api_client).get_api_resources(
                resource.group, resource.version, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _failure(exc, f"discovery of {resource.api_version}") from None
        names = {str(item.get("name")) for item in listing.get("resources") or []}
        served = None if resource.plural not in names else f"{resource.plural}/status" in names
        if served is not None:  # a CRD installed later is found at a later write
            self._status_served[resource] = served
        return served

    def _written(self, target: tuple[str, str, str, str]) -> None:
        """Note a status write to ``target`` and forget the writes too old to space the next one: the
        link keeps the objects written in the last interval, not one per PodGroup ever written."""
        now = time.monotonic()
        written = self._status_written
        written[target] = now
        written.move_to_end(target)
        forget_before(written, now - self.status_interval)

    async def _patch_status(self, resource: Resource, namespace: str | None, name: str, body: dict[str, Any], *,
                            subresource: bool) -> None:
        await checked(self._merge_patch(resource, namespace, name, body, status=subresource))

    def _merge_patch(self, resource: Resource, namespace: str | None, name: str, body: dict[str, Any], *,
                     status: bool = False) -> Awaitable[Any]:
        """A JSON merge patch of an object (or its status subresource) through the client's calls:
        ``CoreV1Api`` for a Pod or Node, ``CustomObjectsApi`` for every other group (its paths serve
        built-in groups too). The content type is named, as the client would pick another for a mapping."""
        options = {"_content_type": MERGE_PATCH, "_preload_content": False}
        if resource.kind == "Pod":
            pod = self.core.patch_namespaced_pod_status if status else self.core.patch_namespaced_pod
            return pod(name, namespace, body, **options)
        if resource.kind == "Node":
            node = self.core.patch_node_status if status else self.core.patch_node
            return node(name, body, **options)
        api = self.custom
        if resource.namespaced:
            patch = api.patch_namespaced_custom_object_status if status else api.patch_namespaced_custom_object
            return patch(resource.group, resource.version, namespace, resource.plural, name, body, **options)
        patch = api.patch_cluster_custom_object_status if status else api.patch_cluster_custom_object
        return patch(resource.group, resource.version, resource.plural, name, body, **options)

    async def _bind(self, effect: KubeEffect) -> Outcome:
        if not effect.node:  # the API server's answer would be a 500 (BindingREST.Create returns its
            # validation errors as an aggregate, not a Status), which is retried as an outage for ever
            raise Refused(f"bind Pod {effect.namespace}/{effect.name}: no node to bind it to")
        await self._victims_gone(effect.node)
        for claim in effect.claims:
            if not await self._select_node(effect.namespace, claim, effect.node):
                log.warning("pod %s/%s not bound to %s: its claim %s is gone or was given another node",
                            effect.namespace, effect.name, effect.node, claim)
                return "conflict"
        metadata: dict[str, Any] = {"name": effect.name, "namespace": effect.namespace}
        if effect.annotations:
            metadata["annotations"] = dict(effect.annotations)
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": metadata,
                "target": {"apiVersion": "v1", "kind": "Node", "name": effect.node}}
        try:
            await checked(self.core.create_namespaced_pod_binding(effect.name, effect.namespace, body,
                                                                   _preload_content=False))
            return "applied"
        except ApiException as exc:
            if exc.status == 404:
                return "absent"
            if exc.status != 409:
                raise _failure(exc, f"bind Pod {effect.namespace}/{effect.name}") from None
        pod = await self._read_pod(effect.namespace, effect.name)
        if pod is None:
            return "absent"
        bound_to = (pod.get("spec") or {}).get("nodeName")
        if bound_to == effect.node:
            return "unchanged"
        log.warning("pod %s/%s is bound to %s, not %s: left as it is", effect.namespace, effect.name,
                    bound_to, effect.node)
        return "conflict"

    async def _evict(self, effect: KubeEffect) -> Outcome:
        pod = await self._read_pod(effect.namespace, effect.name)
        if pod is None:
            return "absent"
        node = (pod.get("spec") or {}).get("nodeName")
        if node:  # before the request: the watch may see the pod go before the request returns
            async with self._gone:
                self.leaving.setdefault(node, set()).add((effect.namespace, effect.name))
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=effect.name, namespace=effect.namespace))
        try:
            await checked(self.core.create_namespaced_pod_eviction(effect.name, effect.namespace, body,
                                                                    _preload_content=False))
        except ApiException as exc:
            await self.pod_gone(effect.namespace, effect.name)  # nothing will leave: do not wait for it
            if exc.status == 404:
                return "absent"
            if _budget_refused(exc):  # not Transient: retried for ever, it held every later effect back
                raise Refused(f"evict Pod {effect.namespace}/{effect.name}: {exc.status} {exc.reason}: "
                              f"{server_message(exc)} {_causes(exc)}".rstrip()) from None
            raise _failure(exc, f"evict Pod {effect.namespace}/{effect.name}") from None
        return "applied"

    async def _victims_gone(self, node: str) -> None:
        """Placement counts a victim's resources free once it decides the preemption; the kubelet
        does only once the victim's pod is gone. Wait for that (as KAI's binder does), at most
        ``victim_wait`` seconds; then ask the API server, in case a deletion was not seen."""
        if not self.leaving.get(node):
            return  # nothing leaves that node (almost every bind): no lock, no timeout task
        async with self._gone:
            try:
                await asyncio.wait_for(self._gone.wait_for(lambda: not self.leaving.get(node)), self.victim_wait)
                return
            except asyncio.TimeoutError:
                pass
        for namespace, name in sorted(self.leaving.get(node, ())):
            if await self._read_pod(namespace, name) is None:
                await self.pod_gone(namespace, name)
        if self.leaving.get(node):
            log.warning("binding to %s while evicted pods are still there: %s", node,
                        ", ".join(f"{ns}/{n}" for ns, n in sorted(self.leaving[node])))

    async def _event(self, effect: KubeEffect, effect_id: str) -> Outcome:
        resource = next(iter(candidates(effect.kind)), None)
        namespace = effect.namespace if resource is None or resource.namespaced else "default"
        now = dt.datetime.now(dt.timezone.utc)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"{effect.name}.{effect_id[:16]}", namespace=namespace),
            involved_object=client.V1ObjectReference(
                kind=effect.kind or (resource.kind if resource else ""), name=effect.name,
                namespace=effect.namespace if resource is None or resource.namespaced else None,
                api_version=resource.api_version if resource else None),
            reason=effect.reason, message=effect.message, type=effect.event_type,
            source=client.V1EventSource(component=COMPONENT), reporting_component=COMPONENT,
            first_timestamp=now, last_timestamp=now, count=1,
        )
        try:
            await checked(self.core.create_namespaced_event(namespace, body, _preload_content=False))
            return "applied"
        except ApiException as exc:
            if exc.status == 409:
                return "unchanged"
            if exc.status == 404:
                return "absent"
            raise _failure(exc, f"event on {effect.subject}") from None

    async def _select_node(self, namespace: str, name: str, node: str) -> bool:
        """Write ``node`` as the claim's ``volume.kubernetes.io/selected-node`` (VolumeBinding's PreBind,
        ``bindAPIUpdate``), unless it has it; False when the claim is gone or names another node (then the
        pod must not be bound there). The patch carries the version read, so a writer in between (another
        scheduler, the provisioner dropping a failed selection) is seen and the claim read again."""
        for _ in range(_CLAIM_TRIES):
            try:
                claim = await checked(self.core.read_namespaced_persistent_volume_claim(
                    name, namespace, _preload_content=False))
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise _failure(exc, f"read PersistentVolumeClaim {namespace}/{name}") from None
            meta = claim.get("metadata") or {}
            selected = (meta.get("annotations") or {}).get(SELECTED_NODE)
            if selected == node or (claim.get("spec") or {}).get("volumeName"):
                return True  # given this node already, or bound meanwhile: nothing to provision
            if selected:
                return False
            body = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": {SELECTED_NODE: node}}}
            try:
                await checked(self.core.patch_namespaced_persistent_volume_claim(
                    name, namespace, body, _content_type=MERGE_PATCH, _preload_content=False))
                return True
            except ApiException as exc:
                if exc.status == 404:
                    return False
                if exc.status != 409:
                    raise _failure(exc, f"annotate PersistentVolumeClaim {namespace}/{name}") from None
        raise Transient(f"PersistentVolumeClaim {namespace}/{name} kept changing while its node was written")

    async def _read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await checked(self.core.read_namespaced_pod(name, namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _failure(exc, f"read Pod {namespace}/{name}") from None


# --------------------------------------------------------------------------- watch
Sink = Callable[[Change, dict[str, Any]], Awaitable[None]]
Inventory = Callable[[Resource, str, list[dict[str, Any]]], Awaitable[None]]
"""After a list: the resource, the list's resourceVersion and every object in it (``Watcher.run``)."""
_CHANGES: dict[str, Change] = {"ADDED": "Added", "MODIFIED": "Modified", "DELETED": "Deleted"}


class Watcher:
    """List, then watch from the list's resourceVersion, resuming each time the server ends a watch;
    list again when the version has expired (410) or the connection failed.

    What a relist finds is compared with what was seen: new objects are Added, changed ones
    Modified, missing ones Deleted (with their last version), unchanged ones not sent again; and
    every list is reported whole (``inventory``), for what a restarted watcher never saw to be found
    gone downstream (``shared.kernel.listing``). A
    resource the cluster does not serve (a CRD not installed: 404) is tried again every
    ``absent_retry`` seconds, so installing Volcano later needs no restart.

    What was seen is kept as text, not as the parsed objects: see ``Cached``.
    """

    def __init__(self, api: client.ApiClient, *, watch_timeout: int = 300, absent_retry: float = 30.0,
                 error_retry: float = 2.0) -> None:
        self.api = api
        self.watch_timeout = watch_timeout
        self.absent_retry = absent_retry
        self.error_retry = error_retry
        self.lists = 0
        """How many list calls were made (a relist is visible in tests and logs)."""

    async def probe(self) -> None:
        """One cheap request (a list of at most one node): raises when the API server cannot be used."""
        await checked(self._call(NODE, limit=1, _preload_content=False))

    async def run(self, resource: Resource, sink: Sink, listed: Callable[[], None] | None = None,
                  inventory: Inventory | None = None) -> None:
        """Report every change of ``resource`` to ``sink``, forever. After each list, ``inventory``
        gets the list's resourceVersion and every object in it (after the list's changes went to
        ``sink``, before any later one), and ``listed`` is called: from then on a deletion is seen as
        one. A resource not served (404) is no listing (as client-go's reflector, which replaces
        its store only with a list it got): its objects are judged at the first list that works."""
        seen: dict[tuple[str, str], Cached] = {}
        version: str | None = None
        absent_logged = False
        while True:
            try:
                if version is None:
                    version, listing = await self._relist(resource, seen, sink)
                    absent_logged = False
                    if inventory is not None:
                        await inventory(resource, version, listing)
                    if listed is not None:
                        listed()
                version = await self._watch(resource, version, seen, sink)
            except ApiException as exc:
                version = None
                if exc.status == 404:  # no listing: a list that failed says nothing of what exists
                    if listed is not None:
                        listed()  # nothing of it exists to miss the deletion of
                    if not absent_logged:
                        log.info("%s (%s) is not served by this cluster; trying again every %ss",
                                 resource.plural, resource.api_version, self.absent_retry)
                        absent_logged = True
                    await asyncio.sleep(self.absent_retry)
                elif exc.status != 410:  # 410: the version expired; list again at once
                    log.warning("watching %s: %s %s; listing again", resource.plural, exc.status, exc.reason)
                    await asyncio.sleep(self.error_retry)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                version = None
                log.warning("watching %s: %s; listing again", resource.plural, exc)
                await asyncio.sleep(self.error_retry)

    async def _relist(self, resource: Resource, seen: dict[tuple[str, str], Cached], sink: Sink
                      ) -> tuple[str, list[dict[str, Any]]]:
        """List, report what changed since ``seen``; the list's resourceVersion and its objects."""
        self.lists += 1
        listing = await checked(self._call(resource, _preload_content=False))
        present: dict[tuple[str, str], dict[str, Any]] = {}
        for item in listing.get("items") or []:
            obj = _complete(item, resource)
            present[_key(obj)] = obj
        for key in [k for k in seen if k not in present]:
            await sink("Deleted", revived(seen.pop(key), resource))
        for key, obj in present.items():
            before = seen.get(key)
            if before is None or before[:2] != _version(obj):
                seen[key] = _seen(obj)
                await sink("Added" if before is None else "Modified", obj)
        return str((listing.get("metadata") or {}).get("resourceVersion") or ""), list(present.values())

    async def _watch(self, resource: Resource, version: str, seen: dict[tuple[str, str], Cached], sink: Sink) -> str:
        """Follow one watch until the server ends it; the resourceVersion to resume from."""
        watch = _RawWatch(return_type="object")
        async with watch:
            stream = watch.stream(self._call, resource, resource_version=version, allow_watch_bookmarks=True,
                                  timeout_seconds=self.watch_timeout)
            async for event in stream:
                change = _CHANGES.get(event["type"])
                if change is None:
                    continue  # BOOKMARK: only moves the resourceVersion on
                obj = _complete(event["raw_object"], resource)
                if change == "Deleted":
                    seen.pop(_key(obj), None)
                else:
                    seen[_key(obj)] = _seen(obj, event.get("raw_line"))
                await sink(change, obj)
        return str(watch.resource_version or version)

    async def get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        """One object as the API server has it now, None if there is none (``owners.Owners.look_up``:
        a pod seen before the RayCluster or RayJob it belongs to)."""
        try:
            obj = await client.CustomObjectsApi(self.api).get_namespaced_custom_object(
                resource.group, resource.version, namespace, resource.plural, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return _complete(obj, resource) if isinstance(obj, dict) else None

    async def _call(self, resource: Resource, **kwargs: Any) -> Any:
        """GET the resource's collection across namespaces (a list, or a watch with ``watch=True``)."""
        core = client.CoreV1Api(self.api)
        if resource.kind == "Pod":
            return await core.list_pod_for_all_namespaces(**kwargs)
        if resource.kind == "Node":
            return await core.list_node(**kwargs)
        if resource.kind == "PriorityClass":
            return await client.SchedulingV1Api(self.api).list_priority_class(**kwargs)
        if resource.kind == "RuntimeClass":
            return await client.NodeV1Api(self.api).list_runtime_class(**kwargs)
        if resource.kind == "PersistentVolumeClaim":
            return await core.list_persistent_volume_claim_for_all_namespaces(**kwargs)
        if resource.kind == "PersistentVolume":
            return await core.list_persistent_volume(**kwargs)
        if resource.kind == "StorageClass":
            return await client.StorageV1Api(self.api).list_storage_class(**kwargs)
        return await client.CustomObjectsApi(self.api).list_cluster_custom_object(
            resource.group, resource.version, resource.plural, **kwargs)


class _RawWatch(Watch):
    """kubernetes-asyncio's watch hands each event's object to ``deserialize`` for the return type;
    for ``object`` that is a ``json.dumps`` and a ``json.loads`` of the dict it has just parsed, twice
    the parsing a watch event needs. This one keeps the parsed dict (``raw_object``, as the watcher
    reads it) and the line it came in (``raw_line``, what ``Cached`` keeps); errors, bookmarks and the
    resourceVersion are handled as before."""

    def unmarshal_event(self, data: str | bytes, response_type: str | None) -> Any:
        event = super().unmarshal_event(data, None)
        if not isinstance(event, dict):
            # a line that is not JSON: the API server's plain-text answer to a path it does not route
            # ("404 page not found": a CRD deleted between the list and the watch), which the client
            # hands on as a string; an error like the JSON ones it raises, so the watcher waits it out
            text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
            exc = ApiException(status=getattr(self.resp, "status", None) or 500, reason=" ".join(text.split())[:200])
            exc.body = text
            raise exc
        event["raw_line"] = data
        return event


Cached = tuple[str, str, "str | bytes", bool]
"""An object as the watcher last saw it: ``(uid, resourceVersion, text, whether the text is the watch
event's line)`` (``_seen``); ``revived`` parses it again, for the one use of a past object: reporting
it deleted when a relist no longer finds it.

The watcher holds the last version of every object it watches, as an informer's cache does, but
nothing reads those objects except that rare relist. Kept as parsed dicts they were what the cluster
link's cyclic collector walked: every watch event's object survived the young collections (a pod
replaces its last version), so a young collection walked tens of thousands of objects (generation
1, a pause of its own under load), and a full one the whole cache, every pod and node of the
cluster (the longest pauses of all once it was full). A plain tuple of texts is
not tracked by the collector once a collection has seen it (CPython untracks tuples of atomic
values; a subclass it would not), the line is already there (nothing encoded on a watch event; a
list's items are encoded once), and the text is smaller than its dicts."""


def _seen(obj: dict[str, Any], line: str | bytes | None = None) -> Cached:
    """``obj`` as the watcher keeps it: the watch event's ``line`` when given, else its JSON text."""
    uid, version = _version(obj)
    if line is None:
        return (uid, version, json.dumps(obj, separators=(",", ":")), False)
    return (uid, version, line, True)


def revived(kept: Cached, resource: Resource) -> dict[str, Any]:
    """The object ``_seen`` kept, as the watch or list gave it."""
    value = json.loads(kept[2])
    return _complete(value["object"] if kept[3] else value, resource)


def _complete(obj: dict[str, Any], resource: Resource) -> dict[str, Any]:
    """List items of built-in kinds come without kind/apiVersion; ingest reads the kind from there."""
    obj.setdefault("kind", resource.kind)
    obj.setdefault("apiVersion", resource.api_version)
    return obj


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))


def _version(obj: dict[str, Any]) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return (str(metadata.get("uid") or ""), str(metadata.get("resourceVersion") or ""))
