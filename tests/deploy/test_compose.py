"""docker-compose.yml, read as compose reads it: the stack keeps its state on volumes and publishes
nothing beyond this machine, nor anything without auth but on loopback."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    return {k: str(v) for k, v in env.items()} if isinstance(env, dict) else dict(e.split("=", 1) for e in env)


def test_every_published_port_binds_loopback_only() -> None:
    published = 0
    for name, service in SERVICES.items():
        for port in service.get("ports", []):
            published += 1
            assert isinstance(port, str) and port.startswith("127.0.0.1:"), f"{name} publishes {port} on every address"
    assert published >= 6


def test_kafka_and_postgres_keep_their_data_on_named_volumes() -> None:
    declared = set(COMPOSE.get("volumes") or {})
    kafka, postgres = SERVICES["kafka"], SERVICES["postgres"]
    mounts = {name: dict(v.split(":")[:2] for v in SERVICES[name].get("volumes", [])) for name in ("kafka", "postgres")}
    kafka_dir = _env(kafka)["KAFKA_LOG_DIRS"]
    assert mounts["kafka"] and set(mounts["kafka"]) <= declared
    assert kafka_dir in mounts["kafka"].values(), "Kafka's log dirs must be the volume, not the container's disk"
    assert "/var/lib/postgresql/data" in mounts["postgres"].values() and set(mounts["postgres"]) <= declared
    assert _env(postgres).get("PGDATA", "/var/lib/postgresql/data").startswith("/var/lib/postgresql/data")


def test_grafana_asks_for_a_password_set_by_whoever_starts_the_stack() -> None:
    env = _env(SERVICES["grafana"])
    assert env.get("GF_AUTH_ANONYMOUS_ENABLED", "false") == "false"
    assert env.get("GF_AUTH_DISABLE_LOGIN_FORM", "false") != "true"
    # required: compose refuses to start without it (no default password to leave in place)
    assert re.fullmatch(r"\$\{GRAFANA_ADMIN_PASSWORD:\?[^}]+\}", env["GF_SECURITY_ADMIN_PASSWORD"])


def test_the_services_create_topics_with_an_explicit_replication() -> None:
    env = _env({"environment": COMPOSE["x-muster"]["environment"]})
    assert (env["MUSTER_TOPIC_REPLICATION"], env["MUSTER_TOPIC_MIN_INSYNC"]) == ("1", "1")


SASL = yaml.safe_load((ROOT / "docker-compose.sasl.yml").read_text())["services"]


def test_the_sasl_override_makes_every_kafka_listener_and_client_authenticate() -> None:
    """docker-compose.sasl.yml (docs/operations.md, Exposure): on top of the stack, no listener but the
    controller's (inside the broker) takes a client without SASL, and every muster process that talks to
    Kafka logs in, with a password whoever starts the stack must set."""
    kafka = {**_env(SERVICES["kafka"]), **{k: str(v) for k, v in SASL["kafka"]["environment"].items()}}
    protocols = dict(p.split(":") for p in kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    listeners = [entry.split("://")[0] for entry in kafka["KAFKA_LISTENERS"].split(",")]
    assert {name: protocols[name] for name in listeners} == {
        "INTERNAL": "SASL_PLAINTEXT", "CONTROLLER": "PLAINTEXT", "HOST": "SASL_PLAINTEXT"}
    assert kafka["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka:9093" and "9093" not in str(SERVICES["kafka"]["ports"])
    clients = [name for name, service in SERVICES.items() if "MUSTER_KAFKA" in _env(service)]
    assert sorted(clients) == sorted(n for n in SASL if n != "kafka")
    for name in clients:
        env = SASL[name]["environment"]
        assert env["MUSTER_KAFKA_SECURITY"] == "SASL_PLAINTEXT" and env["MUSTER_KAFKA_SASL_USERNAME"] == "muster"
        assert env["MUSTER_KAFKA_SASL_PASSWORD"].startswith("${MUSTER_KAFKA_PASSWORD:?")
