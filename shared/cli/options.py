"""What several command groups share: help texts, time options, writing a file, the ``--trace`` check."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from shared.cli.errors import failed
from shared.kernel.eventtime import TimeArg, TimeArgError, TimeFormat, parse_time_arg

SCHEDULER_NAMES_HELP = ("The spec.schedulerName values muster schedules pods for, comma-separated, e.g. "
                        "muster,volcano; pods for any other scheduler only count as used capacity.")
STORE_HELP = ("History store URL: sqlite:///history.db or postgresql+psycopg://user@host:5432/db "
              "(default: $MUSTER_STORE).")
TIME_HELP = ("an ISO 8601 time (2026-12-07T03:16:29Z; naive is UTC, or the machine's zone with --local), "
             "+90s/+1m30s after the log's first event, or epoch seconds (a simulated run: scenario seconds, "
             "e.g. 90 or 90s)")
LOCAL_HELP = "Show (and read naive --at/--since/--until) times in this machine's zone instead of UTC."


def time_arg(value: str) -> TimeArg:
    """A time option (``--at``, ``--since``, ``--until``) checked for its form at parse time (a bad one is a
    usage error, one line); where it falls needs the log (``resolved``). ``nan``, ``inf`` and a negative
    time are refused rather than answered: event time starts at 0."""
    try:
        return parse_time_arg(value)
    except TimeArgError as exc:
        raise typer.BadParameter(str(exc)) from None


def resolved(clock: TimeFormat, arg: Optional[TimeArg], flag: str) -> Optional[float]:
    """The event time a time option names in the log ``clock`` reads (None when not given); one
    ``Invalid value`` line when it names none there (an ISO time in a simulated run, say)."""
    if arg is None:
        return None
    try:
        return clock.resolve(arg)
    except TimeArgError as exc:
        raise typer.BadParameter(str(exc), param_hint=f"'{flag}'") from None


def writable(path: Path, what: str) -> None:
    """Fail before the work, not after it, when ``path`` cannot be written."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise failed(f"cannot write {what} {path}: folder {folder} does not exist")
    if path.is_dir():
        raise failed(f"cannot write {what} {path}: it is a folder")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise failed(f"cannot write {what} {path}: permission denied")


def write(path: Path, text: str, what: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise failed(f"cannot write {what} {path}: {exc.strerror or exc}") from None


def tracing_ready(err: Console) -> None:
    """``--trace`` needs somewhere to send spans: exit 2 with what to set when it has none."""
    from shared.observability.tracing.config import TracingConfigError, check, enabled

    try:
        check()
    except TracingConfigError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2)
    if not enabled():
        err.print("[red]error:[/] --trace: no OTLP endpoint; set OTEL_EXPORTER_OTLP_ENDPOINT (e.g. "
                  "http://localhost:4318; OTEL_SDK_DISABLED and OTEL_TRACES_EXPORTER=none turn tracing off)")
        raise typer.Exit(2)
