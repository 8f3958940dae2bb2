"""``muster simulate --cluster``: a kubeconfig that leads nowhere, and a scenario the API server refuses,
are one line and exit 2, never a traceback."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from tests.builders.cli import invoke, one_line_error

if TYPE_CHECKING:
    from shared.parts.devcluster import DevCluster

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
