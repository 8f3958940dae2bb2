"""Inter-pod constraints: pod affinity and anti-affinity, and topology spread, as kube-scheduler's
InterPodAffinity and PodTopologySpread plugins decide them (``docs/design/placement.md``, "Inter-pod
affinity and anti-affinity" and "Topology spread constraints").

Where other pods run is kept as an index of *marks*: a mark is what a pod shows to others' selectors
(namespace, labels) and the required anti-affinity terms it holds against them. A ``Demand`` carries
its pod's mark, so the one place that charges a node (``NodeTable.charge``, also inside a statement)
counts the mark there, and a statement's rollback, a victim's release or an eviction takes it off
again with the charge: the gang's own pods placed earlier in the attempt count exactly as running
ones do (kube-scheduler's ``AddPod`` on its cycle state), and nothing can be left counted.

Nothing of this costs a cluster that has no such constraint: marks are made only once the index is
*on* (``NodeTable.marking``), which the first pod set or running pod with an inter-pod constraint
turns on (``activate``); from then on every pod charged is marked. A pod set without constraints of
its own is placed as before unless some counted pod holds required anti-affinity (kube-scheduler
skips the plugin on the same test: ``PreFilter`` returns ``Skip``).

Counting: selectors are matched once per distinct mark (``PodIndex.matching``, kept and extended as new
marks appear); pods per node are summed from the matched marks' rows, and per topology domain by one
``bincount`` over the node table's domain ids (``NodeTable.domains``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np

from services.placement import filters
from shared.kernel import kube
from shared.kernel.model import LabelSelector, PodAffinityTerm, PodSet, SpreadConstraint, WorkloadSpec
from shared.kernel.podconstraints import ConstraintError, matches, pod_affinity, with_own_labels

if TYPE_CHECKING:
    from services.placement.nodes import NodeTable

AFFINITY_RULES = "node(s) didn't match pod affinity rules"
"""kube-scheduler's ``ErrReasonAffinityRulesNotMatch`` (interpodaffinity/filtering.go)."""
ANTI_AFFINITY_RULES = "node(s) didn't match pod anti-affinity rules"
"""``ErrReasonAntiAffinityRulesNotMatch``."""
EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
"""``ErrReasonExistingAntiAffinityRulesNotMatch``."""
SPREAD = "node(s) didn't match pod topology spread constraints"
"""kube-scheduler's ``ErrReasonConstraintsNotMatch`` (podtopologyspread/filtering.go)."""
SPREAD_LABEL = SPREAD + " (missing required label)"
"""``ErrReasonNodeLabelNotMatch``."""
HOSTNAME = "kubernetes.io/hostname"
"""``v1.LabelHostname``: a spread over it has as many domains as nodes (``scoring.go`` ``initPreScoreState``)."""
MAX_NODE_SCORE = 100.0
"""``framework.MaxNodeScore``: each soft rule's scores are normalised to 0..100 over the candidate nodes."""


@dataclass(frozen=True)
class Mark:
    """What one pod shows other pods' selectors, and the required anti-affinity it holds against them
    (selectors with the pod's own ``matchLabelKeys`` already added)."""

    namespace: str
    labels: tuple[tuple[str, str], ...]
    anti: tuple[PodAffinityTerm, ...] = ()


@dataclass
class PodIndex:
    """Pods counted on the nodes, by mark: per mark, its rows and how many of its pods each holds."""

    gid: dict[Mark, int] = field(default_factory=dict)
    marks: list[Mark] = field(default_factory=list)
    rows: list[dict[int, int]] = field(default_factory=list)
    anti_pods: int = 0
    """Pods counted whose mark holds required anti-affinity: while 0, a pod set without constraints of its
    own has nothing to check (kube-scheduler's ``Skip``)."""
    matched: dict[Any, tuple[list[int], int]] = field(default_factory=dict)
    """(selector, namespaces) -> (ids of the marks it matches, how many marks it has looked at)."""

    def __getstate__(self) -> dict[str, Any]:
        """A snapshot leaves the selector memo out: it is matched again as asked."""
        state = self.__dict__.copy()
        state["matched"] = {}
        return state

    def add(self, row: int, mark: Mark, sign: int) -> None:
        g = self.gid.get(mark)
        if g is None:
            g = self.gid[mark] = len(self.marks)
            self.marks.append(mark)
            self.rows.append({})
        rows = self.rows[g]
        count = rows.get(row, 0) + sign
        if count:
            rows[row] = count
        else:
            rows.pop(row, None)
        if mark.anti:
            self.anti_pods += sign

    def matching(self, sel: LabelSelector | None, namespaces: frozenset[str] | None) -> list[int]:
        """Ids of the marks a selector over ``namespaces`` (None: every one) matches, each mark tested once."""
        key = (sel, namespaces)
        found, seen = self.matched.get(key, ([], 0))
        if seen < len(self.marks):
            found = list(found)
            for g in range(seen, len(self.marks)):
                mark = self.marks[g]
                if (namespaces is None or mark.namespace in namespaces) and matches(sel, dict(mark.labels)):
                    found.append(g)
            self.matched[key] = (found, len(self.marks))
        return found

    def counts(self, gids: Iterable[int], n: int) -> np.ndarray:
        """Pods of these marks on each of the first ``n`` rows."""
        out = np.zeros(n, np.int64)
        for g in gids:
            for row, count in self.rows[g].items():
                if row < n:
                    out[row] += count
        return out

    def remap(self, new_of_old: list[int]) -> None:
        """Rows moved (``NodeTable.compact``); a row that was dropped held nothing."""
        self.rows = [{new_of_old[r]: c for r, c in rows.items() if new_of_old[r] >= 0} for rows in self.rows]


def term_namespaces(term: PodAffinityTerm, own: str) -> frozenset[str] | None:
    """The namespaces a term reads (None: all): its list, else the pod's own (``GetNamespacesFromPodAffinityTerm``)."""
    if term.all_namespaces:
        return None
    return frozenset(term.namespaces) if term.namespaces else frozenset((own,))


def _resolved(term: PodAffinityTerm, labels: Mapping[str, str]) -> PodAffinityTerm:
    sel = with_own_labels(term.selector, labels, term.match_label_keys, term.mismatch_label_keys)
    return term if sel is term.selector else term.model_copy(update={"selector": sel})


def mark_of(namespace: str, labels: Mapping[str, str], anti: Iterable[PodAffinityTerm] = ()) -> Mark:
    return Mark(namespace, tuple(sorted(labels.items())), tuple(_resolved(t, labels) for t in anti))


def pod_set_mark(ps: PodSet) -> Mark:
    """The mark of a pod of ``ps`` (``marked_spec`` gave it its namespace and full labels)."""
    return mark_of(ps.namespace, ps.labels, ps.pod_affinity.required_anti if ps.pod_affinity else ())


def object_mark(namespace: str, obj: Mapping[str, Any]) -> Mark:
    """The mark of a running pod from its object: labels as they are, required anti-affinity terms as
    ``shared.kernel.podconstraints`` reads them (a pod whose terms cannot be read shows its labels only:
    another scheduler placed it, and a core never raises on input)."""
    labels = {k: v for k, v in kube.labels(obj).items() if isinstance(k, str) and isinstance(v, str)}
    try:
        affinity = pod_affinity(kube.mapping(obj.get("spec")), "spec")
    except ConstraintError:
        affinity = None
    return mark_of(namespace, labels, affinity.required_anti if affinity else ())


def holds_anti(obj: Mapping[str, Any]) -> bool:
    """Does the pod object state pod anti-affinity (turns the index on: others must respect it)?"""
    spec = obj.get("spec")
    affinity = spec.get("affinity") if isinstance(spec, Mapping) else None
    return isinstance(affinity, Mapping) and affinity.get("podAntiAffinity") is not None


def pod_labels(spec: WorkloadSpec, ps: PodSet) -> dict[str, str]:
    """The labels a pod of ``ps`` will carry: its template's, and those KubeRay's ``labelPod`` writes on
    the head and workers of the workload's RayCluster (what another pod's selector may name)."""
    labels = dict(ps.labels)
    if spec.kind in ("RayCluster", "RayJob") and ps.name != "submitter" and spec.cluster_name:
        head = ps.name == "head"
        labels.update({kube.RAY_CLUSTER: spec.cluster_name, kube.RAY_NODE_TYPE: "head" if head else "worker",
                       kube.RAY_GROUP: "headgroup" if head else ps.name})
    return labels


def marked_spec(spec: WorkloadSpec) -> WorkloadSpec:
    """``spec`` with every pod set's namespace and full labels (``pod_labels``): what its marks show."""
    sets = tuple(ps.model_copy(update={"namespace": spec.namespace, "labels": pod_labels(spec, ps)})
                 for ps in spec.gang.pod_sets)
    return spec.model_copy(update={"gang": spec.gang.model_copy(update={"pod_sets": sets})})


# ---------------------------------------------------------------------------------------------- deciding
@dataclass
class Verdict:
    """Per node row: the first inter-pod rule it fails ("" when none), and the soft score (0..200)."""

    ok: np.ndarray
    reason: list[str]
    soft: np.ndarray


def active(table: "NodeTable", ps: PodSet) -> bool:
    """Whether placing a pod of ``ps`` reads the index at all."""
    return table.marking and (ps.inter_pod or table.pods_on.anti_pods > 0)


def evaluate(table: "NodeTable", ps: PodSet, candidates: np.ndarray) -> Verdict:
    """Filter (in kube-scheduler's order: PodTopologySpread, then InterPodAffinity's affinity, anti-affinity
    and existing pods' anti-affinity) and soft score of one more pod of ``ps`` on every node row;
    ``candidates``: the rows that pass every other filter, over which soft scores are normalised."""
    n = table.n
    reason = [""] * n
    own = dict(ps.labels)
    fails = _spread_filter(table, ps, own, n) + _affinity_filter(table, ps, own, n)
    for why, mask in fails:
        for i in np.flatnonzero(mask).tolist():
            if not reason[i]:
                reason[i] = why
    ok = np.ones(n, bool)
    for _, mask in fails:
        ok &= ~mask
    soft = _affinity_score(table, ps, own, n, candidates & ok) + _spread_score(table, ps, own, n, candidates & ok)
    return Verdict(ok, reason, soft)


def _domain_counts(ids: np.ndarray, counts: np.ndarray, rows: np.ndarray, size: int) -> np.ndarray:
    """Pods per domain over ``rows`` (a mask): ``counts`` summed by domain id."""
    pick = rows & (ids >= 0)
    return np.bincount(ids[pick], weights=counts[pick], minlength=size).astype(np.int64)


def _at(dc: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Each row's domain count (0 where the row has no such label)."""
    return np.where(ids >= 0, dc[np.maximum(ids, 0)] if dc.size else 0, 0)


def _spread_filter(table: "NodeTable", ps: PodSet, own: dict[str, str], n: int) -> list[tuple[str, np.ndarray]]:
    hard = [c for c in ps.spread if c.hard]
    if not hard:
        return []
    present = table.present[:n]
    keyed = present.copy()
    for c in hard:  # a node takes part only with every hard constraint's key (``nodeLabelsMatchSpreadConstraints``)
        keyed &= table.domains(c.topology_key)[0] >= 0
    label_fail = np.zeros(n, bool)
    skew_fail = np.zeros(n, bool)
    decided = np.zeros(n, bool)  # the first constraint a node fails is the one it reports
    for c in hard:
        ids, values = table.domains(c.topology_key)
        missing = present & (ids < 0)
        sel = with_own_labels(c.selector, own, c.match_label_keys)
        counts = _spread_counts(table, sel, ps.namespace, n)
        eligible = keyed & _inclusion(table, ps, c, n)
        dc = _domain_counts(ids, counts, eligible, len(values))
        domains = np.bincount(ids[eligible & (ids >= 0)], minlength=len(values)) > 0
        least = 0 if int(domains.sum()) < c.min_domains else int(dc[domains].min())
        self_match = 1 if matches(sel, own) else 0
        skew = present & (ids >= 0) & (_at(dc, ids) + self_match - least > c.max_skew)
        label_fail |= missing & ~decided
        skew_fail |= skew & ~decided
        decided |= missing | skew
    return [(SPREAD_LABEL, label_fail), (SPREAD, skew_fail)]


def _spread_counts(table: "NodeTable", sel: LabelSelector | None, namespace: str, n: int) -> np.ndarray:
    """Pods a spread constraint counts on each row: those of ``namespace`` its selector matches, and none at
    all for an empty selector (``{}``), though it matches every pod (``countPodsMatchSelector`` returns 0
    when ``selector.Empty()``; the pod itself still counts as matching: found by the differential test)."""
    if sel is not None and not sel.match_labels and not sel.match_expressions:
        return np.zeros(n, np.int64)
    return table.pods_on.counts(table.pods_on.matching(sel, frozenset((namespace,))), n)


def _inclusion(table: "NodeTable", ps: PodSet, c: SpreadConstraint, n: int) -> np.ndarray:
    """Nodes a constraint counts (``matchNodeInclusionPolicies``): the pod's node selector and required node
    affinity when ``nodeAffinityPolicy`` is Honor, its tolerations when ``nodeTaintsPolicy`` is Honor."""
    honor_affinity, honor_taints = c.node_affinity_policy == "Honor", c.node_taints_policy == "Honor"
    if not honor_affinity and not honor_taints:
        return table.present[:n]

    def compute() -> np.ndarray:
        mask = table.present[:n].copy()
        for i in np.flatnonzero(mask).tolist():
            labels = table.labels[i]
            if honor_affinity and not (filters.selector_matches(labels, ps.node_selector)
                                       and filters.affinity_matches(labels, ps.affinity)):
                mask[i] = False
            elif honor_taints and filters.untolerated(table.taints[i], ps.tolerations) is not None:
                mask[i] = False
        return mask

    found: np.ndarray = table.node_cache(("inclusion", ps.constraint_key, honor_affinity, honor_taints), compute)
    return found


def _affinity_filter(table: "NodeTable", ps: PodSet, own: dict[str, str], n: int) -> list[tuple[str, np.ndarray]]:
    index = table.pods_on
    present = table.present[:n]
    out: list[tuple[str, np.ndarray]] = []
    aff = ps.pod_affinity
    if aff is not None and aff.required:
        terms = [_resolved(t, own) for t in aff.required]
        common: set[int] | None = None  # marks matching every term (``podMatchesAllAffinityTerms``)
        for t in terms:
            found = set(index.matching(t.selector, term_namespaces(t, ps.namespace)))
            common = found if common is None else common & found
        counts = index.counts(sorted(common or ()), n)
        fail = np.zeros(n, bool)
        exist = np.ones(n, bool)
        anywhere = False
        for t in terms:
            ids, values = table.domains(t.topology_key)
            fail |= present & (ids < 0)  # every topology label must be on the node
            dc = _domain_counts(ids, counts, present, len(values))
            anywhere |= bool(dc.sum())
            exist &= _at(dc, ids) > 0
        first = not anywhere and all(  # the first of a group with affinity to itself may go anywhere it may
            (ns is None or ps.namespace in ns) and matches(t.selector, own)
            for t in terms for ns in (term_namespaces(t, ps.namespace),))
        if not first:
            fail |= present & ~exist
        out.append((AFFINITY_RULES, fail))
    if aff is not None and aff.required_anti:
        fail = np.zeros(n, bool)
        for t in (_resolved(t, own) for t in aff.required_anti):
            counts = index.counts(index.matching(t.selector, term_namespaces(t, ps.namespace)), n)
            ids, values = table.domains(t.topology_key)
            fail |= present & (_at(_domain_counts(ids, counts, present, len(values)), ids) > 0)
        out.append((ANTI_AFFINITY_RULES, fail))
    if index.anti_pods > 0:
        out.append((EXISTING_ANTI_AFFINITY, _existing_anti(table, ps, own, n)))
    return out


def _existing_anti(table: "NodeTable", ps: PodSet, own: dict[str, str], n: int) -> np.ndarray:
    """Rows in a topology domain where a counted pod's required anti-affinity term matches this pod."""
    index = table.pods_on
    present = table.present[:n]
    forbidden: dict[str, set[int]] = {}
    for g, mark in enumerate(index.marks):
        if not mark.anti or not index.rows[g]:
            continue
        for t in mark.anti:
            ns = term_namespaces(t, mark.namespace)
            if (ns is not None and ps.namespace not in ns) or not matches(t.selector, own):
                continue
            ids = table.domains(t.topology_key)[0]
            hit = forbidden.setdefault(t.topology_key, set())
            for row in index.rows[g]:
                if row < n and ids[row] >= 0:
                    hit.add(int(ids[row]))
    fail = np.zeros(n, bool)
    for key, hit in forbidden.items():
        if hit:
            ids = table.domains(key)[0]
            fail |= present & np.isin(ids, np.fromiter(hit, np.int64, len(hit)))
    return fail


def _affinity_score(table: "NodeTable", ps: PodSet, own: dict[str, str], n: int, scored: np.ndarray) -> np.ndarray:
    """InterPodAffinity's score from the pod's preferred terms: per term, its weight for each matching pod in
    the node's domain (minus for anti-affinity), normalised to 0..100 over ``scored`` (``NormalizeScore``)."""
    aff = ps.pod_affinity
    if aff is None or not (aff.preferred or aff.preferred_anti):
        return np.zeros(n)
    index = table.pods_on
    present = table.present[:n]
    raw = np.zeros(n, np.int64)
    for sign, weighted in ((1, aff.preferred), (-1, aff.preferred_anti)):
        for w in weighted:
            t = _resolved(w, own)
            counts = index.counts(index.matching(t.selector, term_namespaces(t, ps.namespace)), n)
            ids, values = table.domains(t.topology_key)
            raw += sign * w.weight * _at(_domain_counts(ids, counts, present, len(values)), ids)
    out = np.zeros(n)
    if scored.any():
        low, high = int(raw[scored].min()), int(raw[scored].max())
        if high > low:
            out[scored] = MAX_NODE_SCORE * (raw[scored] - low) / (high - low)
    return out


def _spread_score(table: "NodeTable", ps: PodSet, own: dict[str, str], n: int, scored: np.ndarray) -> np.ndarray:
    """PodTopologySpread's score for ``ScheduleAnyway`` constraints: per constraint, the matching pods in the
    node's domain times ``log(domains + 2)`` plus ``maxSkew - 1``; fewer is better, normalised as its
    ``NormalizeScore`` does (nodes without every key score 0)."""
    soft = [c for c in ps.spread if not c.hard]
    out = np.zeros(n)
    if not soft or not scored.any():
        return out
    present = table.present[:n]
    keyed = scored.copy()
    for c in soft:
        keyed &= table.domains(c.topology_key)[0] >= 0
    raw = np.zeros(n)
    for c in soft:
        ids, values = table.domains(c.topology_key)
        sel = with_own_labels(c.selector, own, c.match_label_keys)
        counts = _spread_counts(table, sel, ps.namespace, n)
        eligible = present & (ids >= 0) & _inclusion(table, ps, c, n)
        dc = _domain_counts(ids, counts, eligible, len(values))
        size = int(keyed.sum()) if c.topology_key == HOSTNAME else len(set(ids[keyed].tolist()))
        weight = float(np.log(size + 2))
        raw += _at(dc, ids) * weight + (c.max_skew - 1)
    raw = np.round(raw)
    if keyed.any():
        high, low = float(raw[keyed].max()), float(raw[keyed].min())
        out[keyed] = MAX_NODE_SCORE if high == 0 else MAX_NODE_SCORE * (high + low - raw[keyed]) / high
    return out


# ---------------------------------------------------------------------------------------------- turning on
def activate(table: "NodeTable", pods: Iterable[Any], workloads: Iterable[Any]) -> bool:
    """Turn the index on (once): every pod charged and every slot of an admitted workload gets its mark,
    and each workload's spec its pod sets' namespaces and full labels (``marked_spec``). The marks go into
    the index directly (the usage they charge is the same). False when it was on already."""
    if table.marking:
        return False
    table.marking = True
    for wrec in workloads:
        wrec.spec = marked_spec(wrec.spec)
        sets = {ps.name: ps for ps in wrec.spec.gang.pod_sets}
        for slot in wrec.slots:
            ps = sets.get(slot.pod_set)
            if ps is None:
                continue
            slot.demand = table.marked(slot.demand, pod_set_mark(ps))
            if slot.reserving:
                table.pods_on.add(slot.node, slot.demand.mark, +1)
    for rec in pods:
        if rec.node is not None and rec.demand is not None:
            rec.demand = table.marked(rec.demand, object_mark(rec.facts.namespace, rec.obj))
            table.pods_on.add(rec.node, rec.demand.mark, +1)
    table.scored.kept.clear()
    return True
