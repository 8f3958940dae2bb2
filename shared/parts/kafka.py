"""An Apache Kafka broker of its own: one KRaft node (broker and controller) on loopback.

The jars are those ``make tools`` copied from Maven Central (``catalog.built("kafka")``); the
storage is formatted with Kafka's own ``StorageTool`` and the server started as ``kafka.Kafka``, as
``bin/kafka-storage.sh`` and ``bin/kafka-server-start.sh`` do. Settings are the broker's defaults
but for what one node needs (replication factor 1 for its internal topics, no delay before the
first group rebalance) and a small heap.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from shared.parts import catalog
from shared.parts.process import Part, PartFailed, free_port, tail

if TYPE_CHECKING:
    from contextlib import ExitStack

HEAP = "-Xms256m -Xmx768m"

LOG4J = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka.server.KafkaServer
logger.kafka.level = INFO
"""


def java() -> str:
    found = shutil.which("java") or (os.environ.get("JAVA_HOME", "") + "/bin/java")
    if not found or not Path(found).exists():
        raise catalog.MissingPart("kafka", "no java on PATH (Kafka 4 needs Java 17 or newer)")
    return found


def cluster_id() -> str:
    """A KRaft cluster id of the form Kafka's ``random-uuid`` prints: URL-safe base64 of 16 random bytes,
    never starting with "-", which the storage tool's argument parser takes for an option (one id in 64
    did: ``--cluster-id: expected one argument``, and the broker never started)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


class KafkaBroker:
    """``start()`` it; ``bootstrap`` is its ``host:port``."""

    def __init__(self, root: Path, *, port: int | None = None, settings: dict[str, str] | None = None) -> None:
        self.root = root
        self.port = port or free_port()
        self.controller_port = free_port()
        self.settings = dict(settings or {})
        """Broker properties over the defaults (``listeners``, SASL: a test runs the compose SASL example's)."""
        self.libs = catalog.built("kafka").path / "libs"
        self.part: Part | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _java(self, main: str, *args: str, heap: str = HEAP) -> list[str]:
        return [java(), *heap.split(), "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}",
                "-cp", str(self.libs / "*"), main, *args]

    def _configure(self) -> Path:
        data = self.root / "data"
        props = self.root / "server.properties"
        lines = [
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"log.dirs={data}",
            "num.partitions=1",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=4",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "delete.topic.enable=true",
        ]
        chosen = dict(line.split("=", 1) for line in lines) | self.settings
        props.write_text("".join(f"{key}={value}\n" for key, value in chosen.items()))
        (self.root / "log4j2.properties").write_text(LOG4J.format(log=self.root / "kafka-internal.log"))
        return props

    def start(self, timeout: float = 90.0) -> "KafkaBroker":
        self.root.mkdir(parents=True, exist_ok=True)
        props = self._configure()
        if not (self.root / "data" / "meta.properties").exists():
            fmt = subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t", cluster_id(), "-c", str(props),
                                            heap="-Xmx256m"), capture_output=True, text=True, timeout=timeout)
            if fmt.returncode != 0:
                raise PartFailed(f"kafka storage format failed: {(fmt.stdout + fmt.stderr).strip()[-600:]}")
        self.part = Part("kafka", self._java("kafka.Kafka", str(props)), self.root / "kafka.log").start()
        self.part.wait_until(self._answers, timeout, f"serving metadata on {self.bootstrap}")
        return self

    def _answers(self) -> bool:
        from shared.parts.localbroker import kafka_answers

        return kafka_answers(self.bootstrap) is None

    def stop(self) -> None:
        if self.part is not None:
            self.part.stop(timeout=20)

    @property
    def running(self) -> bool:
        """As ``LocalBroker.running``: ``muster broker`` watches either alike."""
        return self.part is not None and self.part.alive()

    def log_tail(self, lines: int = 8) -> str:
        return tail(self.root / "kafka.log", lines)

    @property
    def pid(self) -> int:
        """The broker's JVM (a test pauses it with SIGSTOP)."""
        assert self.part is not None, "the broker was not started"
        return self.part.pid

    def __enter__(self) -> "KafkaBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def describe(self) -> str:
        return f"Apache Kafka {catalog.version('kafka')} (KRaft, one node) at {self.bootstrap}; log {self.root}"


def broker_for(stack: "ExitStack", given: str | None) -> tuple[str, str]:
    """The bootstrap a benchmark runs on, and what it is: ``given`` (``MUSTER_BENCH_KAFKA``), else an
    Apache Kafka broker of its own in a temporary folder, stopped and removed with ``stack``."""
    if given:
        return given, "MUSTER_BENCH_KAFKA"
    root = Path(tempfile.mkdtemp(prefix="muster-kafka-"))
    stack.callback(shutil.rmtree, root, True)
    broker = stack.enter_context(KafkaBroker(root))
    return broker.bootstrap, f"apache kafka {catalog.version('kafka')} (KRaft, one node)"
