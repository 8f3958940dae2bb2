"""shared/runtime/bus/snapshot.py without a broker: capture and restore a worker, the output digest, the
clock's pending and unsettled timers, and what the loader refuses."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import pickle
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

from shared.runtime import statecodec
from shared.runtime.bus import codec
from shared.runtime.bus.app import InboxReader
from shared.runtime.bus.sequencing import Arrival, Rounds
from shared.runtime.bus.snapshot import (CHILD_NICE, FORMAT, GENESIS, MAX_SHARE, CHUNK, CaptureLost, ForkedCapture, Loaded, Manifest, SnapshotError, SnapshotKeeper,
                                 SnapshotRequired,
                                 Snapshots, capture, fork_wanted, policy_fingerprint, restore)
from shared.kernel.events import TimerFired, wrap
from shared.kernel.policy import Policy
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.worker import Clock, InboxWorker
from shared.runtime.cores import CORE_CLASSES
from shared.runtime.service import Service
from shared.runtime.simulate import simulate
from shared.sim.scenario import load_scenario
from tests.unit.bus.test_worker import TOPICS, FakeProducer, _timer_set

ROOT = Path(__file__).parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SCENARIOS = EXAMPLES + sorted((ROOT / "tests" / "scenarios").glob("*.yaml"))


def _worker(name: str, clock: Clock | None = None) -> InboxWorker:
    return InboxWorker(Service(CORE_CLASSES[name](Policy())), TOPICS, Arrival(), clock=clock)


@pytest.mark.parametrize("example", SCENARIOS, ids=lambda p: p.stem)
def test_a_restored_worker_decides_the_rest_as_the_original(example):
    """Fold the first half of each service's inbox, snapshot, restore into a fresh worker, fold the
    second half in both: the same outputs, byte for byte, and the same digest (every scenario: each
    holds state classes the others may not)."""
    run = simulate(load_scenario(example))
    for name in CORE_CLASSES:
        inbox = [env for env in run.runtime.log if name in _destinations(env)]
        half = len(inbox) // 2
        original = _worker(name)
        original.digest = GENESIS
        for env in inbox[:half]:
            original.replay(codec.encode(env), None)
        copy = _worker(name)
        restore(copy, capture(original))
        for env in inbox[half:]:
            assert original.service.handle(env) == copy.service.handle(env)
        assert copy.digest == original.digest and copy.service.handled == original.service.handled


def _destinations(env):
    from shared.kernel.topology import destinations

    return destinations(env)


def test_the_digest_follows_the_outputs():
    """Two policies that decide one input differently end on different digests."""
    log = simulate(load_scenario(EXAMPLES[0])).runtime.log
    inbox = [env for env in log if "admission" in _destinations(env)]
    digests = []
    for policy in (Policy(), Policy.from_mapping({"scheduler_names": ["nobody"]})):
        worker = InboxWorker(Service(CORE_CLASSES["admission"](policy)), TOPICS, Arrival())
        worker.digest = GENESIS
        for env in inbox:
            worker.replay(codec.encode(env), None)
        digests.append(worker.digest)
    assert digests[0] != GENESIS and digests[0] != digests[1]


def test_a_clock_keeps_pending_and_unsettled_timers_and_forgets_settled_ones():
    clock = Clock(now=lambda: 100.0)
    early, late = _timer_set(5.0, key="early"), _timer_set(50.0, key="late")
    clock.arm(early)
    clock.arm(late)
    (fired,) = clock.due(10.0)  # fired, its TimerFired not read back yet
    assert [t.payload.key for t in clock.state()] == ["late", "early"]
    clock.disarm(fired)  # read back from the inbox
    assert [t.payload.key for t in clock.state()] == ["late"]
    again = Clock()
    again.load(clock.state())
    assert again.next_at() == 50.0


def test_a_replayed_timer_fired_is_not_fired_again():
    worker = _worker("queue", clock=Clock(now=lambda: 100.0))
    timer_set = _timer_set(5.0)
    worker.clock.arm(timer_set)
    fired = wrap(TimerFired(key="cycle"), source="clock", cause=timer_set, index=0, at=5.0)
    worker.replay(codec.encode(fired), None)
    assert worker.clock.due(100.0) == []
    assert asyncio.run(worker.fire_due(100.0, FakeProducer())) == 0


def test_a_snapshot_naming_a_foreign_class_is_refused_without_running_it():
    """A pickle's way in (a callable named in the blob) is no node of the encoding; a class that is no
    pure state class of muster's is refused by name."""
    evil = json.dumps({"format": statecodec.FORMAT, "shapes": [["os:system", []]],
                       "root": ["d", 0, ["service", ["i", 1, 0, []]]]}).encode()
    with pytest.raises(SnapshotError, match="os:system"):
        restore(_worker("queue"), evil)
    with pytest.raises(SnapshotError, match="no JSON"):  # a snapshot of format 1 (a pickle)
        restore(_worker("queue"), pickle.dumps({"service": None}))


def test_garbage_and_another_service_are_refused():
    with pytest.raises(SnapshotError):
        restore(_worker("queue"), b"not a snapshot")
    with pytest.raises(SnapshotError, match="another service"):
        restore(_worker("queue"), capture(_worker("placement")))


def test_a_held_round_and_timers_come_back():
    """Under ``simulate --bus`` the worker holds envelopes until a round is released."""
    worker = InboxWorker(Service(CORE_CLASSES["queue"](Policy())), TOPICS, Rounds(), clock=Clock(now=lambda: 0.0))
    held = _timer_set(5.0)
    worker.ordering.offer(held)
    worker.ordering.round = 3
    worker.clock.arm(_timer_set(9.0, key="later"))
    copy = InboxWorker(Service(CORE_CLASSES["queue"](Policy())), TOPICS, Rounds(), clock=Clock(now=lambda: 0.0))
    restore(copy, capture(worker))
    assert copy.ordering.round == 3 and copy.ordering.held == 1 and copy.ordering._held[held.id] == held
    assert copy.clock.next_at() == 9.0
    with pytest.raises(SnapshotError, match="ordering"):
        restore(_worker("queue"), capture(worker))


# --------------------------------------------------------------------------- loading, and falling back
class _Keeper(SnapshotKeeper):
    """The keeper with its topic's latest snapshot given (the broker's part is tested in
    tests/integration/test_bus_snapshot.py)."""

    def __init__(self, loaded: Loaded | None) -> None:
        super().__init__(BusConfig("127.0.0.1:1"), "admission", Policy())
        self.loaded = loaded

    async def latest(self) -> Loaded | None:
        if self.loaded is not None:
            self.manifest_at, self.snapshot_offset = 0, self.loaded.manifest.offset
        return self.loaded


def _admission_inbox() -> list[bytes]:
    log = simulate(load_scenario(EXAMPLES[0])).runtime.log
    return [codec.encode(env) for env in log if "admission" in _destinations(env)]


def _loaded(spoil: str) -> tuple[Loaded, int]:
    """A snapshot of admission after the first half of its inbox, spoiled as ``spoil`` says."""
    inbox = _admission_inbox()
    half = len(inbox) // 2
    worker = _worker("admission")
    worker.digest = GENESIS
    for value in inbox[:half]:
        worker.replay(value, None)
    blob = capture(worker)
    policy = policy_fingerprint(Policy())
    manifest = Manifest("admission", half, worker.digest.hex(), hashlib.sha256(blob).hexdigest(), len(blob), [1],
                        policy=policy)
    if spoil == "truncated":
        blob = blob[: len(blob) // 2]
    elif spoil == "corrupted":
        at = len(blob) // 2
        blob = blob[:at] + bytes([blob[at] ^ 0x20]) + blob[at + 1:]
    elif spoil == "corrupted, checksum rewritten":  # the checksum cannot help: the decoder must refuse it
        blob = blob.replace(b'"format":', b'"formet":', 1)
        manifest = replace(manifest, sha256=hashlib.sha256(blob).hexdigest(), size=len(blob))
    elif spoil == "wrong version":
        manifest = replace(manifest, format=FORMAT - 1)
    elif spoil == "another policy":
        manifest = replace(manifest, policy="0" * 32)
    elif spoil == "other code":  # same version, another build: its state may be laid out otherwise
        manifest = replace(manifest, code="0" * 16)
    elif spoil == "manifest from before code digests":
        manifest = Manifest.decode(json.dumps({k: v for k, v in manifest.__dict__.items() if k != "code"}).encode())
    return Loaded(manifest, blob, None), half


def _snapshots(loaded: Loaded | None, committed: int) -> Snapshots:
    """As ``InboxReader._start`` calls ``load``: the reader replays up to the committed offset."""
    fresh = lambda: (Service(CORE_CLASSES["admission"](Policy())), Arrival())  # noqa: E731
    reader = InboxReader(BusConfig("127.0.0.1:1"), "g", _worker("admission"), FakeProducer())
    reader._replay_end = committed
    return Snapshots(_Keeper(loaded), reader, fresh)


def test_a_sound_snapshot_is_loaded_and_the_inbox_read_after_it():
    loaded, half = _loaded("none")
    snapshots = _snapshots(loaded, half + 3)
    assert asyncio.run(snapshots.load(None, 0, half + 3)) == half
    assert snapshots.loaded_at == half and snapshots.keeper.fallbacks == 0
    assert snapshots.worker.service.handled > 0


@pytest.mark.parametrize("spoil, said", [
    ("truncated", "checksum does not match"),
    ("corrupted", "checksum does not match"),
    ("corrupted, checksum rewritten", "does not load"),
    ("wrong version", f"snapshot format {FORMAT - 1}"),
    ("another policy", "another policy"),
    ("other code", "snapshot from other code (0000000000000000"),
    ("manifest from before code digests", "snapshot from other code (no digest"),
])
def test_an_unusable_snapshot_means_a_full_replay_said_in_one_line(spoil, said, caplog):
    loaded, half = _loaded(spoil)
    snapshots = _snapshots(loaded, half + 3)
    with caplog.at_level(logging.WARNING, logger="muster.bus"):
        assert asyncio.run(snapshots.load(None, 0, half + 3)) == 0  # from the inbox's start
    assert snapshots.loaded_at is None and snapshots.keeper.fallbacks == 1
    assert snapshots.worker.service.handled == 0  # a first start's state, to fold everything into
    (line,) = [r.getMessage() for r in caplog.records if "snapshot not used" in r.getMessage()]
    assert said in line and line.endswith("rebuilding from the whole inbox") and "\n" not in line


def _nested(depth: int, opener: str = "[", closer: str = "]") -> bytes:
    """A state document whose service is a value nested ``depth`` deep."""
    inner = opener * depth + ("1" if opener == '{"a":' else "") + closer * depth
    return ('{"format":%d,"shapes":[],"root":["d",0,["service",%s]]}' % (statecodec.FORMAT, inner)).encode()


@pytest.mark.parametrize("opener, closer", [("[", "]"), ('{"a":', "}")], ids=["lists", "mappings"])
def test_a_deeply_nested_state_is_refused_not_raised(opener, closer):
    """It used to escape as RecursionError (the JSON parser's own), past every fallback: the service
    crash-looped. Now it is a SnapshotError like any state that does not load."""
    for depth in (5_000, 100_000):
        with pytest.raises(SnapshotError, match="nested too deeply"):
            restore(_worker("queue"), _nested(depth, opener, closer))


def _sound(blob: bytes, offset: int) -> Loaded:
    """``blob`` under a manifest that passes every check but decoding."""
    manifest = Manifest("admission", offset, GENESIS.hex(), hashlib.sha256(blob).hexdigest(), len(blob),
                        list(range(max(1, -(-len(blob) // CHUNK)))), policy=policy_fingerprint(Policy()))
    return Loaded(manifest, blob, None)


def test_a_deeply_nested_snapshot_falls_back_to_a_full_replay(caplog):
    snapshots = _snapshots(_sound(_nested(100_000), 40), 50)
    with caplog.at_level(logging.WARNING, logger="muster.bus"):
        assert asyncio.run(snapshots.load(None, 0, 50)) == 0
    assert snapshots.loaded_at is None and snapshots.keeper.fallbacks == 1
    assert "nested too deeply" in snapshots.keeper.fallback_reason


class _Raising(_Keeper):
    def __init__(self, error: BaseException) -> None:
        super().__init__(None)
        self.error = error

    async def latest(self) -> Loaded | None:
        raise self.error


@pytest.mark.parametrize("error", [RecursionError("maximum recursion depth exceeded"), TypeError("list indices"),
                                   MemoryError(), OverflowError("too large")], ids=lambda e: type(e).__name__)
def test_whatever_loading_raises_means_a_full_replay_not_a_crash(error, caplog):
    reader = _snapshots(None, 50).reader
    snapshots = Snapshots(_Raising(error), reader, lambda: (Service(CORE_CLASSES["admission"](Policy())), Arrival()))
    with caplog.at_level(logging.WARNING, logger="muster.bus"):
        assert asyncio.run(snapshots.load(None, 0, 50)) == 0
    assert snapshots.keeper.fallbacks == 1 and type(error).__name__ in snapshots.keeper.fallback_reason
    (line,) = [r.getMessage() for r in caplog.records if "snapshot not used" in r.getMessage()]
    assert "\n" not in line


# --------------------------------------------------------------------------- an inbox whose first records are gone
def test_a_pruned_inbox_starts_from_a_snapshot_after_its_start():
    loaded, half = _loaded("none")
    snapshots = _snapshots(loaded, half + 3)
    assert asyncio.run(snapshots.load(None, half - 2, half + 3)) == half  # records before half - 2 deleted
    assert snapshots.loaded_at == half and snapshots.keeper.fallbacks == 0


@pytest.mark.parametrize("spoil, said", [
    (None, "there is no snapshot"),
    ("corrupted", "checksum does not match"),
    ("older", "older than the inbox's start"),
])
def test_a_pruned_inbox_without_a_usable_snapshot_is_refused_in_one_line(spoil, said, caplog):
    loaded, half = _loaded("none" if spoil in (None, "older") else spoil)
    begin = half + 1 if spoil == "older" else 5
    snapshots = _snapshots(None if spoil is None else loaded, half + 3)
    with caplog.at_level(logging.ERROR, logger="muster.bus"), pytest.raises(SnapshotRequired) as raised:
        asyncio.run(snapshots.load(None, begin, half + 3))
    message = str(raised.value)
    assert message.startswith(f"admission: its inbox starts at offset {begin} (the records before it were deleted)")
    assert said in message and "refusing to rebuild without them" in message and "\n" not in message
    assert message in caplog.text


def test_a_tail_that_fails_its_check_on_a_pruned_inbox_stops_the_service():
    """Replaying from the inbox's start is no way back when its first records are gone."""
    loaded, half = _loaded("none")
    loaded.check = (half + 2, b"\x00" * 16)  # a digest the tail will not reach
    snapshots = _snapshots(loaded, half + 3)
    assert asyncio.run(snapshots.load(None, 3, half + 3)) == half
    snapshots.replayed(half)
    with pytest.raises(SnapshotRequired, match="did not reproduce the outputs"):
        snapshots.replayed(half + 1)


def test_a_snapshot_is_due_after_the_interval_or_the_record_count():
    keeper = SnapshotKeeper(BusConfig("127.0.0.1:1"), "queue", Policy(), interval=3600.0, every_records=100)
    assert not keeper.due(0) and keeper.due(1)
    keeper.snapshot_offset, keeper.last_written = 10, time.time()  # just written
    assert not keeper.due(50) and keeper.due(110)
    assert keeper.due(11, force=True) and not keeper.due(10, force=True)
    keeper.last_written = 0.0  # long ago: the interval has passed
    assert keeper.due(11)


def test_a_costly_snapshot_waits_longer():
    """One that took a second to capture and write is not followed by another within 1 / MAX_SHARE s."""
    keeper = SnapshotKeeper(BusConfig("127.0.0.1:1"), "queue", Policy(), interval=0.0, every_records=1)
    keeper.snapshot_offset, keeper.last_written, keeper.cost = 10, time.time(), 1.0
    assert not keeper.due(10_000)
    keeper.last_written = time.time() - 1.0 / MAX_SHARE - 1
    assert keeper.due(10_000)


# --------------------------------------------------------------------------- captured in a forked child
fork_only = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")


def _folded(name: str) -> InboxWorker:
    """A worker after the first half of its inbox in the first example."""
    worker = _worker(name)
    worker.digest = GENESIS
    log = simulate(load_scenario(EXAMPLES[0])).runtime.log
    inbox = [env for env in log if name in _destinations(env)]
    for env in inbox[: len(inbox) // 2]:
        worker.replay(codec.encode(env), None)
    return worker


def _gone(pid: int) -> bool:
    """``pid`` is no child of this process any more: reaped, not a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@fork_only
@pytest.mark.parametrize("name", list(CORE_CLASSES))
def test_a_forked_capture_gives_the_bytes_of_the_capture_in_process(name):
    worker = _folded(name)
    child = ForkedCapture.start(worker)
    blob, sha256 = asyncio.run(child.result())
    assert blob == capture(worker) and sha256 == hashlib.sha256(blob).hexdigest()
    assert _gone(child.pid) and child.status == 0 and child.cpu is not None and child.cpu > 0


@fork_only
def test_the_child_encodes_the_state_as_it_was_at_the_fork():
    """The parent goes on handling while the child encodes: the child's bytes are the state's at the fork."""
    worker = _folded("admission")
    before = capture(worker)

    async def go() -> bytes:
        child = ForkedCapture.start(worker)
        log = simulate(load_scenario(EXAMPLES[0])).runtime.log
        for env in [env for env in log if "admission" in _destinations(env)][-5:]:
            worker.replay(codec.encode(env), None)
        return (await child.result())[0]

    assert asyncio.run(go()) == before != capture(worker)


@fork_only
def test_the_child_encodes_at_a_lower_priority(monkeypatch):
    """Background work: the services' loops on the same cores come first."""
    worker = _folded("queue")
    monkeypatch.setattr("shared.runtime.bus.snapshot.capture", lambda w: str(os.nice(0)).encode())
    child = ForkedCapture.start(worker)
    assert CHILD_NICE > 0
    assert asyncio.run(child.result())[0] == str(min(os.nice(0) + CHILD_NICE, 19)).encode()  # 19: the lowest


class _Written(SnapshotKeeper):
    """The keeper with its topic replaced by a list of what it was asked to write."""

    def __init__(self, interval: float = 0.0) -> None:
        super().__init__(BusConfig("127.0.0.1:1"), "admission", Policy(), interval=interval, every_records=1_000)
        self.blobs: list[tuple[bytes, int]] = []

    async def write(self, blob, offset, digest, *, taken_at=None, how="", sha256=None):  # type: ignore[override]
        self.blobs.append((blob, offset))
        self.snapshot_offset, self.last_written = offset, taken_at or time.time()
        self.written += 1

    async def checkpoint(self, offset, digest):  # type: ignore[override]
        pass


def _writing(worker: InboxWorker, *, fork: bool, interval: float = 0.0) -> Snapshots:
    reader = InboxReader(BusConfig("127.0.0.1:1"), "g", worker, FakeProducer())
    reader.processed = 7
    snapshots = Snapshots(_Written(interval), reader, lambda: None)  # type: ignore[arg-type]
    snapshots.fork = fork
    return snapshots


@pytest.mark.parametrize("fork", [pytest.param(True, marks=fork_only), False])
def test_write_once_writes_the_capture_and_counts_its_cost(fork, monkeypatch):
    """Forked or in process, the same bytes are written; forked, the cost is the child's CPU (and the
    fork), which ``MAX_SHARE`` spaces the next by, and the inbox waited for the fork only."""
    worker = _folded("placement")
    snapshots = _writing(worker, fork=fork)
    asyncio.run(snapshots.write_once())
    keeper = snapshots.keeper
    assert keeper.blobs == [(capture(worker), 7)]
    assert snapshots.stalls == 1 and 0 < snapshots.stalled <= keeper.cost
    spacing = keeper.cost / MAX_SHARE  # the clock is set, not read: a loaded machine's write takes longer
    for after, due in ((0.5 * spacing, False), (1.01 * spacing, True)):
        monkeypatch.setattr("shared.runtime.bus.snapshot.time.time", lambda: keeper.last_written + after)
        assert keeper.due(8) is due


class _Sent(SnapshotKeeper):
    """The keeper with its topic replaced by a list of the records it sent (their offsets: indexes)."""

    def __init__(self) -> None:
        super().__init__(BusConfig("127.0.0.1:1"), "placement", Policy(), interval=0.0, every_records=1_000)
        self.records: list[tuple[bytes, bytes, str]] = []

    async def _send(self, records):  # type: ignore[override]
        self.records.extend(records)
        return list(range(len(self.records) - len(records), len(self.records)))


@pytest.mark.parametrize("fork", [pytest.param(True, marks=fork_only), False])
def test_the_manifest_checksum_verifies_whoever_computed_it(fork, monkeypatch):
    """Forked, the child hashes the blob (the parent's loop does not spend the CPU a large state's
    hash takes); in process, the keeper does, on a thread. Either way the manifest written verifies
    against the chunks written, and the state loads back."""
    monkeypatch.setattr("shared.runtime.bus.snapshot.CHUNK", 4096)  # several chunks
    worker = _folded("placement")
    reader = InboxReader(BusConfig("127.0.0.1:1"), "g", worker, FakeProducer())
    reader.processed = 7
    keeper = _Sent()
    snapshots = Snapshots(keeper, reader, lambda: None)  # type: ignore[arg-type]
    snapshots.fork = fork
    hashed_here: list[int] = []
    real = hashlib.sha256
    monkeypatch.setattr("shared.runtime.bus.snapshot.hashlib.sha256", lambda *a: hashed_here.append(1) or real(*a))
    asyncio.run(snapshots.write_once())
    assert bool(hashed_here) != fork  # forked: the child's hash (its calls are not this process's)
    *chunks, (_, body, kind) = [r for r in keeper.records if r[2] != "checkpoint"]
    assert kind == "manifest" and len(chunks) > 1 and all(k == "chunk" for _, _, k in chunks)
    manifest = Manifest.decode(body)
    blob = b"".join(value for _, value, _ in chunks)
    keeper.verify(manifest, blob)  # raises on a checksum that does not match
    assert blob == capture(worker) and manifest.offset == 7
    copy = _worker("placement")
    restore(copy, blob)
    assert copy.service.handled == worker.service.handled > 0 and copy.digest == worker.digest


def test_fork_is_the_default_and_the_variable_turns_it_off(monkeypatch):
    monkeypatch.delenv("MUSTER_SNAPSHOT_FORK", raising=False)
    assert fork_wanted() == hasattr(os, "fork")
    monkeypatch.setenv("MUSTER_SNAPSHOT_FORK", "0")
    assert not fork_wanted()
    assert not _snapshots(None, 0).fork  # a service captures in process then


def _die(how: str):
    def capture_in_child(worker):
        if how == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "exits":
            os._exit(3)
        if how == "silent":
            os._exit(0)
        raise SnapshotError("state cannot be written: a test's state")
    return capture_in_child


@fork_only
@pytest.mark.parametrize("how, said, level", [
    ("killed", "no snapshot this time: its child was killed by signal 9", logging.WARNING),
    ("exits", "no snapshot this time: its child exited with status 3", logging.WARNING),
    ("silent", "no snapshot this time: its child's answer is cut short (0 bytes)", logging.WARNING),
    ("fails", "state cannot be written: a test's state", logging.ERROR),
])
def test_a_child_that_gives_no_snapshot_is_said_once_and_changes_nothing(how, said, level, monkeypatch, caplog):
    worker = _folded("queue")
    before = capture(worker)
    snapshots = _writing(worker, fork=True, interval=3600.0)
    snapshots.keeper.snapshot_offset = 3  # the last one, an interval ago
    monkeypatch.setattr("shared.runtime.bus.snapshot.capture", _die(how))  # what the child runs (it is forked after)
    with caplog.at_level(logging.INFO, logger="muster.bus"):
        asyncio.run(snapshots.write_once())
    (line,) = [r for r in caplog.records if "snapshot" in r.getMessage() or "state" in r.getMessage()]
    assert line.getMessage() == f"admission: {said}" and line.levelno == level
    assert snapshots.keeper.blobs == [] and snapshots.keeper.snapshot_offset == 3
    monkeypatch.undo()
    assert capture(worker) == before  # the parent's state untouched
    assert not snapshots.keeper.due(7)  # tried again after the interval, not at every commit


@fork_only
def test_a_stopped_capture_kills_and_reaps_its_child(monkeypatch):
    """A service stopping cancels its snapshot task: the child is killed and reaped, no zombie left."""
    def slow(worker):
        time.sleep(60)
        return b""

    snapshots = _writing(_folded("reconciler"), fork=True)
    monkeypatch.setattr("shared.runtime.bus.snapshot.capture", slow)
    children: list[ForkedCapture] = []
    start = ForkedCapture.start
    monkeypatch.setattr(ForkedCapture, "start", classmethod(lambda cls, w: children.append(start(w)) or children[-1]))

    async def go() -> None:
        task = asyncio.ensure_future(snapshots.write_once())
        while not children:
            await asyncio.sleep(0.01)
        assert not _gone(children[0].pid)  # encoding, while the loop goes on
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())
    (child,) = children
    assert _gone(child.pid) and os.WIFSIGNALED(child.status) and child.fd == -1
    assert snapshots.keeper.blobs == []


@fork_only
def test_a_child_past_its_time_is_killed_and_reaped(monkeypatch):
    def stuck(worker):  # as a child stuck on a lock another thread held at the fork would be
        time.sleep(60)
        return b""

    monkeypatch.setattr("shared.runtime.bus.snapshot.capture", stuck)
    child = ForkedCapture.start(_worker("queue"))
    with pytest.raises(CaptureLost, match="took more than"):
        asyncio.run(child.result(timeout=0.2))
    assert _gone(child.pid) and os.WIFSIGNALED(child.status)


def test_the_latest_snapshots_inbox_offset_is_a_metric():
    """What an operator reads before deleting inbox records (docs/operations.md, Retention)."""
    from shared.observability.metrics.stack import ServiceCollector

    snapshots = _snapshots(None, 0)
    reader = snapshots.reader
    reader.snapshots = snapshots

    def offset() -> float:
        collected = {f.name: f for f in ServiceCollector("admission", reader.worker, reader).collect()}
        return collected["muster_snapshot_inbox_offset"].samples[0].value

    assert offset() == -1
    snapshots.keeper.snapshot_offset = 120
    assert offset() == 120


@pytest.mark.parametrize("ready", [False, True], ids=["before ready", "sleeping"])
def test_a_keeper_closed_without_its_loop_awaits_nothing(ready):
    """A loop closed under a running keeper (a service stop that timed out) leaves the collector to
    close its coroutine: an await in its ``finally`` was "coroutine ignored GeneratorExit", reported
    as a PytestUnraisableExceptionWarning in the bus parity test."""
    snapshots = _writing(_folded("queue"), fork=False, interval=3600.0)
    stopped: list[str] = []

    async def close() -> None:  # as a producer's stop: it suspends
        await asyncio.sleep(0)
        stopped.append("stopped")

    snapshots.keeper.close = close  # type: ignore[method-assign]

    async def go() -> None:
        if ready:
            snapshots.reader.ready.set()
        coro = snapshots.keep()
        coro.send(None)  # up to its first suspension: waiting for ready, or sleeping after a write
        coro.close()  # what the collector does once the loop has gone away

    asyncio.run(go())
    assert stopped == []

    async def cancelled() -> None:  # cancelled on a running loop, it does stop its producer
        snapshots.reader.ready.set()
        task = asyncio.ensure_future(snapshots.keep())
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(cancelled())
    assert stopped == ["stopped"]
