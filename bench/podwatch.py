"""When a bench's pods were first seen and first seen bound, by the bench's own watches: one clock for
every scheduler a bench compares (``cluster_bench``: muster against kube-scheduler; ``peers_bench``:
muster against Volcano and KAI), so both sides are measured alike.

``PodTimes`` is the record, fed one watch line at a time; ``PodWatch`` feeds it from ``kubectl get
--watch`` processes (pods, and RayClusters when a figure runs from a RayCluster's creation), each
started again when the API server ends its watch: the fresh list shows what happened meanwhile, seen
late (``restarts`` counts them).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from shared.parts import catalog

POD_LINE = 'jsonpath={.metadata.name} {.spec.nodeName} {.metadata.labels.ray\\.io/cluster}{"\\n"}'
"""What the pods' watch prints of each pod: its name, its node (empty until bound), its RayCluster (empty
for a pod of none). Three words a line, none holding a space; far less for kubectl to print and the
bench to read than each pod's JSON."""
NAME_LINE = 'jsonpath={.metadata.name}{"\\n"}'


class PodTimes:
    """The instant each pod was first seen and first seen bound (by pod name), each RayCluster's first
    sighting (its creation, as near as a watcher can tell), and the RayCluster each pod belongs to."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.clusters: dict[str, float] = {}
        self.cluster_of: dict[str, str] = {}

    def pod(self, line: str, now: float) -> None:
        """One line of the pods' watch (``POD_LINE``), read at ``now``."""
        name, _, rest = line.strip("\n").partition(" ")
        node, _, cluster = rest.partition(" ")
        if not name:
            return
        self.seen.setdefault(name, now)
        if cluster:
            self.cluster_of[name] = cluster
        if node and name not in self.bound:
            self.bound[name] = now

    def raycluster(self, line: str, now: float) -> None:
        """One line of the RayClusters' watch (``NAME_LINE``), read at ``now``."""
        name = line.strip()
        if name:
            self.clusters.setdefault(name, now)

    def latencies(self) -> list[float]:
        """Per RayCluster (or pod of none): from its first sighting to its last pod bound, sorted."""
        last: dict[tuple[str, str], float] = {}
        for name, at in self.bound.items():
            cluster = self.cluster_of.get(name)
            group = ("raycluster", cluster) if cluster else ("pod", name)
            last[group] = max(last.get(group, 0.0), at)
        return sorted(at - (self.clusters[name] if kind == "raycluster" else self.seen[name])
                      for (kind, name), at in last.items())


class PodWatch(PodTimes):
    """``PodTimes`` of ``namespace``'s pods (and, with ``rayclusters``, its RayClusters) from ``kubectl get
    --watch`` processes of this bench, from now until ``close``."""

    def __init__(self, kubeconfig: Path, namespace: str, *, rayclusters: bool = False) -> None:
        super().__init__()
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.restarts = 0
        """Watches the API server ended and this one started again: > 0, some sightings came late."""
        self._closed = False
        self._procs: dict[str, subprocess.Popen[str]] = {}
        follow = [("pods", POD_LINE, self.pod)]
        if rayclusters:
            follow.append(("rayclusters.ray.io", NAME_LINE, self.raycluster))
        for resource, output, take in follow:
            threading.Thread(target=self._follow, args=(resource, output, take), daemon=True).start()

    def _follow(self, resource: str, output: str, take: Callable[[str, float], None]) -> None:
        """Watch ``resource`` until closed, starting the watch again whenever kubectl ends it."""
        while not self._closed:
            proc = subprocess.Popen([catalog.binary("kubernetes", "kubectl"), "--kubeconfig", str(self.kubeconfig),
                                     "get", resource, "-n", self.namespace, "--watch", "-o", output],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._procs[resource] = proc
            assert proc.stdout is not None
            for line in proc.stdout:
                take(line, time.monotonic())
            proc.wait()
            if not self._closed:
                self.restarts += 1

    def wait_seen(self, pods: int, timeout: float) -> None:
        self._wait(lambda: len(self.seen) >= pods, timeout, lambda: f"{len(self.seen)} of {pods} pods created")

    def wait_bound(self, pods: int, timeout: float) -> None:
        self._wait(lambda: len(self.bound) >= pods, timeout, lambda: f"{len(self.bound)} of {pods} pods bound")

    @staticmethod
    def _wait(done: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what()} after {timeout:g} s")
            time.sleep(0.05)

    def close(self) -> None:
        self._closed = True
        for proc in self._procs.values():
            proc.terminate()
            proc.wait(timeout=10)
