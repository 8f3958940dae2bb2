"""Where a loaded workload's wait goes: ``e2e_bench``'s loaded run, with each hop's time read back
from the log. A diagnosis, not a figure (nothing here goes into results.json).

For each workload written in the measured part: when each kind of envelope about it was first
appended to the log (the Kafka record's timestamp), relative to when it was written into the API
server, p50 and p99 over the workloads, in the order they happen: seen by the watch, admitted,
enqueued, dequeued, placed, its effects, bound. A stage that adds seconds where the one before
adds milliseconds is the queue in front of that service.

Then, from each process's stage trace (``shared.runtime.bus.stagetrace``, on for the run) over the measured
part: how old records were when a fetch returned them, how long a batch and a send took, the
collections (their wall time, their CPU — the difference is waiting for a core — and the garbage
they found), how late the event loop ran a 10 ms timer, the effects' HTTP requests, the captures.

    python -m bench.e2e_stages [--nodes 200 --fill 150 --waiting 20 --workloads 50 --rate 50]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import re
import tempfile
import time
from contextlib import ExitStack
from typing import Any

from bench import e2e_bench
from bench.bus_bench import _log_reader
from bench.stats import percentile
from shared.kernel.events import Envelope
from shared.parts.kafka import broker_for
from shared.runtime.bus import codec, stagetrace
from shared.runtime.bus.config import BusConfig


async def _first_appended(config: BusConfig, names: set[str]) -> dict[str, dict[str, float]]:
    """RayCluster name -> stage -> wall time its first record was appended to the log."""
    seen: dict[str, dict[str, float]] = {}
    async with _log_reader(config) as (consumer, tp):
        end = (await consumer.end_offsets([tp]))[tp]
        position = 0
        while position < end:
            for message in (await consumer.getmany(tp, timeout_ms=1000, max_records=20_000)).get(tp, ()):
                position = message.offset + 1
                try:
                    env = codec.decode(message.value, message.headers)
                except codec.BadRecord:
                    continue
                found = re.search(r"\brc-\d+", env.subject) if isinstance(env, Envelope) else None
                if found is None or found.group(0) not in names:
                    continue
                p: Any = env.payload
                stage = f"seen {p.kind} {p.change}" if env.type == "ObjectChanged" else \
                    f"effect {p.op}" if env.type == "KubeEffect" else env.type
                seen.setdefault(found.group(0), {}).setdefault(stage, message.timestamp / 1000)
    return seen


def traced(folder: str, start: float, end: float) -> list[str]:
    """The stage traces of ``folder`` (``shared.runtime.bus.stagetrace``) between ``start`` and ``end`` (wall
    seconds), one line per process and kind: counts, p50 / p99 / max in ms."""
    found: dict[tuple[str, str], list[float]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
        process = os.path.basename(path).rsplit("-", 1)[0]  # <process>-<pid>.jsonl (``StageTrace``)
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                what, t = row[0], row[1]
                if not start <= t <= end:
                    continue
                if what == "fetch":
                    found.setdefault((row[2], "record age at fetch"), []).extend(row[3])
                elif what in ("batch", "send", "gc", "capture"):
                    found.setdefault((row[3], what if what != "gc" else f"gc gen{row[4]}"), []).append(row[2] - t)
                    if what == "gc" and len(row) > 6:
                        found.setdefault((row[3], f"gc gen{row[4]} cpu"), []).append(row[5])
                        found.setdefault((row[3], f"gc gen{row[4]} garbage"), []).append(row[6])
                elif what == "lag":
                    found.setdefault((row[2], "loop late >2ms"), []).append(row[3])
                elif what == "apply":
                    found.setdefault((process, f"apply {row[3]}"), []).append(row[2] - t)
                elif what == "publish":
                    found.setdefault((process, "publish burst"), []).append(row[2] - t)
    out = []
    for (process, what), values in sorted(found.items()):
        v = sorted(values)
        scale, unit = (1, "objects") if what.endswith("garbage") else (1000, "ms")
        out.append(f"{process:16s} {what:22s} n {len(v):6d}  p50 {scale * percentile(v, 0.5):8.1f}  "
                   f"p99 {scale * percentile(v, 0.99):8.1f}  max {scale * v[-1]:8.1f}  "
                   f"sum {scale * sum(v):9.0f} {unit}")
    return out


window: list[float] = []
"""The measured part of the last ``stages`` run: (first submission, last binding), wall seconds."""


def stages(nodes: int, fill: int, waiting: int, workloads: int, rate: float,
           folder: str | None = None) -> list[tuple[str, float, float]]:
    """(stage, p50 ms, p99 ms) after submission, in the order of their p50; with ``folder``, the
    processes' stage traces go there and ``window`` holds the measured part's (start, end)."""
    e2e_bench.NODES = nodes
    offset = time.time() - time.monotonic()  # the API server's times are monotonic, the log's wall
    rows: dict[str, list[float]] = {}

    def inspect(config: BusConfig, submitted: dict[str, tuple[float, list[str]]],
                bound: dict[tuple[str, str], float]) -> None:
        window[:] = [min(at for at, _ in submitted.values()) + offset, max(bound.values()) + offset]
        appended = asyncio.run(_first_appended(config, set(submitted)))
        for name, (at, pods) in submitted.items():
            written = at + offset
            for stage, when in appended.get(name, {}).items():
                rows.setdefault(stage, []).append(1000 * (when - written))
            last = max(bound[("bench", p)] for p in pods)
            rows.setdefault("bound (last pod)", []).append(1000 * (last - at))
            hops = appended.get(name, {})
            for stage, before in (("WorkloadSubmitted", "seen RayCluster Added"), ("effect bind", "PodAssigned"),
                                  ("bound (last pod)", "effect bind")):
                if before in hops and (stage in hops or stage.startswith("bound")):
                    end = last + offset if stage.startswith("bound") else hops[stage]
                    rows.setdefault(f"  {before} -> {stage}", []).append(1000 * (end - hops[before]))

    saved = os.environ.get(stagetrace.VARIABLE)
    if folder is not None:
        os.environ[stagetrace.VARIABLE] = folder  # the service processes inherit it
    try:
        with ExitStack() as stack:
            bootstrap, _ = broker_for(stack, None)
            e2e_bench._loaded_run(bootstrap, rate, workloads, fill, waiting, inspect=inspect)
    finally:
        if saved is None:
            os.environ.pop(stagetrace.VARIABLE, None)
        else:
            os.environ[stagetrace.VARIABLE] = saved
    out = [(stage, percentile(sorted(v), 0.5), percentile(sorted(v), 0.99)) for stage, v in rows.items()]
    return sorted(out, key=lambda row: row[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--fill", type=int, default=150)
    parser.add_argument("--waiting", type=int, default=20)
    parser.add_argument("--workloads", type=int, default=50)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--trace", help="keep the stage traces in this folder (default: a temporary one)")
    args = parser.parse_args()
    folder = args.trace or tempfile.mkdtemp(prefix="muster-stages-")
    os.makedirs(folder, exist_ok=True)
    for stage, p50, p99 in stages(args.nodes, args.fill, args.waiting, args.workloads, args.rate, folder):
        print(f"{stage:32s} p50 {p50:9.1f} ms   p99 {p99:9.1f} ms")
    print(f"stage traces ({folder}), over the measured part:")
    for line in traced(folder, *window):
        print(line)


if __name__ == "__main__":
    main()
