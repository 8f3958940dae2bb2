"""``make bench``: every benchmark, figures written to bench/results.json (never asserted in tests).

Each section records the machine's load before and after it ran (``bench.stats.measured``): on a
shared 2-core machine a figure from a loaded minute must say so."""

from __future__ import annotations

import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from bench import (bus_bench, cluster_bench, contention_bench, e2e_bench, gpu_trace, kueue_bench, peers_bench,
                   placement_bench, projector_bench, replay_bench, restart_bench, scenario_bench, soak_bench)
from bench.stats import load, measured


SECTIONS: dict[str, Callable[[], dict[str, Any]]] = {
    "placement": placement_bench.run_all, "simulate": scenario_bench.run, "simulate_store": scenario_bench.run_store,
    "contention": contention_bench.run,
    "kueue": kueue_bench.run, "projector": projector_bench.run, "bus": bus_bench.run,
    "tracing": bus_bench.run_tracing, "e2e": e2e_bench.run, "replay": replay_bench.run, "gpu_trace": gpu_trace.run,
    "soak": soak_bench.run, "restart": restart_bench.run, "cluster": cluster_bench.run,
    "peers": peers_bench.run}


def main(argv: list[str]) -> None:
    """Run every section, or only those named (``python -m bench.run kueue e2e``): a re-measured section
    replaces its figures in results.json and keeps the others, each section with its own time and load.
    The file is written after each section, so a run stopped part way keeps the sections it finished."""
    unknown = [name for name in argv if name not in SECTIONS]
    if unknown:
        raise SystemExit(f"unknown benchmark section {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    out = Path(__file__).with_name("results.json")
    figures: dict[str, object] = json.loads(out.read_text()) if argv and out.exists() else {}
    figures["machine"] = {"python": platform.python_version(), "cpus": load()["cpus"]}
    figures.pop("measured_at", None)
    for name in argv or list(SECTIONS):
        print(f"running {name} benchmark ...", flush=True)
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        figures[name] = {"measured_at": started, **measured(SECTIONS[name])}
        print(json.dumps(figures[name], indent=2), flush=True)
        out.write_text(json.dumps(figures, indent=2) + "\n")  # each section kept as it ends: a run cut short keeps them
        print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
