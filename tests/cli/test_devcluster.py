"""``muster devcluster up|down`` (``make devcluster``): a real cluster left running, then nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders.cli import invoke, one_line_error

NODES = Path(__file__).parents[2] / "deploy" / "devcluster" / "nodes.yaml"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_up_leaves_a_cluster_running_and_down_leaves_nothing(tmp_path: Path) -> None:
    """As ``make devcluster`` runs it: a process of its own, which returns while the cluster goes on."""
    from shared.parts.catalog import MissingPart, built

    try:
        kubectl = built("kubernetes").file("bin/kubectl")
    except MissingPart as exc:
        pytest.skip(str(exc)) if exc.unreachable else pytest.fail(str(exc), pytrace=False)
    root = tmp_path / "dc"
    up = subprocess.run([sys.executable, "-m", "shared.cli.main", "devcluster", "up", "--dir", str(root),
                         "--nodes", str(NODES)], capture_output=True, text=True, timeout=300)
    try:
        assert up.returncode == 0, up.stderr
        assert f"export KUBECONFIG={root.resolve() / 'kubeconfig'}" in up.stdout
        pids = json.loads((root / "state.json").read_text())["pids"]
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kuberay"}
        assert all(_alive(pid) for pid in pids.values())
        nodes = subprocess.run([str(kubectl), "--kubeconfig", str(root / "kubeconfig"), "wait", "--for=condition=Ready",
                                "nodes", "--all", "--timeout=60s"], capture_output=True, text=True, timeout=90)
        assert nodes.returncode == 0, nodes.stderr
        assert "kind-worker" in nodes.stdout and "kind-worker2" in nodes.stdout
        again = invoke("devcluster", "up", "--dir", root, "--nodes", NODES)
        one_line_error(again, 2, f"a dev cluster already runs from {root}")
    finally:
        down = invoke("devcluster", "down", "--dir", root)
    assert down.exit_code == 0, down.output
    assert "stopped" in down.output
    assert not root.exists()
    assert not any(_alive(pid) for pid in pids.values())
    assert "no dev cluster" in invoke("devcluster", "down", "--dir", root).output


def test_bad_arguments_are_one_line_and_exit_2(tmp_path: Path) -> None:
    one_line_error(invoke("devcluster", "up", "--dir", tmp_path / "a", "--batch-scheduler", "yunikorn"), 2,
                   "--batch-scheduler yunikorn: one of none, volcano, kai-scheduler, scheduler-plugins")
    one_line_error(invoke("devcluster", "up", "--dir", tmp_path / "b", "--nodes", tmp_path / "missing.yaml"), 2,
                   f"--nodes {tmp_path / 'missing.yaml'}: no such file")
