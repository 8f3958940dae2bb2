"""``muster devcluster up|down``: bad arguments are one line and exit 2 (the cluster itself:
tests/realcluster/test_cli_cluster.py)."""

from __future__ import annotations

from pathlib import Path

from tests.builders.cli import invoke, one_line_error


def test_bad_arguments_are_one_line_and_exit_2(tmp_path: Path) -> None:
    one_line_error(invoke("devcluster", "up", "--dir", tmp_path / "a", "--batch-scheduler", "yunikorn"), 2,
                   "--batch-scheduler yunikorn: one of none, volcano, kai-scheduler, scheduler-plugins")
    one_line_error(invoke("devcluster", "up", "--dir", tmp_path / "b", "--nodes", tmp_path / "missing.yaml"), 2,
                   f"--nodes {tmp_path / 'missing.yaml'}: no such file")
    one_line_error(invoke("devcluster", "up", "--dir", tmp_path / "c", "--peer", "yunikorn"), 2,
                   "--peer yunikorn: one of none, kai")
