"""``muster run cluster``'s effect loop against the API emulator (real HTTP), without a broker:
``ClusterBridge.apply_batch`` as the Faust agent calls it, with a recording producer."""

from __future__ import annotations

import asyncio
from typing import Iterator

import pytest

from services.reconciler.kubeapi import connect
from shared.bus.cluster import BIND_CONCURRENCY, ClusterBridge
from shared.bus.topics import Topics
from shared.bus.worker import Incoming, Record, envelope_record
from shared.events import KubeEffect, wrap
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


def test_binds_between_other_effects_all_land_and_the_other_effects_keep_their_place(kube: KubeApiEmulator) -> None:
    pods = [f"p{i}" for i in range(BIND_CONCURRENCY + 8)]
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
    writes = [(method, path) for method, path in kube.state.requests if method in ("PATCH", "POST")]
    assert writes[0][0] == "PATCH" and writes[-1][0] == "PATCH"
    assert {path.rsplit("/", 2)[-2] for _, path in writes[1:-1]} == set(pods)
    assert kube.get("Pod", "v1", "team", "p0")["metadata"]["annotations"]["step"] == "after"
