"""migrations/: up and down on a real Postgres and on SQLite, through muster and through alembic's CLI;
the migrated schema is exactly shared/history/models.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from shared.history import schema
from shared.history.engine import connect
from shared.history.models import Base, TABLE_NAMES

REPO = Path(__file__).resolve().parents[2]
EXPECTED_TABLES = {"event_log", "workloads", "workload_transitions", "placements", "queue_usage", "decisions",
                   "consumed_offsets", "queues", "log_header", "log_signed"}


def _tables(url: str) -> set[str]:
    engine = connect(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def _drift(url: str) -> list:
    engine = connect(url)
    try:
        with engine.connect() as conn:
            return compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        engine.dispose()


def _indexes(url: str) -> set[tuple[str, str]]:
    engine = connect(url)
    try:
        insp = inspect(engine)
        return {(t, ix["name"]) for t in TABLE_NAMES for ix in insp.get_indexes(t)}
    finally:
        engine.dispose()


def test_the_models_are_the_tables_the_brief_names():
    assert TABLE_NAMES == EXPECTED_TABLES


def _up_and_down(url: str) -> None:
    schema.downgrade(url)
    assert _tables(url) == set()
    assert schema.current(url) is None
    schema.upgrade(url)
    assert _tables(url) == EXPECTED_TABLES
    assert schema.current(url) == schema.head() == "0003"
    assert _drift(url) == [], "the migrations and shared/history/models.py disagree"
    expected_ix = {(t.name, ix.name) for t in Base.metadata.sorted_tables for ix in t.indexes}
    assert expected_ix <= _indexes(url)
    schema.downgrade(url)
    assert _tables(url) == set()


def test_postgres_up_and_down(postgres_url):
    try:
        _up_and_down(postgres_url)
    finally:
        schema.upgrade(postgres_url)


def test_sqlite_up_and_down(tmp_path):
    _up_and_down(f"sqlite:///{tmp_path / 'h.db'}")


def _alembic(*args: str, store: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MUSTER_STORE"} | {"MUSTER_STORE": store}
    return subprocess.run([sys.executable, "-m", "alembic", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def test_alembic_cli_reads_muster_store(postgres_url):
    try:
        schema.downgrade(postgres_url)
        up = _alembic("upgrade", "head", store=postgres_url)
        assert up.returncode == 0, up.stderr
        assert _tables(postgres_url) == EXPECTED_TABLES
        down = _alembic("downgrade", "base", store=postgres_url)
        assert down.returncode == 0, down.stderr
        assert _tables(postgres_url) == set()
    finally:
        schema.upgrade(postgres_url)


def test_alembic_cli_without_a_store_says_how_to_give_one():
    env = {k: v for k, v in os.environ.items() if k != "MUSTER_STORE"}
    out = subprocess.run([sys.executable, "-m", "alembic", "upgrade", "head"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "set MUSTER_STORE" in out.stderr + out.stdout


def test_ensure_creates_an_empty_store_and_refuses_an_old_one(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    schema.ensure(url)
    assert _tables(url) == EXPECTED_TABLES
    schema.ensure(url)  # at head: nothing to do
    engine = connect(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '0000'")
    engine.dispose()
    with pytest.raises(schema.StoreError, match="muster db upgrade"):
        schema.ensure(url)
