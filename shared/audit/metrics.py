"""What a history amounts to, per workload and per queue: admission waits, preemptions, GPU-hours,
jobs finished. Read off the folded log (``fold.AuditFold``), for ``muster report`` and the what-if.

A *wait* runs from the moment a workload is Queued (submitted, or sent back by a preemption) to
the moment its gang is Admitted; a wait still open at the end, or ended by a deletion, is *unadmitted*:
it counts in the workload's time waited and in the wait figures with its length so far, which is a
lower bound of the wait it would have had (the figures it can change say so). A wait a rejection
ended is neither: the workload stopped waiting for admission.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from shared.audit.fold import AuditFold

WAITING = ("Queued", "Preempted")
AT_LEAST = ("≥: at least — a workload never admitted (still waiting at the end, or deleted while waiting) counts "
            "with its wait so far")
"""The note under a table that shows a lower bound (a figure ``summary`` names in ``wait_lower_bounds``)."""
FINISHED = ("Succeeded", "Failed")


@dataclass
class WorkloadFigures:
    key: str
    queue: str | None
    phase: str | None
    waits: list[float] = field(default_factory=list)
    """Admission waits, each from Queued to Admitted."""
    unadmitted: list[float] = field(default_factory=list)
    """Waits no admission ended (still waiting at the end, or deleted while waiting): their length so far."""
    waited: float = 0.0
    """Every second spent waiting, open waits included (up to the end)."""
    first_admitted: float | None = None
    preempted: int = 0
    gpu_hours: float = 0.0
    finished: bool = False
    rejected: str | None = None
    """Admission's reason when it ends refused (no later submission took it back)."""

    def as_json(self) -> dict[str, Any]:
        return {"queue": self.queue, "phase": self.phase, "waits": self.waits, "unadmitted_waits": self.unadmitted,
                "waited": round(self.waited, 6),
                "first_admitted": self.first_admitted, "preempted": self.preempted,
                "gpu_hours": round(self.gpu_hours, 6), "finished": self.finished, "rejected": self.rejected}


def cell(value: Any, at_least: bool = False) -> str:
    """A figure as the report's and the what-if's tables print it: ``-`` for none, ``≥`` before a lower
    bound (a name ``summary`` lists in ``wait_lower_bounds``)."""
    if value is None:
        return "-"
    return ("≥" if at_least else "") + (f"{value:g}" if isinstance(value, float) else str(value))


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (a value that occurred); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def workload_figures(history: AuditFold, end: float) -> dict[str, WorkloadFigures]:
    """Per workload, up to event time ``end``."""
    out: dict[str, WorkloadFigures] = {}
    preempted: dict[str, int] = {}
    for p in history.preemptions:
        preempted[p.victim] = preempted.get(p.victim, 0) + 1
    for key in sorted(history.workloads):
        view = history.workloads[key]
        figures = WorkloadFigures(key, view.queue, view.phase, preempted=preempted.get(key, 0),
                                  finished=view.phase in FINISHED, rejected=view.rejected or None)
        since: float | None = None
        for tr in view.transitions:
            if tr["phase"] in WAITING:
                if since is None:
                    since = tr["t"]
            elif since is not None:
                figures.waited += tr["t"] - since
                if tr["phase"] == "Admitted":
                    figures.waits.append(round(tr["t"] - since, 6))
                elif tr["phase"] != "Rejected":
                    figures.unadmitted.append(round(tr["t"] - since, 6))
                since = None
            if tr["phase"] == "Admitted" and figures.first_admitted is None:
                figures.first_admitted = tr["t"]
        if since is not None:
            figures.waited += max(0.0, end - since)
            figures.unadmitted.append(round(max(0.0, end - since), 6))
        for pod in history.pods_of(key):
            gpus = len(pod.gpu["devices"]) * pod.gpu["fraction"] if pod.gpu else 0.0
            if gpus:
                for start, stop in pod.bound:
                    if start is not None:
                        figures.gpu_hours += gpus * (min(stop if stop is not None else end, end) - start) / 3600
        out[key] = figures
    return out


def summary(figures: Iterable[WorkloadFigures]) -> dict[str, Any]:
    """Admission wait p50/p95/max (unadmitted waits included, see the module docstring), preemptions,
    GPU-hours, jobs finished, over ``figures``. ``wait_lower_bounds`` names the wait figures an
    unadmitted wait can still raise: one at or below it (a longer wait could take its rank)."""
    figures = list(figures)
    waits = [w for f in figures for w in f.waits]
    unadmitted = [w for f in figures for w in f.unadmitted]
    every = waits + unadmitted
    stats = {"wait_p50": percentile(every, 50), "wait_p95": percentile(every, 95), "wait_max": max(every, default=None)}
    return {
        "workloads": len(figures),
        "admissions": len(waits),
        "unadmitted": len(unadmitted),
        **stats,
        "wait_lower_bounds": [k for k, v in stats.items() if v is not None and any(w <= v for w in unadmitted)],
        "preemptions": sum(f.preempted for f in figures),
        "gpu_hours": round(sum(f.gpu_hours for f in figures), 6),
        "finished": sum(1 for f in figures if f.finished),
        "still_waiting": sum(1 for f in figures if f.phase in WAITING),
    }


def per_queue(figures: dict[str, WorkloadFigures]) -> dict[str, dict[str, Any]]:
    """``summary`` for each queue, and ``(all)`` for every workload."""
    queues: dict[str, list[WorkloadFigures]] = {}
    for f in figures.values():
        queues.setdefault(f.queue or "(none)", []).append(f)
    out = {name: summary(members) for name, members in sorted(queues.items())}
    out["(all)"] = summary(figures.values())
    return out
