"""A traced worker (shared/runtime/bus/worker.py with shared/observability/tracing/live.py): outputs carry traceparent in
the envelope and the Kafka headers, each hop handled live is a span with messaging attributes, and a
replay sends none. The sink is a recording one; the OTLP side is tests/integration/test_observability."""

from __future__ import annotations

import asyncio

from shared.kernel.events import Enqueued, WorkloadSubmitted
from shared.observability.tracing.context import TRACEPARENT, parse, trace_id
from shared.observability.tracing.live import HopTracer
from shared.observability.tracing.spans import SpanData
from shared.runtime.bus import codec
from shared.runtime.bus.sequencing import Arrival
from shared.runtime.bus.worker import InboxWorker, Incoming
from shared.runtime.service import Service
from tests.builders.queue import job
from tests.builders.shared import FakeCore, at
from tests.unit.bus.test_worker import TOPICS, FakeProducer


class RecordingSink:
    epoch = 0.0

    def __init__(self) -> None:
        self.spans: list[SpanData] = []

    def send(self, spans: list[SpanData]) -> None:
        self.spans.extend(spans)


def _worker(sink: RecordingSink) -> InboxWorker:
    core = FakeCore("queue", [], lambda env: [Enqueued(key=env.subject, queue="q", reason="waiting")])
    tracer = HopTracer("queue", sink, topic=TOPICS.inbox("queue"), group="muster.queue")  # type: ignore[arg-type]
    return InboxWorker(Service(core, traced=True), TOPICS, Arrival(), tracer=tracer)


def test_a_traced_hop_is_a_span_and_its_outputs_carry_the_context_in_body_and_headers() -> None:
    sink = RecordingSink()
    worker = _worker(sink)
    submitted = at(WorkloadSubmitted(workload=job("default/job")), 5.0, source="admission")
    producer = FakeProducer()
    asyncio.run(worker.process_batch([Incoming(codec.encode(submitted), codec.envelope_headers(submitted), 0, 41)],
                                     producer))
    logged = [r for call in producer.calls for r in call if r.topic == TOPICS.log]
    out = codec.decode(logged[0].value)
    ref = parse(out.trace)
    assert ref is not None and ref.trace_id == trace_id("default/job", out.id)  # no context came: the output begins one
    assert (TRACEPARENT, out.trace[TRACEPARENT].encode()) in logged[0].headers
    [span] = sink.spans
    assert span.span_id == ref.span_id and span.name == "queue WorkloadSubmitted" and span.kind == "consumer"
    assert span.attributes["messaging.system"] == "kafka"
    assert span.attributes["messaging.destination.name"] == TOPICS.inbox("queue")
    assert span.attributes["messaging.destination.partition.id"] == "0"
    assert span.attributes["messaging.kafka.offset"] == 41
    assert span.attributes["messaging.consumer.group.name"] == "muster.queue"
    assert span.start <= span.end and span.start > 1e9  # the wall clock in the deployment


def test_a_replay_rebuilds_the_contexts_but_sends_no_span() -> None:
    sink = RecordingSink()
    worker = _worker(sink)
    submitted = at(WorkloadSubmitted(workload=job("default/job")), 5.0, source="admission")
    worker.replay(codec.encode(submitted), codec.envelope_headers(submitted))
    assert sink.spans == [] and "default/job" in worker.service.contexts.current  # type: ignore[union-attr]


def test_untraced_envelopes_have_no_traceparent_header() -> None:
    env = at(WorkloadSubmitted(workload=job("default/job")), 5.0, source="admission")
    assert [name for name, _ in codec.envelope_headers(env)] == [codec.TYPE_HEADER, codec.SOURCE_HEADER]
