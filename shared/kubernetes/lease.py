"""Exactly one applier: the coordination.k8s.io Lease ``muster run cluster`` holds while it works.

The election is kubernetes-asyncio's own (``kubernetes_asyncio.leaderelection``: ``LeaderElection``
over a ``LeaseLock``), client-go's protocol: a candidate reads the Lease; absent, it creates it; held
by itself, it renews ``renewTime``; held by another, it waits until the record has not changed for
the lease duration as measured on its own clock from when it saw it change (two machines' clocks are
never compared), or until the holder released it; every write replaces the version it read, so of
two candidates writing at once the API server takes one and answers the other 409. The holder renews
every retry period; when it has not managed to for the renew deadline (shorter than the lease
duration, so before anyone else may take over) it has lost the Lease and must stop applying at once:
``muster run cluster`` exits (code 1) and its Deployment restarts it as a standby.

What muster adds around the client's module, each for a reason the real API server showed:

- ``check``: a candidate whose ServiceAccount may not read, create or update the Lease would wait
  forever (the client logs a 403 and tries again), so it is asked first (SelfSubjectAccessReview,
  which every authenticated user may make) and a refusal is one line and exit code 2.
- A request that fails on its way (connection refused, timeout) is a try that did not succeed, as in
  client-go; the client catches only ``ApiException``, so such an error ended its renew loop with
  an exception, leaving the caller without the "lost" signal.
- ``release``: a holder that stops cleanly empties ``holderIdentity`` (client-go's
  ``ReleaseOnCancel``, which the client lacks), so a standby takes over at its next try instead of
  after the lease duration.
- The client logs a lost race (409) with a traceback; those lines are one line here.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from typing import Any, Awaitable, Callable

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

from shared.kubernetes.resources import LEASE

log = logging.getLogger("muster.lease")
VERBS = ("get", "create", "update")
"""What the election does with the Lease (deploy/k8s/base/rbac.yaml's Role muster-cluster-lease)."""


class LeaseLost(Exception):
    """The holder could not renew within the renew deadline: another candidate may hold it soon."""


class LeaseForbidden(Exception):
    """The ServiceAccount may not use the Lease: waiting for it would never end."""


class _OneLine(logging.Filter):
    """The client logs a failed create or update of the lock (another candidate wrote first: 409) with
    its traceback; the reason alone says it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            reason = f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else str(exc)
            record.msg, record.args = f"{record.getMessage()}: {reason}", ()
            record.exc_info = record.exc_text = None
        return True


for _name in ("kubernetes_asyncio.leaderelection.resourcelock.leaselock",
              "kubernetes_asyncio.leaderelection.leaderelection"):
    logging.getLogger(_name).addFilter(_OneLine())


class _Election(leaderelection.LeaderElection):
    """The client's election, where a request that fails on its way is a try that did not succeed."""

    async def try_acquire_or_renew(self) -> bool:
        try:
            return await super().try_acquire_or_renew()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            log.warning("the lease %s/%s: %s", self.election_config.lock.namespace, self.election_config.lock.name,
                        " ".join(str(exc).split()) or type(exc).__name__)
            return False


async def _nothing() -> None:
    """The client wants a coroutine to run while leading; muster runs its app beside the election instead."""


class LeaseElector:
    """Takes and keeps the Lease ``namespace/name`` for ``identity`` (see the module docstring)."""

    def __init__(self, namespace: str, name: str, identity: str, *, lease_duration: float = 15.0,
                 renew_deadline: float = 10.0, retry_period: float = 2.0) -> None:
        self.namespace, self.name, self.identity = namespace, name, identity
        self.retry_period = retry_period
        # the Lease holds whole seconds, and the client writes the duration with int(str(duration)):
        # a float (the CLI's 15.0) failed there, at the first write, so it is whole seconds here
        whole = math.ceil(lease_duration) if lease_duration > 0 else lease_duration
        try:  # the client's own bounds: lease > renew deadline > 1.2 x retry period, each at least 1 s
            config = electionconfig.Config(_Lock(name, namespace, identity), whole, renew_deadline,
                                           retry_period, _nothing, _nothing)
        except ValueError as exc:
            raise ValueError(f"{exc} (got lease duration {lease_duration:g}, renew deadline {renew_deadline:g}, "
                             f"retry period {retry_period:g})") from None
        self._election = _Election(config)

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def holder(self) -> str:
        """Who held the Lease when this candidate last read it ("" for nobody)."""
        record = self._election.observed_record
        return (record.holder_identity or "") if record is not None else ""

    def _on(self, api: client.ApiClient) -> _Election:
        """The election, its lock requesting through ``api`` (each event loop has its own client)."""
        self._election.election_config.lock = _Lock(self.name, self.namespace, self.identity, api)
        return self._election

    async def check(self, api: client.ApiClient) -> None:
        """``LeaseForbidden`` naming what RBAC does not allow this ServiceAccount to do with the Lease."""
        authz = client.AuthorizationV1Api(api)
        refused = []
        for verb in VERBS:
            review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    group=LEASE.group, resource=LEASE.plural, verb=verb, namespace=self.namespace, name=self.name)))
            try:
                answer = await authz.create_self_subject_access_review(review)
            except ApiException as exc:
                if exc.status == 404:
                    return  # a server without authorization.k8s.io cannot be asked: the election will tell
                raise
            if not answer.status.allowed:
                refused.append(verb)
        if refused:
            raise LeaseForbidden(f"not allowed to {'/'.join(refused)} leases.{LEASE.group} in namespace "
                                 f"{self.namespace} (deploy/k8s/base/rbac.yaml's Role muster-cluster-lease)")

    async def try_once(self, api: client.ApiClient) -> bool:
        """One read, and the create, renewal or takeover the protocol allows: whether this candidate holds it now."""
        return await self._on(api).try_acquire_or_renew()

    async def acquire(self, api: client.ApiClient, *, on_wait: Callable[[str], None] | None = None) -> None:
        """Return once this candidate holds the Lease; ``on_wait(holder)`` is told once per holder it waits for."""
        told = None
        while not await self.try_once(api):
            if on_wait is not None and self.holder != told:
                told = self.holder
                on_wait(told)
            await asyncio.sleep(self.retry_period)

    async def keep(self, api: client.ApiClient) -> None:
        """Renew (the client's renew loop) until a renewal has not succeeded for the renew deadline:
        then ``LeaseLost``."""
        await self._on(api).renew_loop()
        holder = self.holder
        raise LeaseLost(f"the lease {self.where} is held by {holder} now" if holder and holder != self.identity
                        else f"the lease {self.where} was not renewed within the renew deadline")

    async def release(self, api: client.ApiClient) -> None:
        """Give the Lease up (no holder, a lease of 1 s) if this candidate holds it, so a standby need not wait."""
        leases = client.CoordinationV1Api(api)
        try:
            lease = await leases.read_namespaced_lease(self.name, self.namespace)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            await leases.replace_namespaced_lease(self.name, self.namespace, lease)  # names the version read
            log.info("released the lease %s", self.where)
        except (ApiException, aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            log.warning("could not release the lease %s: %s", self.where, exc)


class _Lock(LeaseLock):
    """The client's ``LeaseLock``; made without a client for the configuration's checks, given one to run."""

    def __init__(self, name: str, namespace: str, identity: str, api: client.ApiClient | None = None) -> None:
        if api is None:
            self.name, self.namespace, self.identity = name, namespace, identity
            self.lease_reference = None
            return
        super().__init__(name, namespace, identity, api)


class LeaseKeeper:
    """Renews a held Lease on a thread of its own, from the moment it was taken: whatever the process
    does meanwhile (a Faust worker starting takes seconds), the Lease does not lapse. When it is lost,
    ``on_lost(reason)`` is called on that thread (``muster run cluster`` exits there). ``stop()``
    releases the Lease."""

    def __init__(self, elector: LeaseElector, connect: Callable[[], Awaitable[client.ApiClient]],
                 on_lost: Callable[[str], None]) -> None:
        self.elector, self.connect, self.on_lost = elector, connect, on_lost
        self._loop = asyncio.new_event_loop()
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._run, name="muster-lease", daemon=True)

    def start(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop renewing and release the Lease (so a standby need not wait out its duration)."""
        if self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(timeout)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._task = self._loop.create_task(self._keep())
        try:
            self._loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass
        finally:
            self._loop.close()

    async def _keep(self) -> None:
        api: Any = await self.connect()
        try:
            await self.elector.keep(api)
        except LeaseLost as exc:
            self.on_lost(str(exc))
        finally:
            try:
                await asyncio.shield(self.elector.release(api))
            finally:
                await api.close()
