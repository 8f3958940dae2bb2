"""Node predicates that do not depend on usage: cordon, taints, nodeSelector, required node affinity.

Kubernetes runs its filter plugins in a fixed order and reports the first one that rejects a
node (NodeUnschedulable, TaintToleration, NodeAffinity, then NodeResourcesFit). ``static_failure``
keeps that order so failure reasons read like ``kubectl describe pod``. The node table caches the
outcome per ``PodSet.constraint_key`` (see ``nodes.NodeTable.static_mask``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from shared.kernel.model import MatchExpression, PodSet, Toleration

HARD_EFFECTS = ("NoSchedule", "NoExecute")
"""Taint effects that keep pods off a node; PreferNoSchedule only scores, so it is ignored here."""

UNSCHEDULABLE = "node(s) were unschedulable"
AFFINITY = "node(s) didn't match Pod's node affinity/selector"
TAINTED = "node(s) had untolerated taint(s)"
"""kube-scheduler's words since it stopped naming the taint (v1.34's TaintToleration plugin logs it at -v=4):
one count for every node a taint keeps off, whichever taint."""


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")
"""A cordoned node admits pods that tolerate this taint (the NodeUnschedulable plugin's rule)."""


def parse_taints(raw: Any) -> tuple[Taint, ...]:
    """``spec.taints`` of a Node; malformed entries are skipped (a core never raises on input)."""
    if not isinstance(raw, list):
        return ()
    out = []
    for item in raw:
        if isinstance(item, Mapping) and item.get("key") is not None:
            out.append(Taint(str(item.get("key") or ""), str(item.get("value") or ""), str(item.get("effect") or "")))
    return tuple(out)


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """Kubernetes' ``Toleration.ToleratesTaint``: empty key + Exists tolerates every taint."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator == "Exists":
        return True
    return toleration.value == taint.value


def untolerated(taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...]) -> Taint | None:
    """The first NoSchedule/NoExecute taint no toleration covers (the one Kubernetes reports)."""
    for taint in taints:
        if taint.effect in HARD_EFFECTS and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def selector_matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


_INT64 = re.compile(r"[+-]?[0-9]+")
INT64 = (-(1 << 63), (1 << 63) - 1)


def int64(text: str | None) -> int | None:
    """``text`` read as Go's ``strconv.ParseInt(text, 10, 64)`` reads it, None where that fails: ASCII digits
    after an optional sign, nothing else (no ``_``, no spaces, which Python's ``int`` takes), within int64."""
    if text is None or not _INT64.fullmatch(text):
        return None
    value = int(text)
    return value if INT64[0] <= value <= INT64[1] else None


def expression_matches(labels: Mapping[str, str], expr: MatchExpression) -> bool:
    """One requirement of a node selector term, as ``labels.Requirement.Matches`` (k8s.io/apimachinery)
    decides it. ``Gt``/``Lt``: the label and the one value both int64 (a label that is not, or a
    requirement with a value that is not, matches no node: kube-scheduler's term fails to parse)."""
    if expr.operator in ("Gt", "Lt"):
        label = int64(labels.get(expr.key))
        bound = int64(expr.values[0]) if len(expr.values) == 1 else None
        if label is None or bound is None:
            return False
        return label > bound if expr.operator == "Gt" else label < bound
    if expr.operator == "Exists":
        return expr.key in labels
    if expr.operator == "DoesNotExist":
        return expr.key not in labels
    if expr.operator == "In":
        return expr.key in labels and labels[expr.key] in expr.values
    return expr.key not in labels or labels[expr.key] not in expr.values  # NotIn


def affinity_matches(labels: Mapping[str, str], terms: tuple[tuple[MatchExpression, ...], ...]) -> bool:
    """OR over terms, AND within a term; an empty term matches nothing (as in Kubernetes), so terms that
    are all empty match no node; no terms at all (no required affinity) match every node."""
    if not terms:
        return True
    return any(term and all(expression_matches(labels, e) for e in term) for term in terms)


def static_failure(labels: Mapping[str, str], taints: tuple[Taint, ...], unschedulable: bool,
                   pod_set: PodSet) -> str | None:
    """Why this node can never host this pod set whatever its usage, or None when it can."""
    if unschedulable and not any(tolerates(t, UNSCHEDULABLE_TAINT) for t in pod_set.tolerations):
        return UNSCHEDULABLE
    if untolerated(taints, pod_set.tolerations) is not None:
        return TAINTED
    if not selector_matches(labels, pod_set.node_selector) or not affinity_matches(labels, pod_set.affinity):
        return AFFINITY
    return None
