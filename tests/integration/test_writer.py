"""ProjectionWriter: redelivery is harmless, offsets commit with the rows, writers that take turns
stay correct, a failed transaction leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from shared.history import query, record
from shared.history.engine import StoreError, Unstorable, connect
from shared.history.models import ConsumedOffset, TABLES
from shared.history.rows import Located
from shared.history.writer import ProjectionWriter, write_log
from shared.kernel.events import ObjectChanged, wrap
from tests.integration.conftest import SCENARIOS, scenario_run

PREEMPTION = next(p for p in SCENARIOS if p.stem == "kai-priority-preemption")
FAIR_SHARE = next(p for p in SCENARIOS if p.stem == "fair-share-two-teams")


def counts(url: str) -> dict[str, int]:
    engine = connect(url)
    try:
        with engine.connect() as conn:
            return {t.name: conn.execute(select(func.count()).select_from(t)).scalar_one() for t in TABLES}
    finally:
        engine.dispose()


def histories(url: str, path: Path) -> dict:
    return {key: query.workload_history(url, key) for key in scenario_run(path).result()["workloads"]}


def expected(path: Path) -> dict:
    return {key: {"workload": key, **doc} for key, doc in scenario_run(path).result()["workloads"].items()}


def test_the_same_batch_twice_changes_nothing(store):
    log = scenario_run(PREEMPTION).runtime.log
    with ProjectionWriter(store) as writer:
        first = writer.write(log)
        before = counts(store)
        again = writer.write(log)
    assert (first.events, first.skipped) == (len(log), 0)
    assert (again.events, again.skipped, again.transitions, again.placements) == (0, len(log), 0, 0)
    assert counts(store) == before
    assert histories(store, PREEMPTION) == expected(PREEMPTION)


def test_an_overlapping_batch_only_adds_what_is_new(store):
    log = scenario_run(FAIR_SHARE).runtime.log
    half, overlap = len(log) // 2, len(log) // 4
    with ProjectionWriter(store) as writer:
        writer.write(log[:half])
        middle = counts(store)
        again = writer.write(log[half - overlap:half])          # entirely redelivered
        assert counts(store) == middle and again.events == 0
        rest = writer.write(log[half - overlap:])                # overlaps the last batch, then goes on
    assert (rest.skipped, rest.events) == (overlap, len(log) - half)
    assert counts(store)["event_log"] == len(log)
    assert histories(store, FAIR_SHARE) == expected(FAIR_SHARE)


def test_a_fresh_writer_after_a_crash_redelivers_harmlessly(store):
    """A projector restarted from older offsets sees events it wrote before: a new writer (cold)."""
    log = scenario_run(FAIR_SHARE).runtime.log
    with ProjectionWriter(store) as writer:
        write_log(writer, log[:200], batch_size=50)
    before = counts(store)
    with ProjectionWriter(store) as restarted:
        again = write_log(restarted, log[:200], batch_size=64)
        assert again.events == 0 and counts(store) == before
        write_log(restarted, log[150:], batch_size=64)
    assert histories(store, FAIR_SHARE) == expected(FAIR_SHARE)


def test_consumed_offsets_are_the_next_to_read_and_never_go_back(store):
    log = scenario_run(PREEMPTION).runtime.log
    located = [Located(env, topic=f"muster.{env.source}", partition=i % 2, offset=i) for i, env in enumerate(log)]
    with ProjectionWriter(store, consumer="projector-a") as writer:
        writer.write(located[:100])
        writer.write(located[50:150])
        writer.write(located[:20])          # an old redelivery: offsets stay where they were
    offsets = {(r.topic, r.partition): r.offset for r in _offset_rows(store)}
    expected_next: dict[tuple[str, int], int] = {}
    for item in located[:150]:
        where = (item.topic, item.partition)
        expected_next[where] = max(expected_next.get(where, 0), item.offset + 1)
    assert offsets == expected_next
    assert counts(store)["event_log"] == len(located[:150])  # the scenario's whole log when it is shorter


def _offset_rows(url: str):
    engine = connect(url)
    try:
        with engine.connect() as conn:
            return conn.execute(select(ConsumedOffset.__table__)).all()
    finally:
        engine.dispose()


def test_writers_taking_turns_read_back_what_the_other_wrote(store):
    """Each writer notices the other has been there (the event log grew) and folds from the rows."""
    log = scenario_run(FAIR_SHARE).runtime.log
    a, b = ProjectionWriter(store), ProjectionWriter(store)
    try:
        for i, start in enumerate(range(0, len(log), 40)):
            (a if i % 2 == 0 else b).write(log[start:start + 40])
    finally:
        a.close()
        b.close()
    assert histories(store, FAIR_SHARE) == expected(FAIR_SHARE)


def test_pipelined_and_one_at_a_time_give_the_same_rows(pg_store):
    log = scenario_run(FAIR_SHARE).runtime.log
    with ProjectionWriter(pg_store) as writer:
        write_log(writer, log, batch_size=17)      # write_many: the next batch folds while one commits
    pipelined = histories(pg_store, FAIR_SHARE), counts(pg_store)
    assert pipelined[0] == expected(FAIR_SHARE)
    from tests.conftest import empty

    empty(pg_store)
    with ProjectionWriter(pg_store) as writer:
        for start in range(0, len(log), 17):
            writer.write(log[start:start + 17])
    assert (histories(pg_store, FAIR_SHARE), counts(pg_store)) == pipelined


def test_a_failed_batch_leaves_no_rows_and_the_writer_recovers(sqlite_store, monkeypatch):
    log = scenario_run(PREEMPTION).runtime.log
    writer = ProjectionWriter(sqlite_store)
    writer.write(log[:60])
    before = counts(sqlite_store)

    def broken(conn, name, values, **_):
        raise RuntimeError("disk full")

    monkeypatch.setattr(writer, "_upsert", broken)
    with pytest.raises(RuntimeError):
        writer.write(log[60:120])
    assert counts(sqlite_store) == before           # event_log rows of the failed batch rolled back too
    monkeypatch.undo()
    writer.write(log[60:])                          # cold again: reads state back and goes on
    writer.close()
    assert histories(sqlite_store, PREEMPTION) == expected(PREEMPTION)


def test_an_envelope_the_store_cannot_hold_is_unstorable_and_its_batch_changes_nothing(pg_store):
    log = scenario_run(PREEMPTION).runtime.log
    nul = wrap(ObjectChanged(change="Added", kind="ConfigMap", namespace="ns", name="a\x00b", object={}),
               source="ingest", cause=None, index=0, at=log[60].occurred_at)
    with ProjectionWriter(pg_store) as writer:
        writer.write(log[:60])
        before = counts(pg_store)
        with pytest.raises(Unstorable, match="NUL"):  # a StoreError: the store is fine, the data is not
            writer.write([*log[60:70], nul])
        assert counts(pg_store) == before
        writer.write(log[60:])
    assert histories(pg_store, PREEMPTION) == expected(PREEMPTION)


def test_an_integer_too_large_for_its_column_is_unstorable(store):
    log = scenario_run(PREEMPTION).runtime.log
    at = next(i for i, e in enumerate(log) if e.type == "WorkloadSubmitted")
    env = log[at]
    huge = env.model_copy(update={"payload": env.payload.model_copy(update={
        "workload": env.payload.workload.model_copy(update={"priority": 2 ** 70})})})
    with ProjectionWriter(store) as writer:
        writer.write(log[:at])
        with pytest.raises(Unstorable):  # Postgres: integer out of range; SQLite: the driver's OverflowError
            writer.write([huge])
        writer.write(log[at:])
    assert histories(store, PREEMPTION) == expected(PREEMPTION)


def test_a_batch_another_writer_stored_first_is_folded_again_and_written(sqlite_store, monkeypatch):
    log = scenario_run(PREEMPTION).runtime.log
    writer = ProjectionWriter(sqlite_store)
    real_store, calls = writer._store, []

    def raced(conn, ops):
        calls.append(1)
        if len(calls) == 1:
            raise IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed: event_log.event_id"))
        return real_store(conn, ops)

    monkeypatch.setattr(writer, "_store", raced)
    assert writer.write(log).events == len(log)
    writer.close()
    assert len(calls) == 2
    assert histories(sqlite_store, PREEMPTION) == expected(PREEMPTION)


def test_record_refuses_to_mix_two_runs(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    first = scenario_run(PREEMPTION).runtime.log
    assert record(url, first).events == len(first)
    assert record(url, first).skipped == len(first)        # the same run again: nothing changes
    with pytest.raises(StoreError, match="already holds another history"):
        record(url, scenario_run(FAIR_SHARE).runtime.log)


def test_an_unreachable_store_is_a_store_error():
    with pytest.raises(StoreError, match="cannot use the store"):
        unreachable = ProjectionWriter("postgresql+psycopg://postgres@127.0.0.1:1/nothing")
        unreachable.write(scenario_run(PREEMPTION).runtime.log)


def test_a_refused_pipelined_commit_is_written_again_cold(pg_store, monkeypatch):
    """Another writer got in between: the refused batch and the one folded meanwhile are redone."""
    from shared.history import writer as writer_module

    log = scenario_run(FAIR_SHARE).runtime.log
    writer = ProjectionWriter(pg_store)
    real_commit, calls = writer._commit, []

    def sometimes_refused(ops):
        calls.append(1)
        if len(calls) == 3:
            raise writer_module._Incoherent()
        return real_commit(ops)

    monkeypatch.setattr(writer, "_commit", sometimes_refused)
    total = write_log(writer, log, batch_size=30)
    writer.close()
    assert (total.events, total.skipped) == (len(log), 0)
    assert counts(pg_store)["event_log"] == len(log)
    assert histories(pg_store, FAIR_SHARE) == expected(FAIR_SHARE)


def test_the_recorder_writes_what_a_runtime_publishes(sqlite_store):
    from shared.history.writer import Recorder

    log = scenario_run(PREEMPTION).runtime.log
    with ProjectionWriter(sqlite_store) as writer:
        recorder = Recorder(writer, batch_size=13)
        for env in log:          # what runtime.subscribe(recorder) would deliver
            recorder(env)
        assert counts(sqlite_store)["event_log"] == len(log) // 13 * 13
        assert recorder.flush().events == len(log)
    assert histories(sqlite_store, PREEMPTION) == expected(PREEMPTION)
