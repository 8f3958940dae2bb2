"""``muster run``: what the environment can get wrong ends in one line and exit code 2."""

from __future__ import annotations

from typer.testing import CliRunner

from shared.cli.main import app
from shared.parts.localbroker import free_port
from tests.builders.cli import invoke, one_line_error


def test_an_unreachable_kafka_is_one_line_and_exit_2():
    port = free_port()  # nothing listens there
    result = CliRunner().invoke(app, ["run", "admission", "--kafka", f"127.0.0.1:{port}", "--metrics-port", "0"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert " ".join(" ".join(lines).split()).startswith(f"error: Kafka at 127.0.0.1:{port} cannot be used:")


def test_empty_scheduler_names_exit_2():
    result = CliRunner().invoke(app, ["run", "placement", "--kafka", "127.0.0.1:1", "--scheduler-names", ",",
                                      "--metrics-port", "0"])
    assert result.exit_code == 2, result.output
    assert "--scheduler-names" in result.stderr


def test_broker_on_a_port_out_of_range_exit_2():
    """A port no socket can have is a usage error, not bind()'s OverflowError traceback."""
    for port in ("99999", "-1", "0"):
        one_line_error(invoke("broker", "--port", port), 2, f"--port {port}: a port from 1 to 65535")
