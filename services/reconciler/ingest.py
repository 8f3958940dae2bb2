"""Watch event -> ``ObjectChanged``: a pure translation, so replaying a watch log gives the same inbox."""

from __future__ import annotations

from typing import Any, Literal, Mapping

from shared.events import ObjectChanged

Change = Literal["Added", "Modified", "Deleted"]


def _text(value: object) -> str:
    """Manifests are validated downstream (admission rejects with a reason); ingest must not fail."""
    return value if isinstance(value, str) else ""


def observe(change: Change, obj: Mapping[str, Any]) -> ObjectChanged:
    """Describe one watch event; kind, apiVersion, namespace and name come from the object itself."""
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    return ObjectChanged(
        change=change,
        kind=_text(obj.get("kind")),
        api_version=_text(obj.get("apiVersion")),
        namespace=_text(metadata.get("namespace")),
        name=_text(metadata.get("name")),
        object=dict(obj),
    )
