"""shared/observability/tracing/otel.py and config.py: spans as the SDK exports them, and the OTEL_* settings."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, TraceIdRatioBased
from opentelemetry.trace import SpanKind, StatusCode

from shared.observability.tracing.config import TracingConfigError, check, enabled, epoch_for, epoch_from_env
from shared.observability.tracing.context import SpanRef, trace_id
from shared.observability.tracing.otel import SpanSink, sampler_from_env
from shared.observability.tracing.spans import SpanData

TRACE, ROOT, CHILD = "1" * 32, "2" * 16, "3" * 16


def _spans() -> list[SpanData]:
    return [
        SpanData(TRACE, ROOT, None, "RayJob default/j", "muster", 10.0, 70.0, attributes={"muster.workload": "default/j"},
                 events=[(20.0, "backed off", {"muster.reason": "no room"})], error="deleted while waiting"),
        SpanData(TRACE, CHILD, ROOT, "queue TimerFired", "muster-queue", 60.0, 60.5, kind="consumer",
                 links=[SpanRef("4" * 32, "5" * 16)]),
    ]


def test_a_span_goes_out_with_its_derived_ids_event_times_and_links() -> None:
    exporter = InMemorySpanExporter()
    sink = SpanSink(epoch=1_000.0, exporter=exporter)
    sink.send(_spans())
    sink.flush()
    root, child = sorted(exporter.get_finished_spans(), key=lambda s: s.start_time)
    assert format(root.context.trace_id, "032x") == TRACE and format(root.context.span_id, "016x") == ROOT
    assert root.parent is None and format(child.parent.span_id, "016x") == ROOT
    assert (root.start_time, root.end_time) == (1_010 * 10**9, 1_070 * 10**9)
    assert root.events[0].timestamp == 1_020 * 10**9 and root.events[0].name == "backed off"
    assert root.status.status_code == StatusCode.ERROR and root.status.description == "deleted while waiting"
    assert child.kind == SpanKind.CONSUMER
    assert format(child.links[0].context.trace_id, "032x") == "4" * 32
    assert root.resource.attributes["service.name"] == "muster"
    assert child.resource.attributes["service.name"] == "muster-queue"
    sink.close()


def test_the_sampler_keeps_or_drops_whole_traces_alike_everywhere() -> None:
    dropped = InMemorySpanExporter()
    sink = SpanSink(exporter=dropped, sampler=ALWAYS_OFF)
    sink.send(_spans())
    sink.flush()
    assert dropped.get_finished_spans() == () and sink.sent == 0
    half = [SpanSink(exporter=InMemorySpanExporter(), sampler=TraceIdRatioBased(0.5)) for _ in range(2)]
    traces = [trace_id(f"default/w{i}", "e") for i in range(200)]
    verdicts = [[sink._keep(t) for t in traces] for sink in half]
    assert verdicts[0] == verdicts[1] and 0 < sum(verdicts[0]) < len(traces)


def test_tracing_is_on_only_with_an_endpoint_and_nothing_turning_it_off() -> None:
    assert not enabled({})
    assert enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert enabled({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert not enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})
    assert not enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"})


@pytest.mark.parametrize("env, says", [
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTLP over HTTP only"),
    ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "http/protobuf"),
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "'otlp'"),
    ({"OTEL_TRACES_SAMPLER": "sometimes"}, "one of always_on"),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "a ratio from 0 to 1"),
])
def test_settings_muster_cannot_follow_are_refused_in_one_line(env: dict, says: str) -> None:
    with pytest.raises(TracingConfigError, match=says):
        check(env)


def test_the_sampler_is_read_from_the_standard_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    chosen = sampler_from_env()
    assert isinstance(chosen, TraceIdRatioBased) and chosen.rate == 0.25
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    assert sampler_from_env() is ALWAYS_OFF


def test_event_time_is_placed_by_an_epoch() -> None:
    assert epoch_from_env({}) == 0.0 and epoch_from_env({"MUSTER_TRACE_EPOCH": "12.5"}) == 12.5
    with pytest.raises(TracingConfigError, match="MUSTER_TRACE_EPOCH"):
        epoch_from_env({"MUSTER_TRACE_EPOCH": "soon"})
    assert epoch_for(1.7e9, now=2e9) == 0.0  # a deployment's log: wall-clock already
    assert epoch_for(0.0, now=2e9) == 2e9    # a simulated run: shown from now on
