"""The README's audit examples run as written: the command block of its "Audit" section in order, in
a fresh folder, then every `e.g.` of the command table's log/replay/explain/report rows (docs/cli.md)
against the log that block made (so each NAMESPACE/NAME and queue they name exists in it).
docs/audit.md shows the same block."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.builders.cli import clean_exit, invoke

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CLI = (ROOT / "docs" / "cli.md").read_text()
AUDIT = (ROOT / "docs" / "audit.md").read_text()


def block_commands(text: str = README, start: str = "\n## Audit") -> list[str]:
    """The lines of the first code block after ``start`` (the README's "## Audit" section)."""
    section = text[text.index(start):]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block, f"no command block after {start!r}"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def table_examples() -> list[str]:
    """The `e.g.` commands of the command table's rows for log import, replay, explain and report, but
    for those that need an OTLP collector (``--trace``, tested in test_observability)."""
    out = []
    for row in re.findall(r"^\| `muster (?:log import|replay|explain|report)\b.*$", CLI, re.M):
        out += [c for c in re.findall(r"e\.g\. `([^`]+)`", row) if "OTEL_EXPORTER_OTLP_ENDPOINT" not in c]
    return out


def _run(command: str) -> None:
    words = shlex.split(command)
    assert words[0] == "muster", command
    result = invoke(*words[1:])
    assert result.exit_code == 0, (command, result.output)
    clean_exit(result, 0)


def test_the_readme_names_its_audit_commands() -> None:
    assert block_commands()[0].startswith("muster simulate examples/")
    assert len(table_examples()) >= 5  # log import, verify, what-if, explain twice, report


def test_the_audit_page_shows_the_readmes_block() -> None:
    assert block_commands(AUDIT, "# Audit") == block_commands()


def test_the_readmes_audit_examples_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # "from the repository's root"
    monkeypatch.chdir(tmp_path)
    for command in block_commands():
        _run(command)
    for command in table_examples():
        _run(command)
    assert (tmp_path / "whatif.html").is_file() and (tmp_path / "report.html").is_file()
