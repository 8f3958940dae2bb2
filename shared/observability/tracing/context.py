"""Trace context as data: which trace each envelope belongs to, with ids any runtime derives alike.

One trace per workload *incarnation*: from its submission to its gang Running, and a new one from
each preemption (or disruption of a running gang) to Running again. A trace id is derived from the
workload's key and the id of the envelope that started the incarnation, and every span id from
what the span stands for (``root``, a phase, one service handling one input), so the embedded
runtime, the services on Kafka and a replay of a recorded log name the same spans the same way,
without asking each other: the event log stays byte-identical between runtimes with tracing on.

A service keeps, per workload, the trace its events go in now (``TraceContexts``): the trace comes
with an incarnation's first event (``WorkloadSubmitted`` from admission, ``PreemptionRequested``
and ``GangDisrupted`` from placement) and every later output about that workload carries it, as
W3C ``traceparent`` in the envelope's ``trace`` field, whose span is the hop that made the output.
This module only computes; the adapters (``shared.observability.tracing.live``, ``shared.observability.tracing.spans``) make
spans of it, and the cores never see any of it.
"""

from __future__ import annotations

import hashlib
import re
from typing import Mapping, NamedTuple

from shared.kernel.events import Envelope

TRACEPARENT = "traceparent"

WORKLOAD_EVENTS = frozenset({
    "WorkloadSubmitted", "WorkloadUpdated", "WorkloadRejected", "WorkloadFinished", "WorkloadDeleted",
    "Enqueued", "BackedOff", "Dequeued", "ReclaimRequested", "WorkloadWithdrawn", "GangPlaced",
    "PlacementFailed", "PodAssigned", "GangRunning", "GangDisrupted", "GangEvicted", "PreemptionRequested",
    "PodsMoved",
})
"""Event types whose subject is a workload key (``namespace/name``)."""

STARTS = frozenset({"WorkloadSubmitted", "WorkloadRejected", "PreemptionRequested", "GangDisrupted"})
"""Outputs that begin an incarnation: a submission (or a refusal) of a workload not followed yet,
a preemption, a running gang losing a member."""

ENDS = frozenset({"WorkloadFinished", "WorkloadDeleted", "WorkloadWithdrawn", "WorkloadRejected"})
"""After these a service forgets the workload's trace: a later submission of the same name (the
object fixed, or made anew) is a new incarnation."""

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})\Z")


class SpanRef(NamedTuple):
    """A span in a trace: where an envelope's context points."""

    trace_id: str
    span_id: str


def _digest(size: int, *parts: object) -> str:
    text = "\x1f".join(str(p) for p in parts).encode()
    value = hashlib.blake2b(text, digest_size=size).hexdigest()
    return value if value.strip("0") else "1".rjust(size * 2, "0")  # all zeros is W3C's "invalid"


def trace_id(workload: str, started_by: str) -> str:
    """The trace of ``workload``'s incarnation that the envelope ``started_by`` began (32 hex)."""
    return _digest(16, "trace", workload, started_by)


def span_id(*parts: object) -> str:
    """A span id (16 hex) derived from what the span stands for."""
    return _digest(8, "span", *parts)


def root_span(trace: str) -> str:
    """The span covering a whole incarnation: every phase is its child."""
    return span_id("root", trace)


def hop_span(service: str, input_id: str, trace: str) -> str:
    """The span of ``service`` handling the envelope ``input_id``, in ``trace``."""
    return span_id("hop", service, input_id, trace)


def traceparent(ref: SpanRef) -> str:
    return f"00-{ref.trace_id}-{ref.span_id}-01"


def parse(trace: Mapping[str, str]) -> SpanRef | None:
    """The span an envelope's ``trace`` field points at; None when it has none (or a malformed one:
    a context from outside is never a reason to refuse an event)."""
    value = trace.get(TRACEPARENT) if trace else None
    if not value:
        return None
    match = _TRACEPARENT.match(value)
    if match is None or not match.group(1).strip("0") or not match.group(2).strip("0"):
        return None
    return SpanRef(match.group(1), match.group(2))


def workload_of(env: Envelope) -> str | None:
    """The workload an envelope is about, or None (queues, nodes, timers, effects)."""
    return env.subject if env.type in WORKLOAD_EVENTS else None


class TraceContexts:
    """One service's traces: ``fill`` gives each output of one handled input its context."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.current: dict[str, str] = {}
        """Workload key -> the trace its events go in now."""

    def fill(self, cause: Envelope, outputs: list[Envelope]) -> list[Envelope]:
        """``outputs`` (made by handling ``cause``) with their ``trace`` set: a workload's events in
        its trace, an effect or other non-workload output in its cause's, a ``TimerSet`` in none
        (a scheduling cycle serves every queue, not the workload whose event armed it)."""
        parent = parse(cause.trace)
        about = workload_of(cause)
        if parent is not None and about is not None and (cause.type in STARTS or about not in self.current):
            self.current[about] = parent.trace_id
        cause_trace = self.current.get(about) if about is not None else None
        if cause_trace is None and parent is not None:
            cause_trace = parent.trace_id
        filled: list[Envelope] = []
        gone: list[str] = []
        for out in outputs:
            key = workload_of(out)
            if key is not None:
                trace = self.current.get(key)
                if trace is None or (out.type in STARTS and out.type not in ("WorkloadSubmitted", "WorkloadRejected")):
                    trace = self.current[key] = trace_id(key, out.id)
                if out.type in ENDS:
                    gone.append(key)
            elif out.type == "TimerSet":
                trace = None
            else:
                trace = cause_trace
            context = {TRACEPARENT: traceparent(SpanRef(trace, hop_span(self.service, cause.id, trace)))} if trace else {}
            filled.append(out if out.trace == context else out.model_copy(update={"trace": context}))
        if about is not None and cause.type in ENDS:
            gone.append(about)
        for key in gone:
            self.current.pop(key, None)
        return filled
