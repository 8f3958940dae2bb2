"""shared/bus/snapshot.py without a broker: capture and restore a worker, the output digest, the
clock's pending and unsettled timers, and what the loader refuses."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import pickle
import time
from dataclasses import replace
from pathlib import Path

import pytest

from shared.bus import codec
from shared import statecodec
from shared.bus.app import InboxReader
from shared.bus.sequencing import Arrival, Rounds
from shared.bus.snapshot import (FORMAT, GENESIS, MAX_SHARE, Loaded, Manifest, SnapshotError, SnapshotKeeper, Snapshots, capture,
                                 policy_fingerprint, restore)
from shared.bus.worker import Clock, InboxWorker
from shared.bus.config import BusConfig
from shared.embedded import CORE_CLASSES
from shared.events import TimerFired, wrap
from shared.policy import Policy
from shared.scenario import load_scenario
from shared.service import Service
from shared.simulate import simulate
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
    from shared.topology import destinations

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
