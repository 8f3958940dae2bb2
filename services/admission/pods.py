"""One pod template (or a plain Pod) → one ``PodSet``: resources, GPU share, node constraints.

Resources are what kube-scheduler counts (``kube.effective_requests``: the regular and sidecar
containers, at least the largest init container beside the sidecars before it, pod-level requests,
overhead; limits filling a missing request), which the peers charge to quota as well. The shape of every field is checked first so a malformed template is a reason,
never an AttributeError.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.admission.fields import Invalid, mapping, opt_list, opt_mapping, quantities, show, string, string_map
from shared.kernel import gpumemory, kube
from shared.kernel import quantity as q
from shared.kernel.model import AffinityOperator, MatchExpression, PodSet, Toleration, TolerationOperator
from shared.kernel.validation import one_of

_TOLERATION_OPERATORS: tuple[TolerationOperator, ...] = ("Equal", "Exists")
_AFFINITY_OPERATORS: tuple[AffinityOperator, ...] = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def pod_resources(spec: Mapping[str, Any], where: str) -> q.Resources:
    """Per-pod requests; ``where`` is the pod spec's path, e.g. ``spec.headGroupSpec.template.spec``."""
    containers = opt_list(spec.get("containers"), f"{where}.containers")
    if not containers:
        raise Invalid(f"{where}.containers: missing (a pod needs at least one container)")
    for field, listed in (("containers", containers), ("initContainers", opt_list(spec.get("initContainers"),
                                                                                  f"{where}.initContainers"))):
        for i, container in enumerate(listed):
            if type(container) is not dict and not isinstance(container, Mapping):
                raise Invalid(f"{where}.{field}[{i}]: {show(container)} is not a mapping")
            name = container.get("name") or str(i)
            res = opt_mapping(container.get("resources"), f"{where}.{field}[{name}].resources")
            for part in ("requests", "limits"):
                quantities(res.get(part), f"{where}.{field}[{name}].resources.{part}")
    quantities(opt_mapping(spec.get("resources"), f"{where}.resources").get("requests"), f"{where}.resources.requests")
    quantities(spec.get("overhead"), f"{where}.overhead")
    problem = kube.pod_spec_problem(spec, where)
    if problem is not None:
        raise Invalid(f"{problem}: the API server refuses such a pod, so none is made")
    try:
        return kube.effective_requests(spec, where)
    except q.QuantityError as exc:
        raise Invalid(str(exc)) from None


def tolerations(spec: Mapping[str, Any], where: str) -> tuple[Toleration, ...]:
    out: list[Toleration] = []
    for i, raw in enumerate(opt_list(spec.get("tolerations"), f"{where}.tolerations")):
        at = f"{where}.tolerations[{i}]"
        t = mapping(raw, at)
        operator = string(t.get("operator"), f"{at}.operator", default="Equal") or "Equal"
        if not one_of(operator, _TOLERATION_OPERATORS):
            raise Invalid(f"{at}.operator: {show(operator)} is not one of {', '.join(_TOLERATION_OPERATORS)}")
        out.append(Toleration(key=string(t.get("key"), f"{at}.key"), operator=operator,
                              value=string(t.get("value"), f"{at}.value"),
                              effect=string(t.get("effect"), f"{at}.effect")))
    return tuple(out)


def required_affinity(spec: Mapping[str, Any], where: str) -> tuple[tuple[MatchExpression, ...], ...]:
    """``nodeSelectorTerms``: OR over terms, AND within one. A term without expressions is kept, empty: it
    matches no node (``filters.affinity_matches``), as kube-scheduler's does; skipping it made a pod whose
    only term is empty fit every node."""
    at = f"{where}.affinity"
    affinity = opt_mapping(spec.get("affinity"), at)
    node_affinity = opt_mapping(affinity.get("nodeAffinity"), f"{at}.nodeAffinity")
    at = f"{at}.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    required = opt_mapping(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"), at)
    terms: list[tuple[MatchExpression, ...]] = []
    for i, raw_term in enumerate(opt_list(required.get("nodeSelectorTerms"), f"{at}.nodeSelectorTerms")):
        term_at = f"{at}.nodeSelectorTerms[{i}]"
        term = mapping(raw_term, term_at)
        if term.get("matchFields"):
            raise Invalid(f"{term_at}.matchFields: not supported by muster (use matchExpressions on node labels)")
        exprs: list[MatchExpression] = []
        for j, raw in enumerate(opt_list(term.get("matchExpressions"), f"{term_at}.matchExpressions")):
            e_at = f"{term_at}.matchExpressions[{j}]"
            e = mapping(raw, e_at)
            op = string(e.get("operator"), f"{e_at}.operator")
            if not one_of(op, _AFFINITY_OPERATORS):
                raise Invalid(f"{e_at}.operator: {show(op)} is not supported (one of {', '.join(_AFFINITY_OPERATORS)})")
            values = opt_list(e.get("values"), f"{e_at}.values")
            for k, v in enumerate(values):
                if not isinstance(v, str):
                    raise Invalid(f"{e_at}.values[{k}]: {show(v)} is not a string")
            if op in ("Gt", "Lt") and len(values) != 1:
                raise Invalid(f"{e_at}.values: Required value: must be specified single value when `operator` is "
                              f"'Lt' or 'Gt': the API server refuses such a pod, so none is made")
            key = string(e.get("key"), f"{e_at}.key")
            if not key:
                raise Invalid(f"{e_at}.key: missing")
            exprs.append(MatchExpression(key=key, operator=op, values=tuple(values)))
        terms.append(tuple(exprs))
    return tuple(terms)


def gpu_request(annotations: Mapping[str, str], resources: q.Resources, where: str) -> tuple[int, int]:
    """(``gpu-fraction`` share, ``gpu-memory`` MiB) of a pod's metadata at ``where``; at most one is set.

    A pod asks for one kind of GPU: a fraction of one device, memory of one device, or whole devices.
    KAI's admission webhook refuses a pod asking two (``ValidateGpuRequests``,
    ``pkg/binder/plugins/gpusharing/gpu-request/gpu_request_validator.go``: "cannot request both GPU
    and GPU memory"), so such a pod could never run there: it is rejected here, naming both."""
    try:
        share = kube.gpu_share(annotations, where)
        memory = gpumemory.request(annotations, where)
    except q.QuantityError as exc:
        raise Invalid(str(exc)) from None
    if share and memory:
        raise Invalid(f"{where}.annotations: {kube.GPU_FRACTION} {show(annotations[kube.GPU_FRACTION])} and "
                      f"{gpumemory.ANNOTATION} {show(annotations[gpumemory.ANNOTATION])}: a pod asks for a fraction "
                      f"of one GPU or for GPU memory, not both (KAI refuses it)")
    whole = resources.get(q.GPU)
    if whole and (share or memory):
        name = kube.GPU_FRACTION if share else gpumemory.ANNOTATION
        raise Invalid(f"{where}.annotations.{name}: a pod asks for {'a fraction of one GPU' if share else 'GPU memory'} "
                      f"or for whole GPUs ({q.GPU}: {q.human(q.GPU, whole)}), not both")
    return share, memory


def pod_set(name: str, count: int, template: object, where: str, *, in_gang: bool = True,
            extra: q.Resources | None = None) -> PodSet:
    """A pod set from a template (``metadata`` + ``spec``) at path ``where`` ("" for a Pod itself).

    ``extra`` adds per-pod resources (a SidecarMode RayJob's submitter container in the head).
    """
    at = f"{where}." if where else ""
    tpl = mapping(template, where or "pod")
    meta = opt_mapping(tpl.get("metadata"), f"{at}metadata")
    annotations = string_map(meta.get("annotations"), f"{at}metadata.annotations")
    spec = mapping(tpl.get("spec"), f"{at}spec")
    resources = pod_resources(spec, f"{at}spec")
    if extra:
        resources = q.add(resources, extra)
    share, memory = gpu_request(annotations, resources, f"{at}metadata")
    return PodSet(name=name, count=count, in_gang=in_gang, resources=resources, gpu_share=share, gpu_memory=memory,
                  node_selector=string_map(spec.get("nodeSelector"), f"{at}spec.nodeSelector"),
                  tolerations=tolerations(spec, f"{at}spec"),
                  affinity=required_affinity(spec, f"{at}spec"))
