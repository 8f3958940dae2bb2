"""``muster replay --verify`` on a 1,000,000-event log: every decision re-derived and compared.

The log comes from ``muster simulate`` on a generated scenario sized to give at least ``EVENTS``
envelopes: the 2,000 nodes of the simulate benchmark, four Volcano queues, RayJobs of a head and
four workers arriving every 50 ms, each running 30-120 s and shutting its cluster down when done, so
capacity is used again and again (watch events with whole pod objects, effects, placements,
timers: the real mix). The run streams its log straight into an exported file (a million envelopes
held in memory would take gigabytes) under the system's temp folder, kept between benchmark runs
while the code that decides is the same (``MUSTER_BENCH_CACHE`` moves it); generating it takes
minutes and is not measured.

Measured: ``verify`` over the file, wall time, ``RUNS`` times, the median and the spread; and, as
the floor of what is not the cores, reading and decoding the same file alone. Figures only, never
asserted. ``python -m bench.replay_bench 50000`` runs it on a smaller log.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.projector_bench import generated_scenario
from shared.audit.header import LogHeader
from shared.audit.logfile import LogFile, decode
from shared.audit.replay import Replayer
from shared.kernel.events import Envelope, to_json
from shared.runtime.build import code_digest
from shared.runtime.embedded import EmbeddedRuntime
from shared.runtime.simulate import new_cluster, play
from shared.sim.scenario import parse_scenario

EVENTS = 1_000_000
RUNS = int(os.environ.get("MUSTER_BENCH_REPLAY_RUNS", "3"))
TARGET = 50_000
EVENTS_PER_JOB = 74
"""About what one RayJob of this scenario adds to the log (measured), to size the scenario."""


class _Stream(list):
    """The runtime's ``log``, written through to the file instead of kept (``append`` only)."""

    def __init__(self, out: Any) -> None:
        super().__init__()
        self.out = out
        self.count = 0

    def append(self, env: Envelope) -> None:  # type: ignore[override]
        self.out.write(to_json(env))
        self.out.write(b"\n")
        self.count += 1


def _code_digest() -> str:
    """The code that makes the log's decisions: a cached log made by other code would not verify (its
    decisions are the old code's), so it is made again."""
    return code_digest(Path(__file__))


def log_file(events: int = EVENTS) -> Path:
    """The cached log of at least ``events`` envelopes, generated if missing (older ones removed)."""
    folder = Path(os.environ.get("MUSTER_BENCH_CACHE", Path(tempfile.gettempdir()) / "muster-bench"))
    folder.mkdir(parents=True, exist_ok=True)
    jobs = events // EVENTS_PER_JOB + 1
    path = folder / f"replay-{jobs}-jobs-{_code_digest()}.jsonl"
    if path.exists():
        return path
    for stale in folder.glob(f"replay-{jobs}-jobs-*.jsonl*"):
        stale.unlink()
    scenario = parse_scenario(generated_scenario(2000, jobs, every=0.05, shutdown=True,
                                                 name=f"replay-bench-{jobs}"), origin="generated")
    policy = scenario.effective_policy()
    header = LogHeader.made_now(policy, origin="simulate", scenario=scenario.name, until=scenario.until)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as out:
        out.write(header.line())
        runtime = EmbeddedRuntime(policy, new_cluster(scenario, policy))
        runtime.log = stream = _Stream(out)
        play(scenario, policy, runtime)
        out.write(b'{"muster_log_end":{"events":%d}}\n' % stream.count)
    partial.replace(path)
    return path


def _verify(path: Path) -> tuple[float, int, int]:
    source = LogFile(path)
    replayer = Replayer(source.header.decided_with())
    started = time.perf_counter()
    for _ in replayer.run(source):
        pass
    seconds = time.perf_counter() - started
    assert replayer.tally.different == 0
    return seconds, replayer.tally.events, replayer.tally.identical


def _decode_only(path: Path) -> tuple[float, int]:
    started = time.perf_counter()
    n = 0
    for record in LogFile(path).records():
        decode(record)
        n += 1
    return time.perf_counter() - started, n


def run(events: int = EVENTS) -> dict[str, Any]:
    started = time.perf_counter()
    path = log_file(events)
    generated = time.perf_counter() - started
    runs = [_verify(path) for _ in range(RUNS)]
    seconds = [r[0] for r in runs]
    n, decisions = runs[0][1], runs[0][2]
    decode_seconds, _ = _decode_only(path)
    rates = sorted(round(n / s) for s in seconds)
    return {
        "replay_events": n,
        "replay_decisions_identical": decisions,
        "replay_log_bytes": path.stat().st_size,
        "replay_generate_seconds": round(generated, 1),
        "replay_runs_wall_seconds": [round(s, 2) for s in seconds],
        "replay_runs_events_per_second": rates,
        "replay_events_per_second": round(statistics.median(n / s for s in seconds)),
        "replay_target_events_per_second": TARGET,
        "replay_read_and_decode_only_events_per_second": round(n / decode_seconds),
    }


if __name__ == "__main__":
    print(run(int(sys.argv[1]) if len(sys.argv) > 1 else EVENTS))
