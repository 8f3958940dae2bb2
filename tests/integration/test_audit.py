"""The audit commands against real stores (SQLite and PostgreSQL) and a real Kafka log.

A store ``muster simulate --store`` wrote, and one ``muster log import`` loaded, verify, explain and
report as the file does; a log read off Kafka after ``simulate --bus`` — whose topic interleaves the
services' outputs — exports to a file that verifies clean, and replays from Kafka directly.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from shared.audit.explain import explain, fold_until, queue_lines
from shared.audit.kafka import KafkaLog
from shared.audit.logfile import LogFile, envelopes
from shared.audit.replay import verify
from shared.audit.timeorder import backwards
from shared.kernel.events import to_json
from shared.kernel.topology import SERVICES
from tests.builders.audit import exported, scenario_run
from tests.builders.cli import clean_exit, flat, invoke as _invoke, one_line_error

SCENARIOS = Path(__file__).parents[1] / "scenarios"
NAME = "kai-priority-preemption"
WHO, QUEUE, AT = "default/train-cluster", "team-a", 40.0
"""At 40s the train cluster waits in team-a, preempted by the build cluster at 30s."""


def _ok(result: Any) -> str:
    clean_exit(result, 0)
    return flat(result.stdout)


def _json(result: Any) -> Any:
    clean_exit(result, 0)
    return json.loads(result.stdout)


def _expected() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What explain says of ``WHO`` and ``QUEUE`` at ``AT``, folded in-process from the embedded run's log."""
    run = scenario_run(NAME)
    moment = fold_until(run.runtime.log, AT, run.policy)
    return json.loads(json.dumps(explain(moment, WHO))), json.loads(json.dumps(queue_lines(moment, QUEUE)))


def _explains_and_reports(where: list[Any], tmp_path: Path, policy: Path | None = None) -> None:
    """``explain NS/NAME``, ``explain --queue`` (JSON and text) and ``report --html`` read the log ``where``
    names (``--store URL`` / ``--log FILE|kafka://...`` and its topic prefix) as the embedded run's own log;
    explain gets ``--policy`` when the log records none (a Kafka log)."""
    workload, pending = _expected()
    ask = [*where, "--at", AT] + (["--policy", policy] if policy is not None else [])
    assert pending and pending[0]["workload"] == WHO  # the queue is not empty: the comparison means something
    assert _json(_invoke("explain", WHO, *ask, "--json")) == workload
    text = _ok(_invoke("explain", WHO, *ask))
    assert flat("\n".join(workload["lines"])) in text
    queue = _json(_invoke("explain", "--queue", QUEUE, *ask, "--json"))
    assert queue == {"queue": QUEUE, "at": AT, "pending": pending, "window": None}
    listed = _ok(_invoke("explain", "--queue", QUEUE, *ask))
    assert listed.startswith(f"queue {QUEUE} at 40s: 1 waiting 1. {WHO} priority 50, waiting 10s: preempted by "
                             "default/build-cluster"), listed
    page = tmp_path / "report.html"
    _ok(_invoke("report", *where, "--html", page))
    text = page.read_text()
    assert 'id="chart-workloads"' in text and 'id="chart-usage-nvidia-com-gpu"' in text
    assert re.search(r'<table id="preemptions">.*default/build-cluster.*priority preemption.*</table>', text, re.S)


def test_a_simulated_store_verifies_explains_and_reports(store: str, tmp_path: Path) -> None:
    """``store`` is a migrated SQLite file or the session's PostgreSQL database (both, parametrised)."""
    _ok(_invoke("simulate", SCENARIOS / f"{NAME}.yaml", "--store", store, "-q"))
    run = scenario_run(NAME)
    out = _ok(_invoke("replay", store, "--verify", "-q"))
    assert f"OK: {len(run.runtime.log)} events" in out and "0 different" in out
    _explains_and_reports(["--store", store], tmp_path)
    change = tmp_path / "policy.yaml"
    change.write_text("min_runtime_seconds: 600\n")
    whatif = _ok(_invoke("replay", store, "--what-if", change, "--json", tmp_path / "w.json"))
    assert "reproduces the log's decisions exactly" in whatif
    assert json.loads((tmp_path / "w.json").read_text())["queues"]["new"]["team-a"]["preemptions"] == 0
    file = tmp_path / "log.jsonl.gz"
    _ok(_invoke("log", "export", "--store", store, "--out", file))
    assert [r.raw for r in LogFile(file).records()] == [to_json(e) for e in run.runtime.log]
    assert LogFile(file).header.policy == run.policy.model_dump(mode="json")


def test_an_exported_file_imports_into_postgres_and_verifies_there(pg_store: str, tmp_path: Path) -> None:
    run = scenario_run("fair-share-two-teams")
    file = exported(run, tmp_path / "log.jsonl")
    out = _ok(_invoke("log", "import", file, "--store", pg_store))
    assert f"{len(run.runtime.log)} events written" in out
    assert "0 different" in _ok(_invoke("replay", pg_store, "--verify", "-q"))
    other = exported(scenario_run(NAME), tmp_path / "other.jsonl")
    refused = _invoke("log", "import", other, "--store", pg_store)
    assert refused.exit_code == 5 and "already holds another history" in refused.stderr


@pytest.fixture(scope="module")
def kafka_run(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One scenario through the services on Kafka (``simulate --bus --store --keep-topics``): the run's
    topic prefix and the store its projector wrote, topics kept for the module."""
    from tests.conftest import delete_topics
    from tests.integration.test_localbroker import topics

    store = f"sqlite:///{tmp_path_factory.mktemp('bus') / 'h.db'}"
    before = topics(kafka_bootstrap)
    _ok(_invoke("simulate", SCENARIOS / f"{NAME}.yaml", "--bus", f"kafka://{kafka_bootstrap}", "--store", store,
                "--keep-topics", "-q"))
    [log_topic] = [t for t in topics(kafka_bootstrap) - before if t.endswith(".events")]
    prefix = log_topic[:-len("events")]
    yield scenario_run(NAME), prefix, store
    delete_topics(kafka_bootstrap, prefix)


def test_the_store_a_kafka_run_wrote_records_its_policy_and_explains(kafka_run: Any) -> None:
    run, _, store = kafka_run
    from shared.history.header import read_header

    header = read_header(store)
    assert header is not None and header["policy"] == run.policy.model_dump(mode="json")
    explained = json.loads(_ok(_invoke("explain", "default/train-cluster", "--store", store, "--at", 40, "--json")))
    assert explained["preempted"][0]["by"] == "default/build-cluster"


def test_a_kafka_log_is_laid_out_so_every_inbox_keeps_its_order_and_verifies(kafka_run: Any,
                                                                              kafka_bootstrap: str) -> None:
    run, prefix, _ = kafka_run
    source = KafkaLog(f"kafka://{kafka_bootstrap}", policy=run.policy, prefix=prefix)
    records = list(source.records())
    assert sorted(r.raw for r in records) == sorted(to_json(e) for e in run.runtime.log)  # each once, as carried
    assert all(r.where.startswith("offset ") for r in records)
    tally = verify(source, run.policy)
    decisions = sum(1 for e in run.runtime.log if e.source in SERVICES)
    assert (tally.identical, tally.different) == (decisions, 0)
    assert backwards(envelopes(source)) == []


def test_export_from_kafka_then_verify_the_file(kafka_run: Any, kafka_bootstrap: str, tmp_path: Path) -> None:
    run, prefix, _ = kafka_run
    policy = tmp_path / "policy.yaml"
    policy.write_text(json.dumps(run.policy.model_dump(mode="json")))
    file = tmp_path / "kafka.jsonl"
    _ok(_invoke("log", "export", "--from", f"kafka://{kafka_bootstrap}", "--topic-prefix", prefix,
                "--policy", policy, "--out", file))
    assert LogFile(file).header.origin == "kafka"
    assert "0 different" in _ok(_invoke("replay", file, "--verify", "-q"))
    direct = _ok(_invoke("replay", f"kafka://{kafka_bootstrap}", "--topic-prefix", prefix, "--policy", policy,
                         "--verify", "-q"))
    assert "0 different" in direct
    _explains_and_reports(["--log", file], tmp_path)
    change = tmp_path / "change.yaml"
    change.write_text("min_runtime_seconds: 600\n")
    whatif = _ok(_invoke("replay", file, "--what-if", change))
    assert "reproduces the log's decisions exactly" in whatif and "2 of 2 workloads changed" in whatif
    without = _invoke("replay", file.with_name("none.jsonl"), "--verify")
    assert without.exit_code == 2
    no_policy = tmp_path / "nopolicy.jsonl"  # the policy comes from the log's PolicyApplied
    _ok(_invoke("log", "export", "--from", f"kafka://{kafka_bootstrap}", "--topic-prefix", prefix, "--out", no_policy))
    assert LogFile(no_policy).header.policy == run.policy.model_dump(mode="json")
    verified = _invoke("replay", no_policy, "--verify", "-q")
    assert verified.exit_code == 0 and "0 different" in verified.stdout and not verified.stderr.strip()


def test_a_file_exported_from_kafka_imports_into_a_store_that_verifies_and_explains_as_the_file(
        kafka_run: Any, kafka_bootstrap: str, store: str, tmp_path: Path) -> None:
    """``log export --from kafka://...`` then ``log import`` into SQLite and PostgreSQL (``store``, both): the
    store keeps the file's laid-out order (it verifies, where the projector's topic-order store need not),
    its policy (recorded from the export's ``--policy``), and explains as the file does."""
    run, prefix, _ = kafka_run
    file = tmp_path / "kafka.jsonl.gz"
    _ok(_invoke("log", "export", "--from", f"kafka://{kafka_bootstrap}", "--topic-prefix", prefix,
                "--policy", _policy_file(run, tmp_path), "--out", file))
    assert f"{len(run.runtime.log)} events written" in _ok(_invoke("log", "import", file, "--store", store))
    out = _ok(_invoke("replay", store, "--verify", "-q"))
    decisions = sum(1 for e in run.runtime.log if e.source in SERVICES)
    assert f"{decisions} identical, 0 different" in out, out
    for ask in (["default/train-cluster"], ["default/build-cluster"], ["--queue", QUEUE]):
        for at in ([], ["--at", AT]):
            from_file = _invoke("explain", *ask, "--log", file, *at, "--json")
            assert _json(_invoke("explain", *ask, "--store", store, *at, "--json")) == _json(from_file), (ask, at)
    _explains_and_reports(["--store", store], tmp_path)


def test_explain_and_report_read_a_kafka_log_directly(kafka_run: Any, kafka_bootstrap: str, tmp_path: Path) -> None:
    """``--log kafka://...``: the topics laid out again (``audit/kafka.py``) give what the embedded log gives;
    ``--policy`` puts the queue core's positions in, as the file's recorded policy does."""
    run, prefix, _ = kafka_run
    _explains_and_reports(["--log", f"kafka://{kafka_bootstrap}", "--topic-prefix", prefix], tmp_path,
                          _policy_file(run, tmp_path))


def _policy_file(run: Any, tmp_path: Path) -> Path:
    """The run's policy as a file, for the commands that read a Kafka log (which records none)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(json.dumps(run.policy.model_dump(mode="json")))
    return policy


def test_a_kafka_address_with_no_such_topics_is_one_line(kafka_bootstrap: str, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("{}\n")
    result = _invoke("replay", f"kafka://{kafka_bootstrap}", "--topic-prefix", "nothing-here.", "--policy", policy,
                     "--verify")
    assert result.exit_code == 2 and "there is no topic nothing-here.events" in " ".join(result.stderr.split())


def _written(kafka_bootstrap: str, prefix: str, records: list[tuple[str, Any]]) -> Any:
    """The stack's topics under ``prefix``, and ``records`` ((topic, envelope)) written as the services write
    them (``send_records``: one record batch per topic and call); the ``BusConfig``."""
    from aiokafka import AIOKafkaProducer

    from shared.runtime.bus.app import ensure_topics, send_records
    from shared.runtime.bus.config import BusConfig
    from shared.runtime.bus.worker import envelope_record

    config = BusConfig(kafka_bootstrap, prefix=prefix)

    async def go() -> None:
        await ensure_topics(config)
        producer = AIOKafkaProducer(**config.aiokafka(), enable_idempotence=False)
        await producer.start()
        try:
            await send_records(producer, [envelope_record(config.topics, topic, env) for topic, env in records])
        finally:
            await producer.stop()

    asyncio.run(go())
    return config


def test_a_kafka_log_whose_last_record_batch_holds_many_records_is_read_whole(kafka_bootstrap: str,
                                                                              topic_prefix: str,
                                                                              tmp_path: Path) -> None:
    """Tansu answers ListOffsets "latest" with the last batch's base offset plus one: a reader that stops
    there loses the rest of that batch. The whole log goes in as one batch; all of it comes out and verifies."""
    run = scenario_run(NAME)
    config = _written(kafka_bootstrap, topic_prefix, [(f"{topic_prefix}events", env) for env in run.runtime.log])
    assert config.topics.log == f"{topic_prefix}events"
    records = list(KafkaLog(f"kafka://{kafka_bootstrap}", policy=run.policy, prefix=topic_prefix).records())
    assert [r.raw for r in records] == [to_json(e) for e in run.runtime.log]
    where = [f"kafka://{kafka_bootstrap}", "--topic-prefix", topic_prefix, "--policy", _policy_file(run, tmp_path)]
    decisions = sum(1 for e in run.runtime.log if e.source in SERVICES)
    assert f"{decisions} identical, 0 different" in _ok(_invoke("replay", *where, "--verify", "-q"))


def test_a_kafka_log_whose_inboxes_read_two_envelopes_in_opposite_orders_is_exit_6(kafka_bootstrap: str,
                                                                                  topic_prefix: str,
                                                                                  tmp_path: Path) -> None:
    """In arrival order (the deployment) two producers' envelopes, each bound for the same two services,
    can reach them in opposite orders: admission's ``QueueDefined`` and the queue's ``Dequeued`` both go to
    placement and the reconciler. No one file order keeps both inboxes (``Unordered``): one line, exit 6."""
    run = scenario_run(NAME)
    defined = next(e for e in run.runtime.log if e.type == "QueueDefined")
    dequeued = next(e for e in run.runtime.log if e.type == "Dequeued")
    assert defined.source != dequeued.source  # two producers: neither's own order ties the two together
    placement, reconciler = f"{topic_prefix}placement", f"{topic_prefix}reconciler"
    _written(kafka_bootstrap, topic_prefix, [
        (f"{topic_prefix}events", defined), (f"{topic_prefix}events", dequeued),
        (placement, defined), (placement, dequeued), (reconciler, dequeued), (reconciler, defined)])
    where = [f"kafka://{kafka_bootstrap}", "--topic-prefix", topic_prefix, "--policy", _policy_file(run, tmp_path)]
    out = tmp_path / "out.jsonl"
    for command in (["log", "export", "--from", *where, "--out", out], ["replay", *where, "--verify", "-q"],
                    ["explain", "default/train-cluster", "--log", *where]):
        one_line_error(_invoke(*command), 6, "the log cannot be laid out in one order that keeps every inbox's own: "
                       f"QueueDefined {defined.subject} ({defined.id}), Dequeued {dequeued.subject} ({dequeued.id}) "
                       "and what waits on them reached two services in opposite orders")
    assert not out.exists()
