"""Exactly one applier: a coordination.k8s.io Lease that ``muster run cluster`` holds while it works.

The protocol is client-go's leader election (``k8s.io/client-go/tools/leaderelection``), over the
Lease's ``resourceVersion`` (optimistic concurrency: of two candidates writing the same version, the
API server takes one and answers the other 409):

- A candidate reads the Lease. Absent: it creates it, holding it. Held by itself: it renews
  ``renewTime``. Held by another: it waits until the record has not changed for the lease's
  ``leaseDurationSeconds`` *as measured on its own clock from when it saw the change* (clocks of two
  machines are never compared), or until the holder released it (empty ``holderIdentity``); then it
  takes it over (``leaseTransitions`` + 1). Every write names the version it read.
- The holder renews every ``retry_period``; when it has not managed to for ``renew_deadline`` (shorter
  than the lease duration, so before anyone else may take over) it has lost the lease and must stop
  applying at once. ``muster run cluster`` then exits (exit code 1) and its Deployment restarts it as
  a standby, as controller-runtime's managers do.
- A holder that stops cleanly releases the Lease (empty holder), so a standby takes over at its next
  try instead of after the lease duration.

``decide`` is the rule, pure; ``LeaseElector`` does the requests.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Literal

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from services.reconciler.kubeapi import checked
from services.reconciler.resources import LEASE

log = logging.getLogger("muster.lease")

Action = Literal["create", "renew", "take", "wait"]


class LeaseLost(Exception):
    """The holder could not renew within the renew deadline: another candidate may hold it soon."""


@dataclass(frozen=True)
class Observed:
    """The Lease as last read, and when (the reader's monotonic clock) its record last changed."""

    holder: str
    duration: float
    record: tuple[Any, ...]
    """What identifies a renewal: holder, renewTime, acquireTime, transitions."""
    changed_at: float


def decide(identity: str, lease: Observed | None, now: float) -> Action:
    """What a candidate does next, from the Lease it read and its own monotonic clock."""
    if lease is None:
        return "create"
    if lease.holder == identity:
        return "renew"
    if not lease.holder or now >= lease.changed_at + lease.duration:
        return "take"
    return "wait"


def micro_time(at: float) -> str:
    """A MicroTime, as Lease times are written: RFC 3339 with microseconds, UTC."""
    return dt.datetime.fromtimestamp(at, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """Takes and keeps the Lease ``namespace/name`` for ``identity``; see the module docstring."""

    def __init__(self, namespace: str, name: str, identity: str, *, lease_duration: float = 15.0,
                 renew_deadline: float = 10.0, retry_period: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        if not lease_duration > renew_deadline > retry_period > 0:
            raise ValueError("need lease duration > renew deadline > retry period > 0 "
                             f"(got {lease_duration}, {renew_deadline}, {retry_period})")
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self.clock, self.wall = clock, wall
        self.observed: Observed | None = None
        self._body: dict[str, Any] | None = None
        """The Lease as last read or written (its resourceVersion is what the next write names)."""
        self.transitions = 0
        """How often this candidate took the Lease over from another holder."""

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"

    # ------------------------------------------------------------------ the loops
    async def acquire(self, api: client.ApiClient, *, on_wait: Callable[[str], None] | None = None) -> None:
        """Return once this candidate holds the Lease; ``on_wait(holder)`` is told once per holder it waits for."""
        told = None
        while True:
            if await self.try_once(api):
                return
            holder = self.observed.holder if self.observed else ""
            if on_wait is not None and holder != told:
                on_wait(holder)
                told = holder
            await asyncio.sleep(self.retry_period)

    async def keep(self, api: client.ApiClient) -> None:
        """Renew every retry period, forever; ``LeaseLost`` when a renewal has not succeeded for the
        renew deadline (or someone else holds the Lease now)."""
        renewed = self.clock()
        while True:
            await asyncio.sleep(self.retry_period)
            try:
                held = await self.try_once(api)
            except (ApiException, aiohttp.ClientError, asyncio.TimeoutError) as exc:
                log.warning("renewing the lease %s: %s", self.where, exc)
                held = False
            if held:
                renewed = self.clock()
            elif self.observed is not None and self.observed.holder not in ("", self.identity):
                raise LeaseLost(f"the lease {self.where} is held by {self.observed.holder} now")
            elif self.clock() - renewed >= self.renew_deadline:
                raise LeaseLost(f"the lease {self.where} was not renewed for {self.renew_deadline:g}s")

    async def release(self, api: client.ApiClient) -> None:
        """Give the Lease up (empty holder) if this candidate holds it, so a standby need not wait."""
        if self.observed is None or self.observed.holder != self.identity or self._body is None:
            return
        spec = dict(self._body.get("spec") or {})
        spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=micro_time(self.wall()))
        try:
            await self._replace(api, spec)
            log.info("released the lease %s", self.where)
        except (ApiException, aiohttp.ClientError, asyncio.TimeoutError) as exc:
            log.warning("could not release the lease %s: %s", self.where, exc)

    # ------------------------------------------------------------------ one step
    async def try_once(self, api: client.ApiClient) -> bool:
        """Read the Lease and create, renew or take it over if the rule says so; whether this
        candidate holds it now. A write that lost a race (409) is no error: it just does not hold."""
        self._observe(await self._read(api))
        action = decide(self.identity, self.observed, self.clock())
        if action == "wait":
            return False
        now = micro_time(self.wall())
        spec: dict[str, Any] = dict((self._body or {}).get("spec") or {})
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=int(max(1, round(self.lease_duration))),
                    renewTime=now)
        if action != "renew":
            spec.update(acquireTime=now, leaseTransitions=int(spec.get("leaseTransitions") or 0)
                        + (1 if action == "take" else 0))
        try:
            if action == "create":
                body = await self._create(api, spec)
            else:
                body = await self._replace(api, spec)
        except ApiException as exc:
            if exc.status == 409:
                return False  # another candidate wrote first: read again next time
            raise
        if action == "take":
            self.transitions += 1
            log.info("took over the lease %s from %s", self.where, self.observed.holder if self.observed else "")
        self._observe(body)
        return True

    def _observe(self, body: dict[str, Any] | None) -> None:
        self._body = body
        if body is None:
            self.observed = None
            return
        spec = body.get("spec") or {}
        record = (spec.get("holderIdentity") or "", spec.get("renewTime"), spec.get("acquireTime"),
                  spec.get("leaseTransitions"))
        before = self.observed
        changed_at = before.changed_at if before is not None and before.record == record else self.clock()
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        self.observed = Observed(holder=str(record[0]), duration=duration, record=record, changed_at=changed_at)

    # ------------------------------------------------------------------ requests
    def _api(self, api: client.ApiClient) -> client.CoordinationV1Api:
        return client.CoordinationV1Api(api)

    async def _read(self, api: client.ApiClient) -> dict[str, Any] | None:
        try:
            return await checked(self._api(api).read_namespaced_lease(self.name, self.namespace,
                                                                       _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def _create(self, api: client.ApiClient, spec: dict[str, Any]) -> dict[str, Any]:
        body = {"apiVersion": LEASE.api_version, "kind": LEASE.kind,
                "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec}
        return await checked(self._api(api).create_namespaced_lease(self.namespace, body, _preload_content=False))

    async def _replace(self, api: client.ApiClient, spec: dict[str, Any]) -> dict[str, Any]:
        assert self._body is not None
        metadata = self._body.get("metadata") or {}
        body = {"apiVersion": LEASE.api_version, "kind": LEASE.kind,
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": metadata.get("resourceVersion")},
                "spec": spec}
        written = await checked(self._api(api).replace_namespaced_lease(self.name, self.namespace, body,
                                                                         _preload_content=False))
        self._body = written
        return written


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
        api = await self.connect()
        try:
            await self.elector.keep(api)
        except LeaseLost as exc:
            self.on_lost(str(exc))
        finally:
            try:
                await asyncio.shield(self.elector.release(api))
            finally:
                await api.close()
