"""shared/observability/tracing/context.py: which trace each output goes in, with ids every runtime derives alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.kernel.events import (
    Enqueued, KubeEffect, PreemptionRequested, TimerFired, TimerSet, WorkloadDeleted, WorkloadWithdrawn, to_json,
    wrap,
)
from shared.runtime.simulate import simulate
from shared.sim.scenario import load_scenario
from shared.observability.tracing.context import (
    TRACEPARENT, SpanRef, TraceContexts, hop_span, parse, root_span, trace_id, traceparent,
)
from tests.builders.shared import at

SCENARIOS = sorted((Path(__file__).parents[2] / "scenarios").glob("*.yaml"))
KEY = "default/job"


def _out(payload, cause, index=0, source="queue"):
    return wrap(payload, source=source, cause=cause, index=index)


def _ref(env) -> SpanRef:
    ref = parse(env.trace)
    assert ref is not None, env
    return ref


def test_ids_are_derived_hex_of_the_w3c_sizes() -> None:
    assert trace_id(KEY, "e1") == trace_id(KEY, "e1") != trace_id(KEY, "e2")
    assert len(trace_id(KEY, "e1")) == 32 and len(root_span(trace_id(KEY, "e1"))) == 16
    int(trace_id(KEY, "e1"), 16), int(hop_span("queue", "e1", "t"), 16)


def test_traceparent_reads_back_and_anything_malformed_is_no_context() -> None:
    ref = SpanRef("a" * 32, "b" * 16)
    assert parse({TRACEPARENT: traceparent(ref)}) == ref
    for bad in ("", "00-xyz", f"00-{'0' * 32}-{'b' * 16}-01", f"00-{'a' * 32}-{'0' * 16}-01",
                f"01-{'a' * 32}-{'b' * 16}-01", f"00-{'A' * 32}-{'b' * 16}-01"):
        assert parse({TRACEPARENT: bad}) is None, bad
    assert parse({}) is None


def test_a_workloads_events_share_the_trace_its_first_output_began() -> None:
    contexts = TraceContexts("queue")
    cause = at(WorkloadDeleted(key="default/other"), 1.0)
    first = _out(Enqueued(key=KEY, queue="q", reason="waiting"), cause)
    [filled] = contexts.fill(cause, [first])
    ref = _ref(filled)
    assert ref == SpanRef(trace_id(KEY, first.id), hop_span("queue", cause.id, ref.trace_id))
    later = at(TimerFired(key="cycle"), 2.0, source="clock")
    [again] = contexts.fill(later, [_out(Enqueued(key=KEY, queue="q", reason="still"), later)])
    assert _ref(again).trace_id == ref.trace_id


def test_a_preemption_begins_a_new_trace_and_the_receiver_adopts_it() -> None:
    placement, queue = TraceContexts("placement"), TraceContexts("queue")
    submitted = at(Enqueued(key=KEY, queue="q", reason="w"), 1.0)
    [first] = placement.fill(submitted, [_out(Enqueued(key=KEY, queue="q", reason="w"), submitted, source="placement")])
    cause = at(TimerFired(key="x"), 5.0, source="clock")
    preempt = _out(PreemptionRequested(key=KEY, kind="RayCluster", gate="pods", preemptor="default/big", pods=(),
                                       reason="preempted"), cause, source="placement")
    [preempted] = placement.fill(cause, [preempt])
    assert _ref(preempted).trace_id == trace_id(KEY, preempt.id) != _ref(first).trace_id
    [requeued] = queue.fill(preempted, [_out(Enqueued(key=KEY, queue="q", reason="preempted"), preempted)])
    assert _ref(requeued).trace_id == _ref(preempted).trace_id
    assert _ref(requeued).span_id == hop_span("queue", preempted.id, _ref(preempted).trace_id)


def test_timers_carry_no_trace_and_effects_carry_their_causes() -> None:
    contexts = TraceContexts("reconciler")
    cause = at(Enqueued(key=KEY, queue="q", reason="w"), 1.0, source="queue")
    cause = cause.model_copy(update={"trace": {TRACEPARENT: traceparent(SpanRef("c" * 32, "d" * 16))}})
    timer, effect = contexts.fill(cause, [
        _out(TimerSet(key="cycle", at=2.0), cause, source="reconciler"),
        _out(KubeEffect(op="event", kind="RayCluster", namespace="default", name="job"), cause, 1, "reconciler")])
    assert timer.trace == {}
    assert _ref(effect) == SpanRef("c" * 32, hop_span("reconciler", cause.id, "c" * 32))


def test_a_workload_that_left_is_forgotten() -> None:
    contexts = TraceContexts("queue")
    cause = at(WorkloadDeleted(key=KEY), 1.0)
    [withdrawn] = contexts.fill(cause, [_out(WorkloadWithdrawn(key=KEY, reason="deleted"), cause)])
    assert parse(withdrawn.trace) is not None and KEY not in contexts.current


@pytest.mark.parametrize("path", SCENARIOS[:8], ids=[p.stem for p in SCENARIOS[:8]])
def test_tracing_changes_no_decision_and_its_log_is_the_same_every_run(path: Path) -> None:
    scenario = load_scenario(path)
    plain, traced, again = simulate(scenario), simulate(scenario, traced=True), simulate(scenario, traced=True)
    assert [e.model_copy(update={"trace": {}}) for e in traced.runtime.log] == plain.runtime.log
    assert [to_json(e) for e in traced.runtime.log] == [to_json(e) for e in again.runtime.log]
    assert {k: v for k, v in traced.result().items() if k != "stats"} == \
        {k: v for k, v in plain.result().items() if k != "stats"}
    assert all(e.trace == {} for e in plain.runtime.log)
