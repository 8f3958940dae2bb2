"""The command line of the distributed stack: ``simulate --bus`` and ``run``, and what they say
when the broker or the arguments are wrong."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from typer.testing import CliRunner

from shared.cli.main import app
from shared.parts.localbroker import free_port
from tests.conftest import delete_topics
from tests.integration.conftest import scenario_run
from tests.integration.test_localbroker import topics
from tests.integration.test_bus_parity import without_stats

SCENARIO = Path(__file__).parents[1] / "scenarios" / "volcano-gang-queue.yaml"
RUN_TOPICS = "muster.sim.volcano-gang-queue."
runner = CliRunner()


def test_simulate_on_the_bus_checks_and_writes_the_embedded_result(kafka_bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    folders = set(Path(tempfile.gettempdir()).glob("muster-services-*"))
    result = runner.invoke(app, ["simulate", str(SCENARIO), "--bus", f"kafka://{kafka_bootstrap}", "--check",
                                 "--json", str(out)])
    assert set(Path(tempfile.gettempdir()).glob("muster-services-*")) == folders  # services as tasks: no output folder
    assert result.exit_code == 0, result.output
    assert "CHECK PASSED" in result.output
    assert without_stats(json.loads(out.read_text())) == without_stats(scenario_run(SCENARIO).result())
    assert not {t for t in topics(kafka_bootstrap) if t.startswith(RUN_TOPICS)}  # the run cleans up after itself


def test_simulate_on_the_bus_keeps_its_topics_when_asked(kafka_bootstrap: str) -> None:
    result = runner.invoke(app, ["simulate", str(SCENARIO), "--bus", f"kafka://{kafka_bootstrap}", "--keep-topics"])
    assert result.exit_code == 0, result.output
    kept = {t for t in topics(kafka_bootstrap) if t.startswith(RUN_TOPICS)}
    prefixes = {t[:t.rindex(".") + 1] for t in kept if ".snapshots." not in t}  # snapshots.<service> is one deeper
    assert len(prefixes) == 1 and {t[len(next(iter(prefixes))):] for t in kept} >= {"events", "queue", "placement"}
    assert all(t.startswith(next(iter(prefixes))) for t in kept)
    assert f"topics kept: {next(iter(prefixes))}*" in result.stderr  # the user is told where they are
    delete_topics(kafka_bootstrap, next(iter(prefixes)))


def test_simulate_with_a_broker_that_does_not_answer_is_exit_2() -> None:
    result = runner.invoke(app, ["simulate", str(SCENARIO), "--bus", f"kafka://127.0.0.1:{free_port()}"])
    assert result.exit_code == 2
    assert "does not answer" in result.output


def test_simulate_refuses_an_unknown_services_mode() -> None:
    result = runner.invoke(app, ["simulate", str(SCENARIO), "--bus", "kafka://127.0.0.1:9", "--services", "threads"])
    assert result.exit_code == 2 and "'tasks' or 'processes'" in result.output


def test_run_refuses_an_unknown_service_and_a_missing_broker(monkeypatch) -> None:
    monkeypatch.delenv("MUSTER_KAFKA", raising=False)
    unknown = runner.invoke(app, ["run", "scheduler", "--kafka", "127.0.0.1:9092"])
    assert unknown.exit_code == 2 and "unknown service 'scheduler'" in unknown.output
    nowhere = runner.invoke(app, ["run", "queue"])
    assert nowhere.exit_code == 2 and "MUSTER_KAFKA" in nowhere.output
    bad = runner.invoke(app, ["run", "queue", "--kafka", "localhost"])
    assert bad.exit_code == 2 and "host:port" in bad.output


def test_run_cluster_says_when_the_api_server_cannot_be_used(tmp_path: Path) -> None:
    silent = runner.invoke(app, ["run", "cluster", "--kafka", "127.0.0.1:9092",
                                 "--kube-url", f"http://127.0.0.1:{free_port()}"])
    assert silent.exit_code == 2 and "Kubernetes API" in silent.output and "does not answer" in silent.output
    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    unloadable = runner.invoke(app, ["run", "cluster", "--kafka", "127.0.0.1:9092", "--kubeconfig", str(broken)])
    assert unloadable.exit_code == 2 and "cannot load the client configuration" in unloadable.output
