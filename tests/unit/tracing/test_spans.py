"""shared/observability/tracing/spans.py: the spans of every scenario, built from its event log."""

from __future__ import annotations

from collections import Counter, defaultdict
from functools import lru_cache
from pathlib import Path

import pytest

from shared.observability.tracing.context import root_span
from shared.observability.tracing.spans import PHASES, SpanBuilder, SpanData
from shared.runtime.simulate import Run, simulate
from shared.sim.scenario import load_scenario

SCENARIOS = sorted((Path(__file__).parents[2] / "scenarios").glob("*.yaml"))
IDS = [p.stem for p in SCENARIOS]


@lru_cache(maxsize=None)
def runs(path: Path) -> tuple[Run, Run]:
    scenario = load_scenario(path)
    return simulate(scenario), simulate(scenario, traced=True)


def waits(workload: dict) -> list[float]:
    """Each incarnation's wait in the result document: first Queued to Admitted."""
    out, since = [], None
    for tr in workload["transitions"]:
        if tr["phase"] == "Queued" and since is None:
            since = tr["t"]
        elif tr["phase"] == "Admitted" and since is not None:
            out.append(round(tr["t"] - since, 6))
            since = None
        elif tr["phase"] == "Preempted":
            since = None
    return out


def _key(span: SpanData) -> tuple:
    return (span.trace_id, span.span_id, span.parent_id, span.name, span.start, span.end, span.service)


@pytest.mark.parametrize("path", SCENARIOS, ids=IDS)
def test_a_log_recorded_without_tracing_gives_the_same_spans(path: Path) -> None:
    plain, traced = runs(path)
    assert sorted(map(_key, SpanBuilder().build(plain.runtime.log))) == \
        sorted(map(_key, SpanBuilder().build(traced.runtime.log)))


@pytest.mark.parametrize("path", SCENARIOS, ids=IDS)
def test_each_trace_has_one_root_its_phases_and_the_waits_of_the_result(path: Path) -> None:
    _, run = runs(path)
    spans = SpanBuilder().build(run.runtime.log)
    traces: dict[str, list[SpanData]] = defaultdict(list)
    for span in spans:
        traces[span.trace_id].append(span)
    ids = Counter((s.trace_id, s.span_id) for s in spans)
    assert max(ids.values()) == 1, "span ids are unique"
    for trace, members in traces.items():
        [root] = [s for s in members if s.parent_id is None]
        assert root.span_id == root_span(trace)
        known = {s.span_id for s in members}
        assert all(s.parent_id in known for s in members if s.parent_id), "every parent is in the trace"
        for phase in (s for s in members if s.name in PHASES):
            assert phase.parent_id == root.span_id
            assert root.start <= phase.start <= phase.end <= root.end
    result = run.result()
    placed = {s.trace_id for s in spans if s.name == "placing"}
    queued = Counter((s.attributes["muster.workload"], round(s.end - s.start, 6))
                     for s in spans if s.name == "queued" and s.trace_id in placed)
    expected = Counter((key, w) for key, doc in result["workloads"].items() for w in waits(doc))
    assert queued == expected


def test_a_preempted_workload_has_a_second_trace_from_the_preemption_to_running_again() -> None:
    _, run = runs(next(p for p in SCENARIOS if p.stem == "kai-priority-preemption"))
    roots = sorted((s for s in SpanBuilder().build(run.runtime.log)
                    if s.parent_id is None and s.attributes["muster.workload"] == "default/train-cluster"),
                   key=lambda s: s.start)
    assert [(r.start, r.end, r.attributes["muster.outcome"]) for r in roots] == [(1.0, 3.0, "Running"),
                                                                                  (30.0, 202.0, "Running")]
    assert roots[1].attributes["muster.preempted_by"] == "default/build-cluster"
    assert any(name == "preempted" for _, name, _ in roots[1].events)


def test_a_rejected_workload_is_a_trace_that_ends_in_an_error() -> None:
    _, run = runs(next(p for p in SCENARIOS if p.stem == "bad-input-rejected"))
    rejected = [s for s in SpanBuilder().build(run.runtime.log)
                if s.parent_id is None and s.attributes["muster.outcome"] == "Rejected"]
    assert rejected and all(s.error for s in rejected)
    assert {s.attributes["muster.workload"] for s in rejected} <= set(run.result()["workloads"])


def test_hop_spans_follow_the_services_and_link_a_decision_to_its_cause() -> None:
    _, run = runs(next(p for p in SCENARIOS if p.stem == "volcano-gang-queue"))
    spans = SpanBuilder().build(run.runtime.log)
    by_id = {s.span_id: s for s in spans}
    hops = [s for s in spans if s.kind == "consumer"]
    assert {s.service for s in hops} == {"muster-admission", "muster-queue", "muster-placement", "muster-reconciler"}
    for hop in hops:
        assert hop.start == hop.end == hop.attributes["muster.event.time"]  # event time: handling takes none
        parent = by_id[hop.parent_id]
        assert parent.trace_id == hop.trace_id
    submitted = [s for s in hops if s.name == "queue WorkloadSubmitted"]
    assert submitted and all(by_id[s.parent_id].name == "admission ObjectChanged" for s in submitted)
    cycles = [s for s in hops if s.name == "queue TimerFired" and "Dequeued" in s.attributes.get("muster.outputs", [])]
    assert cycles and all(by_id[s.parent_id].parent_id is None for s in cycles)


def test_a_deployments_hop_spans_show_their_event_time_as_iso_8601() -> None:
    """A deployment's event times are the wall clock: the attribute a person reads in Tempo is ISO
    8601; a simulated run's stays its scenario seconds (the test above)."""
    _, run = runs(next(p for p in SCENARIOS if p.stem == "volcano-gang-queue"))
    epoch = 1_796_532_000.0  # 2026-12-06T04:40:00Z
    log = [e.model_copy(update={"occurred_at": epoch + e.occurred_at}) for e in run.runtime.log]
    hops = [s for s in SpanBuilder().build(log) if s.kind == "consumer"]
    assert hops and all(isinstance(s.attributes["muster.event.time"], str) for s in hops)
    first = min(hops, key=lambda s: s.start)
    assert first.attributes["muster.event.time"] == f"2026-12-06T04:40:{first.start - epoch:06.3f}Z"
