"""shared/kubernetes/cluster.py's watch side without a broker: what the link does with watch events it
cannot send, and how a task that fails shows in ``/readyz`` (``ClusterBridge.not_ready``)."""

from __future__ import annotations

import asyncio
import json
from typing import Sequence

from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError

from services.reconciler.ingest import watch_envelope
from shared.kubernetes.cluster import ClusterBridge
from shared.runtime.bus import codec
from shared.runtime.bus.topics import Topics
from shared.runtime.bus.worker import Record
from tests.builders import node

TOPICS = Topics()


class Broker:
    """Takes every record but those whose value holds ``refuse`` (refused for good), after failing
    ``outages`` calls as unreachable first."""

    def __init__(self, refuse: bytes = b"\x00", outages: int = 0) -> None:
        self.refuse, self.outages = refuse, outages
        self.sent: list[Record] = []

    async def send_all(self, records: Sequence[Record]) -> list[int]:
        if self.outages:
            self.outages -= 1
            raise KafkaConnectionError("broker unreachable")
        if any(self.refuse in r.value for r in records):
            raise MessageSizeTooLargeError("too large")
        self.sent.extend(records)
        return list(range(len(records)))


def _bridge() -> ClusterBridge:
    return ClusterBridge(TOPICS, retry_first=0.001, retry_max=0.002)


def _events(*names: str):
    return [watch_envelope("Added", node(name), 1.0) for name in names]


def test_an_envelope_the_broker_refuses_is_dead_lettered_and_the_rest_sent_in_order():
    bridge, broker = _bridge(), Broker(refuse=b'"name":"n2"')
    asyncio.run(bridge.send_burst(_events("n1", "n2", "n3"), broker))
    logged = [codec.decode(r.value).subject for r in broker.sent if r.topic == TOPICS.log]
    assert logged == ["Node/n1", "Node/n3"]
    [letter] = [json.loads(r.value) for r in broker.sent if r.topic == TOPICS.deadletter]
    assert letter["error"].startswith("Node n2: refused by the broker: MessageSizeTooLargeError")
    assert json.loads(letter["value"])["name"] == "n2" and (bridge.unsent, bridge.dead_letters) == (1, 1)


def test_an_envelope_too_large_or_unencodable_is_dead_lettered_before_anything_is_sent():
    bridge, broker = _bridge(), Broker()
    bridge.max_record_bytes = 600
    big = node("big", labels={"blob": "x" * 1_000})
    burst = [watch_envelope("Added", obj, 1.0) for obj in (node("n1"), big, node("odd"))]
    # ingest refuses lone surrogates itself (tests/unit/reconciler); the link must still survive one
    # that reaches it, so put it in after ingest
    burst[2].payload.object["metadata"]["labels"] = {"note": "\ud800"}
    asyncio.run(bridge.send_burst(burst, broker))
    letters = [json.loads(r.value)["error"] for r in broker.sent if r.topic == TOPICS.deadletter]
    assert letters[0].startswith("Node big: ") and "more than the broker takes (600)" in letters[0]
    assert letters[1].startswith("Node odd: cannot be encoded")
    assert [codec.decode(r.value).subject for r in broker.sent if r.topic == TOPICS.log] == ["Node/n1"]


def test_an_unreachable_broker_is_waited_out_and_nothing_is_lost():
    bridge, broker = _bridge(), Broker(outages=3)
    asyncio.run(bridge.send_burst(_events("n1", "n2"), broker))
    assert [codec.decode(r.value).subject for r in broker.sent if r.topic == TOPICS.log] == ["Node/n1", "Node/n2"]
    assert (bridge.retries, bridge.dead_letters) == (3, 0)


def test_an_object_ingest_cannot_read_is_dead_lettered_by_the_watch_sink():
    bridge = _bridge()
    bad = ["not", "an", "object"]  # a malformed name is refused by ingest in an event; this has no identity at all
    asyncio.run(bridge.observe("Added", bad))
    item = bridge._changes.get_nowait()
    assert isinstance(item, Record) and item.topic == TOPICS.deadletter
    assert "cannot be read" in json.loads(item.value)["error"]


def test_a_task_that_fails_is_started_again_and_the_link_is_not_ready_meanwhile():
    bridge = _bridge()
    bridge.connected.set()
    runs: list[str] = []
    states: list[str | None] = []

    async def flaky() -> None:
        runs.append("run")
        states.append(bridge.not_ready())
        if len(runs) < 3:
            raise RuntimeError("lost the plot")
        await asyncio.sleep(3600)

    async def go() -> str | None:
        task = asyncio.create_task(bridge.supervised("publishing", flaky))
        while len(runs) < 2:
            await asyncio.sleep(0)
        while not bridge.down:
            await asyncio.sleep(0)
        down = bridge.not_ready()
        while len(runs) < 3:
            await asyncio.sleep(0.001)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return down

    down = asyncio.run(go())
    assert down is not None and down.startswith("publishing is down (RuntimeError: lost the plot)")
    assert states == [None, None, None] and bridge.not_ready() is None  # ready again once it runs


def test_an_effect_whose_application_fails_otherwise_is_dead_lettered_and_the_next_applied():
    from shared.kernel.events import KubeEffect, wrap
    from shared.runtime.bus.worker import Incoming

    class Applier:
        def __init__(self) -> None:
            self.applied: list[str] = []

        async def apply(self, effect: KubeEffect, effect_id: str) -> str:
            if effect.name == "odd":
                raise KeyError("spec")
            self.applied.append(effect.name)
            return "applied"

    bridge, broker = _bridge(), Broker()
    bridge.applier = Applier()  # type: ignore[assignment]
    effects = [wrap(KubeEffect(op="unsuspend", kind="RayCluster", namespace="ns", name=name), source="reconciler",
                    cause=None, index=i, at=1.0) for i, name in enumerate(("odd", "fine"))]
    batch = [Incoming(codec.encode(env), codec.envelope_headers(env), 0, offset) for offset, env in enumerate(effects)]
    asyncio.run(bridge.apply_batch(batch, broker))
    assert bridge.applier.applied == ["fine"]  # type: ignore[attr-defined]
    [letter] = [json.loads(r.value) for r in broker.sent]
    assert (letter["offset"], letter["topic"]) == (0, TOPICS.effects)
    assert letter["error"] == "cannot be applied: KeyError: 'spec'"


def test_an_object_ingest_refuses_is_sent_as_its_identity_logged_and_counted_per_kind(caplog):
    from shared.observability.metrics.stack import ClusterCollector

    bridge = _bridge()
    bad = node("n1", labels={"note": "x" * 64})
    with caplog.at_level("WARNING", logger="muster.cluster"):
        asyncio.run(bridge.observe("Added", bad))
        asyncio.run(bridge.observe("Added", node("n2")))
    assert bridge.refused == {"Node": 1} and bridge.observed == 2 and bridge.dead_letters == 0
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("Node n1 refused at ingest (left out of scheduling until a version muster can read "
                           "comes): metadata.labels.note:")
    [family] = [f for f in ClusterCollector(bridge).collect() if f.name == "muster_cluster_refused_watch_events"]
    assert [(s.labels, s.value) for s in family.samples if s.name.endswith("_total")] == [({"kind": "Node"}, 1)]


def test_effects_read_while_earlier_ones_are_in_flight_start_at_once_and_the_commit_waits_for_the_oldest(
        monkeypatch):
    """The effects reader does not apply batch by batch: a second batch's effect on another object is
    applied while the first batch's is held by the API server, one on the held object waits behind
    it, and what may be committed never passes the held one."""
    from shared.kernel.events import KubeEffect, wrap
    from shared.runtime.bus.worker import Incoming

    class Applier:
        def __init__(self) -> None:
            self.applied: list[str] = []
            self.release = asyncio.Event()

        async def apply(self, effect: KubeEffect, effect_id: str) -> str:
            if effect.name == "slow" and effect.op == "bind":
                await self.release.wait()
            self.applied.append(f"{effect.op} {effect.name}")
            return "applied"

    def batch(first: int, *effects: tuple[str, str]) -> list[Incoming]:
        envs = [wrap(KubeEffect(op=op, kind="Pod", namespace="ns", name=name, node="n1"), source="reconciler",
                     cause=None, index=first + i, at=1.0) for i, (op, name) in enumerate(effects)]
        return [Incoming(codec.encode(env), codec.envelope_headers(env), 0, first + i) for i, env in enumerate(envs)]

    bridge, broker = _bridge(), Broker()
    applier = bridge.applier = Applier()  # type: ignore[assignment]

    async def go() -> list[int | None]:
        through = []
        await bridge.admit(batch(0, ("bind", "slow"), ("bind", "a")))
        await bridge.admit(batch(2, ("bind", "b"), ("annotate", "slow")))  # not held by the first batch
        for _ in range(20):
            await asyncio.sleep(0)
        through.append(await bridge.settle(broker))
        assert applier.applied == ["bind a", "bind b"]  # "annotate slow" waits for "bind slow"
        applier.release.set()
        through.append(await bridge.drain(broker))
        return through

    assert asyncio.run(go()) == [None, 4]  # nothing past the held bind at offset 0; all four once it is done
    assert applier.applied == ["bind a", "bind b", "bind slow", "annotate slow"]
    assert broker.sent == [] and bridge.outcomes == {"applied": 4}

    # with EFFECTS_AHEAD unsettled, the reader reads no more until the oldest is done
    monkeypatch.setattr("shared.kubernetes.cluster.EFFECTS_AHEAD", 2)
    applier.release = asyncio.Event()
    applier.applied.clear()

    async def held() -> int | None:
        await bridge.admit(batch(10, ("bind", "slow"), ("bind", "c")))
        third = asyncio.ensure_future(bridge.admit(batch(12, ("bind", "d"))))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not third.done() and applier.applied == ["bind c"]
        applier.release.set()
        await third  # the oldest is done: it reads on (the reader then settles)
        return await bridge.drain(broker)

    assert asyncio.run(held()) == 13

