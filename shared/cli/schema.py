"""``muster schema export``: the event contract as JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from shared.cli.errors import failed
from shared.cli.options import write


def schema_export(directory: Path = typer.Argument(..., help="Folder to write one JSON Schema per event type.")) -> None:
    """Write JSON Schema for the envelope and every payload."""
    from shared.kernel.events import json_schemas

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise failed(f"cannot create {directory}: {exc.strerror or exc}") from None
    for name, schema in json_schemas().items():
        write(directory / f"{name}.schema.json", json.dumps(schema, indent=2, sort_keys=True) + "\n", "schema")
    typer.echo(f"wrote {len(json_schemas())} schemas to {directory}")
