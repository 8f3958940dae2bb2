"""shared/sim/timeline.py: the human view of a result document."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from shared.sim.check import Failure
from shared.sim.scenario import Expectation
from shared.sim.timeline import render


def _result(**workload_overrides: Any) -> dict[str, Any]:
    workload = {
        "kind": "RayCluster", "queue": "q", "priority": 5,
        "gang": {"min_member": 3, "resources": {"cpu": "3", "memory": "4Gi"}},
        "phase": "Running",
        "transitions": [{"t": 1.0, "phase": "Queued", "reason": "waiting in queue q"},
                        {"t": 2.5, "phase": "Admitted", "reason": "3/3 pods placed on 1 node(s) (binpack)"},
                        {"t": 4.0, "phase": "Running", "reason": "3/3 gang pods bound and Running"}],
        "pods": [
            {"name": "w-head-a", "pod_set": "head", "node": "n1", "gpu": {"devices": [0], "fraction": 0.5},
             "bound": [[2.5, None]]},
            {"name": "w-worker-b", "pod_set": "worker", "node": "n1", "gpu": None, "bound": [[2.5, None]]},
            {"name": "w-worker-c", "pod_set": "worker", "node": "n1", "gpu": None, "bound": [[2.5, None]]},
            {"name": "w-worker-old", "pod_set": "worker", "node": "n2", "gpu": None, "bound": [[1.0, 2.0]]},
            {"name": "w-worker-d", "pod_set": "worker", "node": None, "gpu": None, "bound": []},
        ],
    }
    workload.update(workload_overrides)
    return {
        "scenario": "demo",
        "workloads": {"ns/w": workload},
        "queues": {"q": {"usage": {"cpu": "3", "memory": "4Gi"}, "active": ["ns/w"],
                         "pending": [{"workload": "ns/x", "position": 1}], "backoff": ["ns/y"]},
                   "empty": {"usage": {}, "active": [], "pending": [], "backoff": []}},
        "stats": {"events": 100, "decisions": 54, "wall_seconds": 0.014},
    }


def _render(result: dict[str, Any], failures: list[Failure] | None = None, checked: bool = False) -> list[str]:
    console = Console(file=io.StringIO(), width=160, color_system=None, highlight=False)
    render(result, console, failures, checked=checked)
    return [line.rstrip() for line in console.file.getvalue().splitlines()]


def test_workload_header_transitions_and_placement():
    lines = _render(_result())
    assert "demo" in lines[0]
    assert lines[1] == "ns/w RayCluster queue=q priority=5 gang=3 (cpu 3, memory 4Gi) -> Running"
    assert [line.split() for line in lines[2:5]] == [
        ["1s", "Queued", "waiting", "in", "queue", "q"],
        ["2.5s", "Admitted", "3/3", "pods", "placed", "on", "1", "node(s)", "(binpack)"],
        ["4s", "Running", "3/3", "gang", "pods", "bound", "and", "Running"],
    ]
    # only pods bound now; unbound and formerly bound pods are left out
    assert lines[5].strip() == "bound now: n1: head gpu[0]x0.5, worker x2"


def test_queue_table_and_stats():
    text = "\n".join(_render(_result()))
    assert "queues at the end" in text
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in text.splitlines() if line.startswith("│")}
    assert rows == {"q": ["cpu 3, memory 4Gi", "ns/w", "1. ns/x", "ns/y"], "empty": ["-", "-", "-", "-"]}
    assert text.splitlines()[-1] == "100 events, 54 decisions, 0.01s wall"


def test_check_verdicts():
    failure = Failure(Expectation(at=60.0, workload="ns/w", pods_bound=2), "pods_bound", 2, 3)
    assert _render(_result(), [failure], checked=True)[-2:] == [
        "CHECK FAILED (1):", "  ✗ at 60s ns/w: pods_bound: expected 2, got 3"]
    assert _render(_result(), [], checked=True)[-1] == "CHECK PASSED: every expectation holds"
    assert not any("CHECK" in line for line in _render(_result(), [failure], checked=False))


def test_rejected_workload_without_queue_or_pods():
    lines = _render(_result(queue=None, phase="Rejected", gang={"min_member": 0, "resources": {}}, pods=[],
                            transitions=[{"t": 1.0, "phase": "Rejected", "reason": "minReplicas 3 > maxReplicas 2"}]))
    assert lines[1] == "ns/w RayCluster queue=- priority=5 gang=- -> Rejected"
    assert lines[2].split() == ["1s", "Rejected", "minReplicas", "3", ">", "maxReplicas", "2"]
    assert not any("bound now" in line for line in lines)


@pytest.mark.parametrize("value", ["lots", "[/b]", "[bold]x"])
def test_reasons_are_printed_verbatim(value):
    reason = f"spec.headGroupSpec.template.spec.containers[ray-head].resources.requests.cpu: '{value}' is not a quantity"
    lines = _render(_result(transitions=[{"t": 1.0, "phase": "Rejected", "reason": reason}]))
    assert lines[2].split(maxsplit=2) == ["1s", "Rejected", reason]
