"""``muster run cluster``'s effect loop against the API emulator (real HTTP), without a broker:
``ClusterBridge.apply_batch`` (the reader's ``admit`` then settling, for one batch whole), with a
recording producer."""

from __future__ import annotations

import asyncio
from typing import Iterator

import pytest

from shared.kernel.events import KubeEffect, wrap
from shared.kubernetes.cluster import EFFECT_CONCURRENCY, ClusterBridge
from shared.kubernetes.kubeapi import connect
from shared.runtime.bus.topics import Topics
from shared.runtime.bus.worker import Incoming, Record, envelope_record
from tests.builders import node, pod
from tests.kubeapi import KubeApiEmulator


class _Letters:
    def __init__(self) -> None:
        self.sent: list[Record] = []

    async def send_all(self, records: list[Record]) -> list[int]:
        self.sent.extend(records)
        return list(range(len(records)))


@pytest.fixture
def kube() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator() as emulator:
        yield emulator


def _incoming(topics: Topics, effects: list[KubeEffect]) -> list[Incoming]:
    out = []
    for i, effect in enumerate(effects):
        record = envelope_record(topics, topics.effects, wrap(effect, source="reconciler", cause=None, index=i, at=1.0))
        out.append(Incoming(record.value, record.headers, 0, i))
    return out


def test_effects_on_one_object_keep_their_order_while_other_objects_go_side_by_side(kube: KubeApiEmulator) -> None:
    pods = [f"p{i}" for i in range(EFFECT_CONCURRENCY + 8)]
    kube.create(node("n1", cpu="64", pods="110"))
    for name in pods:
        kube.create(pod(name, "team"))
    topics = Topics()
    effects = [KubeEffect(op="annotate", kind="Pod", namespace="team", name="p0", annotations={"step": "before"})]
    effects += [KubeEffect(op="bind", kind="Pod", namespace="team", name=name, node="n1") for name in pods]
    effects.append(KubeEffect(op="bind", kind="Pod", namespace="team", name="p1", node="n1"))  # a repeat
    effects.append(KubeEffect(op="annotate", kind="Pod", namespace="team", name="p0", annotations={"step": "after"}))
    letters = _Letters()

    async def run() -> ClusterBridge:
        bridge = ClusterBridge(topics)
        api = await connect(kube.url, None, None)
        try:
            bridge.connect(api)
            await bridge.apply_batch(_incoming(topics, effects), letters)
        finally:
            await api.close()
        return bridge

    bridge = asyncio.run(run())
    assert letters.sent == [] and bridge.outcomes == {"applied": len(pods) + 2, "unchanged": 1}
    assert all(kube.get("Pod", "v1", "team", name)["spec"]["nodeName"] == "n1" for name in pods)
    p0 = [method for method, path in kube.state.requests if "/pods/p0" in path and method in ("PATCH", "POST")]
    assert p0 == ["PATCH", "POST", "PATCH"]  # annotate, bind, annotate: in the order they were decided
    assert kube.get("Pod", "v1", "team", "p0")["metadata"]["annotations"]["step"] == "after"


def test_an_eviction_waits_for_the_effects_before_it_and_holds_back_those_after_it(kube: KubeApiEmulator) -> None:
    kube.create(node("n1", cpu="64", pods="110"))
    for name in ("victim", "a", "b"):
        kube.create(pod(name, "team"))
    kube.patch("Pod", "v1", "team", "victim", {"spec": {"nodeName": "n1"}})
    topics = Topics()
    effects = [KubeEffect(op="annotate", kind="Pod", namespace="team", name="a", annotations={"x": "1"}),
               KubeEffect(op="evict", kind="Pod", namespace="team", name="victim"),
               KubeEffect(op="bind", kind="Pod", namespace="team", name="b", node="n1")]

    async def run() -> None:
        bridge = ClusterBridge(topics)
        api = await connect(kube.url, None, None)
        try:
            bridge.connect(api)
            assert bridge.applier is not None
            bridge.applier.victim_wait = 0.5  # no watch here tells it the victim is gone: it asks the server
            await bridge.apply_batch(_incoming(topics, effects), _Letters())
        finally:
            await api.close()

    asyncio.run(run())
    writes = [path.split("/")[-2:] for method, path in kube.state.requests if method in ("PATCH", "POST")]
    assert writes == [["pods", "a"], ["victim", "eviction"], ["b", "binding"]]
