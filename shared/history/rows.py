"""Envelopes to row operations: the projector's pure conversion step.

Like Armada's ingester (``instructions.go``), turning events into database operations is pure;
``writer.py`` reads what is needed, calls this, and writes the result in one transaction. Nothing
here does I/O: stored state comes in and rows go out as plain dicts keyed by column name.

The rules (when a transition is recorded, which phase an event means, when a pod is bound, what a
workload charges to which queues) are ``shared.kernel.projection.ResultProjection``'s and are not
repeated here. ``Projector`` *is* a ``ResultProjection``, seeded from the stored rows of the
workloads a batch touches, that folds each batch and reads rows off what changed. So the store
and ``muster simulate``'s result cannot disagree about a workload's history.

    prepare(batch, stored_ids[, consumed]) -> Prepared: new envelopes, their workloads
    projector.needs(prepared)       -> Needs: stored state it does not hold yet
    projector.seed(StoredState)     -> takes the rows the writer loaded
    projector.convert(prepared, consumer) -> RowOps: rows to insert or upsert, per table

A ``Projector`` keeps what it folded for the next batch (up to ``max_workloads`` workloads; the
rest are read again when touched), so a writer that stays coherent with the store (writer.py
checks) reads almost nothing back. ``convert(prepared, state, consumer=...)`` is the stateless
form: a fresh projector, seeded, one batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Container, NamedTuple, Sequence

from pydantic import TypeAdapter

from shared.kernel.events import Envelope
from shared.kernel.model import QueueSpec
from shared.kernel.projection import PodView, ResultProjection, WorkloadView, pod_workload_key, rolled_up

QUEUE_TREE_EVENTS = frozenset({"QueueDefined", "QueueRemoved"})
QUEUE_EVENTS = QUEUE_TREE_EVENTS | {"QueueRejected"}

_VIEW = TypeAdapter(WorkloadView)
"""Serialises a workload's whole fold state, so state ResultProjection gains is carried too."""

_FOLD_STATE = frozenset({"scenario", "workloads", "pods", "queues", "rejected_queues", "events", "decisions", "now"})
"""ResultProjection's attributes: the store carries its workloads, pods, queues and rejected queues
and has no use for the rest (counters, the scenario name, the latest time). Tests guard that there
are no others, so state the projection gains cannot be silently dropped by the store."""
_DERIVED_STATE = frozenset({"held", "_in_queue", "_queue_members", "_folded"})
"""ResultProjection's indexes of its views (quota held, members of each queue, the view being folded):
``Projector._hold_row`` rebuilds them as it loads views (``ResultProjection.hold``), so they are not stored."""
_NOT_FOLD_STATE = {"key", "transitions"}
"""A workload's key and transitions have columns and a table of their own: not in ``fold_state``."""
_POD_FIELDS = ("name", "pod_set", "node", "gpu", "bound", "gone")
"""PodView's fields, each stored in ``placements`` (tests guard that it has no others)."""


class ConversionError(RuntimeError):
    """The batch touched state that was not loaded for it (a bug in ``needs``, never bad input)."""


class JsonText(str):
    """A value that is already JSON text (pydantic serialises a payload much faster than ``json``);
    the store's JSON serialiser passes it through unchanged."""

    __slots__ = ()


_EMPTY = JsonText("{}")


class Located(NamedTuple):
    """An envelope and where the projector read it; all three None in the embedded runtime.
    (A named tuple: the Kafka projector makes one per record, and a tuple is made far more cheaply
    than a frozen dataclass.)"""

    envelope: Envelope
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    payload: str | None = None
    """The payload's JSON text as read (``codec.payload_text``), stored as it is; None: serialise it."""
    raw: bytes | None = None
    """The envelope's bytes as the bus carried them (what the hash chain covers); None: serialise it."""


@dataclass(frozen=True)
class Needs:
    """Stored state to load before a batch can be folded."""

    workload_keys: frozenset[str]
    """Workloads (their ``workloads`` row, if any, and every ``placements`` row)."""
    holding_quota: bool = False
    """Also every workload holding quota: the queue tree changes, so usage is rolled up anew."""
    queues: bool = False
    """Every ``queues`` row and the next workload ordinal (a projector that starts cold)."""

    def __bool__(self) -> bool:
        return bool(self.workload_keys) or self.holding_quota or self.queues


@dataclass
class StoredState:
    """Rows the writer loaded for ``Needs`` (dicts keyed by column name)."""

    workload_keys: frozenset[str] = frozenset()
    """The keys that were asked for: every one of them is now loaded, with or without a row."""
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    placements: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Workload key -> its placement rows, ordered by ``pod_ordinal`` then ``seq``."""
    holding: dict[str, dict[str, Any]] | None = None
    """Every workload holding quota (when ``Needs.holding_quota``; None when not loaded)."""
    queues: dict[str, dict[str, Any]] | None = None
    next_ordinal: int = 0


@dataclass
class RowOps:
    """Rows to write, per table. ``event_log``, ``decisions`` and ``transitions`` are inserts;
    ``workloads``, ``placements``, ``queues`` and ``queue_usage`` are upserts by primary key;
    ``offsets`` upserts keeping the larger offset."""

    TABLES: ClassVar[tuple[str, ...]] = (
        "event_log", "decisions", "workloads", "transitions", "placements", "queues", "queue_usage", "offsets")

    event_log: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    workloads: list[dict[str, Any]] = field(default_factory=list)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    placements: list[dict[str, Any]] = field(default_factory=list)
    queues: list[dict[str, Any]] = field(default_factory=list)
    queue_usage: list[dict[str, Any]] = field(default_factory=list)
    offsets: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0
    """Envelopes of the batch the store already held (or that came twice in it)."""
    signed: list[dict[str, Any]] = field(default_factory=list)
    """``log_signed`` rows: the records the writer's signer made with the batch (``shared.history.integrity``)."""

    def counts(self) -> dict[str, int]:
        return {name: len(getattr(self, name)) for name in self.TABLES}


# --------------------------------------------------------------------------- what an event is about
_NO_WORKLOAD = frozenset({"TimerSet", "TimerFired", "CapacityChanged", "KubeEffect", "QueueDefined", "QueueRemoved",
                          "QueueRejected", "PolicyApplied"})
_BY_SPEC = frozenset({"WorkloadSubmitted", "WorkloadUpdated"})


def workload_key(env: Envelope) -> str | None:
    """The workload whose history ``env`` is part of: exactly the key ``ResultProjection`` folds
    it into (a pod's events belong to the pod's workload). None for everything else."""
    kind = env.type
    if kind in _NO_WORKLOAD:
        return None
    p = env.payload
    if kind == "ObjectChanged":
        return pod_workload_key(p) if p.kind == "Pod" else None
    if kind in _BY_SPEC:
        return p.workload.key
    key = vars(p).get("key")  # a payload's fields are its attributes; pydantic's miss raises, slowly
    return key if isinstance(key, str) else None


def decision_reason(env: Envelope) -> str:
    """Why a service emitted this, in its own words."""
    p = env.payload
    if env.type == "KubeEffect":
        target = f"{p.kind} {p.namespace}/{p.name}" if p.namespace else f"{p.kind} {p.name}"
        text = p.message or p.annotations.get("muster.dev/status", "") or p.reason
        return f"{p.op} {target}" + (f": {text}" if text else "") + (f" -> {p.node}" if p.node else "")
    if env.type == "TimerSet":
        return f"wake {p.key} at {p.at:g}s"
    return str(vars(p).get("reason") or "")


@dataclass(frozen=True)
class Prepared:
    """A batch reduced to what the store does not hold yet, with each envelope's workload."""

    items: list[Located]
    keys: list[str | None]
    workload_keys: frozenset[str]
    tree_changes: bool
    offsets: list[tuple[str, int, int]]
    """(topic, partition, next offset) after the whole batch, duplicates included."""
    skipped: int


Position = tuple[str, int, int]
"""(topic, partition, offset) of a record read."""


def prepare(batch: Sequence[Located], stored_ids: Container[str] = frozenset(),
            consumed: Sequence[Position] = ()) -> Prepared:
    """Drop envelopes the store holds (``stored_ids``) or that repeat within the batch.

    ``consumed``: records read with the batch that carried no envelope (dead-lettered); they
    move the consumed offsets on too, so a restart does not read them again."""
    seen: set[str] = set()
    items: list[Located] = []
    keys: list[str | None] = []
    tree = False
    offsets: dict[tuple[str, int], int] = {}
    for topic, partition, offset in consumed:
        offsets[(topic, partition)] = max(offsets.get((topic, partition), 0), offset + 1)
    for item in batch:
        env, topic, partition, offset, _, _ = item
        if topic is not None and partition is not None and offset is not None:
            where = (topic, partition)
            if offset >= offsets.get(where, 0):
                offsets[where] = offset + 1
        event_id = env.id
        if event_id in seen or event_id in stored_ids:
            continue
        seen.add(event_id)
        items.append(item)
        keys.append(workload_key(env))
        tree = tree or env.type in QUEUE_TREE_EVENTS
    return Prepared(items, keys, frozenset(k for k in keys if k is not None), tree,
                    [(t, p, o) for (t, p), o in sorted(offsets.items())], len(batch) - len(items))


# --------------------------------------------------------------------------- the fold
def _payload_json(payload: Any) -> str:
    """``payload.model_dump_json()`` straight from the model's core serialiser (without the method's own
    overhead)."""
    return payload.__pydantic_serializer__.to_json(payload).decode()


_Charge = tuple[bool, str | None, dict[str, int]]
"""What a workload charges to quota: (holds quota, queue, demand). Compared after every event of
the workload (most are its pods'), so the demand is compared as a dict, and kept as a copy."""


_NO_CHARGE: _Charge = (False, None, {})


def _charge(view: WorkloadView) -> _Charge:
    if not view.holds_quota:
        return _NO_CHARGE   # queue and demand only matter while quota is held
    return (True, view.queue, view.demand)


def _kept(charge: _Charge) -> _Charge:
    """``charge`` as the projector keeps it, to compare later ones with: its demand a copy."""
    holds, queue, demand = charge
    return (holds, queue, dict(demand))


def _pod_signature(pod: PodView | None) -> tuple | None:
    if pod is None:
        return None
    return (pod.pod_set, pod.node, repr(pod.gpu), tuple(tuple(b) for b in pod.bound), pod.gone)


def _pod_view(rows: list[dict[str, Any]]) -> PodView:
    last = rows[-1]
    gpu = None if last["gpu_devices"] is None else {"devices": list(last["gpu_devices"]),
                                                     "fraction": last["gpu_fraction"]}
    return PodView(name=last["pod"], pod_set=last["pod_set"], node=last["node"], gpu=gpu, gone=last["gone"],
                   bound=[[r["bound_at"], r["unbound_at"]] for r in rows if r["bound_at"] is not None])


class Projector(ResultProjection):
    """``ResultProjection`` seeded from stored rows, that turns each batch it folds into rows.

    It refuses to invent a workload or pod list that was not loaded (``ConversionError``), so a
    stored workload is never overwritten from a blank start.
    """

    def __init__(self, *, max_workloads: int = 50_000) -> None:
        super().__init__()
        self.max_workloads = max_workloads
        self.loaded: dict[str, None] = {}
        """Keys whose workload row (if any) and pods are held, least recently used first."""
        self.rows: dict[str, dict[str, Any]] = {}
        """Bookkeeping from each held workload's last stored row (transition count, times)."""
        self.queue_rows: dict[str, dict[str, Any]] | None = None
        self.usage: dict[str, dict[str, int]] = {}
        self.next_ordinal = 0
        self.holding_complete = False
        self._charges: dict[str, _Charge] = {}
        """What each held workload charges to quota, as last folded (usage changes by the difference)."""
        self._touched: dict[str, None] = {}
        self._last_used: frozenset[str] = frozenset()
        self._pods_before: dict[tuple[str, str], tuple | None] = {}
        self._folding: tuple[Any, str | None] = (None, None)
        """The payload being folded and its workload key, as ``prepare`` found it."""

    # ------------------------------------------------------------------ loading
    def needs(self, batch: Prepared) -> Needs:
        return Needs(frozenset(k for k in batch.workload_keys if k not in self.loaded),
                     holding_quota=batch.tree_changes and not self.holding_complete,
                     queues=self.queue_rows is None)

    def seed(self, state: StoredState) -> None:
        for key in state.workload_keys:
            row = state.workloads.get(key)
            if row is not None:
                self._hold_row(row)
            pods = self.pods.setdefault(key, {})
            rows = state.placements.get(key, [])
            start = 0
            for i in range(1, len(rows) + 1):
                if i == len(rows) or rows[i]["pod"] != rows[start]["pod"]:
                    pods.setdefault(rows[start]["pod"], _pod_view(rows[start:i]))
                    start = i
            if not pods:
                del self.pods[key]
            self.loaded[key] = None
        if state.holding is not None:
            for row in state.holding.values():
                self._hold_row(row)
            self.holding_complete = True
        if state.queues is not None:
            self.queue_rows = {name: dict(row) for name, row in state.queues.items()}
            self.usage = {name: dict(row["usage"]) for name, row in state.queues.items()}
            self.next_ordinal = state.next_ordinal
            for name, row in state.queues.items():
                if row["spec"] is not None and row["removed_at"] is None:
                    self.queues[name] = QueueSpec.model_validate(row["spec"])
                if row["rejected"] is not None:
                    self.rejected_queues[name] = row["rejected"]

    def _hold_row(self, row: dict[str, Any]) -> None:
        key = row["key"]
        if key not in self.workloads:
            view = self.workloads[key] = _VIEW.validate_python({**row["fold_state"], "key": key, "transitions": []})
            self.hold(view)
            self._charges[key] = _kept(_charge(view))
            self.rows[key] = {k: row[k] for k in ("transition_count", "first_seen_at", "phase_since")}

    # ------------------------------------------------------------------ guarded access (ResultProjection hooks)
    def _workload(self, key: str, kind: str = "") -> WorkloadView:
        if key not in self.workloads:
            if key not in self.loaded:
                raise ConversionError(f"workload {key!r} was not loaded before its events were folded")
            view = super()._workload(key, kind)
            view.order = self.next_ordinal
            self.next_ordinal += 1
        else:
            view = super()._workload(key, kind)
        self._touched[key] = None
        return view

    def _pod_workload(self, p: Any) -> str | None:
        """The key ``prepare`` found for the envelope being folded (``workload_key``: the same rule)."""
        payload, key = self._folding
        return key if p is payload else super()._pod_workload(p)

    def _pod(self, key: str, name: str, pod_set: str) -> PodView:
        if key not in self.loaded:
            raise ConversionError(f"pods of {key!r} were not loaded before its events were folded")
        if (key, name) not in self._pods_before:
            self._pods_before[(key, name)] = _pod_signature(self.pods.get(key, {}).get(name))
        return super()._pod(key, name, pod_set)

    def contribution(self, charge: _Charge) -> dict[str, dict[str, int]]:
        """Usage one workload with this charge adds to each queue, rolled up by ResultProjection."""
        holds, queue, demand = charge
        if not holds or queue is None:
            return {}
        return rolled_up({queue: demand}, self.queues)

    # ------------------------------------------------------------------ one batch
    def convert(self, batch: Prepared, *, consumer: str) -> RowOps:
        """Fold ``batch``; the rows it changes. Call ``needs``/``seed`` first."""
        if self.queue_rows is None:
            raise ConversionError("the queues were not loaded (seed a StoredState with queues first)")
        ops = RowOps(skipped=batch.skipped)
        self._touched, self._pods_before = {}, {}
        queue_rows: dict[str, dict[str, Any]] = {}
        usage_points: dict[tuple[str, str, float], int] = {}
        first_seen: dict[str, float] = {}
        last_event: dict[str, float] = {}
        transition_events: dict[str, list[str]] = {}

        def queue_row(name: str, t: float) -> dict[str, Any]:
            row = queue_rows.get(name)
            if row is None:
                assert self.queue_rows is not None
                stored = self.queue_rows.get(name)
                row = dict(stored) if stored is not None else {
                    "name": name, "parent": None, "dialect": None, "guarantee": {}, "limit": {}, "spec": None,
                    "usage": {}, "rejected": None, "defined_at": None, "removed_at": None}
                queue_rows[name] = row
            row["updated_at"] = t
            return row

        def set_usage(new: dict[str, dict[str, int]], names: list[str], t: float) -> None:
            for name in names:
                old_q, new_q = self.usage.get(name, {}), new.get(name, {})
                changed = False
                for resource in sorted(set(old_q) | set(new_q)):
                    value = new_q.get(resource, 0)
                    if old_q.get(resource, 0) != value:
                        usage_points[(name, resource, t)] = value
                        changed = True
                if changed:
                    self.usage[name] = {r: v for r, v in new_q.items() if v}
                    queue_row(name, t)["usage"] = dict(sorted(self.usage[name].items()))

        workloads, apply = self.workloads, self.apply
        add_event, add_decision = ops.event_log.append, ops.decisions.append
        at, t = None, 0.0
        for item, key in zip(batch.items, batch.keys):
            env = item.envelope
            view = workloads.get(key) if key is not None else None
            seen_transitions = len(view.transitions) if view is not None else 0
            decisions = self.decisions

            self._folding = (env.payload, key)
            apply(env)

            if env.occurred_at != at:  # many envelopes share a time; rounding is slow
                at = env.occurred_at
                t = round(at, 6)
            add_event({
                "event_id": env.id, "type": env.type, "subject": env.subject, "source": env.source,
                "occurred_at": env.occurred_at, "causation_id": env.causation_id,
                "correlation_id": env.correlation_id, "schema_version": env.schema_version,
                "trace": JsonText(json.dumps(env.trace, separators=(",", ":"))) if env.trace else _EMPTY,
                "payload": JsonText(_payload_json(env.payload) if item.payload is None else item.payload),
                "workload_key": key,
                "topic": item.topic, "partition": item.partition, "offset": item.offset})
            if self.decisions > decisions:  # ResultProjection's own rule for what counts as a decision
                add_decision({
                    "event_id": env.id, "service": env.source, "type": env.type, "subject": env.subject,
                    "workload_key": key, "input_event_id": env.causation_id, "t": t,
                    "reason": decision_reason(env)})

            if key is not None and (view := workloads.get(key)) is not None:
                first_seen.setdefault(key, t)
                last_event[key] = t
                if len(view.transitions) > seen_transitions:
                    transition_events.setdefault(key, []).extend(
                        [env.id] * (len(view.transitions) - seen_transitions))
                before, after = self._charges.get(key, _NO_CHARGE), _charge(view)
                if after != before:
                    self._charges[key] = after = _kept(after)
                    was, now = self.contribution(before), self.contribution(after)
                    names = sorted(set(was) | set(now))
                    merged = {name: dict(self.usage.get(name, {})) for name in names}
                    for name in names:
                        for resource, value in was.get(name, {}).items():
                            merged[name][resource] = merged[name].get(resource, 0) - value
                        for resource, value in now.get(name, {}).items():
                            merged[name][resource] = merged[name].get(resource, 0) + value
                    set_usage(merged, names, t)

            if env.type in QUEUE_EVENTS:
                p = env.payload
                name = p.queue.name if env.type == "QueueDefined" else p.name
                row = queue_row(name, t)
                row["rejected"] = self.rejected_queues.get(name)
                if env.type == "QueueDefined":
                    spec = p.queue
                    row.update(parent=spec.parent, dialect=spec.dialect, guarantee=dict(spec.guarantee),
                               limit=dict(spec.limit), spec=spec.model_dump(mode="json"), defined_at=t,
                               removed_at=None)
                elif env.type == "QueueRemoved":
                    row["removed_at"] = t
                if env.type in QUEUE_TREE_EVENTS:
                    if not self.holding_complete:
                        raise ConversionError("the queue tree changed but the workloads holding quota were not loaded")
                    rolled = self.queue_usage()
                    set_usage(rolled, sorted(set(self.usage) | set(rolled)), t)

        # ------------------------------------------------------------------ final state of what changed
        last_t = round(batch.items[-1].envelope.occurred_at, 6) if batch.items else 0.0
        for key in self._touched:
            view = self.workloads[key]
            held = self.rows.get(key) or {"transition_count": 0, "first_seen_at": first_seen.get(key, last_t),
                                          "phase_since": None}
            base = held["transition_count"]
            for i, tr in enumerate(view.transitions):
                ops.transitions.append({"workload_key": key, "seq": base + i, "t": tr["t"], "phase": tr["phase"],
                                        "reason": tr["reason"], "event_id": transition_events[key][i]})
            namespace, _, name = key.rpartition("/")
            row = {
                "key": key, "namespace": namespace, "name": name, "kind": view.kind, "queue": view.queue,
                "priority": view.priority, "min_member": view.min_member, "resources": dict(view.resources),
                "demand": dict(view.demand), "phase": view.phase, "reason": view.reason,
                "holds_quota": view.holds_quota, "queue_state": view.queue_state, "requeue_at": view.requeue_at,
                "ordinal": view.order, "transition_count": base + len(view.transitions),
                "first_seen_at": held["first_seen_at"],
                "phase_since": view.transitions[-1]["t"] if view.transitions else held["phase_since"],
                "last_event_at": last_event.get(key, last_t),
                "fold_state": JsonText(_VIEW.dump_json(view, exclude=_NOT_FOLD_STATE).decode())}
            ops.workloads.append(row)
            self.rows[key] = {k: row[k] for k in ("transition_count", "first_seen_at", "phase_since")}
            view.transitions.clear()  # written; the next batch numbers on from transition_count

        ordinals: dict[str, dict[str, int]] = {}
        for (key, name), signature in self._pods_before.items():
            pod = self.pods[key][name]
            if signature == _pod_signature(pod):
                continue
            if key not in ordinals:
                ordinals[key] = {n: i for i, n in enumerate(self.pods[key])}
            for seq, (bound_at, unbound_at) in enumerate(pod.bound or [[None, None]]):
                ops.placements.append({
                    "workload_key": key, "pod": name, "seq": seq, "pod_ordinal": ordinals[key][name],
                    "pod_set": pod.pod_set, "node": pod.node,
                    "gpu_devices": None if pod.gpu is None else list(pod.gpu["devices"]),
                    "gpu_fraction": None if pod.gpu is None else pod.gpu["fraction"],
                    "bound_at": bound_at, "unbound_at": unbound_at, "gone": pod.gone})

        assert self.queue_rows is not None
        self.queue_rows.update(queue_rows)
        ops.queues = [queue_rows[name] for name in sorted(queue_rows)]
        ops.queue_usage = [{"queue": q, "resource": r, "t": t, "used": v} for (q, r, t), v in usage_points.items()]
        ops.offsets = [{"consumer": consumer, "topic": topic, "partition": partition, "offset": offset}
                       for topic, partition, offset in batch.offsets]
        self._folding = (None, None)
        self._evict(batch.workload_keys)
        return ops

    def _evict(self, used: frozenset[str]) -> None:
        """Keep at most ``max_workloads`` workloads. Never evict one holding quota (usage roll-ups
        need them all), nor one of this batch or the last (a pipelined writer may not have
        committed it yet, so the store could still hold an older row)."""
        protected = used | self._last_used
        self._last_used = used
        for key in sorted(used):
            self.loaded.pop(key, None)
            self.loaded[key] = None  # most recently used last
        excess = len(self.loaded) - self.max_workloads
        for key in list(self.loaded):
            if excess <= 0:
                break
            view = self.workloads.get(key)
            if key in protected or (view is not None and view.holds_quota):
                continue
            del self.loaded[key]
            self.forget(key)
            self.rows.pop(key, None)
            self._charges.pop(key, None)
            excess -= 1


def convert(batch: Prepared, state: StoredState, *, consumer: str) -> RowOps:
    """The stateless form: a fresh ``Projector`` seeded with ``state`` folds ``batch``.

    ``state`` must hold what ``Projector().needs(batch)`` asks for (queues included).
    """
    projector = Projector()
    projector.seed(state)
    return projector.convert(batch, consumer=consumer)
