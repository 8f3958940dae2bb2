"""``shared.history.stream.LogStream``: ``muster simulate --store`` writes the run's log while it is made,
batch by batch, instead of keeping it whole and writing it at the end; the store ends as ``record``
leaves it, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from shared.audit.header import LogHeader
from shared.history import OtherHistory, record
from shared.history.header import read_header
from shared.history.query import event_count, read_log
from shared.history.stream import LogStream
from shared.kernel.policy import Policy
from shared.runtime.simulate import simulate
from shared.sim.scenario import load_scenario
from tests.builders.shared import VOLCANO, minimal_scenario, write_scenario

BATCH = 20


def _streamed(url: str) -> tuple[Any, LogStream, list[int]]:
    """The Volcano example simulated with its log streamed to ``url``: the run, the stream, and how many
    events the store held each time another ``BATCH`` envelopes had been published."""
    header = LogHeader.made_now(Policy(), origin="simulate", scenario="volcano").for_store()
    stream = LogStream(url, header=header, batch_size=BATCH)
    stored: list[int] = []

    def count(env: Any) -> None:
        if stream.seen % BATCH == 0:
            stored.append(event_count(url))

    run = simulate(load_scenario(VOLCANO), keep_log=False, listener=lambda env: (stream(env), count(env)))
    return run, stream, stored


def test_the_log_is_written_while_the_run_goes_and_ends_as_record_writes_it(store: str) -> None:
    url = store
    run, stream, stored = _streamed(url)
    assert run.runtime.log == []  # the run kept no copy of its log
    # written in the run, batch by batch (on PostgreSQL a batch commits while the next is folded: a
    # count may trail by one batch)
    assert len(stored) >= 3 and stored[-1] >= (len(stored) - 2) * BATCH > 0 and stored == sorted(stored)
    counts = stream.finish()
    assert counts.events == stream.seen == run.runtime.published
    expected = simulate(load_scenario(VOLCANO)).runtime.log
    assert [env.id for env in read_log(url)] == [env.id for env in expected]
    assert read_header(url) == stream.header  # the run's header, written once the log is


def test_a_store_holding_the_run_is_left_as_it_is_and_another_run_is_refused(sqlite_store: str, tmp_path) -> None:
    record(sqlite_store, simulate(load_scenario(VOLCANO)).runtime.log)
    held = event_count(sqlite_store)
    again = LogStream(sqlite_store, batch_size=BATCH)
    simulate(load_scenario(VOLCANO), keep_log=False, listener=again)
    assert again.finish().skipped == held and event_count(sqlite_store) == held
    other = LogStream(sqlite_store, batch_size=BATCH)
    simulate(load_scenario(write_scenario(tmp_path, minimal_scenario())), keep_log=False, listener=other)
    with pytest.raises(OtherHistory, match="already holds another history"):
        other.finish()
    assert event_count(sqlite_store) == held
