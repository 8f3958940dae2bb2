"""Builders for tests of the simulated cluster: a tiny clock-driving harness and effect shorthands.

``SimHarness`` plays the embedded runtime's part: it applies objects and effects at a time, keeps
the sim's timer requests and fires them in time order, and collects the watch stream.
"""

from __future__ import annotations

import heapq
from typing import Any

from shared.kernel import kube
from shared.kernel.events import KubeEffect
from shared.sim import SimCluster
from shared.sim.batchscheduler import Setting


def effect(op: str, kind: str, name: str, namespace: str = "default", **fields: Any) -> KubeEffect:
    """``effect("bind", "Pod", "rc-head-xxxxx", node="n1")``."""
    return KubeEffect(op=op, kind=kind, namespace=namespace, name=name, **fields)


class SimHarness:
    def __init__(self, *, pod_startup: float = 2.0, batch_scheduler: Setting = "none") -> None:
        self.sim = SimCluster(pod_startup=pod_startup, batch_scheduler=batch_scheduler)
        self.now = 0.0
        self.watch: list[tuple[str, dict]] = []
        self.fired: list[tuple[float, str]] = []
        self._timers: list[tuple[float, int, str]] = []
        self._seq = 0

    # ------------------------------------------------------------------ steps
    def apply(self, *objs: dict, at: float | None = None) -> "SimHarness":
        self._at(at)
        for obj in objs:
            self.sim.apply(obj, self.now)
        return self._collect()

    def delete(self, kind: str, name: str, namespace: str | None = "default", at: float | None = None) -> "SimHarness":
        self._at(at)
        self.sim.delete(kind, namespace, name, self.now)
        return self._collect()

    def perform(self, *effects: KubeEffect, at: float | None = None) -> "SimHarness":
        self._at(at)
        for e in effects:
            self.sim.perform(e, self.now)
        return self._collect()

    def advance(self, until: float) -> "SimHarness":
        """Fire every timer due up to ``until`` in (time, request order); then ``now = until``."""
        self._collect()
        while self._timers and self._timers[0][0] <= until:
            at, _, key = heapq.heappop(self._timers)
            self.now = max(self.now, at)
            self.fired.append((at, key))
            self.sim.fire(key, self.now)
            self._collect()
        self.now = max(self.now, until)
        return self

    # ------------------------------------------------------------------ reads
    def pods(self, namespace: str = "default", *, cluster: str | None = None) -> list[dict]:
        """Live pods in creation order, optionally those of one RayCluster."""
        return [p for p in self.sim.api.objects("Pod", namespace)
                if cluster is None or kube.labels(p).get(kube.RAY_CLUSTER) == cluster]

    def pod_names(self, namespace: str = "default", *, cluster: str | None = None) -> list[str]:
        return [kube.meta(p)["name"] for p in self.pods(namespace, cluster=cluster)]

    def phases(self, namespace: str = "default") -> dict[str, str]:
        return {kube.meta(p)["name"]: p["status"]["phase"] for p in self.pods(namespace)}

    def bind_all(self, node: str, namespace: str = "default", at: float | None = None) -> "SimHarness":
        """Bind every unbound pod to ``node`` as the reconciler would."""
        unbound = [kube.meta(p)["name"] for p in self.pods(namespace) if not p["spec"].get("nodeName")]
        return self.perform(*(effect("bind", "Pod", n, namespace, node=node) for n in unbound), at=at)

    def take_watch(self) -> list[tuple[str, str, str]]:
        """(change, kind, name) of the watch events collected since the last call."""
        out = [(change, obj["kind"], obj["metadata"]["name"]) for change, obj in self.watch]
        self.watch = []
        return out

    # ------------------------------------------------------------------ internals
    def _at(self, at: float | None) -> None:
        if at is not None:
            self.advance(at)

    def _collect(self) -> "SimHarness":
        self.watch.extend(self.sim.take_watch_events())
        for at, key in self.sim.take_timer_requests():
            heapq.heappush(self._timers, (at, self._seq, key))
            self._seq += 1
        return self
