"""Tracing: a trace per workload incarnation, built by adapters from the events (never in a core).

``context``: which trace an envelope is in (derived ids, W3C ``traceparent``); ``spans``: spans as
data from the event stream (``SpanBuilder``, ``hop_spans``); ``live``: a service's hop spans as it
handles its inbox; ``otel``: the OTLP exporter, configured by ``OTEL_*``; ``export_log``: a whole
recorded or simulated log to the exporter (``simulate --trace``, ``replay --trace``), raising
``TracesNotSent`` when the collector did not take them.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Iterable

from shared.kernel.events import Envelope


class TracesNotSent(RuntimeError):
    """A one-shot export whose spans the collector did not take; the message names the endpoint and why."""


class _Heard(logging.Handler):
    """The SDK exporter's own complaints, kept for the one line ``TracesNotSent`` says instead."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = " ".join(record.getMessage().split())
        self.messages.append(re.sub(r"^Transient error (.*) encountered while exporting .*$", r"\1", text))


def export_log(envelopes: Iterable[Envelope], *, epoch: float | None = None) -> int:
    """Send the spans of a whole log (roots, phases and every service hop) to the OTLP endpoint the
    ``OTEL_*`` variables name; how many were sent. ``epoch``: where the log's time 0 is shown
    (default: a log in wall-clock time stays where it is, a simulated one starts now)."""
    from shared.observability.tracing.config import epoch_for
    from shared.observability.tracing.otel import SpanSink
    from shared.observability.tracing.spans import SpanBuilder

    envelopes = list(envelopes)
    if epoch is None:
        epoch = epoch_for(envelopes[0].occurred_at if envelopes else 0.0, time.time())
    sdk = logging.getLogger("opentelemetry.exporter")
    heard, propagate = _Heard(), sdk.propagate
    sdk.addHandler(heard)
    sdk.propagate = False  # its retries would print lines of their own; the failure is said once, below
    try:
        sink = SpanSink(epoch=epoch)
        try:
            sink.send(SpanBuilder(hops=True).build(envelopes))
            sink.flush()
        finally:
            sink.close()
    finally:
        sdk.removeHandler(heard)
        sdk.propagate = propagate
    if sink.failed:
        # the cause (refused, 404, ...) if the SDK named one before giving up
        why = next((m for m in heard.messages if "due to timeout" not in m), heard.messages[-1] if heard.messages else "")
        raise TracesNotSent(f"{sink.failed} of {sink.sent} spans were not taken by the OTLP endpoint "
                            f"{_endpoint()}" + (f": {why[:300]}" if why else ""))
    return sink.sent


def _endpoint() -> str:
    import os

    from shared.observability.tracing.config import ENDPOINTS

    return next((os.environ[name].strip() for name in ENDPOINTS if os.environ.get(name, "").strip()), "?")
