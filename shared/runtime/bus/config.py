"""Where the broker is and how to reach it: flags, else environment, else defaults.

| environment                     | meaning                                                        |
|---------------------------------|----------------------------------------------------------------|
| ``MUSTER_KAFKA``                | bootstrap servers, ``host:port[,host:port]`` or ``kafka://...`` |
| ``MUSTER_TOPIC_PREFIX``         | prefix of every topic name (default ``muster.``)               |
| ``MUSTER_KAFKA_SECURITY``       | ``PLAINTEXT`` (default), ``SSL``, ``SASL_PLAINTEXT``, ``SASL_SSL`` |
| ``MUSTER_KAFKA_SASL_MECHANISM`` | ``PLAIN`` (default), ``SCRAM-SHA-256``, ``SCRAM-SHA-512``       |
| ``MUSTER_KAFKA_SASL_USERNAME`` / ``MUSTER_KAFKA_SASL_PASSWORD`` | SASL credentials               |
| ``MUSTER_KAFKA_SSL_CAFILE`` / ``_CERTFILE`` / ``_KEYFILE``       | TLS trust and client certificate |
| ``MUSTER_KAFKA_FETCH_WAIT_MS``  | longest a fetch waits for data (default 5)                     |
| ``MUSTER_KAFKA_SESSION_TIMEOUT_MS`` | the session of the Faust worker's own group (default 6000) |
| ``MUSTER_TOPIC_REPLICATION``    | replication factor of the topics muster creates (default 1)    |
| ``MUSTER_TOPIC_MIN_INSYNC``     | their ``min.insync.replicas`` (default 1; at most the factor)  |
| ``MUSTER_KAFKA_IDEMPOTENT``     | ``1`` (default): idempotent producers; ``0`` for a broker without them (Tansu) |
| ``MUSTER_SNAPSHOT_KEY_FILE``    | the key that signs the services' snapshots (``snapshotkey``); unset: no snapshots |

The fetch wait is low on purpose: a broker that does not answer a fetch as soon as data arrives
(Tansu, the test broker) would otherwise add the whole wait to every hop between two services.
Apache Kafka answers early, so a low value costs it only idle polls.

The session timeout is that of the Faust worker's own Kafka group (Faust hosts each process); a
worker heartbeats a third of it apart. The inboxes are not read through a group: each reader
assigns itself its one partition and uses the group for committed offsets only
(``shared.runtime.bus.app.PartitionReader``). A worker killed without leaving its group holds its
successor's start back until its session runs out; the test suite, which kills services on purpose,
sets 2000.

Idempotence: every producer asks the broker for a producer id and numbers its batches, so a batch
sent again after a lost acknowledgement is written once (Kafka's default since 3.0). Tansu, the
in-memory test broker, answers InitProducerId with an error: ``MUSTER_KAFKA_IDEMPOTENT=0`` there.

Replication: 1 suits one broker (compose, Tansu); on a cluster of three or more, 3 and
``min.insync.replicas`` 2 keep every acknowledged record through the loss of a broker (muster's
producers wait for all in-sync replicas: ``acks=all``).
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Mapping

from shared.runtime.bus.snapshotkey import KEY_VARIABLE, SnapshotKeyError, read_key
from shared.runtime.bus.topics import DEFAULT_PREFIX, Topics

Security = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
_SECURITY = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


SESSION_TIMEOUT_MS = 6_000


def _session_timeout(env: Mapping[str, str]) -> int:
    text = env.get("MUSTER_KAFKA_SESSION_TIMEOUT_MS", str(SESSION_TIMEOUT_MS))
    if not _is_port(text):
        raise BusConfigError(f"MUSTER_KAFKA_SESSION_TIMEOUT_MS {text!r}: a whole number of milliseconds")
    return int(text)


def _is_port(text: str) -> bool:
    """A whole number written in ASCII digits (``str.isdigit`` also takes '²')."""
    return text.isascii() and text.isdigit()


class BusConfigError(ValueError):
    """A setting that cannot work; the message names it."""


@dataclass(frozen=True)
class BusConfig:
    """How to reach the broker; ``aiokafka()`` and ``faust()`` give each client's own arguments."""

    bootstrap: str
    prefix: str = DEFAULT_PREFIX
    security: Security = "PLAINTEXT"
    sasl_mechanism: str = "PLAIN"
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    fetch_wait_ms: int = 5
    session_timeout_ms: int = field(default_factory=lambda: _session_timeout(os.environ))
    """``MUSTER_KAFKA_SESSION_TIMEOUT_MS`` (the module docstring); the heartbeat is a third of it."""
    replication: int = 1
    """Replication factor of the topics muster creates (``shared.runtime.bus.topics.Topics.specs``)."""
    min_insync: int = 1
    """Their ``min.insync.replicas``: acknowledged records survive the loss of ``min_insync - 1`` brokers."""
    idempotent: bool = True
    """Producers ask for a producer id (``MUSTER_KAFKA_IDEMPOTENT``): off only for a broker without one."""
    snapshot_key_file: str | None = None
    """The file holding the key snapshots are signed with (``MUSTER_SNAPSHOT_KEY_FILE``,
    ``shared.runtime.bus.snapshotkey``); None: in process, a key of the process's own."""

    def __post_init__(self) -> None:
        servers = self.servers
        if not servers or any(not _is_port(s.rpartition(":")[2]) or not s.rpartition(":")[0] for s in servers):
            raise BusConfigError(f"Kafka bootstrap {self.bootstrap!r}: give host:port[,host:port] (or kafka://host:port)")
        if self.security not in _SECURITY:
            raise BusConfigError(f"MUSTER_KAFKA_SECURITY {self.security!r}: one of {', '.join(_SECURITY)}")
        if self.sasl_mechanism not in _MECHANISMS:
            raise BusConfigError(f"MUSTER_KAFKA_SASL_MECHANISM {self.sasl_mechanism!r}: one of {', '.join(_MECHANISMS)}")
        if self.security.startswith("SASL") and (not self.sasl_username or self.sasl_password is None):
            raise BusConfigError(f"security {self.security} needs MUSTER_KAFKA_SASL_USERNAME and _PASSWORD")
        if self.fetch_wait_ms < 0:
            raise BusConfigError(f"fetch wait {self.fetch_wait_ms} ms: must not be negative")
        if not 1_000 <= self.session_timeout_ms <= 300_000:
            raise BusConfigError(f"session timeout {self.session_timeout_ms} ms: from 1000 to 300000")
        if not 1 <= self.replication <= 32767:
            raise BusConfigError(f"topic replication factor {self.replication}: a whole number from 1 to 32767")
        if not 1 <= self.min_insync <= self.replication:
            raise BusConfigError(f"min.insync.replicas {self.min_insync}: from 1 to the replication factor "
                                 f"({self.replication})")

    @classmethod
    def from_env(cls, bootstrap: str | None = None, *, prefix: str | None = None,
                 replication: int | None = None, min_insync: int | None = None,
                 env: Mapping[str, str] | None = None) -> "BusConfig":
        """Flags win over ``MUSTER_*`` variables; ``bootstrap`` is required from one or the other."""
        env = os.environ if env is None else env
        bootstrap = bootstrap or env.get("MUSTER_KAFKA")
        if not bootstrap:
            raise BusConfigError("no Kafka given: pass --kafka HOST:PORT or set MUSTER_KAFKA")
        wait = env.get("MUSTER_KAFKA_FETCH_WAIT_MS", "5")
        if not _is_port(wait):
            raise BusConfigError(f"MUSTER_KAFKA_FETCH_WAIT_MS {wait!r}: a whole number of milliseconds")
        counts = {}
        for name, given in (("MUSTER_TOPIC_REPLICATION", replication), ("MUSTER_TOPIC_MIN_INSYNC", min_insync)):
            text = env.get(name, "1") if given is None else str(given)
            if not _is_port(text.strip()):
                raise BusConfigError(f"{name} {text!r}: a whole number of brokers")
            counts[name] = int(text)
        idempotent = env.get("MUSTER_KAFKA_IDEMPOTENT", "1").strip()
        if idempotent not in ("0", "1"):
            raise BusConfigError(f"MUSTER_KAFKA_IDEMPOTENT {idempotent!r}: 1 (idempotent producers) or 0")
        key_file = env.get(KEY_VARIABLE) or None
        if key_file is not None:
            try:
                read_key(key_file)  # a key that cannot be used is one line at start, not a surprise later
            except SnapshotKeyError as exc:
                raise BusConfigError(str(exc)) from None
        return cls(
            bootstrap=bootstrap,
            prefix=prefix if prefix is not None else env.get("MUSTER_TOPIC_PREFIX", DEFAULT_PREFIX),
            security=env.get("MUSTER_KAFKA_SECURITY", "PLAINTEXT").upper(),  # type: ignore[arg-type]
            sasl_mechanism=env.get("MUSTER_KAFKA_SASL_MECHANISM", "PLAIN").upper(),
            sasl_username=env.get("MUSTER_KAFKA_SASL_USERNAME"),
            sasl_password=env.get("MUSTER_KAFKA_SASL_PASSWORD"),
            ssl_cafile=env.get("MUSTER_KAFKA_SSL_CAFILE"),
            ssl_certfile=env.get("MUSTER_KAFKA_SSL_CERTFILE"),
            ssl_keyfile=env.get("MUSTER_KAFKA_SSL_KEYFILE"),
            fetch_wait_ms=int(wait),
            session_timeout_ms=_session_timeout(env),
            replication=counts["MUSTER_TOPIC_REPLICATION"],
            min_insync=counts["MUSTER_TOPIC_MIN_INSYNC"],
            idempotent=idempotent == "1",
            snapshot_key_file=key_file,
        )

    def with_prefix(self, prefix: str) -> "BusConfig":
        return replace(self, prefix=prefix)

    @property
    def servers(self) -> list[str]:
        out = []
        for server in self.bootstrap.split(","):
            server = server.strip()
            for scheme in ("kafka://", "tcp://"):
                server = server.removeprefix(scheme)
            if server:
                out.append(server)
        return out

    @property
    def heartbeat_ms(self) -> int:
        """A third of the session timeout, at most a second (aiokafka's and Kafka's rule of thumb)."""
        return min(1_000, self.session_timeout_ms // 3)

    @property
    def topics(self) -> Topics:
        return Topics(self.prefix)

    def env(self) -> dict[str, str]:
        """The ``MUSTER_*`` variables that reproduce this config (for services started as processes)."""
        out = {"MUSTER_KAFKA": ",".join(self.servers), "MUSTER_TOPIC_PREFIX": self.prefix,
               "MUSTER_KAFKA_SECURITY": self.security, "MUSTER_KAFKA_SASL_MECHANISM": self.sasl_mechanism,
               "MUSTER_KAFKA_FETCH_WAIT_MS": str(self.fetch_wait_ms),
               "MUSTER_KAFKA_SESSION_TIMEOUT_MS": str(self.session_timeout_ms),
               "MUSTER_TOPIC_REPLICATION": str(self.replication), "MUSTER_TOPIC_MIN_INSYNC": str(self.min_insync),
               "MUSTER_KAFKA_IDEMPOTENT": "1" if self.idempotent else "0"}
        for name, value in (("SASL_USERNAME", self.sasl_username), ("SASL_PASSWORD", self.sasl_password),
                            ("SSL_CAFILE", self.ssl_cafile), ("SSL_CERTFILE", self.ssl_certfile),
                            ("SSL_KEYFILE", self.ssl_keyfile)):
            if value is not None:
                out[f"MUSTER_KAFKA_{name}"] = value
        if self.snapshot_key_file is not None:
            out[KEY_VARIABLE] = self.snapshot_key_file
        return out

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.security.endswith("SSL"):
            return None
        context = ssl.create_default_context(cafile=self.ssl_cafile)
        if self.ssl_certfile:
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        return context

    def aiokafka(self) -> dict[str, Any]:
        """Connection arguments for aiokafka's producer, consumer and admin client."""
        out: dict[str, Any] = {"bootstrap_servers": self.servers, "security_protocol": self.security}
        context = self.ssl_context()
        if context is not None:
            out["ssl_context"] = context
        if self.security.startswith("SASL"):
            out.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.sasl_username,
                       sasl_plain_password=self.sasl_password)
        return out

    def producing(self) -> dict[str, Any]:
        """aiokafka's producer arguments: every in-sync replica acknowledges, idempotent where it can."""
        return {**self.aiokafka(), "acks": "all", "enable_idempotence": self.idempotent}

    def faust(self) -> dict[str, Any]:
        """Connection settings for a Faust app (``broker`` and ``broker_credentials``)."""
        import faust

        out: dict[str, Any] = {"broker": [f"kafka://{s}" for s in self.servers]}
        context = self.ssl_context()
        if self.security.startswith("SASL"):
            out["broker_credentials"] = faust.SASLCredentials(
                username=self.sasl_username, password=self.sasl_password, ssl_context=context,
                mechanism=self.sasl_mechanism)
        elif context is not None:
            out["broker_credentials"] = faust.SSLCredentials(context)
        return out
