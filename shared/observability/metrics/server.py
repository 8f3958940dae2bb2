"""``/metrics``, ``/healthz`` and ``/readyz`` of ``muster run SERVICE`` on ``--metrics-port``.

The HTTP server runs on the service's own event loop (aiohttp, which Faust brings), so a scrape
reads the worker's state between two batches, never in the middle of one.

- ``/metrics``: Prometheus text format, the service's registry (scheduling metrics on the queue
  service, the stack's own on every one, and the process's CPU, memory and start time).
- ``/healthz``: 200 while the event loop answers and every liveness check passes (``Health.live``;
  a task that died belongs here), else 503 with the reasons, one a line.
- ``/readyz``: 200 once the service is caught up with its inbox: its past replayed and at most
  ``READY_LAG`` records waiting (the projector: the log, the cluster link: connected to the API server
  and none of its tasks down); else 503 with why.

Port: ``--metrics-port`` / ``MUSTER_METRICS_PORT``, default ``DEFAULT_PORT`` (9464, the port
OpenTelemetry's Prometheus exporter uses); 0 turns the server off. Address: ``--metrics-address`` /
``MUSTER_METRICS_ADDRESS``, default ``default_address()``: loopback outside a pod (the endpoints say how
far a service got and what it schedules: no one else on the host or its network needs them), every
interface in a pod (``KUBERNETES_SERVICE_HOST`` is set), where Prometheus scrapes the pod's IP and a
NetworkPolicy (deploy/k8s/networkpolicy.yaml) says who may.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest

log = logging.getLogger("muster.metrics")

DEFAULT_PORT = 9464
PORT_ENV = "MUSTER_METRICS_PORT"
ADDRESS_ENV = "MUSTER_METRICS_ADDRESS"
LOOPBACK = "127.0.0.1"
ALL_INTERFACES = "0.0.0.0"


def default_address(environ: Mapping[str, str]) -> str:
    """Where the endpoints listen unless told: every interface in a pod (the kubelet sets
    ``KUBERNETES_SERVICE_HOST`` in every container), loopback anywhere else."""
    return ALL_INTERFACES if environ.get("KUBERNETES_SERVICE_HOST") else LOOPBACK
READY_LAG = 1_000
"""Records a service may have waiting in its inbox and still be ready (one batch)."""

Check = Callable[[], "str | None"]
"""A health check: None when fine, else what is wrong (one line)."""


class MetricsPortError(OSError):
    """The metrics port cannot be listened on; the message says which and why."""


@dataclass
class Health:
    """The checks behind ``/healthz`` (``live``) and ``/readyz`` (``ready``); anyone may add one."""

    live: list[Check] = field(default_factory=list)
    ready: list[Check] = field(default_factory=list)

    @staticmethod
    def problems(checks: list[Check]) -> list[str]:
        out = []
        for check in checks:
            try:
                problem = check()
            except Exception as exc:  # noqa: BLE001 - a failing check is an unhealthy answer, not a crash
                problem = f"{getattr(check, '__name__', 'check')} failed: {type(exc).__name__}: {exc}"
            if problem:
                out.append(problem)
        return out


def bind(port: int, host: str = LOOPBACK) -> socket.socket:
    """The listening socket, bound before the service starts so a busy port is a clear error. ``host`` is
    an IPv4 or IPv6 address (``::`` for every interface of both)."""
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    except OSError as exc:
        raise MetricsPortError(f"metrics address {host}: {exc.strerror or exc}") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as exc:
        sock.close()
        if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
            raise MetricsPortError(f"metrics port {port}: already in use (choose another with --metrics-port or "
                                   f"{PORT_ENV}, or 0 for none)") from None
        why = getattr(exc, "strerror", None) or str(exc)
        raise MetricsPortError(f"metrics address {host} port {port}: {why} (choose another with "
                               f"--metrics-address or {ADDRESS_ENV})") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def web_app(registry: CollectorRegistry, health: Health) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def answer(checks: list[Check], fine: str) -> web.Response:
        problems = Health.problems(checks)
        if problems:
            return web.Response(status=503, text="\n".join(problems) + "\n")
        return web.Response(text=fine + "\n")

    async def healthz(_: web.Request) -> web.Response:
        return answer(health.live, "ok")

    async def readyz(_: web.Request) -> web.Response:
        return answer(health.ready, "ready")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def serve(sock: socket.socket, registry: CollectorRegistry, health: Health) -> None:
    """Answer on ``sock`` until cancelled."""
    runner = web.AppRunner(web_app(registry, health), access_log=None)
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


@dataclass
class Exposition:
    """One service's registry and health checks, ready to be served."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    health: Health = field(default_factory=Health)

    def attach(self, app: Any, sock: socket.socket) -> None:
        """Serve on ``sock`` as a task of the Faust ``app`` (its loop, started and stopped with it)."""
        registry, health = self.registry, self.health

        @app.task
        async def metrics_server() -> None:
            await serve(sock, registry, health)


def service_exposition(app: Any, service: str) -> Exposition:
    """A service app's metrics (``shared.runtime.bus.app.service_app``): the stack's own, the scheduling
    ones on the queue service; ready once caught up with its inbox."""
    from shared.observability.metrics.scheduling import queue_metrics
    from shared.observability.metrics.stack import ServiceCollector, batch_histogram

    exposition = Exposition()
    ProcessCollector(registry=exposition.registry)
    worker, reader = app.muster_worker, app.muster_reader
    exposition.registry.register(ServiceCollector(service, worker, reader))
    batches = batch_histogram(exposition.registry).labels(service)
    reader.on_batch = batches.observe
    if service == "queue":
        worker.watchers.append(queue_metrics(worker.service.core, exposition.registry))
    exposition.health.ready.append(lambda: reader.caught_up(READY_LAG))
    return exposition


def projector_exposition(app: Any) -> Exposition:
    """The projector's: rows written, dead letters, lag; ready once caught up with the log."""
    from shared.observability.metrics.stack import ProjectorCollector

    exposition = Exposition()
    ProcessCollector(registry=exposition.registry)
    projector = app.muster_projector
    exposition.registry.register(ProjectorCollector(projector, lambda: projector.behind))
    exposition.health.ready.append(
        lambda: None if projector.behind <= READY_LAG else f"{projector.behind} log records behind")
    return exposition


def cluster_exposition(app: Any) -> Exposition:
    """The cluster link's: effects applied, retries, dead letters, watch events; ready once connected
    to the API server, and not while one of its tasks is down (``ClusterBridge.not_ready``)."""
    from shared.observability.metrics.stack import ClusterCollector

    exposition = Exposition()
    ProcessCollector(registry=exposition.registry)
    bridge = app.muster_bridge
    exposition.registry.register(ClusterCollector(bridge))
    exposition.health.ready.append(bridge.not_ready)
    return exposition
