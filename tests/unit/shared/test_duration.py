"""shared/kernel/duration.py: durations as scenarios and annotations write them."""

from __future__ import annotations

import pytest

from shared.kernel.duration import DurationError, parse_duration


@pytest.mark.parametrize("value, seconds", [
    ("90s", 90.0),
    ("5m", 300.0),
    ("1h30m", 5_400.0),
    ("1m30s", 90.0),
    ("250ms", 0.25),
    ("1s250ms", 1.25),
    ("1.5h", 5_400.0),
    ("0.5s", 0.5),
    ("1d", 86_400.0),
    ("1h0m0s", 3_600.0),
    (" 90s ", 90.0),
    ("2", 2.0),
    ("0", 0.0),
    ("2.5", 2.5),
    ("1e3", 1_000.0),
    (2, 2.0),
    (2.5, 2.5),
    (0, 0.0),
])
def test_parse_duration_in_seconds(value, seconds):
    result = parse_duration(value)
    assert result == seconds
    assert isinstance(result, float)


@pytest.mark.parametrize("value, message", [
    ("-5s", "at: '-5s' is not a duration (write e.g. 30s, 5m, 1h30m)"),
    ("", "at: '' is not a duration (write e.g. 30s, 5m, 1h30m)"),
    ("abc", "at: 'abc' is not a duration (write e.g. 30s, 5m, 1h30m)"),
    ("s", "at: 's' is not a duration (write e.g. 30s, 5m, 1h30m)"),
    ("5 s", "at: '5 s' is not a duration (write e.g. 30s, 5m, 1h30m)"),
    ("1h 30m", "at: '1h 30m' is not a duration (write e.g. 30s, 5m, 1h30m)"),
    ("5m30", "at: '5m30' is not a duration (write e.g. 30s, 5m, 1h30m)"),
    ("1S", "at: '1S' is not a duration (write e.g. 30s, 5m, 1h30m)"),
    ("1.s", "at: '1.s' is not a duration (write e.g. 30s, 5m, 1h30m)"),
    ("-1", "at: '-1' is negative"),
    (-3, "at: -3 is negative"),
    ("nan", "at: 'nan' is not a finite duration"),
    ("inf", "at: 'inf' is not a finite duration"),
    (float("inf"), "at: inf is not a finite duration"),
    (True, "at: True is not a duration"),
    (None, "at: None is not a duration"),
    ([1], "at: [1] is not a duration"),
])
def test_parse_duration_errors_name_the_field_and_value(value, message):
    with pytest.raises(DurationError) as exc:
        parse_duration(value, where="at")
    assert str(exc.value) == message


def test_default_field_name_is_duration():
    with pytest.raises(DurationError, match=r"^duration: 'soon' is not a duration"):
        parse_duration("soon")


def test_duration_error_is_a_value_error():
    assert issubclass(DurationError, ValueError)
