"""The human views of the store: a workload's timeline (``muster history``), queues (``muster queues``).

Same look as ``muster simulate``'s timeline (shared/sim/timeline.py): phase colours, ``10s`` times (a
deployment's as ISO 8601, ``shared.kernel.eventtime``).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from shared.kernel.eventtime import SCENARIO, TimeFormat
from shared.sim.timeline import render_workload
from shared.kernel.display import plain


def _at(clock: TimeFormat, t: float | None) -> str:
    return "" if t is None else clock.at(t)


def render_history(doc: dict[str, Any], console: Console, clock: TimeFormat = SCENARIO) -> None:
    """``muster history``: the workload's timeline, then its pods and when each was bound."""
    render_workload(doc["workload"], doc, console, clock)
    if not doc["pods"]:
        console.print("[dim]no pods[/]")
        return
    pods = Table(title="pods", title_justify="left", box=None, padding=(0, 1), pad_edge=False)
    for column in ("pod", "set", "node", "gpu", "bound"):
        pods.add_column(column, no_wrap=column != "bound")
    for pod in doc["pods"]:
        gpu = pod["gpu"]
        gpu_text = f"{gpu['devices']} x{gpu['fraction']:g}" if gpu else "-"
        bound = ", ".join(f"{_at(clock, a)}-{_at(clock, b)}" for a, b in pod["bound"]) or "never bound"
        pods.add_row(plain(pod["name"]), plain(pod["pod_set"]), plain(pod["node"] or "-"), plain(gpu_text),
                     plain(bound))
    console.print(pods)


def render_queues(report: dict[str, dict[str, Any]], console: Console, at: float | None = None,
                  clock: TimeFormat = SCENARIO) -> None:
    """``muster queues``: usage against guarantee and limit per queue (now, or at ``at``)."""
    title = f"queues at {clock.at(at)}" if at is not None else "queues"
    table = Table(title=title, title_justify="left")
    for column in ("queue", "parent", "resource", "used", "guarantee", "limit"):
        table.add_column(column, no_wrap=True)
    if at is None:
        table.add_column("workloads")
    for name, entry in report.items():
        resources = sorted(set(entry["usage"]) | set(entry["guarantee"]) | set(entry["limit"])) or ["-"]
        label = plain(name) + ("" if entry["defined"] else " [dim](implicit)[/]" if not entry.get("rejected")
                                else " [red](rejected)[/]")
        for i, resource in enumerate(resources):
            row = [label if i == 0 else "", plain(entry["parent"] or "-") if i == 0 else "", plain(resource),
                   entry["usage"].get(resource, "0" if resource != "-" else "-"),
                   entry["guarantee"].get(resource, "-"), entry["limit"].get(resource, "-")]
            if at is None:
                row.append(f"{len(entry['active'])} active, {len(entry['waiting'])} waiting" if i == 0 else "")
            table.add_row(*row)
    console.print(table)
    for name, entry in report.items():
        if entry.get("rejected"):
            console.print(f"[red]{plain(name)}[/]: {plain(entry['rejected'])}")
