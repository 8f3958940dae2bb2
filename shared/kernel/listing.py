"""What a core was told exists, per watched resource, so that a list can report what went away unseen.

Kubernetes reports a deletion only to a watch that is open when it happens. An object deleted while
the cluster link was down, or during a watch gap the link closes by listing again (410 Gone, a
dropped connection), is simply absent from the next list; a link that restarted remembers nothing
to compare with. client-go's informers solve this in ``DeltaFIFO.Replace``: after a list, every key
the store knew that the list lacks is queued as a deletion, ``DeletedFinalStateUnknown`` carrying
the last state the store had (docs/design/runtime.md, "Deletions nobody watched").

muster does the same in the cores, where the knowledge is: after each list of a resource the link
publishes ``ObjectsListed`` (the keys that exist, in parts, the last one marked) right after the
list's own watch events and before any later one, so when a core reads the last part it has read
everything the list showed; each key it holds of that resource that the listing lacks is then
handled as an ``ObjectChanged`` Deleted built from the last state held here (``last_state``). A
fold over the inbox, so replay and both runtimes give the same deletions.
"""

from __future__ import annotations

from typing import Any

from shared.kernel.events import ObjectChanged, ObjectsListed

_IDENTITY = ("name", "namespace", "uid")
_META = (*_IDENTITY, "labels", "annotations", "ownerReferences")
_POD_SPEC = ("schedulerName", "nodeName")


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _copy(value: Any) -> Any:
    """A copy of a JSON tree: the state held here shares no container with what a core keeps (a
    snapshot writes each mapping held once as plain JSON, ``shared.runtime.statecodec``). A container of
    leaves alone (labels, annotations, an owner reference: nearly every one) is copied whole in C,
    ``dict.copy``/``list.copy``, which gives exactly what the per-item copy gives."""
    if type(value) is dict:
        if _SCALARS.issuperset(map(type, value.values())):
            return value.copy()
        return {k: _copy(v) for k, v in value.items()}
    if type(value) is list:
        if _SCALARS.issuperset(map(type, value)):
            return value.copy()
        return [_copy(v) for v in value]
    return value


def last_state(obj: dict[str, Any]) -> dict[str, Any]:
    """What a core's handling of a deletion reads of an object: its identity, labels, annotations
    and owners (which workload or gang it belongs to) and, for a pod, its scheduler and node; of a
    node only its identity (its deletion is read by name: a thousand nodes' labels are not kept twice).
    Called for every watch event a core reads, so written out flat."""
    out: dict[str, Any] = {}
    if type(v := obj.get("apiVersion")) is str:
        out["apiVersion"] = v
    kind = obj.get("kind")
    if type(kind) is str:
        out["kind"] = kind
    meta = obj.get("metadata")
    if type(meta) is dict:
        out["metadata"] = {k: v if type(v := meta[k]) is str else _copy(v)
                           for k in (_IDENTITY if kind == "Node" else _META) if k in meta}
    if kind == "Pod":
        spec = obj.get("spec")
        if type(spec) is dict:
            out["spec"] = {k: v for k in _POD_SPEC if type(v := spec.get(k)) is str}
    return out


def resource_of(kind: str, api_version: str) -> str:
    return f"{kind}.{api_version}"


class Held:
    """One object as its watch event gave it, held by reference (``WatchBook.by_reference``). The
    core that asked for it keeps this same ``Held`` rather than the object: a snapshot then reaches
    the object once, through one instance (``shared.runtime.statecodec`` writes an instance reached again as a
    reference, but a mapping reached twice makes it write the whole state the slow way)."""

    __slots__ = ("obj",)

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj


class WatchBook:
    """Per watched resource, the objects a core was told of and not told are gone; and the listing
    being read (its parts come one after another in the inbox)."""

    def __init__(self, by_reference: frozenset[str] = frozenset()) -> None:
        self.held: dict[str, dict[str, Any]] = {}
        """``Kind.apiVersion`` -> ``namespace/name`` -> ``last_state`` of the object, or for a kind of
        ``by_reference`` the ``Held`` object itself (its ``last_state`` taken when a listing lacks it)."""
        self.reading: dict[str, tuple[str, int, set[str]]] = {}
        """``Kind.apiVersion`` -> (resourceVersion, the part expected next, keys listed so far)."""
        self.by_reference = by_reference
        """Kinds held by reference: for a core that keeps each such object anyway (placement's pods),
        copying its ``last_state`` on every watch event was a large part of the core's time in a replay,
        and a listing that lacks an object is rare. Objects in envelopes are never changed (the
        simulated cluster copies on write, decoding makes new ones), so the reference stays the
        version observed."""

    def observe(self, p: ObjectChanged) -> Held | None:
        """Note one watch event (call it for every one the core reads). For a kind held by reference,
        the ``Held`` now in the book (None for a deletion), for the core to keep instead of the object."""
        resource = resource_of(p.kind, p.api_version or str(p.object.get("apiVersion") or ""))
        key = f"{p.namespace}/{p.name}"
        if p.change == "Deleted":
            held = self.held.get(resource)
            if held is not None:
                held.pop(key, None)
                if not held:
                    del self.held[resource]
            return None
        held = self.held.get(resource)
        if held is None:
            held = self.held[resource] = {}
        if p.kind in self.by_reference:
            entry = held[key] = Held(p.object)
            return entry
        held[key] = last_state(p.object)
        return None

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
            if type(state) is Held:
                state = last_state(state.obj)
            namespace, _, name = key.partition("/")
            out.append(ObjectChanged(change="Deleted", kind=p.kind, api_version=p.api_version, namespace=namespace,
                                     name=name, object=state))
        if not held:
            del self.held[resource]
        return out
