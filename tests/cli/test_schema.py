"""``muster schema export DIR``: one JSON Schema file per payload type plus the envelope."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from shared.cli.main import app
from shared.kernel.events import PAYLOAD_TYPES, json_schemas


def test_schema_export_writes_one_file_per_payload_and_the_envelope(tmp_path):
    target = tmp_path / "nested" / "schemas"  # created, parents included
    result = CliRunner().invoke(app, ["schema", "export", str(target)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"wrote {len(PAYLOAD_TYPES) + 1} schemas to {target}\n"
    files = sorted(p.name for p in target.iterdir())
    assert files == sorted(f"{name}.schema.json" for name in [*PAYLOAD_TYPES, "Envelope"])
    expected = json_schemas()
    for name, schema in expected.items():
        text = (target / f"{name}.schema.json").read_text()
        assert json.loads(text) == schema
        assert text == json.dumps(schema, indent=2, sort_keys=True) + "\n"  # stable bytes for diffs


def test_schema_export_overwrites_into_an_existing_directory(tmp_path):
    (tmp_path / "Envelope.schema.json").write_text("stale")
    (tmp_path / "unrelated.txt").write_text("keep")
    result = CliRunner().invoke(app, ["schema", "export", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "Envelope.schema.json").read_text())["title"] == "Envelope"
    assert (tmp_path / "unrelated.txt").read_text() == "keep"


def test_envelope_schema_file_discriminates_every_payload(tmp_path):
    CliRunner().invoke(app, ["schema", "export", str(tmp_path)])
    envelope = json.loads((tmp_path / "Envelope.schema.json").read_text())
    mapping = envelope["properties"]["payload"]["discriminator"]["mapping"]
    assert set(mapping) == set(PAYLOAD_TYPES)
    assert all(ref == f"#/$defs/{name}" for name, ref in mapping.items())


def test_schema_export_where_nothing_can_be_written_exits_2_with_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    result = CliRunner().invoke(app, ["schema", "export", str(blocker / "schemas")])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.stderr.startswith(f"error: cannot create {blocker / 'schemas'}:")
