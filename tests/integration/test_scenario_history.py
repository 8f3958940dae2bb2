"""For every scenario in tests/scenarios, the history store holds what ``muster simulate`` shows.

After writing a run's event log (on SQLite and on Postgres): every workload's transitions (same t,
phase, reason, in order), every pod with its node, GPU and bound intervals, the decision row of
every service output, the final and the over-time usage of every queue, and the event log itself,
which replays byte for byte. The Postgres run writes in small batches with a projector that may
keep only one workload in memory, so reading state back from the rows is exercised too.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import func, select

from shared.history import query
from shared.history.engine import connect
from shared.history.models import Decision, EventLog, Placement, QueueUsage, WorkloadTransition
from shared.history.writer import ProjectionWriter, write_log
from shared.kernel import quantity as q
from shared.kernel.events import to_json
from shared.kernel.projection import ResultProjection
from shared.kernel.topology import SERVICES
from tests.integration.conftest import SCENARIOS, scenario_run


def _write(url: str, path: Path) -> None:
    log = scenario_run(path).runtime.log
    postgres = url.startswith("postgresql")
    with ProjectionWriter(url, max_workloads=1 if postgres else 50_000) as writer:
        counts = write_log(writer, log, batch_size=25 if postgres else 5_000)
    assert counts.events == len({e.id for e in log}) and counts.skipped == 0


def _rows(url: str, stmt):
    engine = connect(url)
    try:
        with engine.connect() as conn:
            return conn.execute(stmt).all()
    finally:
        engine.dispose()


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_store_holds_the_run_history(store: str, path: Path) -> None:
    run = scenario_run(path)
    result = run.result()
    _write(store, path)

    # transitions and pods, workload by workload, exactly as the result shows them
    for key, expected in result["workloads"].items():
        stored = query.workload_history(store, key)
        assert stored is not None, key
        assert stored.pop("workload") == key
        assert stored["transitions"] == expected["transitions"], key
        assert stored["pods"] == expected["pods"], key
        assert stored == expected, key
        t = WorkloadTransition.__table__
        rows = _rows(store, select(t.c.t, t.c.phase, t.c.reason).where(t.c.workload_key == key).order_by(t.c.seq))
        assert [tuple(r) for r in rows] == [(tr["t"], tr["phase"], tr["reason"]) for tr in expected["transitions"]]
    p = Placement.__table__
    for key, expected in result["workloads"].items():
        intervals = _rows(store, select(p.c.pod, p.c.node, p.c.bound_at, p.c.unbound_at)
                          .where(p.c.workload_key == key, p.c.bound_at.is_not(None))
                          .order_by(p.c.pod_ordinal, p.c.seq))
        assert [tuple(r) for r in intervals] == [(pod["name"], pod["node"], a, b)
                                                 for pod in expected["pods"] for a, b in pod["bound"]], key

    # a decision row for every service output: its service, its input event, its time
    outputs = {e.id: e for e in run.runtime.log if e.source in SERVICES}
    d = Decision.__table__
    decisions = {r._mapping["event_id"]: r._mapping for r in _rows(store, select(d))}
    assert set(decisions) == set(outputs)
    for event_id, env in outputs.items():
        row = decisions[event_id]
        assert (row["service"], row["input_event_id"], row["type"], row["t"]) == \
            (env.source, env.causation_id, env.type, round(env.occurred_at, 6))
        reason = getattr(env.payload, "reason", None)
        if reason and env.type != "KubeEffect":
            assert row["reason"] == reason

    # queue usage: now, and over time as a fold of the log says it was at every instant
    report = query.queue_report(store)
    for name, expected in result["queues"].items():
        assert report[name]["usage"] == expected["usage"], name
        assert report[name].get("rejected") == expected.get("rejected"), name
        assert report[name]["active"] == expected["active"], name
    reference = ResultProjection()
    series: dict[tuple[str, str], list[tuple[float, int]]] = {}
    for env in run.runtime.log:
        reference.apply(env)
        for name, used in reference.queue_usage().items():
            for resource, value in used.items():
                points = series.setdefault((name, resource), [])
                if (points[-1][1] if points else 0) != value:
                    points.append((round(env.occurred_at, 6), value))
        for (name, resource), points in series.items():
            if points and points[-1][1] and resource not in reference.queue_usage().get(name, {}):
                points.append((round(env.occurred_at, 6), 0))
    u = QueueUsage.__table__
    stored_series: dict[tuple[str, str], list[tuple[float, int]]] = {}
    for name, resource, t, used in _rows(store, select(u.c.queue, u.c.resource, u.c.t, u.c.used)
                                         .order_by(u.c.queue, u.c.resource, u.c.t)):
        stored_series.setdefault((name, resource), []).append((t, used))
    assert _collapse(stored_series) == _collapse(series)

    # the event log: every envelope once, in order, and it replays to the same bytes and history
    log = run.runtime.log
    assert _rows(store, select(func.count()).select_from(EventLog.__table__))[0][0] == len(log)
    replayed = list(query.read_log(store))
    assert [to_json(e) for e in replayed] == [_as_json_stores_it(to_json(e)) for e in log]


def _as_json_stores_it(data: bytes) -> bytes:
    """The bus keeps a YAML manifest's non-finite numbers (``Infinity``); JSON in PostgreSQL and
    SQLite has none, so the store holds null there — the one place a stored log is not the bus's. Only
    the number tokens (a value after ``:``, ``[`` or ``,``), not the words inside a text: a reason may say
    NaN."""
    return re.sub(rb"(?<=[:\[,])(?:-?Infinity|NaN)(?=[,\]}])", b"null", data)


def _collapse(series: dict[tuple[str, str], list[tuple[float, int]]]) -> dict[tuple[str, str], list[tuple[float, int]]]:
    """Last value per instant, consecutive repeats dropped, leading zeros dropped."""
    out = {}
    for key, points in series.items():
        per_t: dict[float, int] = {}
        for t, v in points:
            per_t[t] = v
        kept: list[tuple[float, int]] = []
        for t, v in per_t.items():
            if (kept[-1][1] if kept else 0) != v:
                kept.append((t, v))
        if kept:
            out[key] = kept
    return out


def test_every_scenario_is_covered():
    assert len(SCENARIOS) >= 24
    kinds = Counter(w["kind"] for p in SCENARIOS for w in scenario_run(p).result()["workloads"].values())
    assert {"RayCluster", "RayJob", "PodGroup"} <= set(kinds)


def test_resources_are_milli_units_in_the_rows(sqlite_store: str) -> None:
    path = next(p for p in SCENARIOS if p.stem == "volcano-gang-queue")
    _write(sqlite_store, path)
    report = query.queue_report(sqlite_store)
    assert report["kuberay-test-queue"]["usage"] == {"cpu": "3", "memory": "4Gi"}
    assert report["kuberay-test-queue"]["limit"] == {"cpu": "4", "memory": "6Gi"}
    assert q.parse_quantity("4Gi") == 4 * 1024**3 * 1000
