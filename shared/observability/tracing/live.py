"""A running service's spans: one per hop (a service handling one record of its inbox, or the
cluster link applying one effect: ``apply <op>``), sent as it goes.

Parent and trace come from the input envelope's context (its ``trace`` field, which the Kafka
record's ``traceparent`` header repeats), the span's id from ``shared.observability.tracing.context`` (the same
one ``SpanBuilder`` gives the hop in a replay), and its attributes follow OpenTelemetry's messaging
conventions for a Kafka consumer: system, operation, destination topic and partition, offset,
consumer group, message id. Times: the wall clock around the handling in the deployment
(``clock="wall"``), event time under the ``simulate --bus`` driver (``clock="event"``), whose
virtual seconds ``epoch`` places.

The projector, which reads the whole log, sends each workload's root and phase spans
(``WorkloadSpans``): nothing else sees a workload from its submission to its pods running.
"""

from __future__ import annotations

from typing import Any, Iterable, Literal, Sequence

from shared.kernel.events import Envelope
from shared.observability.tracing.otel import SpanSink
from shared.observability.tracing.spans import SpanBuilder, hop_spans

Clock = Literal["wall", "event"]

class HopTracer:
    """``handled(cause, outputs, started, ended)`` for each envelope a service handles live."""

    def __init__(self, service: str, sink: SpanSink, *, topic: str, group: str, clock: Clock = "wall") -> None:
        self.service, self.sink, self.clock = service, sink, clock
        self.topic, self.group = topic, group
        self._where: dict[str, tuple[int, int]] = {}
        """Envelope id -> (partition, offset) it was read at, until it is handled."""

    def read(self, env_id: str, partition: int, offset: int) -> None:
        """Where the record of ``env_id`` was read (it may be handled later: a held envelope)."""
        self._where[env_id] = (partition, offset)

    def handled(self, cause: Envelope, outputs: Sequence[Envelope], started: float, ended: float, *,
                name: str | None = None, extra: dict[str, Any] | None = None) -> None:
        where = self._where.pop(cause.id, None)
        attributes: dict[str, Any] = {**(extra or {}),
            "messaging.system": "kafka", "messaging.operation.type": "process", "messaging.operation.name": "process",
            "messaging.destination.name": self.topic, "messaging.consumer.group.name": self.group,
            "messaging.message.id": cause.id,
        }
        if where is not None:
            attributes["messaging.destination.partition.id"] = str(where[0])
            attributes["messaging.kafka.offset"] = where[1]
        if self.clock == "wall":
            start, end = started - self.sink.epoch, ended - self.sink.epoch
        else:
            start = end = cause.occurred_at
        self.sink.send(hop_spans(self.service, cause, outputs, start, end, attributes, name=name))


class WorkloadSpans:
    """The projector's part: roots and phases of every workload, folded from the log it reads."""

    def __init__(self, sink: SpanSink) -> None:
        self.sink = sink
        self.builder = SpanBuilder(hops=False)

    def fold(self, envelopes: Iterable[Envelope]) -> None:
        for env in envelopes:
            spans = self.builder.apply(env)
            if spans:
                self.sink.send(spans)
