"""Spans out over OTLP: the one module that speaks OpenTelemetry.

Configured by the standard ``OTEL_*`` environment variables, read by the SDK itself:

| variable | meaning |
| --- | --- |
| ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` | where the collector listens (``http://collector:4318``); tracing is on only when one is set |
| ``OTEL_EXPORTER_OTLP_PROTOCOL`` / ``..._TRACES_PROTOCOL`` | ``http/protobuf`` (the one muster ships) |
| ``OTEL_EXPORTER_OTLP_HEADERS``, ``..._TIMEOUT``, ``..._COMPRESSION``, ``..._CERTIFICATE`` | as the SDK reads them |
| ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` | override ``service.name`` (default ``muster-<service>``) / add resource attributes |
| ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` | ``always_on`` (default), ``always_off``, ``traceidratio`` with a ratio 0..1, their ``parentbased_`` forms; others are refused |
| ``OTEL_SDK_DISABLED=true``, ``OTEL_TRACES_EXPORTER=none`` | off, whatever else is set |

Spans are built as data (``shared.observability.tracing.spans.SpanData``) with ids derived from the events, so
they go to the exporter as finished spans (``ReadableSpan``) rather than through a tracer that
would pick random ids and the wall clock. Trace ids being derived, a ratio sampler keeps or drops
a whole trace in every process alike.
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Decision, Sampler, TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from shared.observability.tracing.config import check, sampler
from shared.observability.tracing.spans import SpanData

SCOPE = InstrumentationScope("muster", "0.1.0")
_KINDS = {"internal": SpanKind.INTERNAL, "consumer": SpanKind.CONSUMER}


def sampler_from_env() -> Sampler:
    """The sampler ``OTEL_TRACES_SAMPLER`` names (``config.sampler`` checks it)."""
    name, ratio = sampler()
    return {"always_on": ALWAYS_ON, "always_off": ALWAYS_OFF}.get(name) or TraceIdRatioBased(ratio)


def _exporter() -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


class _Counted(SpanExporter):
    """The exporter, counting the spans of the batches it could not deliver: a one-shot export
    (``export_log``) says so instead of claiming them sent; a service only logs them, as the SDK does."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.failed = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.inner.export(spans)
        if result != SpanExportResult.SUCCESS:
            self.failed += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class SpanSink:
    """Finished spans to the OTLP exporter, in batches on the SDK's background thread.

    ``epoch`` is added to every span time: 0 where event time is wall-clock time (the deployment),
    the moment a simulated or replayed run is shown at otherwise (its time 0)."""

    def __init__(self, *, epoch: float = 0.0, exporter: SpanExporter | None = None,
                 sampler: Sampler | None = None) -> None:
        check()
        self.epoch = epoch
        self.sampler = sampler if sampler is not None else sampler_from_env()
        self._exporter = _Counted(exporter if exporter is not None else _exporter())
        self.processor = BatchSpanProcessor(self._exporter)
        self._resources: dict[str, Resource] = {}
        self._sampled: dict[str, bool] = {}
        self.sent = 0

    @property
    def failed(self) -> int:
        """Spans of batches the exporter could not deliver (collector unreachable, refusing, too slow)."""
        return self._exporter.failed

    def resource(self, service: str) -> Resource:
        found = self._resources.get(service)
        if found is None:
            name = os.environ.get("OTEL_SERVICE_NAME") or service
            found = self._resources[service] = Resource.create({
                "service.name": name, "service.namespace": "muster", "muster.component": service})
        return found

    def _keep(self, trace_id: str) -> bool:
        """The sampler's verdict for a whole trace (the same in every process: ids are derived)."""
        kept = self._sampled.get(trace_id)
        if kept is None:
            decision = self.sampler.should_sample(None, int(trace_id, 16), "workload").decision
            kept = decision == Decision.RECORD_AND_SAMPLE
            if len(self._sampled) > 100_000:
                self._sampled.clear()
            self._sampled[trace_id] = kept
        return kept

    def send(self, spans: Iterable[SpanData]) -> None:
        for span in spans:
            if self._keep(span.trace_id):
                self.processor.on_end(self.readable(span))
                self.sent += 1

    def readable(self, span: SpanData) -> ReadableSpan:
        """``span`` as the SDK's finished span (times in ns since the epoch)."""
        flags = TraceFlags(TraceFlags.SAMPLED)
        context = SpanContext(int(span.trace_id, 16), int(span.span_id, 16), is_remote=False, trace_flags=flags)
        parent = (SpanContext(int(span.trace_id, 16), int(span.parent_id, 16), is_remote=True, trace_flags=flags)
                  if span.parent_id else None)
        links = [Link(SpanContext(int(ref.trace_id, 16), int(ref.span_id, 16), is_remote=True, trace_flags=flags),
                      {"muster.link": "cause"}) for ref in span.links]
        status = Status(StatusCode.ERROR, span.error) if span.error else Status(StatusCode.UNSET)
        return ReadableSpan(
            name=span.name, context=context, parent=parent, resource=self.resource(span.service),
            attributes=span.attributes, events=[Event(name, attrs, self._ns(t)) for t, name, attrs in span.events],
            links=links, kind=_KINDS.get(span.kind, SpanKind.INTERNAL), status=status,
            start_time=self._ns(span.start), end_time=self._ns(max(span.end, span.start)),
            instrumentation_scope=SCOPE)

    def _ns(self, t: float) -> int:
        return int(round((self.epoch + t) * 1e9))

    def flush(self, timeout: float = 30.0) -> bool:
        return self.processor.force_flush(int(timeout * 1000))

    def close(self) -> None:
        self.processor.shutdown()
