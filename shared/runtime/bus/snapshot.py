"""Restart from a snapshot: a service's state with the inbox offset it reflects.

Without a snapshot a service rebuilds by folding its inbox from offset 0 (``worker.replay``), which
costs its whole history on every start. With one, it loads the latest snapshot and folds only the
records after it: restart time follows what arrived since the last snapshot, not the history.

What a snapshot holds: the worker's whole state as it stood after handling every inbox record
below ``offset`` — the service (core, dedupe window, counters), the ordering (held envelopes under
``simulate --bus``), the clock's pending timers (and those fired but not yet read back from the
inbox), and ``digest``, a running hash over every output the service has produced since its lineage
began (``chain``). It is encoded by ``shared.runtime.statecodec`` (JSON of tagged nodes, which decoding
cannot turn into code: a snapshot topic someone else could write is no way into the process),
checksummed (SHA-256) and written as records of its own topic ``<prefix>snapshots.<service>``
(made with every other topic, ``shared.runtime.bus.app.ensure_topics``): chunks of ``CHUNK`` bytes, then a
manifest naming them. A writer also records a *checkpoint* (offset, digest) every commit interval.

How: between two batches, under the inbox reader's lock, the process forks (``ForkedCapture``); the
child, a copy-on-write image of the state at that offset, encodes it, hashes it for the manifest and
hands the bytes and their SHA-256 back through a pipe while the parent's inbox goes on, so the inbox
waits for the fork, not for the encoding, which costs a large state far more (docs/benchmarks.md).
``MUSTER_SNAPSHOT_FORK=0`` (or a platform without ``os.fork``) encodes in process while the inbox
waits, as before.

When: every ``INTERVAL`` seconds or ``EVERY_RECORDS`` records handled, whichever comes first, but
never more than ``MAX_SHARE`` of the service's time; so what a restart folds again is bounded in
records and in time, whatever the history.

Manifests and checkpoints are signed (HMAC-SHA256, ``shared.runtime.bus.snapshotkey``) with a key the
services hold and a writer of the topic does not: the key file ``MUSTER_SNAPSHOT_KEY_FILE`` (a mounted
Secret), or, for services sharing one process (``simulate --bus``, tests), a key of that process;
``muster run`` without a key file writes and loads no snapshot.

Loading is checked at four levels; any failure — a refused check, or anything the loader raises
(a state nested deeper than the JSON parser goes used to escape as ``RecursionError`` and the
service crash-looped) — means a full replay, logged on one line and counted
(``muster_snapshot_fallbacks``):
  0. authenticity: the latest manifest or checkpoint must carry this key's MAC, checked before its
     bytes are parsed (unsigned: written by muster before 2026-12-07 or by someone without the key;
     a wrong MAC: forged, or another key's); the manifest must announce at most ``MAX_BYTES``;
  1. format: the manifest's ``FORMAT``, muster's version, the code's digest (``shared.runtime.build``: a
     rebuilt image of the same version may hold its state otherwise) and the policy's fingerprint must
     be this process's (an upgrade or a changed policy rebuilds from the inbox, as before snapshots), and the
     state must decode (``statecodec``: its own format, only muster's pure state classes);
  2. integrity: the chunks' SHA-256 must match the manifest (a truncated or corrupted snapshot);
  3. behaviour: the tail replay from the snapshot must reproduce the outputs recorded for it — the
     digest reached at the latest checkpoint's offset must equal the checkpoint's. Outputs are not
     re-read from the log (the log is shared and long); their hash chain is.
A full replay starts a new lineage and writes a snapshot at once, so the next start is short again.

An inbox whose first records were deleted (retention, Kafka's DeleteRecords after ``muster log
archive``) cannot be replayed from its start: a service starts there from its latest snapshot if
that snapshot lies at or after the inbox's first offset and passes every check; otherwise it stops
with one line saying why (``SnapshotRequired``; ``muster run`` says it before starting,
``shared.runtime.bus.app.ready_to_read``), never rebuilding a state that misses what those records did.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, NoReturn

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from shared.kernel.events import Envelope
from shared.kernel.policy import Policy
from shared.runtime import statecodec
from shared.runtime.build import code_digest, muster_version
from shared.runtime.bus import stagetrace
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.sequencing import Ordering, Rounds
from shared.runtime.bus.snapshotkey import MAC_HEADER, authentic, mac, read_key, run_key
from shared.runtime.bus.topics import Topics
from shared.runtime.service import Service

if TYPE_CHECKING:
    from shared.runtime.bus.worker import InboxWorker

log = logging.getLogger("muster.bus")

FORMAT = 3
"""The snapshot layout (3: ``shared.runtime.statecodec``'s JSON, manifests and checkpoints signed
(``snapshotkey``); 2 was the same unsigned, 1 a pickle); a snapshot of another format is not loaded
(full replay)."""

MAX_BYTES = 1 << 30
"""The largest state a manifest may announce (1 GiB, the snapshot topic's ``retention.bytes``): a
larger one is refused before its chunks are read."""

CHUNK = 512 * 1024
"""Bytes per snapshot record: well under Kafka's default ``message.max.bytes`` (1 MB)."""

INTERVAL = 2.0
"""Seconds between two snapshots of a service that handled something meanwhile: a restart folds at
most this much of the service's work again (a replay sends nothing, so it folds faster than live)."""

EVERY_RECORDS = 5_000
"""Or sooner, once this many inbox records were handled since the last one: a burst of cheap records
does not leave a long tail either."""

MAX_SHARE = 0.1
"""At most this share of a service's time goes into snapshots: after one whose capture cost ``c``
seconds, the next waits at least ``c / MAX_SHARE`` (a large live state is snapshotted less often; the
interval then stretches to that). ``c`` is the forked child's CPU time plus the fork (the inbox goes
on while the child encodes, but a core does not: four services forking every 2 s would take one), or,
captured in process, the seconds the inbox waited; the chunks are sent while the inbox goes on."""

KIND = "muster-snapshot"
"""The header naming a snapshot topic's record: ``chunk``, ``manifest`` or ``checkpoint``."""

GENESIS = b"\0" * 16
"""The digest a lineage starts from."""


def policy_fingerprint(policy: Policy) -> str:
    """Equal for equal policies: a snapshot taken under another policy is not loaded."""
    return hashlib.sha256(policy.model_dump_json().encode()).hexdigest()[:32]


def snapshot_topic(prefix: str, service: str) -> str:
    return Topics(prefix).snapshots(service)


class SnapshotError(ValueError):
    """A snapshot that cannot be loaded: why, in one line."""


class SnapshotRequired(RuntimeError):
    """A service whose inbox no longer holds its first records, without a usable snapshot after them:
    it cannot rebuild its state, and stops (one line)."""


def reason(exc: BaseException) -> str:
    """One line for why a snapshot was not used."""
    if isinstance(exc, SnapshotError):
        return str(exc)
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --------------------------------------------------------------------------- state <-> bytes
@dataclass(frozen=True)
class Manifest:
    service: str
    offset: int
    """The inbox offset the state reflects: every record below it is in, none from it on."""
    digest: str
    """The output digest at ``offset`` (hex)."""
    sha256: str
    size: int
    chunks: list[int]
    """Offsets of the chunk records in the snapshot topic, in order."""
    format: int = FORMAT
    muster: str = field(default_factory=muster_version)
    code: str = field(default_factory=code_digest)
    """The code's digest: the state's layout is the code's, whatever the version says."""
    policy: str = ""
    written_at: float = 0.0

    def encode(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()

    @classmethod
    def decode(cls, value: bytes) -> "Manifest":
        """The manifest in ``value``, its fields of the types written (``SnapshotError`` else)."""
        try:
            raw = json.loads(value)
            manifest = cls(**{"code": "", **raw})  # a manifest from before the digest matches no code
        except (ValueError, TypeError, RecursionError) as exc:
            raise SnapshotError(f"unreadable snapshot manifest: {type(exc).__name__}: {exc}"[:200]) from None
        texts = (manifest.service, manifest.digest, manifest.sha256, manifest.muster, manifest.code, manifest.policy)
        if not (all(type(t) is str for t in texts) and all(type(n) is int for n in (
                manifest.offset, manifest.size, manifest.format, *manifest.chunks))
                and type(manifest.chunks) is list and isinstance(manifest.written_at, (int, float))):
            raise SnapshotError("unreadable snapshot manifest: a field of the wrong type")
        return manifest


def capture(worker: "InboxWorker") -> bytes:
    """The worker's state as bytes (call between two batches: nothing half handled), in the
    encoding of ``shared.runtime.statecodec``: JSON that loading cannot turn into code."""
    clock, ordering = worker.clock, worker.ordering
    held = None
    if isinstance(ordering, Rounds):
        held = {"round": ordering.round, "held": list(ordering._held.values())}
    state = {"service": worker.service, "ordering": type(ordering).__name__, "rounds": held,
             "timers": None if clock is None else clock.state(), "digest": worker.digest}
    try:
        return statecodec.encode(state)
    except (statecodec.StateError, RecursionError) as exc:
        raise SnapshotError(f"state cannot be written: {exc}") from None


def restore(worker: "InboxWorker", blob: bytes) -> None:
    """Put a captured state into ``worker`` (its tracer, watchers and clock's wall clock stay)."""
    try:
        state = statecodec.decode(blob)
    except statecodec.StateError as exc:
        raise SnapshotError(f"snapshot does not load: {exc}"[:300]) from None
    except (RecursionError, MemoryError) as exc:  # statecodec names what it can; nothing else escapes a load
        raise SnapshotError(f"snapshot does not load: {type(exc).__name__}") from None
    if type(state) is not dict or set(state) != {"service", "ordering", "rounds", "timers", "digest"}:
        raise SnapshotError("snapshot does not hold a worker's state")
    service, digest, timers = state["service"], state["digest"], state["timers"]
    if not isinstance(service, Service) or service.name != worker.service.name:
        raise SnapshotError("snapshot holds another service's state")
    if state["ordering"] != type(worker.ordering).__name__:
        raise SnapshotError(f"snapshot was taken under {state['ordering']!r:.30} ordering")
    if not (digest is None or type(digest) is bytes) or not (timers is None or type(timers) is list and all(
            isinstance(t, Envelope) and t.type == "TimerSet" for t in timers)):
        raise SnapshotError("snapshot's digest or timers are malformed")
    ordering = worker.ordering
    if isinstance(ordering, Rounds):
        ordering = Rounds()
        rounds = state["rounds"]
        if type(rounds) is not dict or type(rounds.get("round")) is not int or type(rounds.get("held")) is not list \
                or not all(isinstance(env, Envelope) for env in rounds["held"]):
            raise SnapshotError("snapshot's held envelopes are malformed")
        ordering.round = rounds["round"]
        ordering._held = {env.id: env for env in rounds["held"]}
    service.contexts = worker.service.contexts if service.contexts is None else service.contexts
    worker.service, worker.ordering, worker.digest = service, ordering, digest
    if worker.clock is not None and timers is not None:
        worker.clock.load(timers)


# --------------------------------------------------------------------------- capture in a forked child
FORK_VARIABLE = "MUSTER_SNAPSHOT_FORK"
"""``0`` captures in the service's own process, with the inbox waiting (as before forked captures);
anything else, or unset, forks a child to encode the state where ``os.fork`` exists."""

CHILD_TIMEOUT = 120.0
"""Seconds a capture's child may take before it is killed (no snapshot that time): a child stuck on
something it inherited locked must not hold the next snapshot back for ever."""

_OK, _FAILED = b"S", b"E"
_HEADER = 9
_DIGEST = 32
"""A child's answer: one byte (``_OK``: the blob's SHA-256 (32 bytes) and the blob follow;
``_FAILED``: a one-line reason), then the length of what follows (8 bytes, big-endian), then that.
The child hashes the blob because the manifest needs the checksum, and hashing a large state takes
CPU that the parent's event loop would otherwise spend with the inbox waiting."""


def fork_wanted() -> bool:
    """Capture in a forked child: ``os.fork`` exists and ``MUSTER_SNAPSHOT_FORK`` is not ``0``."""
    return hasattr(os, "fork") and os.environ.get(FORK_VARIABLE, "1").strip() != "0"


class CaptureLost(RuntimeError):
    """A capture's child that gave no snapshot: killed, exited otherwise than with its blob, timed out."""


class ForkedCapture:
    """``capture`` in a child process: the parent's stall is the fork only (a few ms), not the encoding.

    The child is a copy-on-write image of the parent at the fork, so it sees the state exactly as
    the inbox left it at that offset, whatever the parent handles meanwhile; it encodes that state,
    writes the bytes to a pipe and leaves with ``os._exit`` (no atexit handler, no finalizer, no
    flush of the parent's buffers, nothing of the parent's loop, sockets or logging touched). The
    parent reads the pipe from its event loop and reaps the child without blocking the loop; the
    child's CPU time (``wait4``) is what the capture cost. docs/design/runtime.md ("Snapshots encoded
    in a forked child") says why forking a process that has threads is safe here."""

    def __init__(self, pid: int, fd: int, stall: float) -> None:
        self.pid, self.fd, self.stall = pid, fd, stall
        """The child, the pipe's read end, and the seconds the fork held the caller."""
        self.cpu: float | None = None
        """The child's CPU seconds (user and system), once reaped (None: reaped by someone else)."""
        self.status: int | None = None
        """The child's wait status, once reaped."""

    @classmethod
    def start(cls, worker: "InboxWorker") -> "ForkedCapture":
        """Fork a child encoding ``worker``'s state now (call between two batches, as ``capture``).
        Raises OSError when no process can be made (the caller then has no snapshot this time)."""
        started = time.perf_counter()
        read, write = os.pipe()
        try:  # fewer wake-ups for a state of a few MB (1 MiB: what an unprivileged process may ask)
            import fcntl

            fcntl.fcntl(write, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
        except (ImportError, OSError):
            pass
        # SIGTERM and SIGINT held until the child has put back the default handlers: meanwhile the
        # parent's handlers would run in the child, and asyncio's write to the parent's loop's wakeup fd
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            pid = os.fork()
        except OSError:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            os.close(read)
            os.close(write)
            raise
        if pid == 0:  # the child: never returns
            _child(worker, read, write, blocked)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        os.close(write)
        os.set_blocking(read, False)
        return cls(pid, read, time.perf_counter() - started)

    async def result(self, timeout: float = CHILD_TIMEOUT) -> tuple[bytes, str]:
        """The child's blob and its SHA-256 (hex, as the manifest holds it). Raises SnapshotError (the state cannot be encoded, as ``capture``) or
        CaptureLost; the child is reaped whatever happens, killed first if need be (cancelled too)."""
        try:
            answer = await asyncio.wait_for(self._read(), timeout)
            await self._reap()
        except asyncio.TimeoutError:
            raise CaptureLost(f"its child took more than {timeout:.0f} s") from None
        finally:
            self.close()
        status = self.status
        if status is not None and not os.WIFEXITED(status):
            raise CaptureLost(f"its child was killed by signal {os.WTERMSIG(status)}")
        if status is not None and os.WEXITSTATUS(status) != 0:
            raise CaptureLost(f"its child exited with status {os.WEXITSTATUS(status)}")
        kind, size, body = answer[:1], int.from_bytes(answer[1:_HEADER], "big"), answer[_HEADER:]
        if len(answer) < _HEADER or kind not in (_OK, _FAILED) or len(body) != size:
            raise CaptureLost(f"its child's answer is cut short ({len(answer)} bytes)")
        if kind == _FAILED:
            raise SnapshotError(body.decode(errors="replace"))
        if len(body) < _DIGEST:
            raise CaptureLost(f"its child's answer holds no checksum ({len(body)} bytes)")
        return body[_DIGEST:], body[:_DIGEST].hex()

    async def _read(self) -> bytes:
        """Everything the child writes, up to its end of the pipe closing, without blocking the loop."""
        loop = asyncio.get_running_loop()
        chunks: list[bytes] = []
        done: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            while not done.done():
                try:
                    chunk = os.read(self.fd, 1 << 20)
                except BlockingIOError:
                    return
                except OSError as exc:
                    done.set_exception(exc)
                    return
                if not chunk:
                    done.set_result(None)
                    return
                chunks.append(chunk)

        loop.add_reader(self.fd, readable)
        try:
            await done
        finally:
            loop.remove_reader(self.fd)
        return b"".join(chunks)

    async def _reap(self) -> None:
        """Wait for the child's exit (it closed the pipe as it left: a matter of ms) and take its
        status and CPU time; polled with ``WNOHANG`` so that the loop goes on meanwhile."""
        delay = 0.001
        while self.status is None:
            if not self._wait(os.WNOHANG):
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.05)

    def _wait(self, options: int) -> bool:
        """True once the child is reaped (by this call or before)."""
        if self.status is not None:
            return True
        try:
            pid, status, usage = os.wait4(self.pid, options)
        except ChildProcessError:  # reaped by someone else (a waitpid(-1) child watcher): the answer tells
            self.status, self.cpu = 0, None
            return True
        if pid == 0:
            return False
        self.status, self.cpu = status, usage.ru_utime + usage.ru_stime
        return True

    def close(self) -> None:
        """Kill the child unless it is reaped already, reap it (no zombie), close the pipe."""
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._wait(0)  # a killed child goes at once
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


CHILD_NICE = 10
"""How much the encoding child yields to the services: it is background work, and on a small machine
it competes with the loops it was forked from for the same cores; niced, it weighs far less on their
latency's tail (docs/benchmarks.md, "Measurements behind the code's choices")."""


def _child(worker: "InboxWorker", read: int, write: int, blocked: Any) -> NoReturn:
    """In the forked child: encode, write, leave. Nothing else runs (``os._exit`` whatever happens)."""
    code = 70
    try:
        os.close(read)
        gc.disable()  # no finalizer of a parent's object (a client, a socket) runs here
        signal.set_wakeup_fd(-1)  # the fd is the parent's loop's: a signal here must not reach it
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        try:
            os.nice(CHILD_NICE)
        except OSError:  # pragma: no cover - lowering one's own priority is always allowed on Linux
            pass
        try:
            blob = capture(worker)
            kind, head = _OK, hashlib.sha256(blob).digest()
        except SnapshotError as exc:
            kind, head, blob = _FAILED, b"", " ".join(str(exc).split()).encode()
        for part in (kind + (len(head) + len(blob)).to_bytes(_HEADER - 1, "big") + head, blob):
            view = memoryview(part)  # the blob written as it is, not copied behind a header
            while view:
                view = view[os.write(write, view):]
        code = 0
    except BaseException:  # noqa: BLE001 - anything: the parent sees a status and no snapshot
        code = 70
    finally:
        os._exit(code)


# --------------------------------------------------------------------------- on Kafka
@dataclass
class Loaded:
    manifest: Manifest
    blob: bytes
    check: tuple[int, bytes] | None
    """The latest checkpoint of this snapshot's lineage, (offset, digest), if one lies past it."""


class SnapshotKeeper:
    """Writes and finds one service's snapshots on its snapshot topic."""

    def __init__(self, config: BusConfig, service: str, policy: Policy, *, interval: float = INTERVAL,
                 every_records: int = EVERY_RECORDS, key: bytes | None = None) -> None:
        self.config, self.service = config, service
        self.key = key if key is not None else (
            read_key(config.snapshot_key_file) if config.snapshot_key_file is not None else run_key())
        """Signs what this keeper writes and must have signed what it loads (``snapshotkey``): the key
        file's (``MUSTER_SNAPSHOT_KEY_FILE``), else the process's own."""
        self.topic = snapshot_topic(config.prefix, service)
        self.tp = TopicPartition(self.topic, 0)
        self.policy = policy_fingerprint(policy)
        self.interval, self.every_records = interval, every_records
        self.manifest_at: int | None = None
        """Offset of the latest manifest written or loaded: checkpoints name their lineage by it."""
        self.snapshot_offset: int | None = None
        """The inbox offset of that snapshot."""
        self.last_written = 0.0
        self.cost = 0.0
        """Seconds the latest snapshot's capture cost (``MAX_SHARE``): the child's CPU and the fork, or
        the wait of the inbox when captured in process."""
        self.written = 0
        self.fallbacks = 0
        self.fallback_reason: str | None = None
        self._checked: int | None = None
        self._producer: AIOKafkaProducer | None = None

    async def _send(self, records: list[tuple[bytes, bytes, str]]) -> list[int]:
        if self._producer is None:
            self._producer = AIOKafkaProducer(**self.config.producing(), max_request_size=2 * CHUNK + 65536,
                                              max_batch_size=CHUNK + 65536)
            await self._producer.start()
        futures = [await self._producer.send(self.topic, value, key=key, partition=0, headers=self._headers(kind, value))
                   for key, value, kind in records]
        return [(await f).offset for f in futures]

    def _headers(self, kind: str, value: bytes) -> list[tuple[str, bytes]]:
        """A record's kind, and its MAC unless it is a chunk (the signed manifest holds the chunks' SHA-256)."""
        headers = [(KIND, kind.encode())]
        if kind != "chunk":
            headers.append((MAC_HEADER, mac(self.key, kind, self.topic, value)))
        return headers

    def _opened(self, record: Any, kind: str) -> bytes:
        """The value of a manifest or checkpoint ``record`` once its MAC is this keeper's; else
        ``SnapshotError`` (unsigned, forged or written under another key), its bytes never parsed."""
        given = _header(record, MAC_HEADER)
        value = record.value or b""
        if given is None:
            raise SnapshotError(f"snapshot {kind} at offset {record.offset} is not signed (written by an older muster "
                                "or by someone without the key)")
        if not authentic(self.key, kind, self.topic, value, given):
            raise SnapshotError(f"snapshot {kind} at offset {record.offset} is not signed with this service's key "
                                "(forged, or written under another key)")
        return value

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    def due(self, offset: int, *, force: bool = False) -> bool:
        """A snapshot is due at ``offset``: none yet, or the interval or the record count passed
        (``force``: whenever the state moved past the last one)."""
        if force:
            return self.snapshot_offset is None or offset > self.snapshot_offset
        if self.snapshot_offset is None:
            return offset > 0
        if offset <= self.snapshot_offset:
            return False
        since = time.time() - self.last_written
        if since < self.cost / MAX_SHARE:
            return False
        return offset - self.snapshot_offset >= self.every_records or since >= self.interval

    async def write(self, blob: bytes, offset: int, digest: bytes, *, taken_at: float | None = None,
                    how: str = "", sha256: str | None = None) -> Manifest:
        """Chunks, then the manifest naming them (a crash in between leaves the previous one latest).
        ``taken_at``: when the state was captured (the interval counts from there; default now);
        ``how``: how it was captured, for the log line; ``sha256``: the blob's checksum (hex) when
        the capture's child computed it, else it is computed here, on a thread (``hashlib`` lets go
        of the GIL over large buffers: the event loop goes on)."""
        key = self.service.encode()
        if sha256 is None:
            sha256 = (await asyncio.to_thread(hashlib.sha256, blob)).hexdigest()
        pieces = [blob[i:i + CHUNK] for i in range(0, len(blob), CHUNK)] or [b""]
        chunks = await self._send([(key + b".chunk", piece, "chunk") for piece in pieces])
        manifest = Manifest(self.service, offset, digest.hex(), sha256, len(blob), chunks,
                            policy=self.policy, written_at=time.time())
        (self.manifest_at,) = await self._send([(key, manifest.encode(), "manifest")])
        self.snapshot_offset, self.last_written = offset, time.time() if taken_at is None else taken_at
        self.written += 1
        log.info("%s: snapshot of %d bytes at inbox offset %d%s", self.service, len(blob), offset,
                 f" ({how})" if how else "")
        return manifest

    async def checkpoint(self, offset: int, digest: bytes) -> None:
        """Record the output digest reached at ``offset`` (what a later tail replay must reproduce)."""
        if self.manifest_at is None or offset == self._checked:
            return
        body = json.dumps({"offset": offset, "digest": digest.hex(), "manifest": self.manifest_at}).encode()
        await self._send([(self.service.encode() + b".checkpoint", body, "checkpoint")])
        self._checked = offset

    async def latest(self) -> Loaded | None:
        """The latest complete snapshot and its lineage's latest checkpoint; None when there is none.
        Reads a few records from the topic's end, then the chunks the manifest names: the cost does
        not grow with how many snapshots were written before."""
        consumer = AIOKafkaConsumer(**self.config.aiokafka(), enable_auto_commit=False, fetch_max_wait_ms=50,
                                    max_partition_fetch_bytes=2 * CHUNK + 65536)
        await consumer.start()
        try:
            consumer.assign([self.tp])
            start = (await consumer.beginning_offsets([self.tp]))[self.tp]
            end = (await consumer.end_offsets([self.tp]))[self.tp]
            manifest_at, check = None, None
            position = end
            while manifest_at is None and position > start:
                position -= 1
                record = await self._read(consumer, position)
                kind = _kind(record)
                if kind == "checkpoint":
                    manifest_at, check = _checkpoint(self._opened(record, kind))
                elif kind == "manifest":
                    manifest_at = position
            if manifest_at is None:
                return None
            if not start <= manifest_at < end:
                raise SnapshotError(f"the checkpoint names a manifest at offset {manifest_at}, outside {self.topic}")
            record = await self._read(consumer, manifest_at)
            if _kind(record) != "manifest":
                raise SnapshotError(f"offset {manifest_at} of {self.topic} is no snapshot manifest")
            manifest = Manifest.decode(self._opened(record, "manifest"))
            self.check(manifest)  # before reading what it names
            parts = [(await self._read(consumer, at)).value or b"" for at in manifest.chunks]
        finally:
            await consumer.stop()
        blob = b"".join(parts)
        self.manifest_at, self.snapshot_offset = manifest_at, manifest.offset
        if check is not None and check[0] <= manifest.offset:
            check = None  # nothing recorded past the snapshot: its tail is empty
        return Loaded(manifest, blob, check)

    async def _read(self, consumer: AIOKafkaConsumer, offset: int) -> Any:
        consumer.seek(self.tp, offset)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            got = (await consumer.getmany(self.tp, timeout_ms=500, max_records=1)).get(self.tp, ())
            for record in got:
                if record.offset == offset:
                    return record
                consumer.seek(self.tp, offset)
        raise SnapshotError(f"offset {offset} of {self.topic} could not be read (compacted or deleted?)")

    def verify(self, manifest: Manifest, blob: bytes) -> None:
        """Format, version, policy and checksum (levels 1 and 2 of the module docstring)."""
        self.check(manifest)
        if len(blob) != manifest.size or hashlib.sha256(blob).hexdigest() != manifest.sha256:
            raise SnapshotError("snapshot checksum does not match (truncated or corrupted)")

    def check(self, manifest: Manifest) -> None:
        """What a signed manifest must say for this process to load its state (level 1), and a
        size and chunk count it may announce."""
        if manifest.format != FORMAT:
            raise SnapshotError(f"snapshot format {manifest.format}, this muster reads {FORMAT}")
        if manifest.muster != muster_version():
            raise SnapshotError(f"snapshot from muster {manifest.muster}, this is {muster_version()}")
        if manifest.code != code_digest():
            raise SnapshotError(f"snapshot from other code ({manifest.code or 'no digest'}, this is {code_digest()})")
        if manifest.policy != self.policy:
            raise SnapshotError("snapshot taken under another policy")
        if manifest.service != self.service:
            raise SnapshotError(f"snapshot of {manifest.service:.60}, not {self.service}")
        if not 0 <= manifest.size <= MAX_BYTES or len(manifest.chunks) != max(1, -(-manifest.size // CHUNK)):
            raise SnapshotError(f"snapshot of {manifest.size} bytes in {len(manifest.chunks)} chunks: "
                                f"at most {MAX_BYTES} bytes in chunks of {CHUNK}")

    def required(self, begin: int, reason: str) -> "SnapshotRequired":
        """Why this service cannot start on an inbox that begins at ``begin``: logged, and returned."""
        self.fallbacks += 1
        self.fallback_reason = reason
        error = SnapshotRequired(
            f"{self.service}: its inbox starts at offset {begin} (the records before it were deleted) and no usable "
            f"snapshot covers them ({reason}); refusing to rebuild without them")
        log.error("%s", error)
        return error

    def fell_back(self, reason: str) -> None:
        """Say once, on one line, why this start replays the whole inbox."""
        self.fallbacks += 1
        self.fallback_reason = reason
        log.warning("%s: snapshot not used (%s); rebuilding from the whole inbox", self.service, reason)


def _header(record: Any, wanted: str) -> bytes | None:
    for name, value in record.headers or ():
        if name == wanted:
            return bytes(value)
    return None


def _kind(record: Any) -> str:
    return (_header(record, KIND) or b"").decode(errors="replace")


def _checkpoint(value: bytes) -> tuple[int, tuple[int, bytes]]:
    """A signed checkpoint's manifest offset and (offset, digest); ``SnapshotError`` when malformed."""
    try:
        body = json.loads(value)
        manifest, offset, digest = body["manifest"], body["offset"], bytes.fromhex(body["digest"])
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise SnapshotError(f"unreadable snapshot checkpoint: {type(exc).__name__}") from None
    if type(manifest) is not int or type(offset) is not int:
        raise SnapshotError("unreadable snapshot checkpoint: offsets must be whole numbers")
    return manifest, (offset, digest)


Fresh = Callable[[], tuple[Service, Ordering]]
"""Makes a service and ordering as a first start would (a full replay after a fallback)."""


class Snapshots:
    """One inbox reader's snapshots: what it loads on start, checks while it replays the tail, and
    writes while it runs (``shared.runtime.bus.app.InboxReader`` calls these at those moments)."""

    def __init__(self, keeper: SnapshotKeeper, reader: Any, fresh: Fresh) -> None:
        self.keeper, self.reader, self.fresh = keeper, reader, fresh
        self.loaded_at: int | None = None
        """The inbox offset of the snapshot this start loaded (None: it replayed from the start)."""
        self.tail = 0
        """Records the tail replay folded after the snapshot (what a restart cost)."""
        self.load_seconds = (0.0, 0.0)
        """Reading the latest snapshot from its topic, and checking and decoding it."""
        self._check: tuple[int, bytes] | None = None
        self._begin = 0
        self._consumer: Any = None
        self._resume_at = 0
        self.fork = fork_wanted()
        """Capture in a forked child (``ForkedCapture``), else in process while the inbox waits."""
        self.stalls, self.stalled = 0, 0.0
        """Captures taken, and the seconds they held the inbox in all (the forks, or whole captures)."""
        self._one = asyncio.Lock()

    @property
    def worker(self) -> "InboxWorker":
        return self.reader.worker

    async def load(self, consumer: AIOKafkaConsumer, begin: int, committed: int) -> int:
        """Load the latest snapshot into the worker; the inbox offset to read from (``begin`` when
        there is none or it is not usable: a full replay)."""
        self._consumer, self._begin = consumer, begin
        keeper = self.keeper  # its topic is made with the others (``shared.runtime.bus.app.ensure_topics``)
        if committed <= begin == 0:
            self.worker.digest = GENESIS  # a first start: the lineage begins here
            return begin
        started = time.perf_counter()
        try:
            loaded = await keeper.latest()
            read = time.perf_counter()
            if loaded is None:
                if begin == 0:
                    log.info("%s: no snapshot yet; rebuilding from the whole inbox", keeper.service)
                return self._full(begin, None if begin == 0 else "there is no snapshot")
            keeper.verify(loaded.manifest, loaded.blob)
            if loaded.manifest.offset < begin:
                raise SnapshotError(f"snapshot at offset {loaded.manifest.offset} is older than the inbox's start")
            restore(self.worker, loaded.blob)
        except Exception as exc:  # noqa: BLE001 - whatever a snapshot does to its loader, a full replay
            return self._full(begin, reason(exc))
        self.loaded_at = self._resume_at = loaded.manifest.offset
        self._check = loaded.check
        if self._check is not None:
            # A checkpoint is written after its records' outputs were acknowledged, maybe past the
            # committed offset: replaying up to it (sending nothing) is as safe as up to the commit.
            self.reader._replay_end = max(committed, self._check[0])
        self.load_seconds = (read - started, time.perf_counter() - read)
        log.info("%s: loaded the snapshot at inbox offset %d (%d bytes: %.2f s to read, %.2f s to decode); "
                 "replaying %d records after it", keeper.service, loaded.manifest.offset, loaded.manifest.size,
                 *self.load_seconds, max(self.reader._replay_end - loaded.manifest.offset, 0))
        return loaded.manifest.offset

    def _full(self, begin: int, reason: str | None) -> int:
        """Back to a first start's state, to fold the inbox from ``begin``; ``SnapshotRequired`` when
        records before ``begin`` are gone (a fold from there would miss what they did)."""
        if begin > 0:
            raise self.keeper.required(begin, reason or "no usable snapshot")
        if reason is not None:
            self.keeper.fell_back(reason)
        service, ordering = self.fresh()
        worker = self.worker
        worker.service, worker.ordering, worker.digest, worker.replayed = service, ordering, None, 0
        worker.last_handled = None
        if worker.clock is not None:
            worker.clock.load([])
        self.loaded_at, self._check, self.tail = None, None, 0
        # one is written as soon as the rebuild is done; no checkpoint meanwhile names the old one
        self.keeper.snapshot_offset = self.keeper.manifest_at = None
        return begin

    def replayed(self, offset: int) -> bool:
        """After the record at ``offset`` was replayed: False when the snapshot failed its check
        there (the reader then drops the rest of its batch; this rewound it to the start)."""
        if self.loaded_at is not None:
            self.tail += 1
        check = self._check
        if check is None or offset + 1 != check[0]:
            return True
        self._check = None
        if self.worker.digest == check[1]:
            log.info("%s: snapshot verified: the tail replay reproduced the recorded outputs", self.keeper.service)
            return True
        start = self._full(self._begin, f"the tail replay after the snapshot at offset {self.loaded_at} did not "
                                        f"reproduce the outputs recorded at offset {check[0]}")
        self.reader._in_order.next = start
        self._consumer.seek(self.reader.tp, start)
        return False

    def rebuilt(self) -> None:
        """The past is folded: a full replay starts a new lineage (and a snapshot is due at once)."""
        if self.worker.digest is None:
            self.worker.digest = GENESIS
        self._resume_at = max(self._resume_at, self.reader._replay_end or 0)

    async def keep(self) -> None:
        """Every commit interval: a checkpoint, and a snapshot when one is due. Cancelled, it stops
        its producer; closed without its loop (the loop went away before the task was done, and the
        collector closes the coroutine: ``GeneratorExit`` at its ``sleep``) it awaits nothing, since
        an await there is ``RuntimeError: coroutine ignored GeneratorExit``, reported unraisable."""
        closed = False
        try:
            await self.reader.ready.wait()
            while True:
                await self.write_once()
                await asyncio.sleep(self.reader.commit_interval)
        except GeneratorExit:
            closed = True
            raise
        finally:
            if not closed:
                await self.keeper.close()

    async def write_once(self, *, force: bool = False) -> None:
        """A checkpoint, and a snapshot if one is due (``force``: if anything was handled since).

        The state is taken between two batches, under the reader's lock: forked (``ForkedCapture``),
        the inbox waits for the fork only and the child encodes while it goes on; in process
        (``MUSTER_SNAPSHOT_FORK=0``, or no ``os.fork``) it waits for the whole encoding."""
        keeper = self.keeper
        async with self._one:  # one capture (one child) at a time
            child, blob, sha256 = None, None, None
            async with self.reader._lock:  # between two batches: the state is exactly that of ``offset``
                started = time.perf_counter()
                offset = self.reader.processed if self.reader.processed is not None else self._resume_at
                digest = self.worker.digest if self.worker.digest is not None else GENESIS
                if keeper.due(offset, force=force):
                    try:
                        if self.fork:
                            child = ForkedCapture.start(self.worker)
                        else:
                            blob = capture(self.worker)
                    except SnapshotError as exc:  # a state the codec cannot hold: a bug, said; restarts replay it all
                        log.error("%s: %s", keeper.service, exc)
                        keeper.last_written = time.time()
                    except OSError as exc:  # no process to be had now: the next interval tries again
                        log.warning("%s: snapshot not taken: cannot fork (%r)", keeper.service, exc)
                        keeper.last_written = time.time()
                stalled, taken_at = time.perf_counter() - started, time.time()
            if child is not None or blob is not None:
                self.stalls, self.stalled = self.stalls + 1, self.stalled + stalled
                if (trace := stagetrace.current()) is not None:
                    trace.note("capture", taken_at - stalled, taken_at, trace.process)
            cost = stalled  # in process, the inbox waited for the whole capture
            if child is not None:
                try:
                    blob, sha256 = await child.result()
                except (SnapshotError, CaptureLost) as exc:
                    level = logging.ERROR if isinstance(exc, SnapshotError) else logging.WARNING
                    log.log(level, "%s: %s", keeper.service,
                            exc if isinstance(exc, SnapshotError) else f"no snapshot this time: {exc}")
                    keeper.last_written = time.time()
                # the child's CPU time (its wall time if someone else reaped it), and the fork
                cost = stalled + (child.cpu if child.cpu is not None else time.perf_counter() - started)
                keeper.cost = cost
                how = (f"forked in {stalled * 1e3:.1f} ms, encoded by the child in "
                       + ("?" if child.cpu is None else f"{child.cpu * 1e3:.0f}") + " ms of CPU")
            else:
                how = f"captured while the inbox waited {stalled * 1e3:.0f} ms"
            try:
                if blob is not None:
                    await keeper.write(blob, offset, digest, taken_at=taken_at, how=how, sha256=sha256)
                    keeper.cost = cost  # the write is sent while the inbox goes on: not counted
                await keeper.checkpoint(offset, digest)
            except KafkaError as exc:  # the next interval tries again; a restart then replays a longer tail
                log.warning("%s: snapshot not written: %r", keeper.service, exc)
