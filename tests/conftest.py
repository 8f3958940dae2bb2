"""Fixtures shared by every test package: a real PostgreSQL server and a real Apache Kafka broker.

Both are the real parts ``make tools`` builds (``shared.parts``), started by the test session in
temporary directories and stopped at its end; no test assumes a system service.

- PostgreSQL: ``MUSTER_TEST_POSTGRES`` (a server URL, ``postgresql://user@host:5432/postgres``) if set
  (it must answer), else a server of the session's own (``shared.parts.postgres``, Debian's
  binaries). Each session creates its own uniquely named database on it and drops it at the end.
- Kafka: ``MUSTER_TEST_KAFKA`` (``host:port``) if set (it must answer), else an Apache Kafka broker
  of the session's own (``shared.parts.kafka``, KRaft, one node).

A part that is not built fails the tests that need it, naming it and ``make tools``; only where the
machine cannot reach the part's registry at all (``make tools`` recorded it as unreachable) are they
skipped, saying so. Tansu (``tansu_bootstrap``) is for the few tests that say why they want it.
Brokers are shared by the session, so each test names its topics under its own ``topic_prefix``
and those topics are deleted after the test. The fixtures are lazy: a run that needs neither
PostgreSQL nor Kafka starts neither.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    from shared.parts.devcluster import DevCluster

import pytest

os.environ.setdefault("MUSTER_KAFKA_SESSION_TIMEOUT_MS", "2000")
"""Services of the suite (in-process and ``muster run`` processes alike, who inherit it) run their Faust
worker's group with a 2 s session: a worker SIGKILLed by the fault test leaves its member behind, and
its successor's start waits that member's session out (6 s at the deployment's default). The inbox
readers themselves assign their partition and join nothing (shared/runtime/bus/config.py)."""


def _missing(exc: Exception) -> None:
    """A real part that is not here: skipped where its registry is out of reach, else a failure."""
    from shared.parts.catalog import MissingPart

    if isinstance(exc, MissingPart) and exc.unreachable:
        pytest.skip(f"{exc} (this machine cannot reach its registry)")
    pytest.fail(str(exc), pytrace=False)


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


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """URL of a PostgreSQL server's maintenance database (see the module docstring)."""
    from shared.parts.catalog import MissingPart
    from shared.parts.postgres import PostgresServer
    from shared.parts.process import PartFailed

    given = os.environ.get("MUSTER_TEST_POSTGRES")
    if given:
        url = _normalise(given)
        problem = _answers(url)
        if problem:
            pytest.fail(f"MUSTER_TEST_POSTGRES={given} does not answer: {problem}")
        yield url
        return
    try:
        server = PostgresServer().start()
    except (MissingPart, PartFailed) as exc:
        _missing(exc)
    try:
        yield server.url
    finally:
        server.remove()


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
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``host:port`` of an Apache Kafka broker (see the module docstring)."""
    from shared.parts.catalog import MissingPart
    from shared.parts.kafka import KafkaBroker
    from shared.parts.localbroker import kafka_answers
    from shared.parts.process import PartFailed

    given = os.environ.get("MUSTER_TEST_KAFKA")
    if given:
        problem = kafka_answers(given)
        if problem:
            pytest.fail(f"MUSTER_TEST_KAFKA={given} does not answer: {problem}")
        yield given
        return
    try:
        broker = KafkaBroker(tmp_path_factory.mktemp("kafka")).start()
    except (MissingPart, PartFailed) as exc:
        _missing(exc)
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def eventually(check: Callable[[], Any], what: str, timeout: float = 45.0, every: float = 0.1) -> Any:
    """``check()`` once it is truthy; fails naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"still waiting for {what} after {timeout:.0f}s"
        time.sleep(every)


def delete_topics(bootstrap: str, prefix: str) -> list[str]:
    """Delete every topic on ``bootstrap`` whose name starts with ``prefix`` (``shared.runtime.bus.app``)."""
    from shared.runtime.bus.app import delete_topics as delete
    from shared.runtime.bus.config import BusConfig

    return delete(BusConfig(bootstrap, prefix=prefix))


@pytest.fixture
def topic_prefix(kafka_bootstrap: str) -> Iterator[str]:
    """A prefix of this test's own (``t1a2b3c4d.``) for topic names; its topics are deleted afterwards."""
    prefix = f"t{uuid.uuid4().hex[:8]}."
    yield prefix
    delete_topics(kafka_bootstrap, prefix)


@pytest.fixture(scope="session")
def devcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator["DevCluster"]:
    """A real cluster of the session's own (``shared.parts.devcluster``: etcd, kube-apiserver with RBAC,
    controller manager, scheduler, KWOK, KubeRay with no batch scheduler), with no nodes; stopped at the
    end. Tests that change it leave it as ``reset`` does (``clean_cluster``)."""
    from shared.parts.catalog import MissingPart
    from shared.parts.devcluster import DevCluster
    from shared.parts.process import PartFailed

    cluster = DevCluster(tmp_path_factory.mktemp("devcluster"))
    try:
        cluster.up()
    except (MissingPart, PartFailed) as exc:
        cluster.stop()
        _missing(exc)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def clean_cluster(devcluster: "DevCluster") -> Iterator["DevCluster"]:
    """The session's real cluster, emptied before the test (``DevCluster.reset``), its KubeRay back
    to no batch scheduler and its kube-scheduler running."""
    devcluster.reset()
    if devcluster.batch_scheduler != "none":
        devcluster.start_kuberay("none")
    devcluster.kube_scheduler(True)  # a scenario run (tests/realcluster/test_scenario_parity.py) may have stopped it
    yield devcluster


# --------------------------------------------------------------------------- stores
def empty(url: str) -> None:
    """Remove every row from a migrated store."""
    from sqlalchemy import text

    from shared.history.engine import connect
    from shared.history.models import TABLE_NAMES

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
    from shared.history import schema

    if schema.current(postgres_url) != schema.head():
        schema.upgrade(postgres_url)
    empty(postgres_url)
    yield postgres_url


@pytest.fixture
def sqlite_store(tmp_path: Path) -> str:
    """A SQLite file of this test's own at the current schema."""
    from shared.history import schema

    url = f"sqlite:///{tmp_path / 'history.db'}"
    schema.upgrade(url)
    return url


def log_complete(bootstrap: str, prefix: str) -> bool:
    """Whether a live stack's Kafka log holds everything its inputs call for right now (no decision in
    flight): what a test waits for before it stops the stack whose log it then verifies. A stack
    stopped a moment after a timer fired leaves the timer's answer unwritten, which verify rightly
    reports as unfinished."""
    from shared.audit.errors import AuditError
    from shared.audit.kafka import KafkaLog
    from shared.audit.replay import Divergence, verify
    from shared.kernel.policy import Policy

    try:
        return verify(KafkaLog(f"kafka://{bootstrap}", policy=Policy(), prefix=prefix), Policy()).different == 0
    except (Divergence, AuditError):
        return False


@pytest.fixture
def tokyo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The machine's zone is Asia/Tokyo (UTC+09:00, no daylight saving) for the test, and back after it."""
    import time

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def signed_to_its_end(bootstrap: str, prefix: str) -> bool:
    """Whether the projector of a live stack has signed a checkpoint of the Kafka log's last envelope and
    sent it to the checkpoints topic: what a test waits for before it exports the log to verify it with
    the projector's public key (a tail after the last checkpoint is chained, not signed)."""
    from shared.audit.kafka import KafkaLog

    log = KafkaLog(f"kafka://{bootstrap}", prefix=prefix)
    offsets = [r.get("offset") for r in log.signed if r.get("kind") == "checkpoint"]
    size = log.size()
    return bool(offsets) and size is not None and max(offsets) == size[0] - 1  # type: ignore[type-var]
