"""``Pipeline``: the writer a batch at a time, as the Kafka projector drives it — the same store as
one ``write`` per batch, records that were no envelopes move the offsets on, and a failed commit
leaves a writer that resumes from the stored offsets without writing anything twice."""

from __future__ import annotations

import pytest

from shared.history import query
from shared.history.rows import Located
from shared.history.writer import Pipeline, ProjectionWriter, WriteCounts
from tests.integration.conftest import SCENARIOS, scenario_run
from tests.integration.test_writer import counts, expected, histories

FAIR_SHARE = next(p for p in SCENARIOS if p.stem == "fair-share-two-teams")
TOPIC = "muster.events"


def located(start: int = 0) -> list[Located]:
    log = scenario_run(FAIR_SHARE).runtime.log
    return [Located(env, TOPIC, 0, i) for i, env in enumerate(log)][start:]


def test_put_returns_what_the_batch_before_wrote_and_flush_the_rest(store: str) -> None:
    items = located()
    batches = [items[i:i + 60] for i in range(0, len(items), 60)]
    with ProjectionWriter(store) as writer, Pipeline(writer) as pipeline:
        total = WriteCounts()
        for batch in batches:
            total = total + pipeline.put(batch)
        total = total + pipeline.flush()
        assert pipeline.flush() == WriteCounts()
        assert writer.consumed_offsets(TOPIC) == {0: len(items)}
    assert (total.events, total.skipped) == (len(items), 0)
    assert [e.id for e in query.read_log(store)] == [i.envelope.id for i in items]
    assert histories(store, FAIR_SHARE) == expected(FAIR_SHARE)


def test_records_that_were_no_envelopes_move_the_offsets_on(store: str) -> None:
    items = located()[:30]
    with ProjectionWriter(store) as writer:
        with Pipeline(writer) as pipeline:
            pipeline.put(items, consumed=[(TOPIC, 0, 30), (TOPIC, 0, 31)])   # two bad records after them
            pipeline.put([], consumed=[(TOPIC, 0, 32)])                       # a batch of nothing but a bad one
        assert writer.consumed_offsets(TOPIC) == {0: 33}
        assert writer.write([], consumed=[(TOPIC, 0, 3)]).events == 0          # an old position: never back
        assert writer.consumed_offsets(TOPIC) == {0: 33}
    assert counts(store)["event_log"] == 30


def test_a_failed_commit_resumes_from_the_stored_offsets(store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    items = located()
    size = 50
    with ProjectionWriter(store) as writer:
        calls = {"n": 0}
        real = writer._store

        def fail_the_second(conn, ops):  # type: ignore[no-untyped-def]
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("the database went away")
            return real(conn, ops)

        monkeypatch.setattr(writer, "_store", fail_the_second)
        pipeline = Pipeline(writer)
        with pytest.raises(RuntimeError):
            for i in range(0, len(items), size):   # the second batch fails when the third lands it (or at once)
                pipeline.put(items[i:i + size])
            pipeline.flush()
        pipeline.close()
        resume = writer.consumed_offsets(TOPIC)[0]
        assert resume == size                     # the first batch, with its offset; nothing of the second
        with Pipeline(writer) as again:           # what the projector does: read again from there
            for i in range(resume - 10, len(items), size):   # overlapping what was stored: skipped
                again.put(items[i:i + size])
    assert counts(store)["event_log"] == len(items)
    assert histories(store, FAIR_SHARE) == expected(FAIR_SHARE)


def test_a_duplicate_the_pipeline_did_not_check_for_is_written_again_checked(pg_store: str) -> None:
    """After a batch of new envelopes the pipeline folds without asking which are stored; an old
    envelope sent again (a producer's retry) then fails its commit and the batches are redone."""
    items = located()
    with ProjectionWriter(pg_store) as writer, Pipeline(writer) as pipeline:
        total = pipeline.put(items[:40])             # checked (a fresh writer does not know the store)
        assert not writer.check_ids                  # nothing was stored: the next ones go unchecked
        total = total + pipeline.put(items[40:80])
        total = total + pipeline.put(items[80:120] + items[10:11])  # an envelope of the first batch again
        total = total + pipeline.put(items[120:])
        total = total + pipeline.flush()
    assert (total.events, total.skipped) == (len(items), 1)
    assert [e.id for e in query.read_log(pg_store)] == [i.envelope.id for i in items]
    assert histories(pg_store, FAIR_SHARE) == expected(FAIR_SHARE)
