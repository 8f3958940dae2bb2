"""``muster replay LOG --verify``: the verdict on a log, as a person reads it.

All decisions identical: a one-line summary, exit 0. The first divergence: what differs, the
recorded and the re-derived envelope, the input that caused them and its chain of causes back to
the watch event, then the summary; exit 1.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from shared.audit.chain import causes
from shared.audit.errors import DIVERGED, OK
from shared.audit.logfile import LogSource
from shared.audit.progress import progress_of
from shared.audit.replay import Divergence, Replayer, Tally
from shared.kernel.events import Envelope, to_json
from shared.kernel.policy import Policy


def summary(tally: Tally) -> str:
    return (f"{tally.events:,} events, {tally.derived:,} decisions re-derived: {tally.identical:,} identical, "
            f"{tally.different:,} different ({tally.wall_seconds:.2f}s, {tally.events_per_second:,.0f} events/s)")


def _line(env: Envelope | None, raw: bytes | None = None) -> str:
    if raw is not None:
        return raw.decode("utf-8", "replace")
    return to_json(env).decode() if env is not None else "-"


def show_divergence(d: Divergence, source: LogSource, out: Console) -> None:
    out.print(f"[bold red]DIVERGED[/] at {escape(d.where)} ({d.kind}): {escape(d.message)}")
    if d.blame:
        out.print(f"  why         {escape(d.blame)}")
    out.print(f"  recorded    {escape(_line(d.recorded, d.recorded_raw)) if d.recorded else '(not in the log)'}")
    derived = d.derived
    out.print(f"  re-derived  {escape(derived.data.decode()) if derived else '(nothing: no service derived it)'}")
    cause = d.cause
    cause_id = cause.id if cause is not None else (d.recorded.causation_id if d.recorded is not None else None)
    if cause is not None:
        out.print(f"  input       {escape(d.cause_where)}: {escape(_line(cause))}")
    if cause_id:
        chain = causes(source, cause_id, stop=d.where if d.kind != "unfinished" else None)
        for i, (where, env) in enumerate(chain):
            out.print(("  causes      " if i == 0 else "           <- ")
                      + escape(f"{where} {env.source} {env.type} {env.subject} ({env.id})"))


def run(source: LogSource, policy: Policy | None, out: Console, *, progress: bool = True,
        override: Policy | None = None) -> int:
    """Verify ``source``; print the verdict on ``out``; the exit code. ``policy`` is what the log starts
    with when its events do not say (its header's); ``override`` (``--policy``) decides throughout, and
    where it differs from a recorded policy that is said as the replay reaches it, before that
    service's decisions are compared."""
    replayer = Replayer(policy, check=True, override=override,
                        note=lambda text: out.print(f"[yellow]note:[/] {escape(text)}"))
    header = source.header
    out.print(f"[dim]verifying {escape(source.name)}: muster {escape(header.muster_version)}, schema "
              f"{header.schema_version}, origin {escape(header.origin)}[/]")
    try:
        with progress_of(source, "verifying", enabled=progress) as tick:
            for _ in replayer.run(source, tick):
                pass
    except Divergence as d:
        show_divergence(d, source, out)
        out.print(summary(replayer.tally))
        hint = source.hint()
        if hint:
            out.print(f"[yellow]note:[/] {escape(hint)}")
        return DIVERGED
    out.print(f"[green]OK[/]: {summary(replayer.tally)}")
    return OK
