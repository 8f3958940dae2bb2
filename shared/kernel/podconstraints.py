"""A pod spec's inter-pod constraints, read into typed form: pod (anti-)affinity and topology spread.

One reader for admission (a template, refused with the reason) and placement (a running pod another
scheduler may have bound, and a plain pod matched to its pod set by shape), so both read a pod alike.
What the API server itself refuses is refused here too, with the field and value; what muster cannot
evaluate (a ``namespaceSelector`` with labels: muster does not watch Namespaces) is refused by name.
Never raises anything but ``ConstraintError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.kernel.model import LabelSelector, MatchExpression, PodAffinity, PodAffinityTerm, SpreadConstraint

_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
_UNSATISFIABLE = ("DoNotSchedule", "ScheduleAnyway")
_POLICIES = ("Honor", "Ignore")


class ConstraintError(ValueError):
    """A constraint that cannot be read: the field's path and why, in one line."""


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConstraintError(f"{where}: {value!r} is not a mapping")
    return value


def _list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConstraintError(f"{where}: {value!r} is not a list")
    return value


def _string(value: object, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConstraintError(f"{where}: {value!r} is not a string")
    return value


def _strings(value: object, where: str) -> tuple[str, ...]:
    return tuple(_string(v, f"{where}[{i}]") for i, v in enumerate(_list(value, where)))


def _integer(value: object, where: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ConstraintError(f"{where}: {value!r} is not an integer")
    return int(value)


def selector(raw: object, where: str) -> LabelSelector | None:
    """A ``metav1.LabelSelector``; None when absent (it then matches no pod)."""
    if raw is None:
        return None
    sel = _mapping(raw, where)
    labels = _mapping(sel.get("matchLabels"), f"{where}.matchLabels")
    exprs: list[MatchExpression] = []
    for j, e_raw in enumerate(_list(sel.get("matchExpressions"), f"{where}.matchExpressions")):
        at = f"{where}.matchExpressions[{j}]"
        e = _mapping(e_raw, at)
        key, op = _string(e.get("key"), f"{at}.key"), _string(e.get("operator"), f"{at}.operator")
        if not key:
            raise ConstraintError(f"{at}.key: missing")
        if op not in _OPERATORS:
            raise ConstraintError(f"{at}.operator: {op!r} is not one of {', '.join(_OPERATORS)}")
        values = _strings(e.get("values"), f"{at}.values")
        if (op in ("In", "NotIn")) != bool(values):
            raise ConstraintError(f"{at}.values: {op} needs values, Exists and DoesNotExist take none")
        exprs.append(MatchExpression(key=key, operator=op, values=values))  # type: ignore[arg-type]
    return LabelSelector(match_labels=tuple(sorted((str(k), _string(v, f"{where}.matchLabels.{k}"))
                                                   for k, v in labels.items())),
                         match_expressions=tuple(exprs))


def _term(raw: object, where: str) -> PodAffinityTerm:
    t = _mapping(raw, where)
    key = _string(t.get("topologyKey"), f"{where}.topologyKey")
    if not key:
        raise ConstraintError(f"{where}.topologyKey: missing (the API server requires it)")
    all_namespaces = False
    ns_selector = t.get("namespaceSelector")
    if ns_selector is not None:
        chosen = selector(ns_selector, f"{where}.namespaceSelector")
        if chosen is not None and (chosen.match_labels or chosen.match_expressions):
            raise ConstraintError(f"{where}.namespaceSelector: selecting namespaces by their labels is not supported "
                                  "by muster (it does not watch Namespaces); list them in namespaces, or use {} for all")
        all_namespaces = True
    return PodAffinityTerm(selector=selector(t.get("labelSelector"), f"{where}.labelSelector"),
                           namespaces=_strings(t.get("namespaces"), f"{where}.namespaces"),
                           all_namespaces=all_namespaces, topology_key=key,
                           match_label_keys=_strings(t.get("matchLabelKeys"), f"{where}.matchLabelKeys"),
                           mismatch_label_keys=_strings(t.get("mismatchLabelKeys"), f"{where}.mismatchLabelKeys"))


def _terms(block: Mapping[str, Any], where: str, anti: bool) -> list[PodAffinityTerm]:
    at = f"{where}.requiredDuringSchedulingIgnoredDuringExecution"
    out = [_term(raw, f"{at}[{i}]").model_copy(update={"anti": anti})
           for i, raw in enumerate(_list(block.get("requiredDuringSchedulingIgnoredDuringExecution"), at))]
    at = f"{where}.preferredDuringSchedulingIgnoredDuringExecution"
    for i, raw in enumerate(_list(block.get("preferredDuringSchedulingIgnoredDuringExecution"), at)):
        w = _mapping(raw, f"{at}[{i}]")
        weight = _integer(w.get("weight"), f"{at}[{i}].weight", 0)
        if not 1 <= weight <= 100:
            raise ConstraintError(f"{at}[{i}].weight: {weight} is not in 1..100")
        term = _term(w.get("podAffinityTerm"), f"{at}[{i}].podAffinityTerm")
        out.append(term.model_copy(update={"anti": anti, "weight": weight}))
    return out


def pod_affinity(spec: Mapping[str, Any], where: str) -> PodAffinity | None:
    """``spec.affinity.podAffinity`` / ``podAntiAffinity`` of a pod spec at ``where``; None when it has none."""
    affinity = _mapping(spec.get("affinity"), f"{where}.affinity")
    pod, anti = affinity.get("podAffinity"), affinity.get("podAntiAffinity")
    if pod is None and anti is None:
        return None
    terms = _terms(_mapping(pod, f"{where}.affinity.podAffinity"), f"{where}.affinity.podAffinity", False)
    terms += _terms(_mapping(anti, f"{where}.affinity.podAntiAffinity"), f"{where}.affinity.podAntiAffinity", True)
    return PodAffinity(terms=tuple(terms)) if terms else None


def spread(spec: Mapping[str, Any], where: str) -> tuple[SpreadConstraint, ...]:
    """``spec.topologySpreadConstraints`` of a pod spec at ``where``, with the API server's validation."""
    at = f"{where}.topologySpreadConstraints"
    out: list[SpreadConstraint] = []
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(_list(spec.get("topologySpreadConstraints"), at)):
        c_at = f"{at}[{i}]"
        c = _mapping(raw, c_at)
        key = _string(c.get("topologyKey"), f"{c_at}.topologyKey")
        if not key:
            raise ConstraintError(f"{c_at}.topologyKey: missing (the API server requires it)")
        skew = _integer(c.get("maxSkew"), f"{c_at}.maxSkew", 0)
        if skew < 1:
            raise ConstraintError(f"{c_at}.maxSkew: {skew} must be greater than zero")
        when = _string(c.get("whenUnsatisfiable"), f"{c_at}.whenUnsatisfiable")
        if when not in _UNSATISFIABLE:
            raise ConstraintError(f"{c_at}.whenUnsatisfiable: {when!r} is not one of {', '.join(_UNSATISFIABLE)}")
        if (key, when) in seen:
            raise ConstraintError(f"{c_at}: a second constraint of topologyKey {key!r} and {when} (the API server "
                                  "refuses duplicates)")
        seen.add((key, when))
        min_domains = _integer(c.get("minDomains"), f"{c_at}.minDomains", 1)
        if min_domains < 1:
            raise ConstraintError(f"{c_at}.minDomains: {min_domains} must be greater than zero")
        if c.get("minDomains") is not None and when != "DoNotSchedule":
            raise ConstraintError(f"{c_at}.minDomains: only allowed with whenUnsatisfiable DoNotSchedule")
        policies = []
        for name, default in (("nodeAffinityPolicy", "Honor"), ("nodeTaintsPolicy", "Ignore")):
            value = _string(c.get(name), f"{c_at}.{name}") or default
            if value not in _POLICIES:
                raise ConstraintError(f"{c_at}.{name}: {value!r} is not one of {', '.join(_POLICIES)}")
            policies.append(value)
        out.append(SpreadConstraint(max_skew=skew, topology_key=key, hard=when == "DoNotSchedule",
                                    selector=selector(c.get("labelSelector"), f"{c_at}.labelSelector"),
                                    match_label_keys=_strings(c.get("matchLabelKeys"), f"{c_at}.matchLabelKeys"),
                                    min_domains=min_domains, node_affinity_policy=policies[0],  # type: ignore[arg-type]
                                    node_taints_policy=policies[1]))  # type: ignore[arg-type]
    return tuple(out)


def matches(sel: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """Does a pod of ``labels`` match the selector (None matches nothing, an empty one everything)?"""
    if sel is None:
        return False
    for key, value in sel.match_labels:
        if labels.get(key) != value:
            return False
    for e in sel.match_expressions:
        present = e.key in labels
        if e.operator == "In":
            ok = present and labels[e.key] in e.values
        elif e.operator == "NotIn":
            ok = not present or labels[e.key] not in e.values
        elif e.operator == "Exists":
            ok = present
        else:
            ok = not present
        if not ok:
            return False
    return True


def with_own_labels(sel: LabelSelector | None, labels: Mapping[str, str], match_keys: tuple[str, ...],
                    mismatch_keys: tuple[str, ...] = ()) -> LabelSelector | None:
    """The selector with ``matchLabelKeys`` (``key In [own value]``) and ``mismatchLabelKeys`` (``key NotIn
    [own value]``) of the pod's own ``labels`` added; keys the pod lacks are left out, as kube-scheduler does."""
    if sel is None or not (match_keys or mismatch_keys):
        return sel
    extra = [MatchExpression(key=k, operator="In", values=(labels[k],)) for k in match_keys if k in labels]
    extra += [MatchExpression(key=k, operator="NotIn", values=(labels[k],)) for k in mismatch_keys if k in labels]
    if not extra:
        return sel
    return sel.model_copy(update={"match_expressions": sel.match_expressions + tuple(extra)})
