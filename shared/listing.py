"""What a core was told exists, per watched resource, so that a list can report what went away unseen.

Kubernetes reports a deletion only to a watch that is open when it happens. An object deleted while
the cluster link was down, or during a watch gap the link closes by listing again (410 Gone, a
dropped connection), is simply absent from the next list; a link that restarted remembers nothing
to compare with. client-go's informers solve this in ``DeltaFIFO.Replace``: after a list, every key
the store knew that the list lacks is queued as a deletion, ``DeletedFinalStateUnknown`` carrying
the last state the store had (docs/design.md, "Deletions nobody watched").

muster does the same in the cores, where the knowledge is: after each list of a resource the link
publishes ``ObjectsListed`` (the keys that exist, in parts, the last one marked) right after the
list's own watch events and before any later one, so when a core reads the last part it has read
everything the list showed; each key it holds of that resource that the listing lacks is then
handled as an ``ObjectChanged`` Deleted built from the last state held here (``last_state``). A
fold over the inbox, so replay and both runtimes give the same deletions.
"""

from __future__ import annotations

from typing import Any

from shared.events import ObjectChanged, ObjectsListed

_IDENTITY = ("name", "namespace", "uid")
_META = (*_IDENTITY, "labels", "annotations", "ownerReferences")
_POD_SPEC = ("schedulerName", "nodeName")
_TYPE = ("apiVersion", "kind")


def _copy(value: Any) -> Any:
    """A copy of a JSON tree: the state held here shares no container with what a core keeps (a
    snapshot writes each mapping held once as plain JSON, ``shared.statecodec``). A string, the
    commonest leaf, is returned without a call (every watch event copies its labels and annotations)."""
    if type(value) is dict:
        return {k: v if type(v) is str else _copy(v) for k, v in value.items()}
    if type(value) is list:
        return [v if type(v) is str else _copy(v) for v in value]
    return value


def last_state(obj: dict[str, Any]) -> dict[str, Any]:
    """What a core's handling of a deletion reads of an object: its identity, labels, annotations
    and owners (which workload or gang it belongs to) and, for a pod, its scheduler and node; of a
    node only its identity (its deletion is read by name: a thousand nodes' labels are not kept twice)."""
    out: dict[str, Any] = {}
    for k in _TYPE:
        v = obj.get(k)
        if type(v) is str:
            out[k] = v
    kind = obj.get("kind")
    meta = obj.get("metadata")
    if type(meta) is dict:
        held = {}
        for k in _IDENTITY if kind == "Node" else _META:
            if k in meta:
                v = meta[k]
                held[k] = v if type(v) is str else _copy(v)
        out["metadata"] = held
    if kind == "Pod":
        spec = obj.get("spec")
        if type(spec) is dict:
            out["spec"] = {k: v for k in _POD_SPEC if type(v := spec.get(k)) is str}
    return out


def resource_of(kind: str, api_version: str) -> str:
    return f"{kind}.{api_version}"


class WatchBook:
    """Per watched resource, the objects a core was told of and not told are gone; and the listing
    being read (its parts come one after another in the inbox)."""

    def __init__(self) -> None:
        self.held: dict[str, dict[str, dict[str, Any]]] = {}
        """``Kind.apiVersion`` -> ``namespace/name`` -> ``last_state`` of the object."""
        self.reading: dict[str, tuple[str, int, set[str]]] = {}
        """``Kind.apiVersion`` -> (resourceVersion, the part expected next, keys listed so far)."""

    def observe(self, p: ObjectChanged) -> None:
        """Note one watch event (call it for every one the core reads)."""
        resource = resource_of(p.kind, p.api_version or str(p.object.get("apiVersion") or ""))
        key = f"{p.namespace}/{p.name}"
        if p.change == "Deleted":
            held = self.held.get(resource)
            if held is not None:
                held.pop(key, None)
                if not held:
                    del self.held[resource]
            return
        held = self.held.get(resource)
        if held is None:
            held = self.held[resource] = {}
        held[key] = last_state(p.object)

    def listed(self, p: ObjectsListed) -> list[ObjectChanged]:
        """Read one part of a listing; at its last part, the deletions of every object held that it
        lacks, in key order. A part out of sequence (the link restarted within a listing) drops the
        listing: the next one, from part 0, is complete."""
        resource = resource_of(p.kind, p.api_version)
        if p.part == 0:
            reading: tuple[str, int, set[str]] | None = (p.resource_version, 0, set())
        else:
            reading = self.reading.pop(resource, None)
            if reading is None or reading[0] != p.resource_version or reading[1] != p.part:
                return []
        assert reading is not None
        keys = reading[2]
        keys.update(p.keys)
        if not p.last:
            self.reading[resource] = (p.resource_version, p.part + 1, keys)
            return []
        self.reading.pop(resource, None)
        held = self.held.get(resource)
        if not held:
            return []
        gone = sorted(key for key in held if key not in keys)
        out: list[ObjectChanged] = []
        for key in gone:
            state = held.pop(key)
            namespace, _, name = key.partition("/")
            out.append(ObjectChanged(change="Deleted", kind=p.kind, api_version=p.api_version, namespace=namespace,
                                     name=name, object=state))
        if not held:
            del self.held[resource]
        return out
