"""shared/bus/snapshot.py without a broker: capture and restore a worker, the output digest, the
clock's pending and unsettled timers, and what the loader refuses."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path

import pytest

from shared.bus import codec
from shared.bus.sequencing import Arrival
from shared.bus.snapshot import GENESIS, SnapshotError, SnapshotKeeper, capture, restore
from shared.bus.worker import Clock, InboxWorker
from shared.bus.config import BusConfig
from shared.embedded import CORE_CLASSES
from shared.events import TimerFired, wrap
from shared.policy import Policy
from shared.scenario import load_scenario
from shared.service import Service
from shared.simulate import simulate
from tests.unit.bus.test_worker import TOPICS, FakeProducer, _timer_set

EXAMPLES = sorted((Path(__file__).parents[3] / "examples").glob("*.yaml"))


def _worker(name: str, clock: Clock | None = None) -> InboxWorker:
    return InboxWorker(Service(CORE_CLASSES[name](Policy())), TOPICS, Arrival(), clock=clock)


@pytest.mark.parametrize("example", EXAMPLES[:6], ids=lambda p: p.stem)
def test_a_restored_worker_decides_the_rest_as_the_original(example):
    """Fold the first half of each service's inbox, snapshot, restore into a fresh worker, fold the
    second half in both: the same outputs, byte for byte, and the same digest."""
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


def test_a_snapshot_naming_a_foreign_class_is_refused():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with pytest.raises(SnapshotError, match="builtins.print"):
        restore(_worker("queue"), pickle.dumps((Evil(), None, None, None)))


def test_garbage_and_another_service_are_refused():
    with pytest.raises(SnapshotError):
        restore(_worker("queue"), b"not a pickle")
    with pytest.raises(SnapshotError, match="another service"):
        restore(_worker("queue"), capture(_worker("placement")))


def test_a_snapshot_is_due_after_the_interval_or_the_record_count():
    keeper = SnapshotKeeper(BusConfig("127.0.0.1:1"), "queue", Policy(), interval=3600.0, every_records=100)
    assert not keeper.due(0) and keeper.due(1)
    keeper.snapshot_offset, keeper.last_written = 10, 1e18
    assert not keeper.due(50) and keeper.due(110)
    assert keeper.due(11, force=True) and not keeper.due(10, force=True)
