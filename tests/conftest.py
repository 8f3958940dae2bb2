"""Fixtures shared by every test package: a real PostgreSQL for tests/integration.

Where the server comes from, first match wins:

1. ``MUSTER_TEST_POSTGRES``: a server URL (``postgresql://user@host:5432/postgres``); it must answer.
2. the local server at 127.0.0.1:5432 (user postgres, trust auth), if it answers;
3. testcontainers' Postgres module, when a Docker engine answers ``docker info``;
4. else the tests that need Postgres are skipped, saying why.

Each test session creates its own uniquely named database on that server and drops it at the end.
The fixtures are lazy: a run that needs no Postgres never looks for one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from typing import Iterator

import pytest

LOCAL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _normalise(url: str) -> str:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def _answers(url: str) -> str | None:
    """None when the server accepts a connection, else why not."""
    import psycopg
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    try:
        psycopg.connect(host=parsed.host or "127.0.0.1", port=parsed.port or 5432, user=parsed.username,
                        password=parsed.password, dbname=parsed.database or "postgres", connect_timeout=3).close()
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def _docker_works() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """URL of a PostgreSQL server's maintenance database (see the module docstring)."""
    given = os.environ.get("MUSTER_TEST_POSTGRES")
    if given:
        url = _normalise(given)
        problem = _answers(url)
        if problem:
            pytest.fail(f"MUSTER_TEST_POSTGRES={given} does not answer: {problem}")
        yield url
        return
    local_problem = _answers(LOCAL)
    if local_problem is None:
        yield LOCAL
        return
    if not _docker_works():
        pytest.skip(f"no PostgreSQL: MUSTER_TEST_POSTGRES is not set, 127.0.0.1:5432 does not answer "
                    f"({local_problem}) and there is no Docker engine for testcontainers")
    try:
        from testcontainers.postgres import PostgresContainer
    except ImportError as exc:
        pytest.skip(f"no PostgreSQL: 127.0.0.1:5432 does not answer and testcontainers is missing ({exc})")
    try:
        container = PostgresContainer("postgres:16-alpine", driver="psycopg").start()
    except Exception as exc:  # pulling or starting may fail for reasons of the host
        pytest.skip(f"no PostgreSQL: testcontainers could not start postgres:16 ({exc})")
    try:
        yield _normalise(container.get_connection_url())
    finally:
        container.stop()


@pytest.fixture(scope="session")
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A database of this test session's own on the server, dropped at the end."""
    import psycopg
    from sqlalchemy.engine import make_url

    server = make_url(postgres_server)
    name = f"muster_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"

    def admin() -> psycopg.Connection:
        return psycopg.connect(host=server.host or "127.0.0.1", port=server.port or 5432, user=server.username,
                               password=server.password, dbname=server.database or "postgres", autocommit=True)

    with admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
