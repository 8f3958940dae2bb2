"""shared/runtime/bus/stagetrace.py: off without ``MUSTER_STAGE_TRACE``; on, one process's lines in a file of
its own, which ``bench.e2e_stages.traced`` sums over a window."""

from __future__ import annotations

import gc
import json

from bench.e2e_stages import traced
from shared.runtime.bus import stagetrace


def test_off_without_the_variable(monkeypatch):
    monkeypatch.delenv(stagetrace.VARIABLE, raising=False)
    monkeypatch.setattr(stagetrace, "_trace", None)
    assert stagetrace.start("queue") is None and stagetrace.current() is None


def test_on_it_writes_what_each_stage_took_and_the_bench_sums_the_window(monkeypatch, tmp_path):
    monkeypatch.setenv(stagetrace.VARIABLE, str(tmp_path))
    monkeypatch.setattr(stagetrace, "_trace", None)
    trace = stagetrace.start("queue")
    try:
        assert trace is not None and stagetrace.start("other") is trace  # one per process
        trace.note("fetch", 10.0, "queue inbox", [0.004, 0.006])
        trace.note("batch", 10.0, 10.002, "queue inbox", 2)
        trace.note("send", 50.0, 50.1, "queue", 3)  # outside the window
        gc.collect()  # a collection, noted by gc.callbacks
        trace.flush()
    finally:
        gc.callbacks.remove(trace._gc)
    rows = [json.loads(line) for line in (tmp_path / trace.path.rsplit("/", 1)[1]).read_text().splitlines()]
    assert [row[0] for row in rows] == ["fetch", "batch", "send", "gc"]
    lines = traced(str(tmp_path), 9.0, 11.0)
    assert [line.split()[:4] for line in lines] == [["queue", "inbox", "batch", "n"],
                                                      ["queue", "inbox", "record", "age"]]
    assert "n      2" in lines[1] and "max      6.0" in lines[1] and "sum        10 ms" in lines[1]
    collected = rows[3]
    assert collected[3:5] == ["queue", 2] and 0 <= collected[5] and 0 <= collected[6]  # its CPU, its garbage
    around = traced(str(tmp_path), collected[1] - 1, collected[1] + 1)
    assert [line.split()[:4] for line in around] == [["queue", "gc", "gen2", "n"], ["queue", "gc", "gen2", "cpu"],
                                                       ["queue", "gc", "gen2", "garbage"]]
    assert around[2].endswith(" objects") and around[1].endswith(" ms")
