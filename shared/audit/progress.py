"""A progress bar on stderr for reading a long log (only on a terminal, never in a pipe or a test)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from shared.audit.logfile import LogSource

NAME_WIDTH = 32
"""The log's name takes at most this many characters of the line (its end, where a file's name is): a
long path would otherwise leave the bar no room on an 80-column terminal."""


def _short(name: str, width: int = NAME_WIDTH) -> str:
    return name if len(name) <= width else "\u2026" + name[-(width - 1):]


@contextmanager
def progress_of(source: LogSource, what: str, *, enabled: bool = True) -> Iterator[Callable[[], None]]:
    """A ``tick`` to call now and then while ``source`` is read; it moves the bar to ``source.progress()``."""
    console = Console(stderr=True)
    size = source.size()
    if not enabled or not console.is_terminal or size is None:
        yield lambda: None
        return
    total, unit = size
    columns = [TextColumn(f"{what} [dim]{{task.fields[name]}}"), BarColumn()]
    columns.append(MofNCompleteColumn() if unit == "events" else TextColumn("{task.percentage:>3.0f}%"))
    columns.append(TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(what, total=total, name=_short(source.name))
        yield lambda: bar.update(task, completed=source.progress())
