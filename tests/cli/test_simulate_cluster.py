"""``muster simulate --cluster``: a kubeconfig that leads nowhere is one line and exit 2, never a
traceback (a scenario the API server refuses: tests/realcluster/test_cli_cluster.py)."""

from __future__ import annotations

import socket
from pathlib import Path

import yaml

from tests.builders.cli import invoke, one_line_error

SCENARIO = Path(__file__).parents[2] / "tests" / "scenarios" / "volcano-gang-queue.yaml"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again when this returns: nothing listens there


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


def test_a_missing_kubeconfig(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "kubeconfig"
    one_line_error(invoke("simulate", SCENARIO, "--cluster", missing), 2, f"--cluster {missing}: no such kubeconfig")


def test_an_unreachable_api_server(tmp_path: Path) -> None:
    port = _closed_port()
    config = _kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}")
    one_line_error(invoke("simulate", SCENARIO, "--cluster", config), 2, f"Cannot connect to host 127.0.0.1:{port}")


def test_a_kubeconfig_that_is_not_one(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.write_text("clusters: [unclosed\n")
    one_line_error(invoke("simulate", SCENARIO, "--cluster", broken), 2, f"--cluster {broken}: while parsing")
    empty = tmp_path / "empty"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    one_line_error(invoke("simulate", SCENARIO, "--cluster", empty), 2, "Expected key current-context")
