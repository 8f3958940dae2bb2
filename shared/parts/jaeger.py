"""A Jaeger trace store of its own: Jaeger v2 (``cmd/jaeger``) with in-memory storage on loopback.

The binary is the one ``make tools`` built from the Go module proxy (``catalog.built("jaeger")``).
It is an OpenTelemetry Collector build: it receives OTLP (gRPC and HTTP, as any collector does)
into its memory store and serves Jaeger's query API (``GET /api/traces/{traceID}``,
``/api/traces?service=...``) from it. Every port is a free one of this run's, given in the
configuration file written beside its log; nothing else is opened (no Jaeger/Zipkin receivers, no
sampling endpoints, the collector's own metrics off). The query service's clock-skew adjustment is
off, as is Jaeger's default: spans come back with the times they were sent with.

The Go module holds no built UI (its web page is a placeholder saying so); the query API is all
there is, and Grafana's Jaeger data source reads it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from shared.parts import catalog
from shared.parts.process import Part, Served, free_port, port_open

CONFIG = """\
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: info

extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
  jaeger_query:
    storage:
      traces: memstore
    max_clock_skew_adjust: 0s
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}

receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{otlp_grpc}
      http:
        endpoint: 127.0.0.1:{otlp_http}

processors:
  batch:
    timeout: 200ms

exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


class JaegerServer(Served):
    """``start()`` it; ``otlp_endpoint`` is what ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes, ``query_url``
    the query API's root."""

    def __init__(self, root: Path | None = None) -> None:
        super().__init__(root, "muster-jaeger-")
        self.binary = catalog.binary("jaeger", "jaeger")
        self.ports = {name: free_port() for name in ("otlp_grpc", "otlp_http", "query", "query_grpc")}

    @property
    def otlp_endpoint(self) -> str:
        """OTLP over HTTP (``/v1/traces`` below it)."""
        return f"http://127.0.0.1:{self.ports['otlp_http']}"

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['query']}"

    def start(self, timeout: float = 60.0) -> "JaegerServer":
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "jaeger.yaml"
        config.write_text(CONFIG.format(**self.ports))
        self.part = Part("jaeger", [self.binary, "--config", str(config)], self.root / "jaeger.log").start()
        try:
            self.part.wait_until(self._answers, timeout,
                                 f"query API on {self.query_url} and OTLP on {self.otlp_endpoint}")
        except BaseException:
            self.part.stop()  # not left running by a start that failed
            raise
        return self

    def _answers(self) -> bool:
        return port_open(self.ports["otlp_http"]) and self.get("/api/services") is not None

    def get(self, path: str, **params: Any) -> Any:
        """The query API's JSON answer at ``path``, or None where it answers 404 (no such trace)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.query_url}{path}{query}", timeout=10) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """One trace as Jaeger's API gives it (``spans``, ``processes``), or None if it has none."""
        found = self.get(f"/api/traces/{trace_id}")
        data = (found or {}).get("data") or []
        return data[0] if data else None

    def traces(self, service: str, start_us: int, end_us: int, limit: int = 1000) -> list[dict[str, Any]]:
        """Every trace with a span of ``service`` between the two times (microseconds since the epoch)."""
        found = self.get("/api/traces", service=service, start=start_us, end=end_us, limit=limit)
        return (found or {}).get("data") or []

    def describe(self) -> str:
        return f"Jaeger {catalog.version('jaeger')} (in memory): OTLP {self.otlp_endpoint}, query {self.query_url}"
