"""The API server's RuntimeClass admission of a pod, one function for admission and the simulator.

kube-apiserver's RuntimeClass admission plugin (k8s.io/kubernetes v1.34,
plugin/pkg/admission/runtimeclass/admission.go) changes every pod created naming ``runtimeClassName``:
``prepareObjects`` refuses it when the class does not exist ("pod rejected: RuntimeClass %q not
found"); ``setOverhead`` sets ``spec.overhead`` to the class's ``overhead.podFixed`` (refusing a pod
that set another); ``setScheduling`` merges the class's ``scheduling.nodeSelector`` into the pod's
(refusing a key the pod sets to another value) and its tolerations (``tolerations.MergeTolerations``,
pkg/util/tolerations); ``validateOverhead`` refuses an overhead the class does not define. Muster's
admission reads a RayCluster's pod templates through ``admit`` so it counts what the pods will ask
for; the simulated API server admits the pods it creates through it too, so the two agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.kernel import quantity as q


class Refused(ValueError):
    """The API server refuses the pod; the message is its words."""


class Missing(Refused):
    """The pod names a RuntimeClass that does not exist: refused now, made once the class is created."""


def admit(spec: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    """The pod spec as the API server stores it: ``spec`` itself when it names no RuntimeClass, else a
    copy with the class's overhead and scheduling merged in. Raises ``Refused`` (``Missing``) where
    the API server refuses the pod. A pod with an overhead and no class is ``kube.pod_spec_problem``'s."""
    name = spec.get("runtimeClassName")
    if name is None or name == "":
        return spec
    if not isinstance(name, str):
        raise Refused(f"runtimeClassName {name!r} is not a name")
    rc = classes.get(name)
    if rc is None:
        raise Missing(f'pod rejected: RuntimeClass "{name}" not found')
    out = dict(spec)
    _set_overhead(out, rc, name)
    scheduling = rc.get("scheduling")
    if scheduling is not None:
        if not isinstance(scheduling, Mapping):
            raise Refused(f"RuntimeClass {name} scheduling: {scheduling!r} is not a mapping")
        _set_scheduling(out, scheduling, name)
    return out


def _set_overhead(out: dict[str, Any], rc: Mapping[str, Any], name: str) -> None:
    """``setOverhead`` and ``validateOverhead``: the class's ``podFixed`` becomes the pod's overhead; a
    pod that set one of its own must have set the same (compared as quantities, as ``Semantic.DeepEqual``)."""
    own = out.get("overhead")
    if "overhead" not in rc or rc["overhead"] is None:
        if own is not None:
            raise Refused("pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead")
        return
    overhead = rc["overhead"]
    fixed = overhead.get("podFixed") if isinstance(overhead, Mapping) else None
    if fixed is not None and not isinstance(fixed, Mapping):
        raise Refused(f"RuntimeClass {name} overhead.podFixed: {fixed!r} is not a mapping")
    try:
        theirs = q.parse_resources(fixed, where=f"RuntimeClass {name} overhead.podFixed")
    except q.QuantityError as exc:
        raise Refused(str(exc)) from None
    if own:
        try:
            same = isinstance(own, Mapping) and q.parse_resources(own) == theirs
        except q.QuantityError:
            same = False
        if not same:
            raise Refused("pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead")
    if fixed:
        out["overhead"] = dict(fixed)
    else:
        out.pop("overhead", None)


def _set_scheduling(out: dict[str, Any], scheduling: Mapping[str, Any], name: str) -> None:
    """``setScheduling``: the class's node selector added to the pod's (a key the pod sets otherwise is a
    conflict the API server refuses) and the tolerations merged."""
    selector = scheduling.get("nodeSelector") or {}
    if not isinstance(selector, Mapping):
        raise Refused(f"RuntimeClass {name} scheduling.nodeSelector: {selector!r} is not a mapping")
    own = out.get("nodeSelector")
    if selector:
        if own is None:
            out["nodeSelector"] = dict(selector)
        elif isinstance(own, Mapping):  # another shape is the pod's own problem, named by whoever reads it
            merged = dict(own)
            for key, value in selector.items():
                if key in merged and merged[key] != value:
                    raise Refused(f"conflict: runtimeClass.scheduling.nodeSelector[{key}] = {value}; "
                                  f"pod.spec.nodeSelector[{key}] = {merged[key]}")
                merged[key] = value
            out["nodeSelector"] = merged
    theirs = scheduling.get("tolerations") or []
    if not isinstance(theirs, list) or not all(isinstance(t, Mapping) for t in theirs):
        raise Refused(f"RuntimeClass {name} scheduling.tolerations: {theirs!r} is not a list of tolerations")
    mine = out.get("tolerations") or []
    if theirs and isinstance(mine, list) and all(isinstance(t, Mapping) for t in mine):
        out["tolerations"] = merge_tolerations(mine, theirs)


Norm = tuple[str, str, str, str, Any]


def _norm(t: Mapping[str, Any]) -> Norm:
    return (t.get("key") or "", t.get("operator") or "", t.get("value") or "", t.get("effect") or "",
            t.get("tolerationSeconds"))


def _superset(ss: Norm, t: Norm) -> bool:
    """``isSuperset``: whether ``ss`` tolerates everything ``t`` does."""
    if ss == t:
        return True
    key, op, value, effect, seconds = ss
    if t[0] != key and (key != "" or op != "Exists"):
        return False
    if t[3] != effect and effect != "":
        return False
    if effect == "NoExecute" and seconds is not None and (t[4] is None or t[4] > seconds):
        return False
    if op in ("Equal", ""):
        return t[1] == "Equal" and t[2] == value
    return op == "Exists"


def merge_tolerations(first: list[Mapping[str, Any]], second: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``MergeTolerations``: both lists, in order, without a toleration another one covers (of two equal
    ones the first is kept)."""
    every = [*first, *second]
    norms = [_norm(t) for t in every]
    merged: list[int] = []
    for i, t in enumerate(norms):
        if any(_superset(norms[m], t) for m in merged):
            continue
        if any(t2 != t and _superset(t2, t) for t2 in norms[i + 1:]):
            continue
        merged.append(i)
    return [dict(every[i]) for i in merged]
