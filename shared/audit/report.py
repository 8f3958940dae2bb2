"""``muster report``: one self-contained HTML page about a history, to look at in any browser
offline — plotly.js is written into the page itself, nothing is fetched.

    workloads   a Gantt chart: each workload's phases over time (queued, admitted, running, preempted)
    usage       per resource, each queue's usage over time against its guarantee and limit
    waits       the admission-wait distribution per queue
    table       every preemption: when, victim, preemptor, rule, reason, the decision's id

All of it is read off the folded log (``fold.AuditFold``, ``metrics``); the page's chart divs carry
the ids above (``chart-workloads``, ``chart-usage-<resource>``, ``chart-waits``), which the test
that opens the page in a headless browser looks for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared.audit.fold import AuditFold
from shared.audit.metrics import AT_LEAST, cell, per_queue, workload_figures
from shared.kernel import quantity as q
from shared.kernel.eventtime import SCENARIO, TimeFormat
from shared.kernel.display import html_text

COLOURS = {"Queued": "#f2b134", "Admitted": "#4ea1d3", "Running": "#3cb371", "Preempted": "#c2185b"}
DRAWN = tuple(COLOURS)
MAX_ROWS = 400
"""Workloads drawn in the Gantt chart at most (the first ones to arrive); the page says when it cut."""


def _unit(resource: str) -> tuple[float, str]:
    if resource == q.MEMORY:
        return 1000 * 2**30, "GiB"
    return 1000, "GPUs" if resource == q.GPU else ("cores" if resource == q.CPU else "")


def _segments(history: AuditFold, end: float) -> dict[str, list[tuple[str, float, float]]]:
    """Phase -> (workload, start, duration) of every stretch a workload spent in it."""
    out: dict[str, list[tuple[str, float, float]]] = {p: [] for p in DRAWN}
    views = sorted(history.workloads.values(), key=lambda v: v.order)[:MAX_ROWS]
    for view in views:
        stretches: list[tuple[str, float]] = []
        for tr in view.transitions:
            if not stretches or stretches[-1][0] != tr["phase"]:
                stretches.append((tr["phase"], tr["t"]))
        for i, (phase, start) in enumerate(stretches):
            stop = stretches[i + 1][1] if i + 1 < len(stretches) else end
            if phase in out and stop > start:  # a phase left at the instant it was entered has no width
                out[phase].append((view.key, start, stop - start))
    return out


def _time_axis(clock: TimeFormat) -> dict[str, Any]:
    """The x axis of a chart over time: a date axis in a deployment's log (its zone named), event seconds
    in a simulated run."""
    if not clock.wall:
        return {"title": "event time (s)"}
    return {"title": f"time ({clock.zone()})", "type": "date"}


def figures(history: AuditFold, end: float, clock: TimeFormat = SCENARIO) -> dict[str, Any]:
    """The page's plotly figures by div id; instants on date axes in a deployment's log (``clock``)."""
    import plotly.graph_objects as go

    out: dict[str, Any] = {}
    gantt = go.Figure()
    rows = sorted(history.workloads.values(), key=lambda v: v.order)[:MAX_ROWS]
    for phase, segments in _segments(history, end).items():
        if not segments:
            continue
        if clock.wall:  # a date axis: a bar starts at a date and is as long as its milliseconds
            gantt.add_trace(go.Bar(name=phase, orientation="h", y=[html_text(s[0]) for s in segments],
                                   base=[clock.plot_time(s[1]) for s in segments], x=[s[2] * 1000 for s in segments],
                                   customdata=[[clock.at(s[1]), clock.duration(s[2])] for s in segments],
                                   marker_color=COLOURS[phase],
                                   hovertemplate="%{y}<br>" + phase + " from %{customdata[0]} for %{customdata[1]}"
                                                 "<extra></extra>"))
        else:
            gantt.add_trace(go.Bar(name=phase, orientation="h", y=[html_text(s[0]) for s in segments],
                                   base=[s[1] for s in segments], x=[s[2] for s in segments],
                                   marker_color=COLOURS[phase],
                                   hovertemplate="%{y}<br>" + phase + " from %{base:g}s for %{x:g}s<extra></extra>"))
    shown = {v.key for v in rows}
    hits = [p for p in history.preemptions if p.victim in shown]
    if hits:  # a preemption is an instant: marked where it struck
        gantt.add_trace(go.Scatter(name="preempted", mode="markers", y=[html_text(p.victim) for p in hits],
                                   x=[clock.plot_time(p.t) for p in hits],
                                   marker={"symbol": "x", "size": 11, "color": COLOURS["Preempted"]},
                                   text=[html_text(f"by {p.preemptor} ({'reclaim' if p.reclaim else 'priority'})") for p in hits],
                                   customdata=[clock.at(p.t) for p in hits],
                                   hovertemplate="%{y}<br>preempted at %{customdata} %{text}<extra></extra>"
                                   if clock.wall else "%{y}<br>preempted at %{x:g}s %{text}<extra></extra>"))
    gantt.update_layout(barmode="overlay", title="Workloads by phase over time", xaxis=_time_axis(clock),
                        yaxis={"categoryorder": "array", "categoryarray": [html_text(v.key) for v in rows][::-1]},
                        height=max(300, 22 * len(rows) + 120), legend_title="phase")
    out["chart-workloads"] = gantt

    series = history.series
    resources = sorted({r for sample in (series.usage if series else []) for u in sample.values() for r in u}
                       | {r for spec in history.queues.values() for r in (*spec.guarantee, *spec.limit)})
    for resource in resources:
        scale, unit = _unit(resource)
        fig = go.Figure()
        times = (series.times + [end]) if series and series.times and end > series.times[-1] else \
            (series.times if series else [])
        for name in sorted({n for sample in series.usage for n in sample} | set(history.queues)) if series else []:
            values = [sample.get(name, {}).get(resource, 0) / scale for sample in series.usage]
            values += values[-1:] * (len(times) - len(values))  # held until the end
            fig.add_trace(go.Scatter(name=html_text(f"{name} usage"), x=[clock.plot_time(t) for t in times], y=values,
                                     mode="lines", line_shape="hv"))
            spec = history.queues.get(name)
            for label, amount, dash in (("guarantee", spec.guarantee_of(resource) if spec else None, "dot"),
                                        ("limit", spec.limit_of(resource) if spec else None, "dash")):
                if amount:
                    fig.add_trace(go.Scatter(name=html_text(f"{name} {label}"),
                                             x=[clock.plot_time(series.times[0]), clock.plot_time(end)],
                                             y=[amount / scale] * 2, mode="lines", line={"dash": dash}))
        fig.update_layout(title=f"Queue usage of {resource} against guarantee and limit", xaxis=_time_axis(clock),
                          yaxis_title=unit or resource, height=380)
        out[f"chart-usage-{_slug(resource)}"] = fig

    per_workload = workload_figures(history, end)
    waits = go.Figure()
    by_queue: dict[str, list[float]] = {}
    for f in per_workload.values():
        by_queue.setdefault(f.queue or "(none)", []).extend(f.waits)
    for name, values in sorted(by_queue.items()):
        waits.add_trace(go.Box(name=html_text(name), y=values, boxpoints="all", jitter=0.3))
    waits.update_layout(title="Admission wait per queue (Queued to Admitted)", yaxis_title="seconds", height=380,
                        showlegend=False)
    out["chart-waits"] = waits
    return out


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text)


def _table(history: AuditFold, clock: TimeFormat = SCENARIO) -> str:
    """Every preemption, when as ``clock`` shows it."""
    when = "t (s)" if not clock.wall else html_text(f"time ({clock.zone()})")
    head = (f"<tr><th>{when}</th><th>victim</th><th>queue</th><th>preemptor</th><th>priority</th><th>rule</th>"
            "<th>reason</th><th>decision</th></tr>")
    rows = "".join(
        f"<tr><td>{f'{p.t:g}' if not clock.wall else html_text(clock.at(p.t))}</td>"
        f"<td>{html_text(p.victim)}</td><td>{html_text(p.victim_queue or '')}</td>"
        f"<td>{html_text(p.preemptor)}</td><td>{p.preemptor_priority}</td>"
        f"<td>{'reclaim' if p.reclaim else 'priority preemption'}</td><td>{html_text(p.reason)}</td>"
        f"<td><code>{p.event_id}</code></td></tr>" for p in history.preemptions)
    if not rows:
        rows = '<tr><td colspan="8">no preemptions</td></tr>'
    return f'<table id="preemptions">{head}{rows}</table>'


def _summary_table(history: AuditFold, end: float) -> str:
    stats = per_queue(workload_figures(history, end))
    head = ("<tr><th>queue</th><th>workloads</th><th>admissions</th><th>wait p50 (s)</th><th>wait p95 (s)</th>"
            "<th>wait max (s)</th><th>preemptions</th><th>GPU-hours</th><th>finished</th><th>still waiting</th></tr>")

    rows = "".join(
        f"<tr><td>{html_text(name)}</td>" + "".join(
            f"<td>{cell(s[k], k in s['wait_lower_bounds'])}</td>" for k in (
                "workloads", "admissions", "wait_p50", "wait_p95", "wait_max", "preemptions", "gpu_hours", "finished",
                "still_waiting")) + "</tr>" for name, s in stats.items())
    bounds = any(s["wait_lower_bounds"] for s in stats.values())
    return f'<table id="queues">{head}{rows}</table>' + (f'<p class="note">{html_text(AT_LEAST)}</p>' if bounds else "")


STYLE = """body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0 24px}
td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px;text-align:left;vertical-align:top}th{background:#f4f4f4}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}.note{color:#666;font-size:13px}"""


def chart(div_id: str, fig: Any) -> str:
    """A figure as a div of the page (plotly.js itself is in the page's head, once)."""
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


def page(title: str, body: str) -> str:
    """A whole self-contained page: plotly.js inline, no request leaves it."""
    from plotly.offline import get_plotlyjs

    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html_text(title)}</title>
<style>{STYLE}</style>
<script type="text/javascript">{get_plotlyjs()}</script></head>
<body><h1>{html_text(title)}</h1>
{body}
</body></html>
"""


def render(history: AuditFold, end: float, *, title: str, window: str | None = None,
           clock: TimeFormat = SCENARIO) -> str:
    """The whole report; ``window`` is the header's note when the log is a window of a history
    (``LogHeader.window_note``), said above every figure; instants as ``clock`` shows them."""
    parts = [chart(div_id, fig) for div_id, fig in figures(history, end, clock).items()]
    note = (f'<p class="note">The chart shows the first {MAX_ROWS} of {len(history.workloads)} workloads.</p>'
            if len(history.workloads) > MAX_ROWS else "")
    said = f'<p class="note" id="window"><strong>{html_text(window)}</strong></p>\n' if window else ""
    return page(title, f"""{said}<p class="note">{len(history.workloads)} workloads, {history.events} events, event time
{html_text(clock.at(history.first_at or 0))} to {html_text(clock.at(end))}. Generated by muster report from the event log.</p>
<h2>Queues</h2>{_summary_table(history, end)}
<h2>Workloads</h2>{note}{parts[0]}
<h2>Queue usage</h2>{''.join(parts[1:-1]) or '<p class="note">no quota was used</p>'}
<h2>Admission waits</h2>{parts[-1]}
<h2>Preemptions</h2>{_table(history, clock)}""")


def write_report(history: AuditFold, out: Path, *, title: str, end: float | None = None,
                 window: str | None = None, clock: TimeFormat = SCENARIO) -> None:
    """Write the page to ``out`` (to the history's last event time unless ``end`` says otherwise)."""
    out.write_text(render(history, history.now if end is None else end, title=title, window=window, clock=clock),
                   encoding="utf-8")
