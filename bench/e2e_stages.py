"""Where a loaded workload's wait goes: ``e2e_bench``'s loaded run, with each hop's time read back
from the log. A diagnosis, not a figure (nothing here goes into results.json).

For each workload written in the measured part: when each kind of envelope about it was first
appended to the log (the Kafka record's timestamp), relative to when it was written into the API
server, p50 and p99 over the workloads, in the order they happen: seen by the watch, admitted,
enqueued, dequeued, placed, its effects, bound. A stage that adds seconds where the one before
adds milliseconds is the queue in front of that service.

    python -m bench.e2e_stages [--nodes 200 --fill 150 --waiting 20 --workloads 50 --rate 50]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from typing import Any

from bench import e2e_bench
from bench.bus_bench import _log_reader
from bench.stats import percentile
from shared.bus import codec
from shared.bus.config import BusConfig
from shared.bus.localbroker import LocalBroker
from shared.events import Envelope


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


def stages(nodes: int, fill: int, waiting: int, workloads: int, rate: float) -> list[tuple[str, float, float]]:
    """(stage, p50 ms, p99 ms) after submission, in the order of their p50."""
    e2e_bench.NODES = nodes
    offset = time.time() - time.monotonic()  # the API server's times are monotonic, the log's wall
    rows: dict[str, list[float]] = {}

    def inspect(config: BusConfig, submitted: dict[str, tuple[float, list[str]]],
                bound: dict[tuple[str, str], float]) -> None:
        appended = asyncio.run(_first_appended(config, set(submitted)))
        for name, (at, pods) in submitted.items():
            written = at + offset
            for stage, when in appended.get(name, {}).items():
                rows.setdefault(stage, []).append(1000 * (when - written))
            rows.setdefault("bound (last pod)", []).append(1000 * (max(bound[("bench", p)] for p in pods) - at))

    with LocalBroker() as broker:
        e2e_bench._loaded_run(broker.bootstrap, rate, workloads, fill, waiting, inspect=inspect)
    out = [(stage, percentile(sorted(v), 0.5), percentile(sorted(v), 0.99)) for stage, v in rows.items()]
    return sorted(out, key=lambda row: row[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--fill", type=int, default=150)
    parser.add_argument("--waiting", type=int, default=20)
    parser.add_argument("--workloads", type=int, default=50)
    parser.add_argument("--rate", type=float, default=50.0)
    args = parser.parse_args()
    for stage, p50, p99 in stages(args.nodes, args.fill, args.waiting, args.workloads, args.rate):
        print(f"{stage:32s} p50 {p50:9.1f} ms   p99 {p99:9.1f} ms")


if __name__ == "__main__":
    main()
