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
