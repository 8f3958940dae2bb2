"""shared/runtime/bus/config.py: flags, then environment, then defaults; each client's own arguments."""

from __future__ import annotations

import re

import faust
import pytest

from shared.runtime.bus.config import BusConfig, BusConfigError

SASL = {"MUSTER_KAFKA_SECURITY": "SASL_PLAINTEXT", "MUSTER_KAFKA_SASL_USERNAME": "u",
        "MUSTER_KAFKA_SASL_PASSWORD": "p"}


def _from(env: dict[str, str], bootstrap: str | None = None, **kwargs) -> BusConfig:
    return BusConfig.from_env(bootstrap, env=env, **kwargs)


def test_defaults_from_a_bare_environment():
    config = _from({"MUSTER_KAFKA": "k:9092"})
    assert (config.servers, config.prefix, config.security, config.fetch_wait_ms) == (
        ["k:9092"], "muster.", "PLAINTEXT", 5)


def test_flags_win_over_the_environment():
    config = _from({"MUSTER_KAFKA": "env:1", "MUSTER_TOPIC_PREFIX": "env."}, "flag:2", prefix="flag.")
    assert (config.bootstrap, config.prefix) == ("flag:2", "flag.")


def test_the_environment_fills_what_flags_leave_out():
    config = _from({"MUSTER_KAFKA": "env:1", "MUSTER_TOPIC_PREFIX": "env.", "MUSTER_KAFKA_FETCH_WAIT_MS": "50"})
    assert (config.bootstrap, config.prefix, config.fetch_wait_ms) == ("env:1", "env.", 50)


def test_a_bootstrap_is_required():
    with pytest.raises(BusConfigError, match="MUSTER_KAFKA"):
        _from({})


@pytest.mark.parametrize("bootstrap", ["kafka", "k:port", "k:1,other", ","])
def test_a_bootstrap_must_be_host_port(bootstrap):
    with pytest.raises(BusConfigError, match="host:port"):
        _from({}, bootstrap)


def test_an_unknown_security_protocol_is_refused():
    with pytest.raises(BusConfigError, match="MUSTER_KAFKA_SECURITY"):
        _from({"MUSTER_KAFKA": "k:1", "MUSTER_KAFKA_SECURITY": "TLS"})


def test_sasl_needs_credentials():
    with pytest.raises(BusConfigError, match="SASL_USERNAME"):
        _from({"MUSTER_KAFKA": "k:1", "MUSTER_KAFKA_SECURITY": "SASL_PLAINTEXT"})


@pytest.mark.parametrize("wait", ["soon", "-1", "1.5", ""])
def test_the_fetch_wait_must_be_a_whole_number(wait):
    with pytest.raises(BusConfigError, match="MUSTER_KAFKA_FETCH_WAIT_MS"):
        _from({"MUSTER_KAFKA": "k:1", "MUSTER_KAFKA_FETCH_WAIT_MS": wait})


def test_a_superscript_fetch_wait_is_refused_by_name():
    with pytest.raises(BusConfigError, match="MUSTER_KAFKA_FETCH_WAIT_MS"):
        _from({"MUSTER_KAFKA": "k:1", "MUSTER_KAFKA_FETCH_WAIT_MS": "²"})


def test_a_superscript_port_is_refused():
    with pytest.raises(BusConfigError):
        _from({}, "k:²")


def test_servers_drop_the_scheme_and_split_on_commas():
    assert BusConfig(" kafka://a:1, b:2 ,").servers == ["a:1", "b:2"]


def test_every_server_in_a_list_drops_the_scheme():
    assert BusConfig("kafka://a:1,kafka://b:2").servers == ["a:1", "b:2"]


def test_env_round_trips_through_from_env():
    config = BusConfig("a:1,b:2", prefix="p.", security="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                       sasl_username="u", sasl_password="secret", ssl_cafile="/ca.pem", ssl_certfile="/c.pem",
                       ssl_keyfile="/k.pem", fetch_wait_ms=0)
    assert BusConfig.from_env(env=config.env()) == config


def test_env_leaves_out_unset_credentials():
    assert not any("SASL_USERNAME" in name or "SSL_" in name for name in BusConfig("a:1").env())


@pytest.mark.parametrize("security, has_sasl", [("PLAINTEXT", False), ("SSL", False),
                                                ("SASL_PLAINTEXT", True), ("SASL_SSL", True)])
def test_aiokafka_gets_sasl_fields_only_for_sasl(security, has_sasl):
    config = BusConfig("a:1", security=security, sasl_username="u", sasl_password="p")
    args = config.aiokafka()
    assert args["bootstrap_servers"] == ["a:1"] and args["security_protocol"] == security
    assert ("sasl_plain_username" in args) is has_sasl
    assert ("ssl_context" in args) is security.endswith("SSL")


def test_faust_gets_brokers_and_no_credentials_for_plaintext():
    assert BusConfig("a:1,b:2").faust() == {"broker": ["kafka://a:1", "kafka://b:2"]}


def test_faust_gets_sasl_credentials():
    credentials = _from({"MUSTER_KAFKA": "a:1", **SASL}).faust()["broker_credentials"]
    assert isinstance(credentials, faust.SASLCredentials)
    assert (credentials.username, credentials.password) == ("u", "p")


def test_replication_and_min_insync_from_flags_else_environment_else_one():
    assert (_from({"MUSTER_KAFKA": "k:1"}).replication, _from({"MUSTER_KAFKA": "k:1"}).min_insync) == (1, 1)
    env = {"MUSTER_KAFKA": "k:1", "MUSTER_TOPIC_REPLICATION": "3", "MUSTER_TOPIC_MIN_INSYNC": "2"}
    assert (_from(env).replication, _from(env).min_insync) == (3, 2)
    flagged = _from(env, replication=5, min_insync=3)
    assert (flagged.replication, flagged.min_insync) == (5, 3)
    assert BusConfig.from_env(env=_from(env).env()) == _from(env)  # a service started as a process gets them


@pytest.mark.parametrize("env, message", [
    ({"MUSTER_TOPIC_REPLICATION": "three"}, "MUSTER_TOPIC_REPLICATION 'three': a whole number"),
    ({"MUSTER_TOPIC_REPLICATION": "0"}, "replication factor 0"),
    ({"MUSTER_TOPIC_REPLICATION": "3", "MUSTER_TOPIC_MIN_INSYNC": "4"}, "min.insync.replicas 4: from 1 to the "
                                                                         "replication factor (3)"),
    ({"MUSTER_TOPIC_MIN_INSYNC": "0"}, "min.insync.replicas 0"),
])
def test_a_replication_that_cannot_work_is_refused(env, message):
    with pytest.raises(BusConfigError, match=re.escape(message)):
        _from({"MUSTER_KAFKA": "k:1", **env})


def test_the_session_timeout_comes_from_the_environment_and_travels_to_processes():
    config = BusConfig.from_env("a:1", env={"MUSTER_KAFKA_SESSION_TIMEOUT_MS": "2500"})
    assert (config.session_timeout_ms, config.heartbeat_ms) == (2500, 833)
    assert config.env()["MUSTER_KAFKA_SESSION_TIMEOUT_MS"] == "2500"
    assert BusConfig.from_env("a:1", env={}).session_timeout_ms == 6000
    assert BusConfig("a:1", session_timeout_ms=9000).heartbeat_ms == 1000
    with pytest.raises(BusConfigError, match="MUSTER_KAFKA_SESSION_TIMEOUT_MS 'soon'"):
        BusConfig.from_env("a:1", env={"MUSTER_KAFKA_SESSION_TIMEOUT_MS": "soon"})
    with pytest.raises(BusConfigError, match="session timeout 500 ms"):
        BusConfig("a:1", session_timeout_ms=500)


def test_producers_are_idempotent_unless_the_environment_says_the_broker_has_no_producer_ids():
    assert BusConfig.from_env("k:1", env={}).producing()["enable_idempotence"] is True
    off = BusConfig.from_env("k:1", env={"MUSTER_KAFKA_IDEMPOTENT": "0"})
    assert off.producing() == {**off.aiokafka(), "acks": "all", "enable_idempotence": False}
    assert BusConfig.from_env(env=off.env()).idempotent is False  # processes started from it inherit it


@pytest.mark.parametrize("value", ["yes", "2", ""])
def test_an_idempotence_that_is_neither_one_nor_zero_is_refused_by_name(value):
    with pytest.raises(BusConfigError, match=f"MUSTER_KAFKA_IDEMPOTENT {value!r}"):
        BusConfig.from_env("k:1", env={"MUSTER_KAFKA_IDEMPOTENT": value})
