"""``make bench``: every benchmark, figures written to bench/results.json (never asserted in tests)."""

from __future__ import annotations

import json
import platform
from datetime import datetime, timezone
from pathlib import Path

from bench import bus_bench, gpu_trace, placement_bench, projector_bench, replay_bench, scenario_bench


def main() -> None:
    figures: dict[str, object] = {
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
    }
    for name, bench in (("placement", placement_bench), ("simulate", scenario_bench),
                        ("projector", projector_bench), ("bus", bus_bench), ("replay", replay_bench),
                        ("gpu_trace", gpu_trace)):
        print(f"running {name} benchmark ...", flush=True)
        figures[name] = bench.run()
        print(json.dumps(figures[name], indent=2), flush=True)
    out = Path(__file__).with_name("results.json")
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
