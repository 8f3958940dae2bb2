"""Acceptance: every scenario in this folder passes ``muster simulate --check``.

The five documented scenarios are copies of ../shared/scenarios (Volcano, KAI, kube-queue docs);
the others are ours. A scenario without expectations would prove nothing, so each must have some.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.runtime.simulate import simulate
from shared.sim.scenario import load_scenario

HERE = Path(__file__).parent
SCENARIOS = sorted(HERE.glob("*.yaml"))


def test_the_documented_scenarios_are_all_here() -> None:
    names = {p.name for p in SCENARIOS}
    assert {"volcano-gang-queue.yaml", "kube-queue-gang-insufficient.yaml", "kube-queue-quota-tree-rayjobs.yaml",
            "kai-queues-gpu-sharing.yaml", "kai-priority-preemption.yaml"} <= names


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_meets_its_expectations(path: Path) -> None:
    scenario = load_scenario(path)
    assert scenario.expect, f"{path.name} has no expect: list"
    failures = simulate(scenario).check()
    assert not failures, "\n".join(str(f) for f in failures)


EXAMPLES = sorted((HERE.parent.parent / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_a_newcomer_runs_holds_its_expectations(path: Path) -> None:
    """`make demo` runs these with --check; an example that drifted from its test copy would fail there."""
    twin = HERE / path.name
    if twin.exists():
        assert path.read_text() == twin.read_text(), f"examples/{path.name} differs from tests/scenarios/{path.name}"
    failures = simulate(load_scenario(path)).check()
    assert not failures, "\n".join(str(f) for f in failures)
