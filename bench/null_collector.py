"""An OTLP/HTTP endpoint that takes every export and keeps nothing but a count: where ``make bench``
sends the spans of its tracing-on runs, as a process of its own (a collector is one in the
deployment). ``python -m bench.null_collector PORT``; prints ``spans N`` on each export to stdout."""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


def main(port: int) -> None:
    received = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            request = ExportTraceServiceRequest()
            request.ParseFromString(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            received[0] += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            print(f"spans {received[0]}", flush=True)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]))
