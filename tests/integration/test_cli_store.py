"""``muster simulate --store``, ``muster history``, ``muster queues`` and ``muster db`` through CliRunner."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from shared.audit.errors import CANNOT_REPRODUCE
from shared.history import schema
from shared.history.rows import Located
from shared.history.writer import ProjectionWriter
from tests.builders.cli import clean_exit as _clean_exit, flat as _flat, invoke as _invoke, one_line_error
from tests.builders.shared import VOLCANO
from tests.integration.conftest import scenario_run


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[str, dict[str, Any]]:
    """The Volcano example simulated once with --store and --json."""
    folder = tmp_path_factory.mktemp("store")
    url, out = f"sqlite:///{folder / 'h.db'}", folder / "result.json"
    result = _invoke("simulate", VOLCANO, "--store", url, "--json", out, "--check")
    _clean_exit(result, 0)
    doc = json.loads(out.read_text())
    assert f"history: {doc['stats']['events']} events written to {url}" in _flat(result.stdout)
    return url, doc


def test_simulate_with_a_store_keeps_its_output_and_says_where_the_history_went(recorded):
    url, doc = recorded
    again = _invoke("simulate", VOLCANO, "--store", url, "--check")
    _clean_exit(again, 0)
    out = _flat(again.stdout)
    assert "CHECK PASSED: every expectation holds" in out
    assert f"history: 0 events written to {url} ({doc['stats']['events']} were there already)" in out
    quiet = _invoke("simulate", VOLCANO, "--store", url, "--check", "-q")
    _clean_exit(quiet, 0)
    assert (quiet.stdout, quiet.stderr) == ("", "")


def test_history_json_is_the_result_document_of_the_workload(recorded):
    url, doc = recorded
    for key, expected in doc["workloads"].items():
        result = _invoke("history", key, "--store", url, "--json")
        _clean_exit(result, 0)
        assert json.loads(result.stdout) == {"workload": key, **expected}


def test_history_prints_phases_reasons_and_placements(recorded):
    url, _ = recorded
    result = _invoke("history", "default/test-cluster-1", "--store", url)
    _clean_exit(result, 0)
    out = _flat(result.stdout)
    assert out.startswith("default/test-cluster-1 RayCluster queue=kuberay-test-queue priority=0 gang=3 "
                          "(cpu 3, memory 4Gi) -> Running")
    assert "10s Queued waiting in queue kuberay-test-queue" in out
    assert ("10s Queued 3/3 tasks in gang unschedulable: pod group is not ready, 3 Pending, 3 minAvailable; "
            "queue kuberay-test-queue capability cpu 4: used 3, requested 3") in out
    assert "120s Admitted 3/3 pods placed on 1 node(s) (binpack)" in out
    assert "122s Running 3/3 gang pods bound and Running" in out
    assert re.search(r"test-cluster-1-head-\w{5} head kind-worker - 120s-", out), out
    deleted = _flat(_invoke("history", "default/test-cluster-0", "--store", url).stdout)
    assert re.search(r"test-cluster-0-head-\w{5} head kind-worker - 1s-120s", deleted), deleted


def test_history_reads_muster_store_from_the_environment(recorded):
    url, _ = recorded
    result = _invoke("history", "default/test-cluster-0", "--json", env={"MUSTER_STORE": url})
    _clean_exit(result, 0)
    assert json.loads(result.stdout)["phase"] == "Deleted"


def test_queues_show_usage_against_guarantee_and_limit(recorded):
    url, doc = recorded
    result = _invoke("queues", "--store", url)
    _clean_exit(result, 0)
    out = _flat(result.stdout)
    assert "queue parent resource used guarantee limit workloads" in out
    assert "kuberay-test-queue - cpu 3 - 4 1 active, 0 waiting" in out
    assert "memory 4Gi - 6Gi" in out
    as_json = json.loads(_invoke("queues", "--store", url, "--json").stdout)
    entry = as_json["queues"]["kuberay-test-queue"]
    assert entry["usage"] == doc["queues"]["kuberay-test-queue"]["usage"]
    assert (entry["limit"], entry["guarantee"], entry["active"]) == \
        ({"cpu": "4", "memory": "6Gi"}, {}, ["default/test-cluster-1"])


def test_queues_at_a_time_show_the_usage_then(recorded):
    url, _ = recorded
    at = lambda t: json.loads(_invoke("queues", "--store", url, "--json", "--at", t).stdout)["queues"]  # noqa: E731
    assert at(0.5)["kuberay-test-queue"]["usage"] == {}
    assert at(60)["kuberay-test-queue"]["usage"] == {"cpu": "3", "memory": "4Gi"}       # test-cluster-0 only
    assert "active" not in at(60)["kuberay-test-queue"]


def test_unknown_workload_exits_1_and_suggests(recorded):
    url, _ = recorded
    result = _invoke("history", "default/test-cluster", "--store", url)
    _clean_exit(result, 1)
    assert _flat(result.stderr) == (f"error: no workload default/test-cluster in the history at {url}; "
                                    "did you mean default/test-cluster-0, default/test-cluster-1?")


@pytest.mark.parametrize("args, message", [
    (["history", "no-slash", "--store", "sqlite:///x.db"], "name the workload as NAMESPACE/NAME"),
    (["history", "a/b", "--store", "not a url"], "is not a database URL"),
    (["history", "a/b", "--store", "mysql://u@h/db"], "muster stores history in PostgreSQL or SQLite"),
    (["history", "a/b", "--store", "postgresql+psycopg://postgres@127.0.0.1:1/x"], "cannot use the store"),
    (["history", "a/b", "--store", "sqlite:////no/such/dir/h.db"], "there is no database file"),
    (["queues", "--store", "sqlite:////no/such/dir/h.db"], "there is no database file"),
    (["history", "a/b"], "no store given: pass --store URL or set MUSTER_STORE"),
    (["db", "upgrade", "--store", "bogus"], "is not a database URL"),
    (["simulate", VOLCANO, "--store", "bogus"], "is not a database URL"),
])
def test_bad_stores_exit_2_with_one_clear_line(args, message):
    result = _invoke(*args, env={"MUSTER_STORE": ""})
    _clean_exit(result, 2)
    assert message in _flat(result.stderr), result.stderr
    assert result.stdout == ""


def test_a_store_without_tables_says_to_upgrade(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    import sqlite3

    sqlite3.connect(tmp_path / "h.db").close()
    result = _invoke("queues", "--store", url)
    _clean_exit(result, 2)
    assert "holds no muster history tables" in _flat(result.stderr) and "muster db upgrade" in _flat(result.stderr)


def test_simulate_refuses_a_store_holding_another_run(recorded, tmp_path):
    url, _ = recorded
    from tests.builders.shared import minimal_scenario, write_scenario

    result = _invoke("simulate", write_scenario(tmp_path, minimal_scenario()), "--store", url, "-q")
    _clean_exit(result, 2)
    assert "already holds another history" in _flat(result.stderr)


def test_db_upgrade_and_downgrade(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    up = _invoke("db", "upgrade", "--store", url)
    _clean_exit(up, 0)
    assert _flat(up.stdout) == f"{url}: schema at revision {schema.head()}"
    down = _invoke("db", "downgrade", "--yes", env={"MUSTER_STORE": url})
    _clean_exit(down, 0)
    assert _flat(down.stdout) == f"{url}: schema at revision base (no tables)"


@pytest.mark.parametrize("answer, code, tables", [("", 1, True), ("n\n", 1, True), ("y\n", 0, False)])
def test_db_downgrade_asks_first(tmp_path, answer, code, tables):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    _clean_exit(_invoke("db", "upgrade", "--store", url), 0)
    result = _invoke("db", "downgrade", "--store", url, input=answer)
    _clean_exit(result, code)
    assert "drop every muster table" in _flat(result.stderr)
    assert (schema.current(url) == schema.head()) == tables
    if code:
        assert "nothing changed (pass --yes" in _flat(result.stderr)


def test_db_upgrade_on_postgres(postgres_url):
    result = _invoke("db", "upgrade", env={"MUSTER_STORE": postgres_url})
    _clean_exit(result, 0)
    assert schema.current(postgres_url) == schema.head()
    assert "***" in result.stdout or "@" in result.stdout   # passwords are never printed


def test_a_store_the_projector_wrote_from_kafka_says_in_one_line_why_it_cannot_be_verified(tmp_path):
    """The projector writes the log topic's order, not each service's inbox order: ``replay --verify`` of such
    a store, and of a file exported from it, says so before comparing anything (it used to report a decision
    "dropped"); the store and the file are still read, explained and reported on."""
    url = f"sqlite:///{tmp_path / 'projected.db'}"
    run = scenario_run(VOLCANO)
    schema.ensure(url)
    with ProjectionWriter(url) as writer:
        writer.write([Located(env, "muster.events", 0, i) for i, env in enumerate(run.runtime.log)])
    why = "needs each service's inbox order, which a history the projector wrote from Kafka does not keep"
    one_line_error(_invoke("replay", url, "--verify", "-q"), CANNOT_REPRODUCE, f"--verify {why}")
    exported = tmp_path / "projected.jsonl"
    _clean_exit(_invoke("log", "export", "--store", url, "--out", exported), 0)
    assert '"inbox_order":false' in exported.read_text().splitlines()[0]
    one_line_error(_invoke("replay", exported, "--verify", "-q"), CANNOT_REPRODUCE, f"--verify {why}")
    policy = tmp_path / "bigger.yaml"
    policy.write_text("{}\n")
    one_line_error(_invoke("replay", exported, "--what-if", policy, "-q"), CANNOT_REPRODUCE, "--what-if")
    _clean_exit(_invoke("explain", "default/test-cluster-1", "--store", url), 0)
    _clean_exit(_invoke("report", "--store", url, "--html", tmp_path / "report.html"), 0)


def test_sslmode_comes_from_the_url_or_muster_store_sslmode_and_reaches_the_server(postgres_url):
    """docs/operations.md, Exposure: a production store asks for TLS (``sslmode``). The test server speaks
    none, so asking for it is refused by the server, in one line; ``disable`` connects; a mode libpq does not
    know is refused before any connection."""
    result = _invoke("db", "upgrade", "--store", postgres_url, env={"MUSTER_STORE_SSLMODE": "require"})
    _clean_exit(result, 2)
    assert "SSL" in _flat(result.stderr) and len(result.stderr.strip().splitlines()) == 1, result.stderr
    joined = "&" if "?" in postgres_url else "?"
    _clean_exit(_invoke("db", "upgrade", "--store", f"{postgres_url}{joined}sslmode=disable",
                        env={"MUSTER_STORE_SSLMODE": "require"}), 0)  # the URL's own wins
    result = _invoke("db", "upgrade", "--store", postgres_url, env={"MUSTER_STORE_SSLMODE": "verify"})
    _clean_exit(result, 2)
    assert "MUSTER_STORE_SSLMODE 'verify' is not one of disable, allow, prefer, require, verify-ca, verify-full" \
        in _flat(result.stderr)
