"""bench.stats: how every figure is reported (median and spread, the machine's load and pace)."""

from __future__ import annotations

import pytest

from bench.stats import measured, pace, percentile, spread


def test_spread_is_the_median_with_the_runs_around_it() -> None:
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "runs": [3.0, 1.0, 2.0]}
    with pytest.raises(ValueError):
        spread([])


def test_percentile_is_the_nearest_rank() -> None:
    values = list(range(100))
    assert percentile(values, 0.5) == 50 and percentile(values, 0.99) == 99 and percentile(values, 1.0) == 99


def test_a_section_records_the_machines_load_and_pace_before_and_after() -> None:
    figures = measured(lambda: {"figure": 1})
    assert figures["figure"] == 1
    for when in ("before", "after"):
        machine = figures["machine_load"][when]
        assert len(machine["loadavg"]) == 3 and machine["cpus"] >= 1
        assert machine["pace_ms"] > 0

