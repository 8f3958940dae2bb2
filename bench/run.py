"""``make bench``: every benchmark, figures written to bench/results.json (never asserted in tests).

Each section records the machine's load before and after it ran (``bench.stats.measured``): on a
shared 2-core machine a figure from a loaded minute must say so."""

from __future__ import annotations

import json
import platform
from datetime import datetime, timezone
from pathlib import Path

from bench import (bus_bench, contention_bench, e2e_bench, gpu_trace, kueue_bench, placement_bench, projector_bench,
                   replay_bench, restart_bench, scenario_bench, soak_bench)
from bench.stats import load, measured


def main() -> None:
    figures: dict[str, object] = {
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), **load()},
    }
    for name, bench in (("placement", placement_bench), ("simulate", scenario_bench),
                        ("contention", contention_bench), ("kueue", kueue_bench),
                        ("projector", projector_bench), ("bus", bus_bench), ("e2e", e2e_bench),
                        ("replay", replay_bench), ("gpu_trace", gpu_trace), ("soak", soak_bench),
                        ("restart", restart_bench)):
        print(f"running {name} benchmark ...", flush=True)
        figures[name] = measured(bench.run)
        print(json.dumps(figures[name], indent=2), flush=True)
    out = Path(__file__).with_name("results.json")
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
