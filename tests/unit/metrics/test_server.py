"""shared/observability/metrics/server.py: the three endpoints over real HTTP, and a port that cannot be had."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from shared.observability.metrics.server import Health, MetricsPortError, bind, serve


def _get(port: int, path: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.headers.get("Content-Type", ""), reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def test_metrics_health_and_readiness_over_http() -> None:
    registry = CollectorRegistry()
    Counter("muster_things", "Things", registry=registry).inc(3)
    behind = {"records": 5000}
    health = Health(ready=[lambda: f"{behind['records']} inbox records behind" if behind["records"] > 1000 else None])
    sock = bind(0, "127.0.0.1")
    port = sock.getsockname()[1]

    async def scenario() -> list[tuple[int, str, str]]:
        server = asyncio.ensure_future(serve(sock, registry, health))
        await asyncio.sleep(0.2)
        loop = asyncio.get_running_loop()
        answers = [await loop.run_in_executor(None, _get, port, path) for path in ("/metrics", "/healthz", "/readyz")]
        behind["records"] = 0
        answers.append(await loop.run_in_executor(None, _get, port, "/readyz"))
        health.live.append(lambda: 1 / 0)  # a check that breaks is an unhealthy answer
        answers.append(await loop.run_in_executor(None, _get, port, "/healthz"))
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
        return answers

    metrics, healthz, not_ready, ready, broken = asyncio.run(scenario())
    assert metrics[0] == 200 and metrics[1].startswith("text/plain") and "muster_things_total 3.0" in metrics[2]
    assert healthz == (200, healthz[1], "ok\n")
    assert not_ready[0] == 503 and not_ready[2] == "5000 inbox records behind\n"
    assert ready[0] == 200 and ready[2] == "ready\n"
    assert broken[0] == 503 and "ZeroDivisionError" in broken[2]


def test_a_port_in_use_is_a_one_line_error() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        with pytest.raises(MetricsPortError, match=r"metrics port \d+: already in use .*--metrics-port"):
            bind(taken.getsockname()[1], "127.0.0.1")
    finally:
        taken.close()


def test_the_endpoints_listen_on_loopback_outside_a_pod_and_on_every_interface_in_one():
    """Exposure (issue 33): /metrics and the health endpoints say what a service schedules; outside a pod
    nothing but this machine needs them. In a pod Prometheus scrapes the pod's IP (NetworkPolicy says who)."""
    from shared.observability.metrics.server import default_address

    assert default_address({}) == "127.0.0.1"
    assert default_address({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) == "0.0.0.0"
    sock = bind(0)
    try:
        assert sock.getsockname()[0] == "127.0.0.1"
    finally:
        sock.close()


def test_an_address_that_cannot_be_listened_on_is_one_line():
    with pytest.raises(MetricsPortError, match=r"^metrics address 192\.0\.2\.1 port 0: .*--metrics-address"):
        bind(0, "192.0.2.1")  # TEST-NET-1: no interface of this machine has it
