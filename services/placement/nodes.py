"""The node table: what each node offers, what is used on it, and which pod shapes it accepts.

Everything per node lives in numpy arrays indexed by the node's row, rows in the order nodes
were first seen (a Node object, or a pod bound to a node not seen yet), so ``argmax`` ties break
by that order. Resource arrays are resource-major (``alloc[col, node]``): one requested resource
is one contiguous vector over all nodes.

- ``alloc``/``used``/``free`` in milli-units; ``pods`` counts 1000 per pod. The GPU column is
  derived from the device matrix (a device with any share used is not free for whole-GPU pods).
- ``gpu_memory``: each node's memory per GPU device in MiB, from its ``nvidia.com/gpu.memory`` label as
  KAI reads it (``shared.kernel.gpumemory.device``; 0: unknown). A ``gpu-memory`` pod's share of a
  device is worked out per node from it (``share_on``, ``memory_need``): it fits where that share
  fits one device, never where the memory is unknown.
- ``static_mask`` answers cordon/taint/selector/affinity, and what a pod set's claims allow
  (``volumes``, the ``VolumeBook``), once per ``PodSet.constraint_key``; the cache is dropped whenever
  any node's labels, taints, cordon or presence change, or a claim, volume or class does.
- ``preference``: a pod set's preferred node affinity per row, normalised as kube-scheduler's
  NodeAffinity score is, cached like the static masks; ``score`` adds it to the strategy's score.
- ``ports``: the host ports charged on each node (pods bound there, slots reserved), per row that has
  any: a pod asking one of them fits no such node (``port_conflicts``, kube-scheduler's NodePorts).
- ``feasible`` and ``score`` are the vectorised filter and scorer; they take a slice (``score`` also
  an index array) so the gang placer can recompute one node with exactly the same arithmetic
  (identical floats, stable ties).
- ``mix``: the shapes of recently arrived pods, which the ``fragmentation`` strategy measures against
  (``fragmentation.py``); the core feeds it as workloads arrive.
- ``compact``: rows of nodes that left and that nothing refers to any more are dropped once they
  outnumber the live ones (``compaction_due``), live rows keeping their relative order: the table is
  bounded by the live nodes, not by every node ever seen (an autoscaler names each node anew).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from services.placement import filters, fragmentation, gpu
from services.placement.filters import Taint, expression_matches
from services.placement.interpod import Mark, PodIndex
from services.placement.volumes import VolumeBook
from shared.kernel import gpumemory
from shared.kernel import quantity as q
from shared.kernel.model import ConstraintKey, HostPort, PodSet, PreferredTerm

DEFAULT_MAX_PODS = 110_000
"""kubelet's default ``maxPods`` (110), for Node objects that do not state ``pods``."""

MAX_DEVICES = 64
"""GPU devices tracked per node (a node claiming more gets the first 64 as devices)."""

MAX_AMOUNT = 1 << 56
"""Per-node and per-pod amounts are clamped here so int64 sums over a node cannot overflow."""

_BASE_RESOURCES = (q.CPU, q.MEMORY, q.PODS, q.GPU)

FRAGMENTATION = "fragmentation"
TIE_BREAK = 64.0
"""Fragmentation scores ``utilisation - TIE_BREAK * rise``: rises are whole numbers and a utilisation
sum stays below 64 (one per resource, each at most 1 on a node that fits; with a preference at most
three per resource), so a smaller rise always wins and binpack only breaks ties."""
PREFERENCE_WEIGHT = 2.0
"""How much a node preferred by every weight counts against the strategy's score over its whole range:
kube-scheduler's default weights, NodeAffinity 2 and NodeResourcesFit 1
(``pkg/scheduler/apis/config/v1/default_plugins.go``)."""


DEMAND_MEMO = 4096
"""Distinct pod requests ``NodeTable.demand`` remembers (pods come from a few templates)."""

SCORED_SHAPES = 32
"""Pod shapes (demand, constraints, strategy) whose score vectors ``NodeTable.scores`` keeps."""
ONE_BY_ONE = 24
"""Up to this many changed rows a kept vector is brought up to date row by row (``fit_score``), past
it with one numpy pass over those rows."""
COMPACT_MIN = 64
"""Rows of gone nodes the table keeps before it compacts at all (``compaction_due``)."""
CHANGED_ROWS = 4096
"""Rows changed (``ScoreIndex.changed``) that are kept to bring kept score vectors up to date; past
that the log starts afresh and every kept vector is computed again when next asked for."""


@dataclass(frozen=True, eq=False)
class Demand:
    """What one pod asks of a node, resolved to table columns once per pod shape."""

    items: tuple[tuple[str, int], ...]
    """(resource, milli) with amount > 0, sorted: the identity of the demand."""
    filter: tuple[tuple[int, int], ...]
    """(column, amount) every node must have free: all resources incl. pods and whole GPUs."""
    score: tuple[tuple[int, int], ...]
    """(column, amount) that count for binpack/spread: resources except pods and GPU."""
    charge: tuple[tuple[int, int], ...]
    """(column, amount) added to ``used`` (GPU excluded: devices account for it)."""
    gpu_whole: int
    gpu_share: int
    gpu_memory: int = 0
    """MiB of one device (KAI's ``gpu-memory``): its share depends on the node (``NodeTable.share_on``)."""
    mark: Mark | None = None
    """What the pod shows other pods' affinity and spread selectors (``interpod``): counted where it is
    charged; None while the index is off (``NodeTable.marking``)."""
    ports: tuple[HostPort, ...] = ()
    """Host ports the pod binds: held on its node like a resource, but as names, not amounts."""

    @property
    def gpu_need(self) -> int:
        """Thousandths of a device this pod adds to a node's GPU load, on any node (0 for a ``gpu_memory``
        pod, whose need is the node's: ``NodeTable.memory_need``)."""
        return self.gpu_share or self.gpu_whole * gpu.FULL

    @property
    def shape(self) -> fragmentation.Shape:
        """What the pod asks of a node's cpu, memory and GPUs: its kind in the workload mix."""
        asks = dict(self.items)
        return asks.get(q.CPU, 0), asks.get(q.MEMORY, 0), self.gpu_whole, self.gpu_share

    def same_as(self, other: "Demand | None") -> bool:
        return other is not None and (self.items, self.gpu_whole, self.gpu_share, self.gpu_memory, self.mark,
                                      self.ports) == (other.items, other.gpu_whole, other.gpu_share,
                                                      other.gpu_memory, other.mark, other.ports)


@dataclass(eq=False)
class _Scored:
    """A kept score vector (``NodeTable.scores``): for which static mask, and how much of
    ``ScoreIndex.changed`` it has taken in."""

    static: np.ndarray
    vector: np.ndarray
    seen: int
    prefer: np.ndarray | None = None
    """The preference vector it was scored with (``NodeTable.preference``); a new one is computed afresh."""


@dataclass(eq=False)
class ScoreIndex:
    """The node index's state (``NodeTable.scores``): a window bounded by construction (at most
    ``SCORED_SHAPES`` vectors and ``CHANGED_ROWS`` rows), whatever the history."""

    changed: list[int] = field(default_factory=list)
    """Rows whose usage changed, in order (charges and their undoing): what ``scores`` recomputes."""
    kept: dict[tuple[tuple[tuple[str, int], ...], int, int, str, ConstraintKey, tuple[HostPort, ...],
                     tuple[PreferredTerm, ...]], _Scored] = field(default_factory=dict)
    """(demand items, GPU share, GPU memory, strategy, constraint key, host ports, preferences) -> the vector
    kept for it."""


@dataclass(frozen=True)
class NodeChange:
    capacity: bool
    """Allocatable, presence or cordon changed (the schedulable totals may differ)."""
    grew: bool
    """Some schedulable capacity appeared."""
    constraints: bool
    """Labels or taints changed: pods that did not fit because of them might now."""


def _node_fields(obj: Mapping[str, Any]) -> tuple[dict[str, str], tuple[Taint, ...], bool, dict[str, int]]:
    """(labels, taints, schedulable, allocatable) of a Node object, tolerant of malformed parts."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        meta = {}
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        spec = {}
    raw_labels = meta.get("labels")
    labels = {str(k): str(v) for k, v in raw_labels.items()} if isinstance(raw_labels, Mapping) else {}
    return labels, filters.parse_taints(spec.get("taints")), not bool(spec.get("unschedulable")), \
        parse_allocatable(obj)


def parse_allocatable(obj: Mapping[str, Any]) -> dict[str, int]:
    """``status.allocatable`` (else ``status.capacity``) in milli-units; bad quantities are skipped."""
    status = obj.get("status")
    if not isinstance(status, Mapping):
        status = {}
    raw = status.get("allocatable") or status.get("capacity") or {}
    out: dict[str, int] = {}
    if isinstance(raw, Mapping):
        for name, value in raw.items():
            try:
                out[q.canonical_name(str(name))] = min(q.parse_quantity(value), MAX_AMOUNT)
            except (ValueError, ArithmeticError):  # QuantityError, or .inf/.nan/1e1000000 escaping it
                continue
    out.setdefault(q.PODS, DEFAULT_MAX_PODS)
    return out


_ROW_ARRAYS: tuple[tuple[str, Any, int], ...] = (
    ("alloc", 0, 1), ("used", 0, 1), ("free", 0, 1), ("divisor", 1.0, 1),
    ("present", False, 0), ("schedulable", True, 0), ("hard_tainted", False, 0), ("gpu_count", 0, 0),
    ("gpu_used", gpu.SENTINEL, 0), ("gpu_room", -1, 0), ("gpu_load", 0, 0), ("gpu_div", 1.0, 0),
    ("gpu_memory", 0, 0),
)
"""``NodeTable``'s per-row arrays: name, what an unused row holds, the axis rows run along. Growing
and compacting go over this one list, so no array is left out of line with the others."""


ANY_ADDRESS = "0.0.0.0"


def port_taken(used: Mapping[HostPort, int], wanted: tuple[HostPort, ...]) -> bool:
    """``HostPortInfo.CheckConflict`` (kube-scheduler ``framework/types.go``): a wanted port conflicts with a
    used one of the same protocol and number when either binds every address (0.0.0.0) or both bind the same."""
    for want in wanted:
        for have in used:
            if have.port == want.port and have.protocol == want.protocol and \
                    (want.ip == ANY_ADDRESS or have.ip == ANY_ADDRESS or have.ip == want.ip):
                return True
    return False


def _padded(a: np.ndarray, extra: int, fill: Any, axis: int) -> np.ndarray:
    """``a`` with ``extra`` rows of ``fill`` added along ``axis``."""
    pad = [(0, 0)] * a.ndim
    pad[axis] = (0, extra)
    return np.pad(a, pad, constant_values=fill)


class NodeTable:
    """Nodes × resources, GPU devices per node, and the cached static filters."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.resources: list[str] = list(_BASE_RESOURCES)
        self.col: dict[str, int] = {r: i for i, r in enumerate(self.resources)}
        self.labels: list[dict[str, str]] = []
        self.taints: list[tuple[Taint, ...]] = []
        cap, width = 64, len(self.resources)
        self.alloc = np.zeros((width, cap), np.int64)
        self.used = np.zeros((width, cap), np.int64)
        self.free = np.zeros((width, cap), np.int64)
        self.divisor = np.ones((width, cap), np.float64)
        self.present = np.zeros(cap, bool)
        self.schedulable = np.ones(cap, bool)
        self.hard_tainted = np.zeros(cap, bool)
        self.gpu_count = np.zeros(cap, np.int64)
        self.gpu_used = np.full((cap, 8), gpu.SENTINEL, np.int64)
        self.gpu_room = np.full(cap, -1, np.int64)
        self.gpu_load = np.zeros(cap, np.int64)
        self.gpu_div = np.ones(cap, np.float64)
        self.gpu_memory = np.zeros(cap, np.int64)
        """MiB per GPU device (``gpumemory.device`` of the node's labels); 0: unknown."""
        self.total_alloc: list[int] = [0] * width
        """Σ allocatable over present, schedulable nodes (what CapacityChanged reports); Python ints:
        a cluster-wide sum of memory in milli-bytes can exceed int64."""
        self._masks: dict[ConstraintKey, np.ndarray] = {}
        self._demands: dict[tuple[tuple[tuple[str, int], ...], int, int, Mark | None, tuple[HostPort, ...]],
                            Demand] = {}
        self.marking = False
        """Whether pods are counted by their marks (``interpod``): off until the first inter-pod
        constraint is met, so a cluster without any pays nothing for them."""
        self.pods_on = PodIndex()
        """Marks of the pods charged, per row (``interpod.PodIndex``)."""
        self._node_cache: dict[Any, Any] = {}
        """Per node label set: topology domains (``domains``) and other node masks (``node_cache``)."""
        self.volumes = VolumeBook()
        """Claims, volumes and storage classes, which a pod set's claims are judged against (``static_mask``)."""
        self._preferences: dict[tuple[ConstraintKey, tuple[PreferredTerm, ...]], np.ndarray] = {}
        self.ports: dict[int, dict[HostPort, int]] = {}
        """Row -> host ports held there (how many holders of each), only rows holding any."""
        self.mix = fragmentation.Mix()
        self._schedulable: int | None = None
        self.scored = ScoreIndex()
        self.live = 0
        """Present rows; the others are nodes that left (or that only a pod has named so far)."""
        self.compact_min: int | None = COMPACT_MIN
        """Gone rows tolerated before ``compaction_due``; None never compacts (tests compare the two)."""
        self._absent_kept = 0
        """Gone rows the last compaction had to keep (something still referred to them)."""

    def __getstate__(self) -> dict[str, Any]:
        """A snapshot (``shared.runtime.bus.snapshot``) leaves the demand memo out: it is rebuilt as pods come."""
        state = self.__dict__.copy()
        state.pop("_demands", None)
        state.pop("_node_cache", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._demands = {}
        self._node_cache = {}
        self.__dict__.setdefault("marking", False)
        self.__dict__.setdefault("pods_on", PodIndex())

    # ------------------------------------------------------------------ shape
    @property
    def n(self) -> int:
        return len(self.names)

    def counting(self, i: int) -> bool:
        """Does this node count toward the schedulable totals?"""
        return bool(self.present[i] and self.schedulable[i])

    def column(self, resource: str) -> int:
        """The column of a resource, added (zero everywhere) the first time anyone names it."""
        c = self.col.get(resource)
        if c is None:
            c = len(self.resources)
            self.resources.append(resource)
            self.col[resource] = c
            pad = ((0, 1), (0, 0))
            self.alloc = np.pad(self.alloc, pad)
            self.used = np.pad(self.used, pad)
            self.free = np.pad(self.free, pad)
            self.divisor = np.pad(self.divisor, pad, constant_values=1.0)
            self.total_alloc.append(0)
        return c

    def ensure(self, name: str) -> int:
        """The row of a node, created absent (not schedulable onto) when first named by a pod."""
        i = self.index.get(name)
        if i is not None:
            return i
        i = self.n
        if i == self.present.shape[0]:
            self._grow_rows()
        self.names.append(name)
        self.index[name] = i
        self.labels.append({})
        self.taints.append(())
        self._nodes_changed()
        return i

    def _grow_rows(self) -> None:
        extra = self.present.shape[0]
        for name, fill, axis in _ROW_ARRAYS:
            setattr(self, name, _padded(getattr(self, name), extra, fill, axis))

    # ------------------------------------------------------------------ node objects
    def upsert(self, name: str, obj: Mapping[str, Any]) -> NodeChange | None:
        """Take a Node object as the truth for its row; None when nothing placement uses changed."""
        i = self.ensure(name)
        labels, taints, schedulable, allocatable = _node_fields(obj)
        vector = self._vector(allocatable)
        was_present, was_counting = bool(self.present[i]), self.counting(i)
        old = self.alloc[:, i].copy()
        constraints = labels != self.labels[i] or taints != self.taints[i]
        capacity = not was_present or schedulable != bool(self.schedulable[i]) or not np.array_equal(old, vector)
        if not (constraints or capacity):
            return None
        if was_counting:
            self._add_total(old, -1)
        if not was_present:
            self.live += 1
        self.alloc[:, i] = vector
        self.free[:, i] = vector - self.used[:, i]
        self.divisor[:, i] = np.maximum(vector, 1)
        self.present[i], self.schedulable[i] = True, schedulable
        self.labels[i], self.taints[i] = labels, taints
        self.gpu_memory[i] = gpumemory.device(labels)
        self.hard_tainted[i] = any(t.effect in filters.HARD_EFFECTS for t in taints)
        self._set_gpu_count(i, min(int(vector[self.col[q.GPU]]) // gpu.FULL, MAX_DEVICES))
        if self.counting(i):
            self._add_total(vector, +1)
        grew = self.counting(i) and (not was_counting or bool((vector > old).any()))
        self._nodes_changed()
        return NodeChange(capacity=capacity, grew=grew, constraints=constraints and was_present)

    def cordon(self, name: str) -> NodeChange | None:
        """The node's object was refused at ingest (``shared.kernel.kube.REFUSED``): nothing new lands on it,
        and what is charged there stays charged against its last readable capacity, until a version
        that can be read comes (``upsert``). A node never read before is present with no capacity."""
        i = self.ensure(name)
        if self.present[i] and not self.schedulable[i]:
            return None
        if self.counting(i):
            self._add_total(self.alloc[:, i], -1)
        if not self.present[i]:
            self.live += 1
        self.present[i], self.schedulable[i] = True, False
        self._nodes_changed()
        return NodeChange(capacity=True, grew=False, constraints=False)

    def _vector(self, amounts: Mapping[str, int]) -> np.ndarray:
        """A dense row over all columns (adding columns for resources not seen before)."""
        cols = [(self.column(name), amount) for name, amount in amounts.items()]
        vector = np.zeros(len(self.resources), np.int64)
        for c, amount in cols:
            vector[c] = amount
        return vector

    def remove(self, name: str) -> NodeChange | None:
        """The node left: nothing lands on it again; pods still charged there are forgotten as they go."""
        i = self.index.get(name)
        if i is None or not self.present[i]:
            return None
        if self.counting(i):
            self._add_total(self.alloc[:, i], -1)
        self.present[i] = False
        self.live -= 1
        self._nodes_changed()
        return NodeChange(capacity=True, grew=False, constraints=False)

    def compaction_due(self) -> bool:
        """More rows of gone nodes than live ones (and at least ``compact_min``, and twice what the last
        compaction had to keep, so rows still referred to do not make every event try again)."""
        absent = len(self.names) - self.live
        return self.compact_min is not None and absent >= self.compact_min and absent > self.live \
            and absent > 2 * self._absent_kept

    def compact(self, referenced: set[int]) -> np.ndarray:
        """Drop the rows of nodes not present that no row number in ``referenced`` names (the caller's
        pods and slots); returns the new row of every old one (-1: dropped), for the caller to remap.

        Live rows keep their relative order, so every tie broken by row order among them breaks alike
        and decisions do not change: a dropped row was never feasible (not present) and charged
        nothing (nothing referred to it). A name whose row was dropped that comes back gets a new row
        after every other, as a node added anew does in kube-scheduler's node tree. Kept score vectors
        and static masks are dropped (computed afresh they are the same floats: ``scores``); the
        arrays shrink to the rows kept."""
        n = self.n
        keep = self.present[:n].copy()
        if referenced:
            keep[np.fromiter(referenced, np.intp, len(referenced))] = True
        rows = np.flatnonzero(keep)
        new_of_old = np.full(n, -1, np.intp)
        new_of_old[rows] = np.arange(len(rows))
        order = rows.tolist()
        self.names = [self.names[i] for i in order]
        self.index = {name: j for j, name in enumerate(self.names)}
        self.labels = [self.labels[i] for i in order]
        self.taints = [self.taints[i] for i in order]
        self.ports = {int(new_of_old[i]): held for i, held in self.ports.items() if new_of_old[i] >= 0}
        cap = 64
        while cap < len(order):
            cap *= 2
        for name, fill, axis in _ROW_ARRAYS:
            setattr(self, name, _padded(np.take(getattr(self, name), rows, axis=axis), cap - len(order), fill, axis))
        self._nodes_changed()
        self.scored = ScoreIndex()
        self._absent_kept = len(order) - self.live
        self.pods_on.remap(new_of_old.tolist())
        return new_of_old

    def _add_total(self, vector: np.ndarray, sign: int) -> None:
        for c, amount in enumerate(vector.tolist()):
            self.total_alloc[c] += sign * amount

    def _nodes_changed(self) -> None:
        """A node came, left, or changed what it accepts: static masks, preferences and the node count are stale."""
        self._masks.clear()
        self._preferences.clear()
        self._schedulable = None
        self._node_cache.clear()

    def node_cache(self, key: Any, compute: Any) -> Any:
        """``compute()`` remembered under ``key`` until any node comes, leaves or changes its labels, taints
        or cordon (what a per-node mask of labels or taints depends on)."""
        value = self._node_cache.get(key)
        if value is None:
            value = self._node_cache[key] = compute()
        return value

    def domains(self, key: str) -> tuple[np.ndarray, list[str]]:
        """Per row, the id of its value of node label ``key`` (-1: the node lacks it or is not present), and
        the values by id: the topology domains inter-pod constraints count pods in."""
        def compute() -> tuple[np.ndarray, list[str]]:
            values: dict[str, int] = {}
            ids = np.full(self.n, -1, np.int64)
            for i in np.flatnonzero(self.present[:self.n]).tolist():
                value = self.labels[i].get(key)
                if value is not None:
                    ids[i] = values.setdefault(value, len(values))
            return ids, list(values)
        found: tuple[np.ndarray, list[str]] = self.node_cache(("domains", key), compute)
        return found

    def _set_gpu_count(self, i: int, count: int) -> None:
        if count > self.gpu_used.shape[1]:
            self.gpu_used = np.pad(self.gpu_used, ((0, 0), (0, count - self.gpu_used.shape[1])),
                                   constant_values=gpu.SENTINEL)
        row = self.gpu_used[i]
        for device in range(row.shape[0]):
            if device < count and row[device] >= gpu.SENTINEL:
                row[device] -= gpu.SENTINEL
            elif device >= count and row[device] < gpu.SENTINEL:
                row[device] += gpu.SENTINEL
        self.gpu_count[i] = count
        self.gpu_div[i] = max(count * gpu.FULL, 1)
        self._refresh_gpu(i)

    def _refresh_gpu(self, i: int) -> None:
        """Derive the node's GPU figures (room, load, GPU column) from its device row."""
        row = self.gpu_used[i].tolist()
        self.gpu_room[i] = gpu.room(row)
        self.gpu_load[i] = gpu.load(row)
        g = self.col[q.GPU]
        self.used[g, i] = (int(self.gpu_count[i]) - gpu.free_devices(row)) * gpu.FULL
        self.free[g, i] = self.alloc[g, i] - self.used[g, i]

    def device_row(self, i: int) -> list[int]:
        row: list[int] = self.gpu_used[i].tolist()
        return row

    # ------------------------------------------------------------------ usage
    def demand(self, resources: Mapping[str, int], gpu_share: int = 0, gpu_memory: int = 0,
               mark: Mark | None = None, ports: tuple[HostPort, ...] = ()) -> Demand:
        """Resolve a per-pod request (milli-units, ``pods`` included by the caller) to columns.

        Remembered per request (``DEMAND_MEMO`` of them, then afresh): every event of a bound pod
        asks again, and a Demand is immutable and its columns never move. Keys that are equal give
        equal demands (``1``, ``1.0`` and ``True`` all resolve to ``int(v) == 1``)."""
        key = (tuple(resources.items()), gpu_share, gpu_memory, mark, ports)
        demand = self._demands.get(key)
        if demand is None:
            demand = self._resolve(resources, gpu_share, gpu_memory, mark, ports)
            if len(self._demands) >= DEMAND_MEMO:
                self._demands.clear()
            self._demands[key] = demand
        return demand

    def marked(self, demand: Demand, mark: Mark | None) -> Demand:
        """The same request showing ``mark`` (its columns and amounts are the same: charging one and
        uncharging the other leaves usage as it was)."""
        if demand.mark == mark:
            return demand
        return self.demand(dict(demand.items), demand.gpu_share, demand.gpu_memory, mark, demand.ports)

    def _resolve(self, resources: Mapping[str, int], gpu_share: int, gpu_memory: int,
                 mark: Mark | None = None, ports: tuple[HostPort, ...] = ()) -> Demand:
        items = tuple(sorted((name, min(int(v), MAX_AMOUNT)) for name, v in resources.items() if v > 0))
        whole = 0
        filter_cols: list[tuple[int, int]] = []
        score_cols: list[tuple[int, int]] = []
        charge: list[tuple[int, int]] = []
        for name, amount in items:
            c = self.column(name)
            if name == q.GPU:
                if not gpu_share and not gpu_memory:  # a GPU share (of any kind) is held on devices
                    whole = -(-amount // gpu.FULL)
                    filter_cols.append((c, whole * gpu.FULL))
                continue
            filter_cols.append((c, amount))
            charge.append((c, amount))
            if name != q.PODS:
                score_cols.append((c, amount))
        return Demand(items=items, filter=tuple(filter_cols), score=tuple(score_cols),
                      charge=tuple(charge),
                      gpu_whole=whole, gpu_share=gpu_share, gpu_memory=gpu_memory, mark=mark, ports=ports)

    def charge(self, i: int, demand: Demand, devices: gpu.GpuCharge) -> None:
        self.touch(i)
        used, free = self.used, self.free
        # Element by element: a pod charges 3-4 distinct columns, where two fancy-indexed updates cost
        # several times as much (every bound pod is charged and uncharged on each change of its slot).
        for c, amount in demand.charge:
            used[c, i] += amount
            free[c, i] -= amount
        if devices:
            for device, share in devices:
                self.gpu_used[i, device] += share
            self._refresh_gpu(i)
        if demand.mark is not None:
            self.pods_on.add(i, demand.mark, +1)
        if demand.ports:
            held = self.ports.setdefault(i, {})
            for port in demand.ports:
                held[port] = held.get(port, 0) + 1

    def uncharge(self, i: int, demand: Demand, devices: gpu.GpuCharge) -> None:
        self.touch(i)
        used, free = self.used, self.free
        for c, amount in demand.charge:  # see ``charge``
            used[c, i] -= amount
            free[c, i] += amount
        if devices:
            for device, share in devices:
                self.gpu_used[i, device] -= share
            self._refresh_gpu(i)
        if demand.mark is not None:
            self.pods_on.add(i, demand.mark, -1)
        if demand.ports:
            held = self.ports[i]
            for port in demand.ports:
                held[port] -= 1
                if not held[port]:
                    del held[port]
            if not held:
                del self.ports[i]

    def port_conflicts(self, ports: tuple[HostPort, ...]) -> np.ndarray:
        """Rows where a pod binding ``ports`` would meet a host port already held (NodePorts' filter)."""
        out = np.zeros(self.n, bool)
        for i, held in self.ports.items():
            out[i] = port_taken(held, ports)
        return out

    # ------------------------------------------------------------------ filtering and scoring
    def static_mask(self, pod_set: PodSet) -> np.ndarray:
        """Nodes this pod shape may use whatever runs there (present, cordon, taints, selector, affinity, what
        its claims allow); cached."""
        key = pod_set.constraint_key
        mask = self._masks.get(key)
        if mask is None:
            n = self.n
            mask = self.present[:n] & self.schedulable[:n] & ~self.hard_tainted[:n]
            verdict = self.volumes.verdict(pod_set.volumes) if pod_set.volumes else None
            if verdict is not None and verdict.wait:
                mask[:] = False
                candidates = np.flatnonzero(mask)
            elif pod_set.node_selector or pod_set.affinity or verdict is not None and verdict.restricts:
                candidates = np.flatnonzero(self.present[:n])
            else:
                candidates = np.flatnonzero(self.present[:n] & ~mask)
            for i in candidates.tolist():
                mask[i] = filters.static_failure(self.labels[i], self.taints[i], not self.schedulable[i],
                                                 pod_set) is None and (verdict is None or verdict.allows(self.labels[i], self.names[i]))
            self._masks[key] = mask
        return mask

    def volumes_changed(self) -> None:
        """A claim, volume or storage class changed: what pod sets' claims allow is judged again."""
        self._masks.clear()
        self._preferences.clear()

    def preference(self, pod_set: PodSet) -> np.ndarray | None:
        """Per row, how much ``pod_set``'s preferred node affinity favours the node, in [0, 1]; None when it
        has none. kube-scheduler's ``NodeAffinity.Score`` sums the weights of the terms a node matches, and
        ``NormalizeScore`` (``helper.DefaultNormalizeScore``) scales them to 0-100 by the highest, in integers;
        the highest is taken over the nodes the static filters leave, so the value is one node's own (the
        node index keeps working) and only changes when the nodes do. Cached like the static masks."""
        if not pod_set.preferred:
            return None
        key = (pod_set.constraint_key, pod_set.preferred)
        cached = self._preferences.get(key)
        if cached is None:
            n = self.n
            static = self.static_mask(pod_set)[:n]
            weights = np.zeros(n, np.int64)
            for i in np.flatnonzero(self.present[:n]).tolist():
                labels = self.labels[i]
                weights[i] = sum(term.weight for term in pod_set.preferred
                                 if all(expression_matches(labels, e) for e in term.expressions))
            top = int(weights[static].max()) if static.any() else 0
            cached = ((100 * weights) // top if top else np.zeros(n, np.int64)) / 100.0
            self._preferences[key] = cached
        return cached

    @staticmethod
    def preference_scale(demand: Demand) -> float:
        """What a fully preferred node adds for one pod of ``demand``: ``PREFERENCE_WEIGHT`` times the range of the
        strategy's score, one per resource it sums (kube-scheduler's NodeResourcesFit averages them to 0-100)."""
        parts = len(demand.score) + (1 if demand.gpu_need or demand.gpu_memory else 0)
        return PREFERENCE_WEIGHT * max(parts, 1)

    def feasible(self, demand: Demand, static: np.ndarray, sl: slice | np.ndarray) -> np.ndarray:
        ok = static[sl].copy()
        if demand.ports and self.ports:
            ok &= ~self.port_conflicts(demand.ports)[sl]
        for c, amount in demand.filter:
            ok &= self.free[c, sl] >= amount
        if demand.gpu_share:
            ok &= self.gpu_room[sl] >= demand.gpu_share
        elif demand.gpu_memory:
            ok &= self.gpu_room[sl] >= self.memory_need(demand.gpu_memory, sl)
        return ok

    def memory_need(self, memory: int, sl: slice | np.ndarray) -> np.ndarray:
        """Per row, the share of one device ``memory`` MiB is there (``gpumemory.share``, the same
        integers), ``gpu.SENTINEL`` where the node's GPU memory is unknown: more than any room."""
        mem = self.gpu_memory[sl]
        need = 10 * -((-100 * memory) // np.maximum(mem, 1))
        return np.where(mem > 0, need, gpu.SENTINEL)

    def share_on(self, i: int, demand: Demand) -> int:
        """Thousandths of one device a pod of ``demand`` holds on node ``i``: its ``gpu-fraction``, or
        its memory's share of this node's devices (``gpu.SENTINEL`` when unknown there, which fits no
        device)."""
        if demand.gpu_share or not demand.gpu_memory:
            return demand.gpu_share
        return gpumemory.share(demand.gpu_memory, int(self.gpu_memory[i])) or gpu.SENTINEL

    def least_gpu_memory(self) -> int:
        """The least memory per GPU device among schedulable nodes with GPUs that state it (MiB; 0 if
        none does): what a ``gpu-memory`` pod is charged at before it has a node (KAI's
        ``MinNodeGPUMemory``, ``pkg/scheduler/cache/cluster_info/cluster_info.go`` ``snapshotNodes``)."""
        n = self.n
        stated = self.gpu_memory[:n][self.present[:n] & self.schedulable[:n] & (self.gpu_count[:n] > 0)
                                     & (self.gpu_memory[:n] > 0)]
        return int(stated.min()) if stated.size else 0

    def scores(self, demand: Demand, pod_set: PodSet, strategy: str) -> np.ndarray:
        """Every node's score for one more pod of ``demand`` and ``pod_set``'s constraints, ``-inf``
        where it does not fit: the vector the gang placer takes the best node from (``argmax``: ties
        to the lowest row).

        The node index: under binpack and spread a node's fit and score depend on that node's row
        alone, so one vector is kept per pod shape (demand, constraints, strategy) and only the rows
        charged or uncharged since it was last asked for (``ScoreIndex.changed``) are computed again, with the
        same elementwise numpy arithmetic (so the same floats), instead of every node for every pod
        set of every gang: between two gangs a few dozen rows change out of thousands. A vector whose
        static mask was rebuilt (nodes came, left or changed) is computed afresh, and so is every
        one under ``fragmentation``, whose scores follow the workload mix too.

        The caller may write into the vector (it is the kept one) only at rows it then charges, or
        names to ``touch``, so that the next call computes them again."""
        static = self.static_mask(pod_set)
        prefer = self.preference(pod_set)
        if strategy == FRAGMENTATION:
            return self._fresh(demand, static, strategy, slice(0, self.n), prefer)
        key = (demand.items, demand.gpu_share, demand.gpu_memory, strategy, pod_set.constraint_key, demand.ports,
               pod_set.preferred)
        index = self.scored
        kept = index.kept.get(key)
        changed = index.changed
        if kept is None or kept.static is not static or (prefer is not None and kept.prefer is not prefer):
            if len(index.kept) >= SCORED_SHAPES:
                index.kept.clear()
            kept = index.kept[key] = _Scored(static, self._fresh(demand, static, strategy, slice(0, self.n), prefer),
                                               len(changed), prefer)
        elif kept.seen < len(changed):
            rows = set(changed[kept.seen:])
            if len(rows) <= ONE_BY_ONE:
                vector = kept.vector
                for i in rows:
                    vector[i] = self.fit_score(demand, static, strategy, i, prefer)
            elif len(rows) * 4 < self.n:
                at = np.fromiter(rows, np.intp, len(rows))
                kept.vector[at] = self._fresh(demand, static, strategy, at, prefer)
            else:
                kept.vector = self._fresh(demand, static, strategy, slice(0, self.n), prefer)
            kept.seen = len(changed)
        return kept.vector

    def fit_score(self, demand: Demand, static: np.ndarray, strategy: str, i: int,
                  prefer: np.ndarray | None = None) -> float:
        """``_fresh`` for one row under binpack or spread, element by element: numpy's own scalar
        arithmetic on the same dtypes in the same order (int64 sum, float64 quotient, float64 sums),
        so the very float ``_fresh`` gives, far more cheaply than numpy calls on a one-row slice."""
        if not static[i]:
            return -np.inf
        if demand.ports and i in self.ports and port_taken(self.ports[i], demand.ports):
            return -np.inf
        free = self.free
        for c, amount in demand.filter:
            if free[c, i] < amount:
                return -np.inf
        need = demand.gpu_need
        if demand.gpu_share and self.gpu_room[i] < demand.gpu_share:
            return -np.inf
        if demand.gpu_memory:
            need = self.share_on(i, demand)
            if self.gpu_room[i] < need:
                return -np.inf
        used, divisor = self.used, self.divisor
        total = None
        for c, amount in demand.score:
            part = (used[c, i] + amount) / divisor[c, i]
            total = part if total is None else total + part
        if need:
            part = (self.gpu_load[i] + need) / self.gpu_div[i]
            total = part if total is None else total + part
        if total is None:
            total = np.float64(0.0)
        if prefer is not None:
            return float((-total if strategy == "spread" else total) + self.preference_scale(demand) * prefer[i])
        return float(-total if strategy == "spread" else total)

    def touch(self, i: int) -> None:
        """Row ``i`` changed, or a vector from ``scores`` was written there without a charge."""
        index = self.scored
        index.changed.append(i)
        if len(index.changed) >= CHANGED_ROWS:  # the log starts afresh; kept vectors are computed anew
            index.changed.clear()
            index.kept.clear()

    def _fresh(self, demand: Demand, static: np.ndarray, strategy: str, rows: slice | np.ndarray,
               prefer: np.ndarray | None = None) -> np.ndarray:
        """Fit and score of ``rows`` (a slice from 0, or row numbers), ``-inf`` where the pod does not fit."""
        ok = self.feasible(demand, static, rows)
        if strategy != FRAGMENTATION:  # elementwise: scoring every row gives the fitting ones the same floats
            return np.where(ok, self.score(demand, strategy, rows, prefer), -np.inf)
        picked = np.flatnonzero(ok)
        out = np.full(len(ok), -np.inf)
        out[picked] = self.score(demand, strategy, picked if isinstance(rows, slice) else rows[picked], prefer)
        return out

    def score(self, demand: Demand, strategy: str, sl: slice | np.ndarray,
              prefer: np.ndarray | None = None) -> np.ndarray:
        """Higher is better. binpack: Σ over requested resources of utilisation after placing; spread:
        its negative; fragmentation: least rise of GPU fragmentation first, then binpack's score. A
        preference (``preference``) adds ``preference_scale`` times its value to binpack's or spread's
        score (under fragmentation, to the binpack part, below the rise)."""
        utilisation = self._utilisation(demand, sl)
        if strategy == "spread":
            out = -utilisation
        elif strategy == FRAGMENTATION:
            rise, _ = self._fragmentation_rise(demand, sl)
            out = utilisation - TIE_BREAK * rise
        else:
            out = utilisation
        if prefer is not None:
            return out + self.preference_scale(demand) * prefer[sl]
        return out

    def _utilisation(self, demand: Demand, sl: slice | np.ndarray) -> np.ndarray:
        total: np.ndarray | None = None
        for c, amount in demand.score:
            part = (self.used[c, sl] + amount) / self.divisor[c, sl]
            total = part if total is None else total + part
        if demand.gpu_need:
            part = (self.gpu_load[sl] + demand.gpu_need) / self.gpu_div[sl]
            total = part if total is None else total + part
        elif demand.gpu_memory:
            part = (self.gpu_load[sl] + self.memory_need(demand.gpu_memory, sl)) / self.gpu_div[sl]
            total = part if total is None else total + part
        if total is None:
            total = np.zeros(self._count(sl), np.float64)
        return total

    def _fragmentation_rise(self, demand: Demand, sl: slice | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``fragmentation.increase`` on the rows with GPUs; a node without any has no fragment to grow."""
        rows = np.arange(self.n)[sl] if isinstance(sl, slice) else sl
        with_gpus = np.flatnonzero(self.gpu_count[rows] > 0)
        rise, device = np.zeros(len(rows)), np.full(len(rows), -1, np.intp)
        cpu, memory, whole, share = demand.shape
        groups = [(share, with_gpus)]
        if with_gpus.size and demand.gpu_memory:  # the share is each node's own: rows grouped by it
            needs = self.memory_need(demand.gpu_memory, rows[with_gpus])
            groups = [(need, with_gpus[needs == need]) for need in sorted(set(needs[needs <= gpu.FULL].tolist()))]
        for need, part in groups:
            if part.size:
                at = rows[part]
                rise[part], device[part] = fragmentation.increase(
                    fragmentation.free_shares(self.gpu_used[at]), self.free[self.col[q.CPU], at],
                    self.free[self.col[q.MEMORY], at], self.mix.arrays(), cpu, memory, whole, need)
        return rise, device

    def _count(self, sl: slice | np.ndarray) -> int:
        return len(range(*sl.indices(self.n))) if isinstance(sl, slice) else len(sl)

    def devices_for(self, i: int, demand: Demand, strategy: str) -> gpu.GpuCharge | None:
        """The devices a pod placed on node ``i`` gets; None when it cannot host it (the caller filtered).

        A fractional pod goes to the fullest device that fits (``gpu.charge_for``), except under
        ``fragmentation``, where it goes to the device whose use raises the node's fragmentation least.
        """
        share = self.share_on(i, demand)
        if share > gpu.FULL:  # a gpu-memory pod this node's devices cannot hold (the caller filtered)
            return None
        if strategy == FRAGMENTATION and share:
            _, device = self._fragmentation_rise(demand, slice(i, i + 1))
            return None if device[0] < 0 else ((int(device[0]), share),)
        return gpu.charge_for(self.device_row(i), demand.gpu_whole, share)

    # ------------------------------------------------------------------ totals
    def totals(self) -> dict[str, int]:
        return {r: self.total_alloc[c] for c, r in enumerate(self.resources) if self.total_alloc[c] > 0}

    def free_gpu(self) -> int:
        """Thousandths of a device free over present, schedulable nodes, however spread over devices: what
        any moving of pods could ever give a gang."""
        n = self.n
        mask = self.present[:n] & self.schedulable[:n]
        return int((self.gpu_count[:n] * gpu.FULL - self.gpu_load[:n])[mask].sum())

    def schedulable_count(self) -> int:
        """Present, schedulable nodes (every CapacityChanged says it): counted again only after a change."""
        if self._schedulable is None:
            n = self.n
            self._schedulable = int((self.present[:n] & self.schedulable[:n]).sum())
        return self._schedulable

