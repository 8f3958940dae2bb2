"""Spans as data, built from the event stream: where each workload's time went.

Per workload incarnation (``shared.observability.tracing.context``) a ``root`` span covers the whole wait, from
its first event to its gang Running (or to its end: deleted, rejected, finished, preempted), and
its children are the phases:

    queued     first Enqueued -> the Dequeued/ReclaimRequested whose placement succeeded; each
               attempt in between (BackedOff, PlacementFailed, a new reason) is a span event
    placing    that Dequeued/ReclaimRequested -> GangPlaced (with reclaim victims, if any)
    binding    GangPlaced -> every pod of the gang bound to its node
    starting   every pod bound -> GangRunning

and, with ``hops``, one span per service hop: a service handling one input, with what it emitted
(``hop_spans``). Times are event times (seconds), moved by the exporter's epoch: wall-clock in the
deployment, the scenario's or the recorded log's time in ``simulate --trace`` and ``replay --trace``.

``SpanBuilder`` is a fold (``apply(envelope) -> finished spans``) used alike by ``simulate --trace``
and ``replay --trace`` (over the whole log) and by the projector in the deployment (root and phase
spans only: the services send their hop spans themselves, ``shared.observability.tracing.live``). It reads an
envelope's context when it has one and derives it as the services would when it has none (a log
recorded with tracing off), so the ids agree either way. Pure: no OpenTelemetry here.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from shared.kernel import kube
from shared.kernel.events import Envelope
from shared.kernel.eventtime import attribute_time
from shared.observability.tracing.context import (
    STARTS, SpanRef, TraceContexts, hop_span, parse, root_span, span_id, workload_of,
)
from shared.kernel.topology import SERVICES

Attributes = dict[str, Any]

GPU = "nvidia.com/gpu"
ENDED_KEPT = 100_000
CAUSES_KEPT = 200_000
"""Outputs follow their cause closely in a log (a batch of a service at most), so a long-running
fold (the projector's) keeps only the latest envelopes to find causes among."""
_LEFT = frozenset({"WorkloadDeleted", "WorkloadFinished", "WorkloadRejected"})
PHASES = ("queued", "placing", "binding", "starting")


@dataclass
class SpanData:
    """One finished span, in event time (seconds)."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    service: str
    """Who the span speaks for: ``muster-<service>``, ``muster`` for a workload's root."""
    start: float
    end: float
    kind: str = "internal"
    """``internal`` or ``consumer`` (a service handling a record of its inbox)."""
    attributes: Attributes = field(default_factory=dict)
    events: list[tuple[float, str, Attributes]] = field(default_factory=list)
    links: list[SpanRef] = field(default_factory=list)
    error: str | None = None
    """A status message when the span ended badly (rejected, preempted, deleted while waiting)."""


def reason_of(payload: Any) -> str | None:
    reason = getattr(payload, "reason", None)
    return reason if isinstance(reason, str) and reason else None


def hop_spans(service: str, cause: Envelope, outputs: Sequence[Envelope], start: float, end: float,
              attributes: Attributes | None = None, cause_ref: SpanRef | None = None,
              name: str | None = None) -> list[SpanData]:
    """The spans of ``service`` handling ``cause`` into ``outputs``: one per trace its outputs went
    to (and one in the cause's own trace when it has one). In the cause's trace the span is the
    child of the cause's span; in another trace (a scheduling cycle deciding for a workload) it is
    the child of that trace's root and links to the cause: the decision's span points at the event
    that caused it. ``cause_ref`` is the cause's context when it is not in its ``trace`` field;
    ``name`` replaces ``<service> <cause type>``."""
    parent = cause_ref if cause_ref is not None else parse(cause.trace)
    groups: dict[str, list[Envelope]] = {}
    if parent is not None:
        groups[parent.trace_id] = []
    for out in outputs:
        ref = parse(out.trace)
        if ref is not None:
            groups.setdefault(ref.trace_id, []).append(out)
    spans = []
    for trace, made in groups.items():
        same = parent is not None and parent.trace_id == trace
        attrs: Attributes = {"muster.service": service, "muster.event.type": cause.type,
                             "muster.event.id": cause.id, "muster.event.time": attribute_time(cause.occurred_at),
                             **(attributes or {})}
        about = workload_of(cause) or next((workload_of(o) for o in made if workload_of(o)), None)
        if about:
            attrs["muster.workload"] = about
        if made:
            attrs["muster.outputs"] = [o.type for o in made]
            reasons = [r for r in (reason_of(o.payload) for o in made) if r]
            if reasons:
                attrs["muster.reason"] = reasons[-1]
        spans.append(SpanData(
            trace_id=trace, span_id=hop_span(service, cause.id, trace),
            parent_id=parent.span_id if same and parent is not None else root_span(trace),
            name=name or f"{service} {cause.type}", service=f"muster-{service}", start=start, end=end, kind="consumer",
            attributes=attrs, links=[] if same or parent is None else [parent]))
    return spans


@dataclass
class _Incarnation:
    """What the builder knows of one trace while it is open."""

    trace: str
    key: str
    start: float
    last: float
    attributes: Attributes = field(default_factory=dict)
    queued_at: float | None = None
    dequeued_at: float | None = None
    placed_at: float | None = None
    slots: int = 0
    bound_at: float | None = None
    events: list[tuple[float, str, Attributes]] = field(default_factory=list)
    victims: tuple[str, ...] = ()


class SpanBuilder:
    """Folds envelopes (in log order) into finished spans: ``apply`` returns those each one ends,
    ``close`` those still open at the end of the stream (marked ``muster.open``)."""

    def __init__(self, *, hops: bool = True) -> None:
        self.hops = hops
        self._contexts: dict[str, TraceContexts] = {}
        self._open: dict[str, _Incarnation] = {}
        """Trace id -> the incarnation still being followed."""
        self._current: dict[str, str] = {}
        """Workload key -> its latest trace."""
        self._ended: OrderedDict[str, None] = OrderedDict()
        """The traces ended last (their late events are dropped, not taken for a new incarnation)."""
        self._bound: dict[str, set[str]] = {}
        """Workload key -> names of its pods bound now."""
        self._pending_hop: tuple[str, str] | None = None
        self._hop_cause: Envelope | None = None
        self._hop_outputs: list[Envelope] = []
        self._hop_at = 0.0
        self._by_id: OrderedDict[str, Envelope] = OrderedDict()
        """The latest envelopes by id (``CAUSES_KEPT``): a cause is looked up when its outputs come."""

    # ------------------------------------------------------------------ the fold
    def apply(self, env: Envelope) -> list[SpanData]:
        out: list[SpanData] = []
        env = self._with_context(env)
        if self.hops:
            out.extend(self._hop(env))
        ref = parse(env.trace)
        key = workload_of(env)
        if key is not None and ref is not None:
            out.extend(self._phase(env, key, ref.trace_id))
        elif env.type == "ObjectChanged" and env.payload.kind == "Pod":
            out.extend(self._pod(env))
        return out

    def close(self) -> list[SpanData]:
        """The spans of incarnations still waiting when the stream ends, ended at their last event."""
        out: list[SpanData] = []
        if self.hops:
            out.extend(self._flush_hop())
        for inc in list(self._open.values()):
            inc.attributes["muster.open"] = True
            out.extend(self._end(inc, inc.last, outcome="open"))
        self._open.clear()
        return out

    def build(self, envelopes: Iterable[Envelope]) -> list[SpanData]:
        """Every span of a whole stream."""
        spans: list[SpanData] = []
        for env in envelopes:
            spans.extend(self.apply(env))
        spans.extend(self.close())
        return spans

    # ------------------------------------------------------------------ context
    def _with_context(self, env: Envelope) -> Envelope:
        """``env`` with the context its service gave it, or would have (a log recorded untraced)."""
        if parse(env.trace) is None and env.source in SERVICES and env.causation_id is not None:
            cause = self._by_id.get(env.causation_id)
            if cause is not None:
                contexts = self._contexts.setdefault(env.source, TraceContexts(env.source))
                env = contexts.fill(cause, [env])[0]
        self._by_id[env.id] = env
        if len(self._by_id) > CAUSES_KEPT:
            self._by_id.popitem(last=False)
        return env

    # ------------------------------------------------------------------ hops
    def _hop(self, env: Envelope) -> list[SpanData]:
        if env.source not in SERVICES or env.causation_id is None:
            return []
        slot = (env.source, env.causation_id)
        out: list[SpanData] = []
        if slot != self._pending_hop:
            out.extend(self._flush_hop())
            self._pending_hop = slot
            self._hop_cause = self._by_id.get(env.causation_id)
            self._hop_at = env.occurred_at
        self._hop_outputs.append(env)
        return out

    def _flush_hop(self) -> list[SpanData]:
        cause, outputs, slot = self._hop_cause, self._hop_outputs, self._pending_hop
        self._pending_hop, self._hop_cause, self._hop_outputs = None, None, []
        if slot is None or cause is None:
            return []
        return hop_spans(slot[0], cause, outputs, self._hop_at, self._hop_at)

    # ------------------------------------------------------------------ phases
    def _phase(self, env: Envelope, key: str, trace: str) -> list[SpanData]:
        spans: list[SpanData] = []
        inc = self._open.get(trace)
        t = env.occurred_at
        if inc is None:
            current = self._current.get(key)
            if trace in self._ended or trace == current or (current is not None and env.type not in STARTS):
                self._forget(env, key)
                return []  # a late event of an incarnation already ended
            previous = self._open.get(self._current.get(key, ""))
            if previous is not None:  # preempted or disrupted before it ran
                spans.extend(self._end(previous, t, outcome="Preempted" if env.type == "PreemptionRequested"
                                       else "Disrupted", error=reason_of(env.payload)))
            self._current[key] = trace
            inc = self._open[trace] = _Incarnation(trace, key, t, t, {"muster.workload": key})
        inc.last = t
        spans.extend(self._step(inc, env, key, t))
        self._forget(env, key)
        return spans

    def _forget(self, env: Envelope, key: str) -> None:
        """The workload left, or was refused: whatever comes of that name next is a new incarnation."""
        if env.type in _LEFT:
            self._current.pop(key, None)
            if env.type != "WorkloadRejected":
                self._bound.pop(key, None)

    def _step(self, inc: _Incarnation, env: Envelope, key: str, t: float) -> list[SpanData]:
        """One event of an open incarnation; the spans it ends."""
        p, kind = env.payload, env.type
        spec = getattr(p, "workload", None)
        if spec is not None:
            self._describe(inc, spec)
        if kind == "PreemptionRequested":
            inc.attributes["muster.preempted_by"] = p.preemptor
            inc.attributes["muster.reclaim"] = p.reclaim
            inc.events.append((t, "preempted", {"muster.reason": p.reason}))
        elif kind == "GangDisrupted":
            inc.events.append((t, "disrupted", {"muster.reason": p.reason}))
        elif kind == "GangEvicted":  # a disrupted gang that stayed below its minimum: its incarnation goes on
            inc.events.append((t, "evicted", {"muster.reason": p.reason}))
        elif kind == "PodsMoved":  # pods moved for another workload (consolidation): it runs on
            inc.events.append((t, "pods moved", {"muster.reason": p.reason, "muster.moved_for": p.preemptor}))
        elif kind == "Enqueued":
            inc.attributes["muster.queue"] = p.queue
            if inc.queued_at is None:
                inc.queued_at = t
            inc.events.append((t, "waiting", {"muster.reason": p.reason}))
        elif kind == "BackedOff":
            inc.events.append((t, "backed off", {"muster.reason": p.reason, "muster.attempts": p.attempts,
                                                 "muster.requeue_at": attribute_time(p.requeue_at)}))
        elif kind in ("Dequeued", "ReclaimRequested"):
            inc.dequeued_at = t
            inc.victims = tuple(getattr(p, "victims", ()))
            if inc.queued_at is None:
                inc.queued_at = t
        elif kind == "PlacementFailed":
            inc.events.append((t, "placement failed", {"muster.reason": p.reason}))
        elif kind == "GangPlaced":
            inc.placed_at, inc.slots = t, len(p.slots)
            inc.attributes["muster.reason"] = p.reason
            inc.attributes.setdefault("muster.kind", p.kind)
            inc.attributes.setdefault("muster.queue", p.queue)
            if len(self._bound.get(key, ())) >= inc.slots:
                inc.bound_at = t
        elif kind == "GangRunning":
            inc.attributes["muster.running_reason"] = p.reason
            return self._end(inc, t, outcome="Running")
        elif kind == "WorkloadRejected":
            inc.attributes.setdefault("muster.kind", p.kind)
            return self._end(inc, t, outcome="Rejected", error=p.reason)
        elif kind in ("WorkloadDeleted", "WorkloadFinished", "WorkloadWithdrawn"):
            outcome = getattr(p, "outcome", None) or ("Deleted" if kind == "WorkloadDeleted" else "Withdrawn")
            return self._end(inc, t, outcome=outcome, error=None if outcome == "Succeeded" else p.reason)
        return []

    def _pod(self, env: Envelope) -> list[SpanData]:
        obj = env.payload.object
        key = kube.workload_key_of_pod(obj)
        if key is None:
            return []
        bound = self._bound.setdefault(key, set())
        if env.payload.change != "Deleted" and kube.mapping(obj.get("spec")).get("nodeName"):
            bound.add(env.payload.name)
        else:
            bound.discard(env.payload.name)
            if not bound:
                del self._bound[key]
        inc = self._open.get(self._current.get(key, ""))
        if inc is not None and inc.placed_at is not None and inc.bound_at is None and len(bound) >= inc.slots:
            inc.bound_at = env.occurred_at
        return []

    @staticmethod
    def _describe(inc: _Incarnation, spec: Any) -> None:
        gang = spec.gang
        inc.attributes.update({
            "muster.kind": spec.kind, "muster.queue": spec.queue, "muster.priority": spec.priority,
            "muster.gang.size": sum(ps.count for ps in gang.pod_sets), "muster.gang.min_member": gang.min_member,
            "muster.gpu": gang.resources.get(GPU, 0) / 1000 + gang.gpu_share_total / 1000,
        })

    def _end(self, inc: _Incarnation, t: float, *, outcome: str, error: str | None = None) -> list[SpanData]:
        self._open.pop(inc.trace, None)
        self._ended[inc.trace] = None
        if len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)
        root = root_span(inc.trace)
        service = {"queued": "muster-queue", "placing": "muster-placement", "binding": "muster-placement",
                   "starting": "muster-placement"}
        spans: list[SpanData] = []

        def phase(name: str, start: float | None, end: float | None, **extra: Any) -> None:
            if start is None or end is None:
                return
            attributes = {"muster.workload": inc.key, **extra}
            spans.append(SpanData(inc.trace, span_id(name, inc.trace), root, name, service[name], start, end,
                                  attributes=attributes,
                                  events=[e for e in inc.events if start <= e[0] <= end] if name == "queued" else []))

        placed = inc.placed_at
        if placed is not None:
            queued_end: float | None = inc.dequeued_at if inc.dequeued_at is not None else placed
        else:
            queued_end = t
        phase("queued", inc.queued_at, queued_end, **{"muster.queue": inc.attributes.get("muster.queue", "")})
        if placed is not None:
            phase("placing", inc.dequeued_at if inc.dequeued_at is not None else placed, placed,
                  **({"muster.reclaim.victims": list(inc.victims)} if inc.victims else {}))
            bound = inc.bound_at if inc.bound_at is not None else (t if outcome == "Running" else None)
            phase("binding", placed, bound if bound is not None else t, **{"muster.pods": inc.slots})
            if outcome == "Running" and bound is not None:
                phase("starting", bound, t)
        attributes = {**inc.attributes, "muster.outcome": outcome}
        if inc.queued_at is not None and placed is not None and inc.dequeued_at is not None:
            attributes["muster.wait_seconds"] = inc.dequeued_at - inc.queued_at
        name = f"{inc.attributes.get('muster.kind', 'workload')} {inc.key}"
        spans.append(SpanData(inc.trace, root, None, name, "muster", inc.start, t, attributes=attributes,
                              events=list(inc.events), error=error))
        return spans
