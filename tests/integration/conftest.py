"""The integration tests' scenario runs (each simulated once per session) and ``store``, both store
backends (``pg_store``, ``sqlite_store``: tests/conftest.py)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

from shared.runtime.simulate import Run, simulate
from shared.sim.scenario import load_scenario

SCENARIOS = sorted((Path(__file__).parents[1] / "scenarios").glob("*.yaml"))


@lru_cache(maxsize=None)
def scenario_run(path: Path) -> Run:
    """Each scenario is simulated once per session (runs are deterministic)."""
    return simulate(load_scenario(path))


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> str:
    """Both backends: the same models, the same results."""
    return request.getfixturevalue("sqlite_store" if request.param == "sqlite" else "pg_store")
