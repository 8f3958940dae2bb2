"""The ``muster`` command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from shared.policy import Policy, PolicyError
from shared.scenario import ScenarioError, load_scenario

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="muster: an event-sourced batch scheduler for Ray workloads on Kubernetes.")
schema_app = typer.Typer(no_args_is_help=True, help="The event contract.")
app.add_typer(schema_app, name="schema")
db_app = typer.Typer(no_args_is_help=True, help="The history store's tables (Alembic migrations).")
app.add_typer(db_app, name="db")

STORE_HELP = ("History store URL: sqlite:///history.db or postgresql+psycopg://user@host:5432/db "
              "(default: $MUSTER_STORE).")


def _store_failed(exc: Exception) -> typer.Exit:
    Console(stderr=True, highlight=False).print(f"[red]error:[/] {escape(str(exc))}")
    return typer.Exit(2)


@app.command("simulate")
def simulate_cmd(
    scenario: Path = typer.Argument(..., help="Scenario YAML (see README: scenario format)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the result document here."),
    check: bool = typer.Option(False, "--check", help="Verify the scenario's expect: list; exit 1 on failure."),
    policy_file: Optional[Path] = typer.Option(None, "--policy", help="Policy YAML (scenario's policy: block wins)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No timeline; only check results and errors."),
    store: Optional[str] = typer.Option(None, "--store", help="Also write the run's history to this store "
                                        "(tables are created in an empty one), e.g. sqlite:///history.db."),
) -> None:
    """Run SCENARIO on the embedded stack with a simulated cluster and a virtual clock."""
    from shared.simulate import simulate

    console = Console(stderr=False, highlight=False, width=max(Console().width, 120))
    err = Console(stderr=True, highlight=False)
    if store is not None:
        from shared.store import StoreError, schema

        try:
            schema.ensure(store)  # a bad URL or an unreachable store fails before the run, not after
        except StoreError as exc:
            raise _store_failed(exc) from None
    try:
        policy = Policy.from_yaml(policy_file) if policy_file else None
        run = simulate(load_scenario(scenario), policy)
    except (ScenarioError, PolicyError) as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2)
    result = run.result()
    if store is not None:
        from shared.store import record
        from shared.store.engine import display

        try:
            written = record(store, run.runtime.log)
        except StoreError as exc:
            raise _store_failed(exc) from None
    if json_out:
        json_out.write_text(json.dumps(result, indent=2) + "\n")
    failures = run.check() if check else []
    if quiet:
        for f in failures:
            err.print(f"[red]✗[/] {escape(str(f))}")
    else:
        from shared.timeline import render

        render(result, console, failures, checked=check)
        if store is not None:
            console.print(f"[dim]history: {written.events} events written to {escape(display(store))}"
                          + (f" ({written.skipped} were there already)" if written.skipped else "") + "[/]")
    if failures:
        raise typer.Exit(1)


@app.command("history")
def history_cmd(
    workload: str = typer.Argument(..., metavar="NAMESPACE/NAME", help="The workload, e.g. default/test-cluster-0."),
    store: Optional[str] = typer.Option(None, "--store", envvar="MUSTER_STORE", help=STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the timeline as JSON (the result document's shape)."),
) -> None:
    """Print a workload's timeline from the history store: phases, reasons, placements."""
    from shared.store import StoreError
    from shared.store.engine import display, resolve_url
    from shared.store.query import similar_workloads, workload_history
    from shared.store.render import render_history

    namespace, _, name = workload.partition("/")
    if not namespace or not name or "/" in name:
        raise _store_failed(ValueError(f"{workload!r}: name the workload as NAMESPACE/NAME, e.g. default/my-job"))
    try:
        url = resolve_url(store)
        doc = workload_history(url, workload)
        similar = similar_workloads(url, workload) if doc is None else []
    except StoreError as exc:
        raise _store_failed(exc) from None
    if doc is None:
        err = Console(stderr=True, highlight=False)
        err.print(f"[red]error:[/] no workload {escape(workload)} in the history at {escape(display(url))}"
                  + (f"; did you mean {escape(', '.join(similar))}?" if similar else ""))
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    render_history(doc, Console(highlight=False, width=max(Console().width, 120)))


@app.command("queues")
def queues_cmd(
    store: Optional[str] = typer.Option(None, "--store", envvar="MUSTER_STORE", help=STORE_HELP),
    at: Optional[float] = typer.Option(None, "--at", help="Usage at this scenario time (seconds) instead of now."),
    as_json: bool = typer.Option(False, "--json", help="Print the queues as JSON."),
) -> None:
    """Print each queue's usage against its guarantee and limit, from the history store."""
    from shared.store import StoreError
    from shared.store.engine import resolve_url
    from shared.store.query import queue_report
    from shared.store.render import render_queues

    try:
        report = queue_report(resolve_url(store), at)
    except StoreError as exc:
        raise _store_failed(exc) from None
    if as_json:
        typer.echo(json.dumps({"at": at, "queues": report}, indent=2))
        return
    render_queues(report, Console(highlight=False, width=max(Console().width, 120)), at)


@db_app.command("upgrade")
def db_upgrade(
    store: Optional[str] = typer.Option(None, "--store", envvar="MUSTER_STORE", help=STORE_HELP),
    revision: str = typer.Option("head", "--revision", help="Alembic revision to upgrade to."),
) -> None:
    """Create or upgrade the history store's tables (alembic upgrade)."""
    from shared.store import StoreError, schema
    from shared.store.engine import display, resolve_url

    try:
        url = resolve_url(store)
        schema.upgrade(url, revision)
        now = schema.current(url)
    except StoreError as exc:
        raise _store_failed(exc) from None
    typer.echo(f"{display(url)}: schema at revision {now}")


@db_app.command("downgrade")
def db_downgrade(
    store: Optional[str] = typer.Option(None, "--store", envvar="MUSTER_STORE", help=STORE_HELP),
    revision: str = typer.Option("base", "--revision",
                                 help="Alembic revision to go back to (base drops every table)."),
) -> None:
    """Downgrade the history store's tables (alembic downgrade; to base by default, which drops them)."""
    from shared.store import StoreError, schema
    from shared.store.engine import display, resolve_url

    try:
        url = resolve_url(store)
        schema.downgrade(url, revision)
        now = schema.current(url)
    except StoreError as exc:
        raise _store_failed(exc) from None
    typer.echo(f"{display(url)}: schema at revision {now or 'base (no tables)'}")


@schema_app.command("export")
def schema_export(directory: Path = typer.Argument(..., help="Folder to write one JSON Schema per event type.")) -> None:
    """Write JSON Schema for the envelope and every payload."""
    from shared.events import json_schemas

    directory.mkdir(parents=True, exist_ok=True)
    for name, schema in json_schemas().items():
        (directory / f"{name}.schema.json").write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
    typer.echo(f"wrote {len(json_schemas())} schemas to {directory}")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)


if __name__ == "__main__":
    main()
