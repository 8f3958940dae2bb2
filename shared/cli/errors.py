"""How a command fails: one line on stderr and exit code 2."""

from __future__ import annotations

import typer
from rich.console import Console
from shared.kernel.display import plain


def failed(exc: Exception | str) -> typer.Exit:
    """One line on stderr and exit code 2: what every failure of the environment ends in."""
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[red]error:[/] {plain(str(exc))}")
    return typer.Exit(2)
