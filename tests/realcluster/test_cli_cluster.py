"""The commands that need a real cluster: ``muster devcluster up|down`` (``make devcluster``) leaves
a cluster running, then nothing behind; a scenario the API server refuses is one line and exit 2
under ``simulate --cluster``. Their argument checks are in tests/cli (test_devcluster.py,
test_simulate_cluster.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from tests.builders.cli import invoke, one_line_error

if TYPE_CHECKING:
    from shared.parts.devcluster import DevCluster

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


def test_a_scenario_the_api_server_refuses(tmp_path: Path, devcluster: "DevCluster") -> None:
    """The RayCluster CRD's schema refuses a quantity that is none: the step, the object and the API
    server's own words, on one line."""
    scenario = tmp_path / "refused.yaml"
    scenario.write_text(yaml.safe_dump({
        "name": "refused", "cluster": {"nodes": [{"name": "node-1", "capacity": {"cpu": "4", "memory": "8Gi"}}]},
        "steps": [{"at": "1s", "apply": yaml.safe_dump({
            "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "lots", "namespace": "default"},
            "spec": {"headGroupSpec": {"template": {"spec": {"containers": [
                {"name": "ray-head", "image": "rayproject/ray:2.50.1",
                 "resources": {"requests": {"cpu": "lots", "memory": "1Gi"}}}]}}}}})}],
        "until": "10s", "expect": [{"at": "5s", "workload": "default/lots", "phase": "Rejected"}]}))
    one_line_error(invoke("simulate", scenario, "--cluster", devcluster.kubeconfig), 2,
                   'steps[0]: apply RayCluster default/lots: the API server refused it: The RayCluster "lots" is '
                   'invalid: spec.headGroupSpec.template.spec.containers[0].resources.requests.cpu: Invalid value: '
                   '"lots"')
