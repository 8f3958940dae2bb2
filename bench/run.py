"""``make bench``: every benchmark, figures written to bench/results.json (never asserted in tests).

Each section records the machine's load before and after it ran (``bench.stats.measured``): on a
shared 2-core machine a figure from a loaded minute must say so."""

from __future__ import annotations

import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

from bench import (bus_bench, contention_bench, e2e_bench, gpu_trace, kueue_bench, placement_bench, projector_bench,
                   replay_bench, scenario_bench)
from bench.stats import load, measured


SECTIONS = {"placement": placement_bench, "simulate": scenario_bench, "contention": contention_bench,
            "kueue": kueue_bench, "projector": projector_bench, "bus": bus_bench, "e2e": e2e_bench,
            "replay": replay_bench, "gpu_trace": gpu_trace}


def main(argv: list[str]) -> None:
    """Run every section, or only those named (``python -m bench.run kueue e2e``): a re-measured section
    replaces its figures in results.json and keeps the others, each section with its own time and load."""
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
        figures[name] = {"measured_at": started, **measured(SECTIONS[name].run)}
        print(json.dumps(figures[name], indent=2), flush=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
