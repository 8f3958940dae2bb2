"""Running ``muster`` in-process (typer's CliRunner) and reading what it printed."""

from __future__ import annotations

import re
from typing import Any

from typer.testing import CliRunner

from shared.cli.main import app

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_BOX = re.compile(r"[\u2500-\u257f]")


def invoke(*args: Any, env: dict[str, str] | None = None, input: str | None = None) -> Any:
    """Run ``muster ARGS`` in-process; ``input`` is what the user types at a prompt."""
    return CliRunner().invoke(app, [str(a) for a in args], env=env, input=input)


def flat(text: str) -> str:
    """Output without colour codes, table borders or line wrapping, for substring checks."""
    return " ".join(_BOX.sub(" ", _ANSI.sub("", text)).split())


def clean_exit(result: Any, code: int) -> None:
    """The exit code expected, and no traceback."""
    assert result.exit_code == code, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output


def one_line_error(result: Any, code: int, text: str) -> None:
    """One line on stderr naming the trouble, and the exit code of its kind."""
    clean_exit(result, code)
    lines = [line for line in _ANSI.sub("", result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert text in flat(result.stderr), result.stderr
