"""The command line's tracing and metrics options: ``simulate --trace`` to a real OTLP/HTTP receiver,
and what ``simulate`` and ``run`` say when tracing or the metrics port cannot work."""

from __future__ import annotations

import socket
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shared.cli.main import app
from tests.otlp import OtlpReceiver

SCENARIO = Path(__file__).parents[1] / "scenarios" / "volcano-gang-queue.yaml"
runner = CliRunner()


@pytest.fixture
def no_otel(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED",
                 "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_simulate_trace_sends_a_trace_per_workload(no_otel: pytest.MonkeyPatch) -> None:
    with OtlpReceiver() as receiver:
        no_otel.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        result = runner.invoke(app, ["simulate", str(SCENARIO), "--trace"])
        assert result.exit_code == 0, result.output
        assert "spans of 2 workload(s) sent over OTLP" in result.output
        spans = receiver.spans
    roots = [s for s in spans if s.parent_id is None]
    assert sorted(r.name for r in roots) == ["RayCluster default/test-cluster-0", "RayCluster default/test-cluster-1"]
    assert Counter(s.trace_id for s in spans).keys() == {r.trace_id for r in roots}
    queued = {s.attributes["muster.workload"]: s.duration for s in spans if s.name == "queued"}
    assert queued == {"default/test-cluster-0": 0.0, "default/test-cluster-1": 110.0}
    # shown from now on: scenario time 0 is the moment of the run
    assert min(r.start for r in roots) > 1e9


def test_simulate_trace_a_collector_refuses_is_exit_2_not_sent(no_otel: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A collector that answers 404 (a wrong path) took nothing: one line saying so, exit 2; the result
    document is written all the same."""
    from tests.builders.cli import one_line_error

    with OtlpReceiver() as receiver:
        no_otel.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint + "/not-traces")
        result = runner.invoke(app, ["simulate", str(SCENARIO), "--trace", "-q", "--json", str(tmp_path / "r.json")])
        assert receiver.spans == []
    one_line_error(result, 2, f"spans were not taken by the OTLP endpoint {receiver.endpoint}/not-traces")
    assert "404" in result.stderr and "sent over OTLP" not in result.output
    assert (tmp_path / "r.json").exists()


def test_replay_trace_to_nothing_listening_is_exit_2(no_otel: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from shared.parts.localbroker import free_port
    from shared.runtime.simulate import simulate
    from shared.sim.scenario import load_scenario
    from tests.builders.audit import exported
    from tests.builders.cli import one_line_error

    log = exported(simulate(load_scenario(SCENARIO)), tmp_path / "audit.jsonl")
    endpoint = f"http://127.0.0.1:{free_port()}"
    no_otel.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    no_otel.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # seconds: the SDK's retries give up within it
    result = runner.invoke(app, ["replay", str(log), "--trace"])
    one_line_error(result, 2, f"spans were not taken by the OTLP endpoint {endpoint}")


def test_simulate_trace_without_an_endpoint_is_exit_2(no_otel: pytest.MonkeyPatch) -> None:
    result = runner.invoke(app, ["simulate", str(SCENARIO), "--trace"])
    assert result.exit_code == 2 and "OTEL_EXPORTER_OTLP_ENDPOINT" in result.output


def test_simulate_trace_over_grpc_is_exit_2(no_otel: pytest.MonkeyPatch) -> None:
    no_otel.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    no_otel.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    result = runner.invoke(app, ["simulate", str(SCENARIO), "--trace"])
    assert result.exit_code == 2 and "http/protobuf" in result.output


def test_run_refuses_a_metrics_port_it_cannot_have(no_otel: pytest.MonkeyPatch) -> None:
    absurd = runner.invoke(app, ["run", "queue", "--kafka", "127.0.0.1:9", "--metrics-port", "70000"])
    assert absurd.exit_code == 2 and "--metrics-port 70000" in absurd.output
    taken = socket.socket()
    taken.bind(("0.0.0.0", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        busy = runner.invoke(app, ["run", "queue", "--kafka", "127.0.0.1:9", "--metrics-port", str(port)])
    finally:
        taken.close()
    assert busy.exit_code == 2 and f"metrics port {port}: already in use" in busy.output


def test_run_refuses_tracing_it_cannot_send(no_otel: pytest.MonkeyPatch) -> None:
    no_otel.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    no_otel.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    result = runner.invoke(app, ["run", "queue", "--kafka", "127.0.0.1:9", "--metrics-port", "0"])
    assert result.exit_code == 2 and "OTLP over HTTP only" in result.output


def test_replay_trace_sends_a_recorded_history_to_tempo_as_it_happened(no_otel: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    from shared.runtime.simulate import simulate
    from shared.sim.scenario import load_scenario
    from tests.builders.audit import exported

    run = simulate(load_scenario(Path(__file__).parents[1] / "scenarios" / "kai-priority-preemption.yaml"))
    log = exported(run, tmp_path / "audit.jsonl.gz")
    with OtlpReceiver() as receiver:
        no_otel.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        result = runner.invoke(app, ["replay", str(log), "--trace", "--verify", "-q"])
        assert result.exit_code == 0, result.output
        assert "spans of the log sent over OTLP" in result.output
        spans = receiver.spans
    roots = Counter(s.attributes["muster.workload"] for s in spans if s.parent_id is None)
    assert roots == {"default/train-cluster": 2, "default/build-cluster": 1}  # preempted: a second incarnation
    # the same ids as the run traced live would have had: derived from the events
    from shared.observability.tracing.spans import SpanBuilder

    live = {(s.trace_id, s.span_id) for s in SpanBuilder().build(simulate(run.scenario, traced=True).runtime.log)}
    assert {(s.trace_id, s.span_id) for s in spans} == live


def test_replay_trace_without_an_endpoint_is_exit_2(no_otel: pytest.MonkeyPatch, tmp_path: Path) -> None:
    result = runner.invoke(app, ["replay", str(tmp_path / "missing.jsonl"), "--trace"])
    assert result.exit_code == 2 and "OTEL_EXPORTER_OTLP_ENDPOINT" in result.output
