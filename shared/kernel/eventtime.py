"""How a log's event times are shown to a person and how a person writes one (``--at``, ``--since``,
``--until``): the one place that knows a deployment's times from a simulated run's.

A simulated run's event time is scenario seconds (``0``, ``90``): shown ``90s``, written ``90``,
``90s`` or ``+90s``, exactly as before. A deployment's is the wall clock as epoch seconds
(``1796532185.512``): shown ISO 8601 (``2026-12-07T03:16:29.512Z``, or the machine's zone with
``--local``), written as an ISO time (``Z``, an offset, or naive: UTC, the machine's zone with
``--local``), ``+90s``/``+1m30s``/``+1.5h`` after the log's first event, or epoch seconds. Durations
(a wait, "for 12.3s") stay seconds either way: they are differences, not instants.

Which of the two a log is comes from what it knows: its header's ``origin`` (``simulate`` is always
scenario time) and the size of its times (a deployment's clock is past ``WALL_CLOCK_FROM``; no
scenario runs for 31 years). A log read off Kafka that a ``simulate --bus`` wrote has origin
``kafka`` and scenario seconds: its times decide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

WALL_CLOCK_FROM = 1e9
"""Epoch seconds of 2001-09-09: an event time at or past it is a wall-clock time."""


class TimeArgError(ValueError):
    """A time a person wrote that cannot be read, or cannot mean anything in this log (one line)."""


def is_wall_clock(t: float) -> bool:
    """Whether event time ``t`` is a wall-clock time (epoch seconds) rather than scenario seconds."""
    return t >= WALL_CLOCK_FROM


def seconds_text(seconds: float) -> str:
    """A duration, or a scenario time, as every human view shows it: ``90s``, ``12.5s``."""
    return f"{seconds:g}s"


@dataclass(frozen=True)
class TimeArg:
    """A time option as written, checked for its form but not yet placed in a log (``+90s`` needs the
    log's start, an ISO time needs the log to be a deployment's): ``TimeFormat.resolve`` places it."""

    text: str
    kind: Literal["number", "duration", "since_start", "iso"]
    seconds: float = 0.0
    """``number``/``duration``: the time; ``since_start``: the offset from the log's start."""
    when: datetime | None = None
    """``iso``: the time written (naive: its zone is decided when it is resolved)."""


def parse_time_arg(text: str) -> TimeArg:
    """Read a time option: ``2026-12-07T03:16:29Z`` (or an offset, or naive), ``+90s``/``+1m30s``/``+1.5h``,
    a plain number (epoch seconds; scenario seconds in a simulated run) or a duration as scenarios write
    one (``90s``: scenario seconds). ``TimeArgError`` with a one-line reason otherwise."""
    from shared.kernel.duration import DurationError, parse_duration

    value = text.strip()
    if value.startswith("+"):
        try:
            offset = parse_duration(value[1:].strip(), where=text)
        except DurationError:
            raise TimeArgError(f"{text} is not a duration after the log's start (e.g. +90s, +1m30s, +1.5h)") from None
        return TimeArg(text, "since_start", offset)
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise TimeArgError(f"{text} is not a number of seconds")
        if seconds < 0:
            raise TimeArgError(f"{text} is negative: event time starts at 0")
        return TimeArg(text, "number", seconds)
    try:
        return TimeArg(text, "duration", parse_duration(value, where=text))
    except DurationError:
        pass
    if len(value) >= 10 and value[4:5] == "-":
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            raise TimeArgError(f"{text} is not an ISO 8601 time (e.g. 2026-12-07T03:16:29Z)") from None
        return TimeArg(text, "iso", when=when)
    raise TimeArgError(f"{text} is not a number of seconds, a duration after the log's start (+90s) or an ISO 8601 "
                       "time (2026-12-07T03:16:29Z)")


@dataclass(frozen=True)
class TimeFormat:
    """How one log's event times read: ``wall`` (a deployment: ISO 8601) or scenario seconds; ``local``
    shows and reads naive times in the machine's zone instead of UTC; ``start`` is the log's first event
    time in a deployment (what ``+90s`` counts from; a simulated run counts from scenario time 0)."""

    wall: bool = False
    local: bool = False
    start: float = 0.0

    @classmethod
    def of(cls, origin: str | None, first: float | None, *, local: bool = False) -> "TimeFormat":
        """The format of a log from its header's ``origin`` and its first event time (None: empty)."""
        wall = origin != "simulate" and first is not None and is_wall_clock(first)
        return cls(wall=wall, local=local, start=first if wall and first is not None else 0.0)

    def _datetime(self, t: float) -> datetime:
        utc = datetime.fromtimestamp(round(t, 3), tz=timezone.utc)
        return utc.astimezone() if self.local else utc

    def at(self, t: float) -> str:
        """An instant: ``2026-12-07T03:16:29.512Z`` (``+09:00`` with ``--local``), or ``90s`` in a simulated run."""
        if not self.wall:
            return seconds_text(t)
        text = self._datetime(t).isoformat(timespec="milliseconds")
        return text[:-6] + "Z" if text.endswith("+00:00") and not self.local else text

    def duration(self, seconds: float) -> str:
        """A length of time (a wait, "for ..."): seconds either way."""
        return seconds_text(seconds)

    def plot_time(self, t: float) -> float | str:
        """An instant as a plotly date axis takes it (the display zone's wall time, no offset: plotly.js
        has no zones), or the scenario seconds unchanged."""
        if not self.wall:
            return t
        return self._datetime(t).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]

    def zone(self) -> str:
        """What the instants are shown in: ``UTC``, the machine's zone (``JST, UTC+09:00``) or scenario seconds."""
        if not self.wall:
            return "scenario seconds"
        if not self.local:
            return "UTC"
        now = datetime.fromtimestamp(self.start, tz=timezone.utc).astimezone()
        offset = now.isoformat()[-6:]
        return f"{now.tzname()}, UTC{offset}"

    def resolve(self, arg: TimeArg) -> float:
        """The event time ``arg`` names in this log; ``TimeArgError`` when it names none (an ISO time in a
        simulated run, a scenario-sized number in a deployment's log)."""
        if arg.kind == "since_start":
            return self.start + arg.seconds
        if arg.kind == "iso":
            if not self.wall:
                raise TimeArgError(f"{arg.text}: this log is a simulated run, its times are scenario seconds "
                                   "(write e.g. 90, 90s or +90s)")
            assert arg.when is not None
            when = arg.when
            if when.tzinfo is None:
                when = when.astimezone() if self.local else when.replace(tzinfo=timezone.utc)
            return when.timestamp()
        if self.wall and not is_wall_clock(arg.seconds):
            raise TimeArgError(f"{arg.text}: this log's times are wall-clock (it starts at {self.at(self.start)}): "
                               f"write +{arg.text.strip()}{'s' if arg.kind == 'number' else ''} for that long after its start, an ISO time, or "
                               "epoch seconds")
        return arg.seconds


def attribute_time(t: float) -> float | str:
    """An instant as a trace span attribute: ISO 8601 UTC when it is a wall-clock time (what a person
    reads in Tempo), the scenario seconds unchanged in a simulated run (spans carry no log header, so the
    time's size decides, as ``TimeFormat.of`` does without one)."""
    return TimeFormat(wall=True).at(t) if is_wall_clock(t) else t


SCENARIO = TimeFormat()
"""A simulated run's format: what every view used before it had a log to ask."""
