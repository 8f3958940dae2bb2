"""Tracing: a trace per workload incarnation, built by adapters from the events (never in a core).

``context``: which trace an envelope is in (derived ids, W3C ``traceparent``); ``spans``: spans as
data from the event stream (``SpanBuilder``, ``hop_spans``); ``live``: a service's hop spans as it
handles its inbox; ``otel``: the OTLP exporter, configured by ``OTEL_*``; ``export_log``: a whole
recorded or simulated log to the exporter (``simulate --trace``, ``replay --trace``).
"""

from __future__ import annotations

import time
from typing import Iterable

from shared.events import Envelope


def export_log(envelopes: Iterable[Envelope], *, epoch: float | None = None) -> int:
    """Send the spans of a whole log (roots, phases and every service hop) to the OTLP endpoint the
    ``OTEL_*`` variables name; how many were sent. ``epoch``: where the log's time 0 is shown
    (default: a log in wall-clock time stays where it is, a simulated one starts now)."""
    from shared.tracing.config import epoch_for
    from shared.tracing.otel import SpanSink
    from shared.tracing.spans import SpanBuilder

    envelopes = list(envelopes)
    if epoch is None:
        epoch = epoch_for(envelopes[0].occurred_at if envelopes else 0.0, time.time())
    sink = SpanSink(epoch=epoch)
    try:
        sink.send(SpanBuilder(hops=True).build(envelopes))
        sink.flush()
    finally:
        sink.close()
    return sink.sent
