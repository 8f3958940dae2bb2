"""shared/kernel/eventtime.py: a deployment's times as ISO 8601, a simulated run's as seconds, and the time
options read either way."""

from __future__ import annotations


import pytest

from shared.kernel.eventtime import (SCENARIO, TimeArgError, TimeFormat, attribute_time, is_wall_clock,
                              parse_time_arg)

T = 1_796_613_389.512  # 2026-12-07T03:16:29.512Z
WALL = TimeFormat.of("kafka", T)


def test_which_logs_read_as_the_wall_clock() -> None:
    assert WALL.wall and WALL.start == T
    assert not TimeFormat.of("simulate", T).wall        # a simulated run is scenario seconds, whatever its size
    assert not TimeFormat.of("kafka", 12.0).wall        # simulate --bus read off Kafka: scenario seconds
    assert not TimeFormat.of(None, None).wall           # an empty store
    assert TimeFormat.of(None, T).wall                  # a store no header was recorded in: its times decide
    assert is_wall_clock(1e9) and not is_wall_clock(86400 * 365 * 30)


def test_a_deployment_shows_iso_utc_and_a_simulated_run_seconds() -> None:
    assert WALL.at(T) == "2026-12-07T03:16:29.512Z"
    assert WALL.at(T + 0.0004) == "2026-12-07T03:16:29.512Z"  # milliseconds, rounded
    assert WALL.duration(92.5) == SCENARIO.duration(92.5) == "92.5s"
    assert SCENARIO.at(90) == "90s" and SCENARIO.at(1e9) == "1e+09s"  # as before
    assert WALL.zone() == "UTC" and SCENARIO.plot_time(5.0) == 5.0
    assert WALL.plot_time(T) == "2026-12-07 03:16:29.512"


def test_local_shows_the_machines_zone(tokyo: None) -> None:
    local = TimeFormat.of("store", T, local=True)
    assert local.at(T) == "2026-12-07T12:16:29.512+09:00"
    assert local.zone() == "JST, UTC+09:00" and local.plot_time(T) == "2026-12-07 12:16:29.512"


def test_trace_attributes_carry_iso_for_a_deployment_and_seconds_for_a_simulated_run() -> None:
    assert attribute_time(T) == "2026-12-07T03:16:29.512Z"
    assert attribute_time(42.0) == 42.0


@pytest.mark.parametrize("text", ["2026-12-07T03:18:00Z", "2026-12-07T12:18:00+09:00", "2026-12-07T03:18:00",
                                  "2026-12-07 03:18:00", "+90.488s", "+1m30.488s", f"{T + 90.488!r}"])
def test_every_way_to_write_a_time_names_the_same_instant(text: str) -> None:
    assert WALL.resolve(parse_time_arg(text)) == pytest.approx(T + 90.488, abs=1e-6)


def test_hours_after_the_start_and_naive_times_under_local(tokyo: None) -> None:
    assert WALL.resolve(parse_time_arg("+1.5h")) == pytest.approx(T + 5400)
    local = TimeFormat.of("kafka", T, local=True)
    assert local.resolve(parse_time_arg("2026-12-07T12:18:00")) == pytest.approx(T + 90.488, abs=1e-6)


def test_a_simulated_run_reads_seconds_as_before() -> None:
    for text, seconds in (("90", 90.0), ("90s", 90.0), ("1m30s", 90.0), ("+90s", 90.0), ("1e9", 1e9)):
        assert SCENARIO.resolve(parse_time_arg(text)) == seconds


@pytest.mark.parametrize("text, words", [
    ("abc", "abc is not a number of seconds"),
    ("nan", "nan is not a number of seconds"),
    ("inf", "inf is not a number of seconds"),
    ("-5", "-5 is negative"),
    ("+abc", "not a duration after the log's start"),
    ("+-5s", "not a duration after the log's start"),
    ("2026-13-45T00:00:00Z", "not an ISO 8601 time"),
])
def test_a_bad_time_is_one_line(text: str, words: str) -> None:
    with pytest.raises(TimeArgError, match=words.replace("+", r"\+")) as caught:
        parse_time_arg(text)
    assert "\n" not in str(caught.value)


def test_a_time_that_names_nothing_in_the_log_says_what_to_write() -> None:
    with pytest.raises(TimeArgError, match="simulated run"):
        SCENARIO.resolve(parse_time_arg("2026-12-07T03:18:00Z"))
    with pytest.raises(TimeArgError, match=r"write \+90s for that long after its start"):
        WALL.resolve(parse_time_arg("90"))
    with pytest.raises(TimeArgError, match=r"write \+1m30s"):
        WALL.resolve(parse_time_arg("1m30s"))
