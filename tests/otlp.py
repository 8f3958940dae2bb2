"""An OTLP/HTTP receiver for the tests: a real HTTP server on loopback that takes
``POST /v1/traces`` as OpenTelemetry's exporters send it (protobuf, maybe gzip) and decodes it with
``opentelemetry-proto``, keeping every span with the ``service.name`` of its resource."""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse,
)


@dataclass
class ReceivedSpan:
    service: str
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: int
    start: float
    end: float
    attributes: dict[str, Any]
    events: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)
    status: int = 0
    status_message: str = ""

    @property
    def duration(self) -> float:
        return self.end - self.start


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class OtlpReceiver:
    """``with OtlpReceiver() as r:`` -> ``r.endpoint`` (set it as OTEL_EXPORTER_OTLP_ENDPOINT), ``r.spans``."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._take(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _take(self, request: ExportTraceServiceRequest) -> None:
        got = []
        for rs in request.resource_spans:
            service = str(_attributes(rs.resource.attributes).get("service.name"))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(ReceivedSpan(
                        service=service, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex() or None, name=s.name, kind=s.kind,
                        start=s.start_time_unix_nano / 1e9, end=s.end_time_unix_nano / 1e9,
                        attributes=_attributes(s.attributes),
                        events=[(e.time_unix_nano / 1e9, e.name, _attributes(e.attributes)) for e in s.events],
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                        status=s.status.code, status_message=s.status.message))
        with self._lock:
            self.requests += 1
            self.spans.extend(got)

    def wait_for(self, done: Callable[[list[ReceivedSpan]], bool], timeout: float = 30.0) -> list[ReceivedSpan]:
        """The spans once ``done(spans)`` holds (polling), or what came when ``timeout`` ran out."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = list(self.spans)
            if done(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.1)

    def __enter__(self) -> "OtlpReceiver":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
