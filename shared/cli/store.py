"""The history store's commands: ``muster history``, ``muster queues``, ``muster db upgrade|downgrade``."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console

from shared.cli.errors import failed
from shared.cli.options import LOCAL_HELP, STORE_HELP, TIME_HELP, resolved, time_arg
from shared.kernel.eventtime import TimeArg
from shared.kernel.display import plain


def history_cmd(
    workload: str = typer.Argument(..., metavar="NAMESPACE/NAME", help="The workload, e.g. default/test-cluster-0."),
    store: Optional[str] = typer.Option(None, "--store", envvar="MUSTER_STORE", help=STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the timeline as JSON (the result document's shape)."),
    local: bool = typer.Option(False, "--local", help=LOCAL_HELP),
) -> None:
    """Print a workload's timeline from the history store: phases, reasons, placements."""
    from shared.history import StoreError
    from shared.history.engine import display, resolve_url
    from shared.history.header import time_format
    from shared.history.query import similar_workloads, workload_history
    from shared.history.render import render_history

    namespace, _, name = workload.partition("/")
    if not namespace or not name or "/" in name:
        raise failed(ValueError(f"{workload!r}: name the workload as NAMESPACE/NAME, e.g. default/my-job"))
    try:
        url = resolve_url(store)
        doc = workload_history(url, workload)
        similar = similar_workloads(url, workload) if doc is None else []
        clock = time_format(url, local=local)
    except StoreError as exc:
        raise failed(exc) from None
    if doc is None:
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        err.print(f"[red]error:[/] no workload {plain(workload)} in the history at {plain(display(url))}"
                  + (f"; did you mean {plain(', '.join(similar))}?" if similar else ""))
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    render_history(doc, Console(highlight=False, width=max(Console().width, 120)), clock)


def queues_cmd(
    store: Optional[str] = typer.Option(None, "--store", envvar="MUSTER_STORE", help=STORE_HELP),
    at_arg: Optional[TimeArg] = typer.Option(None, "--at", parser=time_arg, metavar="TIME",
                                             help="Usage at this time instead of now: " + TIME_HELP + "."),
    as_json: bool = typer.Option(False, "--json", help="Print the queues as JSON."),
    local: bool = typer.Option(False, "--local", help=LOCAL_HELP),
) -> None:
    """Print each queue's usage against its guarantee and limit, from the history store."""
    from shared.history import StoreError
    from shared.history.engine import resolve_url
    from shared.history.header import time_format
    from shared.history.query import queue_report
    from shared.history.render import render_queues

    try:
        url = resolve_url(store)
        clock = time_format(url, local=local)
        at = resolved(clock, at_arg, "--at")
        report = queue_report(url, at)
    except StoreError as exc:
        raise failed(exc) from None
    if as_json:
        typer.echo(json.dumps({"at": at, "queues": report}, indent=2))
        return
    render_queues(report, Console(highlight=False, width=max(Console().width, 120)), at, clock)


def db_upgrade(
    store: Optional[str] = typer.Option(None, "--store", envvar="MUSTER_STORE", help=STORE_HELP),
    revision: str = typer.Option("head", "--revision", help="Alembic revision to upgrade to."),
) -> None:
    """Create or upgrade the history store's tables (alembic upgrade)."""
    from shared.history import StoreError, schema
    from shared.history.engine import display, resolve_url

    try:
        url = resolve_url(store)
        schema.upgrade(url, revision)
        now = schema.current(url)
    except StoreError as exc:
        raise failed(exc) from None
    typer.echo(f"{display(url)}: schema at revision {now}")


def db_downgrade(
    store: Optional[str] = typer.Option(None, "--store", envvar="MUSTER_STORE", help=STORE_HELP),
    revision: str = typer.Option("base", "--revision",
                                 help="Alembic revision to go back to (base drops every table)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Downgrade the history store's tables (alembic downgrade; to base by default, which drops them).
    Asks first: a downgrade deletes history that nothing can bring back."""
    from shared.history import StoreError, schema
    from shared.history.engine import display, resolve_url

    try:
        url = resolve_url(store)
    except StoreError as exc:
        raise failed(exc) from None
    if not yes:
        what = "drop every muster table, and the history in them," if revision == "base" else \
            f"downgrade to revision {revision}, dropping what later revisions hold,"
        try:
            confirmed = typer.confirm(f"{what} in {display(url)}?", default=False, err=True)
        except typer.Abort:  # no answer (end of input): not a yes
            confirmed = False
        if not confirmed:
            Console(stderr=True, highlight=False, soft_wrap=True).print("nothing changed (pass --yes to downgrade without asking)")
            raise typer.Exit(1)
    try:
        schema.downgrade(url, revision)
        now = schema.current(url)
    except StoreError as exc:
        raise failed(exc) from None
    typer.echo(f"{display(url)}: schema at revision {now or 'base (no tables)'}")
