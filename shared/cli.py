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


@app.command("simulate")
def simulate_cmd(
    scenario: Path = typer.Argument(..., help="Scenario YAML (see README: scenario format)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the result document here."),
    check: bool = typer.Option(False, "--check", help="Verify the scenario's expect: list; exit 1 on failure."),
    policy_file: Optional[Path] = typer.Option(None, "--policy", help="Policy YAML (scenario's policy: block wins)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No timeline; only check results and errors."),
) -> None:
    """Run SCENARIO on the embedded stack with a simulated cluster and a virtual clock."""
    from shared.simulate import simulate

    console = Console(stderr=False, highlight=False, width=max(Console().width, 120))
    err = Console(stderr=True, highlight=False)
    try:
        policy = Policy.from_yaml(policy_file) if policy_file else None
        run = simulate(load_scenario(scenario), policy)
    except (ScenarioError, PolicyError) as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2)
    result = run.result()
    if json_out:
        json_out.write_text(json.dumps(result, indent=2) + "\n")
    failures = run.check() if check else []
    if quiet:
        for f in failures:
            err.print(f"[red]✗[/] {escape(str(f))}")
    else:
        from shared.timeline import render

        render(result, console, failures, checked=check)
    if failures:
        raise typer.Exit(1)


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
