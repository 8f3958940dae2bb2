"""Durations as users write them in scenarios and annotations: ``90s``, ``5m``, ``1h30m``, ``2``."""

from __future__ import annotations

import re

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class DurationError(ValueError):
    pass


def parse_duration(value: object, *, where: str = "duration") -> float:
    """Seconds from ``"90s"``, ``"1m30s"``, ``"250ms"``, or a plain number of seconds."""
    if isinstance(value, bool):
        raise DurationError(f"{where}: {value!r} is not a duration")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            pos, seconds = 0, 0.0
            for match in _PART.finditer(text):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNIT[match.group(2)]
                pos = match.end()
            if pos != len(text) or not text:
                raise DurationError(f"{where}: {value!r} is not a duration (write e.g. 30s, 5m, 1h30m)") from None
    else:
        raise DurationError(f"{where}: {value!r} is not a duration")
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise DurationError(f"{where}: {value!r} is not a finite duration")
    if seconds < 0:
        raise DurationError(f"{where}: {value!r} is negative")
    return seconds
