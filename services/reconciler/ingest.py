"""Watch event -> ``ObjectChanged``: a pure translation, so replaying a watch log gives the same inbox."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from shared.events import SCHEMA_VERSION, Envelope, ObjectChanged, derive_id
from shared.kube import meta

Change = Literal["Added", "Modified", "Deleted"]


def _text(value: object) -> str:
    """Manifests are validated downstream (admission rejects with a reason); ingest must not fail."""
    return value if isinstance(value, str) else ""


def observe(change: Change, obj: Mapping[str, Any]) -> ObjectChanged:
    """Describe one watch event; kind, apiVersion, namespace and name come from the object itself.

    The object is kept as the API server sent it but for ``metadata.managedFields``: server-side
    apply's field ownership, often half of a real pod's bytes, read by no decision, and carried
    otherwise by every inbox, the log and the history store (controller-runtime's caches drop it
    too)."""
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    kept = dict(obj)
    if "managedFields" in metadata:
        kept["metadata"] = {k: v for k, v in metadata.items() if k != "managedFields"}
    return ObjectChanged(
        change=change,
        kind=_text(obj.get("kind")),
        api_version=_text(obj.get("apiVersion")),
        namespace=_text(metadata.get("namespace")),
        name=_text(metadata.get("name")),
        object=kept,
    )


def watch_envelope(change: Change, obj: Mapping[str, Any], at: float) -> Envelope:
    """A watch event from a real API server as the envelope admission/placement read.

    The id names the object's version (uid and resourceVersion), not the moment it was seen: a
    watcher that restarts and lists everything again re-sends objects it sent before under the
    same ids, and every consumer drops those copies. A deletion gets its own id, since a watcher
    that missed the Deleted event reports the object's last version as deleted.
    """
    payload = observe(change, obj)
    metadata = meta(obj)
    version = (payload.kind, payload.api_version, payload.namespace, payload.name,
               _text(metadata.get("uid")), _text(metadata.get("resourceVersion")))
    event_id = derive_id("ingest", *version, "deleted" if change == "Deleted" else "")
    return Envelope.model_construct(
        id=event_id, type=payload.type, subject=payload.subject, source="ingest", occurred_at=at,
        causation_id=None, correlation_id=event_id, schema_version=SCHEMA_VERSION, trace={}, payload=payload,
    )
