"""The human view of a run: per workload its phases and reasons over time, then queue usage."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from shared.kernel.eventtime import SCENARIO, TimeFormat
from shared.sim.check import Failure
from shared.kernel.display import plain

_STYLE = {"Rejected": "red", "Queued": "yellow", "Admitted": "cyan", "Running": "green",
          "Succeeded": "bold green", "Failed": "red", "Preempted": "magenta", "Deleted": "dim"}


def render_workload(key: str, w: dict[str, Any], console: Console, clock: TimeFormat = SCENARIO) -> None:
    """One workload's header and its transitions: how a run and the history store both show it (a
    deployment's times as ``clock`` shows them)."""
    gang = w["gang"]
    res = ", ".join(f"{k} {v}" for k, v in gang["resources"].items())
    phase = w["phase"] or "-"
    size = f"{gang['min_member']} ({plain(res)})" if gang["min_member"] else "-"  # refused before it was counted
    console.print(f"[bold]{plain(key)}[/] {plain(w['kind'] or '?')} queue={plain(w['queue'] or '-')} "
                  f"priority={w['priority']} gang={size} -> [{_STYLE.get(phase, '')}]{plain(phase)}[/]")
    table = Table(show_header=False, box=None, padding=(0, 1), pad_edge=False)
    table.add_column(justify="right", style="dim", no_wrap=True)
    table.add_column(no_wrap=True)
    table.add_column()
    for tr in w["transitions"]:
        table.add_row(clock.at(tr["t"]), f"[{_STYLE.get(tr['phase'], '')}]{plain(tr['phase'])}[/]", plain(tr["reason"]))
    console.print(table)


def render(result: dict[str, Any], console: Console, failures: list[Failure] | None = None,
           checked: bool = False, elastic: dict[str, tuple[float, str]] | None = None,
           warnings: dict[str, list[tuple[float, str]]] | None = None) -> None:
    """``elastic``: per workload, since when and why its elastic pods wait at the end; ``warnings``: what
    admission warned of on its object (neither is a field of the result document, whose shape outside
    checks read exactly)."""
    console.rule(f"[bold]{plain(result['scenario'])}")
    for key, w in result["workloads"].items():
        render_workload(key, w, console)
        placed: dict[str, dict[str, int]] = {}
        for pod in w["pods"]:
            if pod["node"] and pod["bound"] and pod["bound"][-1][1] is None:
                label = pod["pod_set"] + (f" gpu{pod['gpu']['devices']}x{pod['gpu']['fraction']:g}" if pod["gpu"] else "")
                per_node = placed.setdefault(pod["node"], {})
                per_node[label] = per_node.get(label, 0) + 1
        for t, warning in (warnings or {}).get(key, []):
            console.print(plain(f"   warning at {t:g}s: {warning}"), style="yellow")
        waiting = (elastic or {}).get(key)
        if waiting:
            console.print(plain(f"   elastic since {waiting[0]:g}s: {waiting[1]}"), style="dim")
        if placed:
            console.print(plain("   bound now: " + "; ".join(
                f"{node}: " + ", ".join(f"{label}" + (f" x{n}" if n > 1 else "") for label, n in sets.items())
                for node, sets in placed.items())), style="dim")
    table = Table(title="queues at the end", title_justify="left")
    for column in ("queue", "usage", "active", "pending", "backoff"):
        table.add_column(column)
    for name, qv in result["queues"].items():
        table.add_row(plain(name), plain(", ".join(f"{k} {v}" for k, v in qv["usage"].items()) or "-"),
                      plain("\n".join(qv["active"])) or "-",
                      plain("\n".join(f"{p['position']}. {p['workload']}" for p in qv["pending"])) or "-",
                      plain("\n".join(qv["backoff"])) or "-")
    console.print(table)
    stats = result["stats"]
    console.print(f"[dim]{stats['events']} events, {stats['decisions']} decisions, {stats['wall_seconds']:.2f}s wall[/]")
    if checked:
        if failures:
            console.print(f"[bold red]CHECK FAILED[/] ({len(failures)}):")
            for f in failures:
                console.print(f"  [red]✗[/] {plain(str(f))}")
        else:
            console.print("[bold green]CHECK PASSED[/]: every expectation holds")
