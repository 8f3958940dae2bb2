"""The cluster link's watching process: ``muster run cluster`` watches in a child process of its own.

The link's two loops shared one event loop, and under load it was the loop, not the network, that
made a workload wait: publishing the watch (some 30 events a workload: parsing each, ingest,
encoding, two produce round trips a burst) took most of its CPU and applying effects (some 13
requests a workload) most of the rest, and the loop ran its timers late, in front of every watch
event and every effect (docs/design/runtime.md, "Where a loaded workload's wait goes"). Two processes take
two cores: the parent (``cluster_app``: the Lease, ``/metrics`` and ``/readyz``, the effects reader
and its applier) starts ``python -m shared.kubernetes.cluster_watch``, which lists and watches the API
server and publishes what changes (``ClusterBridge.watch`` and ``publish``, unchanged) with a
producer of its own, and tells the parent, one JSON line each on its standard output:

- ``{"connected": true}``: its API client is made (the link is ready once both sides are);
- ``{"listed": true}``: every watched resource listed once; the effects reader waits for it
  (``ClusterBridge.listed``), as a controller waits for its informers' caches to sync;
- ``{"gone": [namespace, name]}``: a pod deleted, which a bind waiting for an evicted victim's
  node needs (``KubeApplier.pod_gone``);
- ``{"pods_listed": true}``: every pod listed (again), after which the parent's applier asks after
  the evicted pods whose deletion no watch saw (``KubeApplier.pods_listed``);
- ``{"counts": {...}}``: its counters' increments since the last line (``muster_cluster_*``).

The child holds nothing the parent must keep: when it fails, it exits, and the parent says so in
``/readyz`` and starts another with backoff (``ClusterBridge.supervised``), which lists everything
again (the services drop the copies by id). When the parent goes (stopped, killed, the Lease lost),
the child's standard input ends and it exits at once: only a process holding the Lease watches.
A standby starts no child until it holds the Lease.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from typing import Any, Sequence

from aiokafka import AIOKafkaProducer

from shared.kubernetes.cluster import ClusterBridge, KubeTarget, first_to_end
from shared.runtime.bus import stagetrace
from shared.runtime.bus.app import BATCH_BYTES, send_records
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.worker import Record
from shared.runtime.service import collect_less

log = logging.getLogger("muster.cluster")

COUNTS_EVERY = 0.2
"""Seconds between two ``counts`` lines (sent only when a counter moved): a child killed loses at most
that much of its counts, which only ever undercount."""

STOP_WAIT = 5.0
"""Seconds the parent gives a stopped child to exit before it kills it."""

COUNTERS = ("observed", "unsent", "dead_letters", "retries")


class WatcherExited(RuntimeError):
    """The watching process ended (``WatchProcess.run``): the parent starts another."""


class WatchProcess:
    """The parent's side of the split: one child at a time, its lines applied to the parent's bridge."""

    def __init__(self, config: BusConfig, target: KubeTarget, bridge: ClusterBridge, *, loglevel: str = "info") -> None:
        self.config, self.target, self.bridge, self.loglevel = config, target, bridge, loglevel
        self.pid: int | None = None
        """The running child's process id (the bench counts its CPU with the parent's)."""

    def command(self) -> list[str]:
        """How the child is started: this interpreter, the target; the broker's settings go in its
        environment (``BusConfig.env``), never on a command line others can read."""
        args = [sys.executable, "-m", "shared.kubernetes.cluster_watch", "--log-level", self.loglevel]
        for flag, value in (("--kube-url", self.target.url), ("--kubeconfig", self.target.kubeconfig),
                            ("--context", self.target.context), ("--identity", self.target.identity)):
            if value:
                args += [flag, value]
        return args

    async def run(self) -> None:
        """Start a child and apply its lines until it ends (``WatcherExited``) or this is cancelled
        (the child is stopped: SIGTERM, then SIGKILL after ``STOP_WAIT``)."""
        self.bridge.listed.clear()  # the new child lists everything again; a restarted reader waits for it
        child = await asyncio.create_subprocess_exec(
            *self.command(), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env={**os.environ, **self.config.env()}, limit=1 << 20)
        self.pid = child.pid
        assert child.stdout is not None
        try:
            while line := await child.stdout.readline():
                await self.take(json.loads(line))
            raise WatcherExited(f"the watching process exited with code {await child.wait()}")
        finally:
            self.pid = None
            self.bridge.watch_connected(False)
            if child.returncode is None:
                child.terminate()
                try:
                    await asyncio.wait_for(child.wait(), STOP_WAIT)
                except asyncio.TimeoutError:
                    child.kill()
                    await child.wait()

    async def take(self, message: dict[str, Any]) -> None:
        """One line of the child's (the module docstring)."""
        bridge = self.bridge
        if "gone" in message:
            namespace, name = message["gone"]
            if bridge.applier is not None:
                await bridge.applier.pod_gone(namespace, name)
        elif "pods_listed" in message:
            if bridge.applier is not None:
                await bridge.applier.pods_listed()
        elif "counts" in message:
            counts = message["counts"]
            for counter in COUNTERS:
                setattr(bridge, counter, getattr(bridge, counter) + counts.get(counter, 0))
            bridge.refused.update(counts.get("refused", {}))
        elif "listed" in message:
            bridge.listed.set()
        elif "connected" in message:
            bridge.watch_connected(True)


class _Parent:
    """The child's line to the parent: its standard output, kept apart from anything printed (which
    goes to standard error), and its standard input, which ends when the parent does."""

    def __init__(self) -> None:
        self.fd = os.dup(1)
        os.dup2(2, 1)  # a stray print must not break the protocol

    def say(self, message: dict[str, Any]) -> None:
        """One line; a few hundred bytes, which a pipe takes whole (the parent reads continuously)."""
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data):]

    async def gone(self) -> None:
        """Return once the parent has closed our standard input (stopped or died)."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        await reader.read()


class _Producer:
    """``worker.Producer`` over a plain aiokafka producer set as the app's Faust producer is
    (``shared.runtime.bus.app.base_app``: acks from every in-sync replica, linger 0, ``BATCH_BYTES``), each
    call one explicit batch per partition (``send_records``)."""

    def __init__(self, config: BusConfig) -> None:
        self.producer = AIOKafkaProducer(**config.producing(), linger_ms=0, max_batch_size=BATCH_BYTES)

    async def send_all(self, records: Sequence[Record]) -> list[int]:
        trace = stagetrace.current()
        if trace is None:
            return await send_records(self.producer, records)
        started = time.time()
        offsets = await send_records(self.producer, records)
        trace.note("send", started, time.time(), trace.process, len(records))
        return offsets


async def _counts(bridge: ClusterBridge, parent: _Parent) -> None:
    """Every ``COUNTS_EVERY`` seconds, the counters' increments since the last line (when any moved)."""
    last: dict[str, Any] = {counter: 0 for counter in COUNTERS}
    refused: dict[str, int] = {}
    while True:
        await asyncio.sleep(COUNTS_EVERY)
        now = {counter: getattr(bridge, counter) for counter in COUNTERS}
        moved: dict[str, Any] = {k: now[k] - last[k] for k in COUNTERS if now[k] != last[k]}
        kinds = {kind: n - refused.get(kind, 0) for kind, n in bridge.refused.items() if n != refused.get(kind, 0)}
        if kinds:
            moved["refused"] = kinds
        if moved:
            parent.say({"counts": moved})
            last, refused = now, dict(bridge.refused)


async def _listed(bridge: ClusterBridge, parent: _Parent) -> None:
    await bridge.listed.wait()
    parent.say({"listed": True})
    await asyncio.Event().wait()  # first_to_end: this one does not end the child


async def watch(config: BusConfig, target: KubeTarget, parent: _Parent) -> None:
    """List, watch and publish until the parent goes (return) or something fails (raise)."""
    collect_less()
    bridge = ClusterBridge(config.topics)

    async def gone(namespace: str, name: str) -> None:
        parent.say({"gone": [namespace, name]})

    async def pods_listed() -> None:
        parent.say({"pods_listed": True})

    bridge.on_pod_gone, bridge.on_pods_listed = gone, pods_listed
    api = await target.connect()
    producer = _Producer(config)
    try:
        await producer.producer.start()
        parent.say({"connected": True})
        trace = stagetrace.current()
        probes = [trace.lag_probe()] if trace is not None else []
        await first_to_end(bridge.watch(api), bridge.publish(producer), _counts(bridge, parent),
                           _listed(bridge, parent), parent.gone(), *probes)
    finally:
        await producer.producer.stop()
        await api.close()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m shared.kubernetes.cluster_watch``: started by ``muster run cluster`` (``WatchProcess``),
    not by hand; the broker's settings come from the ``MUSTER_KAFKA*`` variables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kube-url")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context")
    parser.add_argument("--identity", default="")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s (watching): %(message)s")
    parent = _Parent()
    config = BusConfig.from_env()
    target = KubeTarget(args.kube_url, args.kubeconfig, args.context, identity=args.identity)
    stagetrace.start("cluster-watch")

    async def run() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):  # stopped by the parent (or ^C on its group)
            loop.add_signal_handler(signum, task.cancel)
        await watch(config, target, parent)

    try:
        asyncio.run(run())
    except (asyncio.CancelledError, BrokenPipeError):  # stopped, or the parent is gone
        pass
    except Exception:  # noqa: BLE001 - the parent starts another and says why in /readyz
        log.exception("the watching process failed")
        sys.exit(1)


if __name__ == "__main__":
    main()
