"""Stores for the integration tests: a clean Postgres store per test (the session's own database,
migrated once, truncated before each test) and a SQLite file per test."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import text

from shared.scenario import load_scenario
from shared.simulate import Run, simulate
from shared.store import schema
from shared.store.engine import connect
from shared.store.models import TABLE_NAMES

SCENARIOS = sorted((Path(__file__).parents[1] / "scenarios").glob("*.yaml"))


@lru_cache(maxsize=None)
def scenario_run(path: Path) -> Run:
    """Each scenario is simulated once per session (runs are deterministic)."""
    return simulate(load_scenario(path))


def empty(url: str) -> None:
    """Remove every row from a migrated store."""
    engine = connect(url)
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text(f"TRUNCATE {', '.join(sorted(TABLE_NAMES))} RESTART IDENTITY"))
        else:
            for table in sorted(TABLE_NAMES):
                conn.execute(text(f"DELETE FROM {table}"))
    engine.dispose()


@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[str]:
    """The session's Postgres database at the current schema, with no rows."""
    if schema.current(postgres_url) != schema.head():
        schema.upgrade(postgres_url)
    empty(postgres_url)
    yield postgres_url


@pytest.fixture
def sqlite_store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'history.db'}"
    schema.upgrade(url)
    return url


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> str:
    """Both backends: the same models, the same results."""
    return request.getfixturevalue("sqlite_store" if request.param == "sqlite" else "pg_store")
