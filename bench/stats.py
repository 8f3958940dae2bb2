"""How every figure is reported: the median of several runs with their spread, and the machine's
load while they ran (this 2-core machine is shared; a figure from a loaded minute says so)."""

from __future__ import annotations

import os
import statistics
from typing import Any, Callable, Sequence


def spread(values: Sequence[float], digits: int = 2) -> dict[str, Any]:
    """``{"median", "min", "max", "runs"}`` of one figure's runs."""
    if not values:
        raise ValueError("a figure needs at least one run")
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits), "runs": [round(v, digits) for v in values]}


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """The value below which ``fraction`` of the (sorted) values lie, nearest rank."""
    if not sorted_values:
        raise ValueError("no values")
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


def load() -> dict[str, Any]:
    """The 1-, 5- and 15-minute load averages and the CPU count now."""
    one, five, fifteen = os.getloadavg()
    return {"loadavg": [round(one, 2), round(five, 2), round(fifteen, 2)], "cpus": os.cpu_count()}


def measured(bench: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one benchmark and record the machine's load before and after it."""
    before = load()
    figures = bench()
    return {**figures, "machine_load": {"before": before, "after": load()}}
