"""One pod template (or a plain Pod) → one ``PodSet``: resources, GPU share, node constraints, labels,
inter-pod constraints (pod affinity and anti-affinity, topology spread: ``shared.kernel.podconstraints``),
host ports, node preferences and the claims its volumes mount.

Resources are what kube-scheduler counts (``kube.effective_requests``: the regular and sidecar
containers, at least the largest init container beside the sidecars before it, pod-level requests,
overhead; limits filling a missing request), which the peers charge to quota as well. The shape of every field is checked first so a malformed template is a reason,
never an AttributeError.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.admission.fields import Invalid, mapping, opt_list, opt_mapping, quantities, show, string, string_map
from shared.kernel import gpumemory, kube, podconstraints, runtimeclass
from shared.kernel import quantity as q
from shared.kernel.model import (
    AffinityOperator, HostPort, MatchExpression, PodSet, PreferredTerm, Toleration, TolerationOperator, Volumes,
)
from shared.kernel.validation import one_of

_TOLERATION_OPERATORS: tuple[TolerationOperator, ...] = ("Equal", "Exists")
_AFFINITY_OPERATORS: tuple[AffinityOperator, ...] = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
PROTOCOLS = ("TCP", "UDP", "SCTP")
"""``ContainerPort.protocol`` as the API server takes it (``validateContainerPorts``)."""


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


def _expressions(term: Mapping[str, Any], term_at: str) -> tuple[MatchExpression, ...]:
    """A node selector term's ``matchExpressions`` (``matchFields`` is refused: muster reads node labels only)."""
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
    return tuple(exprs)


def _node_affinity(spec: Mapping[str, Any], where: str) -> tuple[Mapping[str, Any], str]:
    at = f"{where}.affinity"
    affinity = opt_mapping(spec.get("affinity"), at)
    return opt_mapping(affinity.get("nodeAffinity"), f"{at}.nodeAffinity"), f"{at}.nodeAffinity"


def required_affinity(spec: Mapping[str, Any], where: str) -> tuple[tuple[MatchExpression, ...], ...]:
    """``nodeSelectorTerms``: OR over terms, AND within one. A term without expressions is kept, empty: it
    matches no node (``filters.affinity_matches``), as kube-scheduler's does; skipping it made a pod whose
    only term is empty fit every node."""
    node_affinity, at = _node_affinity(spec, where)
    at = f"{at}.requiredDuringSchedulingIgnoredDuringExecution"
    required = opt_mapping(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"), at)
    terms: list[tuple[MatchExpression, ...]] = []
    for i, raw_term in enumerate(opt_list(required.get("nodeSelectorTerms"), f"{at}.nodeSelectorTerms")):
        term_at = f"{at}.nodeSelectorTerms[{i}]"
        terms.append(_expressions(mapping(raw_term, term_at), term_at))
    return tuple(terms)


def preferred_affinity(spec: Mapping[str, Any], where: str) -> tuple[PreferredTerm, ...]:
    """``preferredDuringSchedulingIgnoredDuringExecution``: each term's weight (1-100, as the API server
    validates it) and expressions; an empty preference matches every node (``NodeAffinity.Score``)."""
    node_affinity, at = _node_affinity(spec, where)
    at = f"{at}.preferredDuringSchedulingIgnoredDuringExecution"
    out: list[PreferredTerm] = []
    for i, raw in enumerate(opt_list(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution"), at)):
        term_at = f"{at}[{i}]"
        term = mapping(raw, term_at)
        weight = term.get("weight")
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 100:
            raise Invalid(f"{term_at}.weight: {show(weight)} is not a whole number from 1 to 100")
        preference = mapping(term.get("preference"), f"{term_at}.preference")
        out.append(PreferredTerm(weight=weight, expressions=_expressions(preference, f"{term_at}.preference")))
    return tuple(out)


def host_ports(spec: Mapping[str, Any], where: str) -> tuple[HostPort, ...]:
    """Every ``hostPort`` its containers bind, and its restartable init containers' (they run as long as the
    pod: ``GetHostPorts`` in kube-scheduler's ``framework/plugins/helper``); an entry without one binds no
    host port. Each (protocol, host IP, port) once."""
    out: dict[HostPort, None] = {}
    for field in ("initContainers", "containers"):
        for i, container in enumerate(opt_list(spec.get(field), f"{where}.{field}")):
            container = mapping(container, f"{where}.{field}[{i}]")
            if field == "initContainers" and container.get("restartPolicy") != "Always":
                continue
            name = container.get("name") or str(i)
            for j, raw in enumerate(opt_list(container.get("ports"), f"{where}.{field}[{name}].ports")):
                at = f"{where}.{field}[{name}].ports[{j}]"
                port = mapping(raw, at)
                number = port.get("hostPort")
                if number is None or number == 0 and not isinstance(number, bool):
                    continue
                if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 65535:
                    raise Invalid(f"{at}.hostPort: {show(number)} is not a port number (1-65535)")
                protocol = string(port.get("protocol"), f"{at}.protocol") or "TCP"
                if protocol not in PROTOCOLS:
                    raise Invalid(f"{at}.protocol: {show(protocol)} is not one of {', '.join(PROTOCOLS)}")
                ip = string(port.get("hostIP"), f"{at}.hostIP") or "0.0.0.0"
                out[HostPort(port=number, protocol=protocol, ip=ip)] = None
    return tuple(out)


def volumes(spec: Mapping[str, Any], where: str, namespace: str) -> Volumes:
    """The claims ``spec.volumes`` mounts in ``namespace``: each ``persistentVolumeClaim.claimName``, and each
    generic ephemeral volume's claim template's storage class (its claim, ``<pod>-<volume>``, is made with
    the pod)."""
    claims: dict[str, None] = {}
    ephemeral: list[str] = []
    for i, raw in enumerate(opt_list(spec.get("volumes"), f"{where}.volumes")):
        volume = mapping(raw, f"{where}.volumes[{i}]")
        at = f"{where}.volumes[{volume.get('name') if isinstance(volume.get('name'), str) else i}]"
        if volume.get("persistentVolumeClaim") is not None:
            claim = mapping(volume["persistentVolumeClaim"], f"{at}.persistentVolumeClaim")
            name = claim.get("claimName")
            if not isinstance(name, str) or not name:
                raise Invalid(f"{at}.persistentVolumeClaim.claimName: {show(name)} is not a claim name")
            claims[f"{namespace}/{name}"] = None
        elif volume.get("ephemeral") is not None:
            template = opt_mapping(mapping(volume["ephemeral"], f"{at}.ephemeral").get("volumeClaimTemplate"),
                                   f"{at}.ephemeral.volumeClaimTemplate")
            claim_spec = opt_mapping(template.get("spec"), f"{at}.ephemeral.volumeClaimTemplate.spec")
            ephemeral.append(string(claim_spec.get("storageClassName"),
                                    f"{at}.ephemeral.volumeClaimTemplate.spec.storageClassName"))
    return Volumes(claims=tuple(claims), ephemeral=tuple(ephemeral)) if claims or ephemeral else NO_VOLUMES


NO_VOLUMES = Volumes()


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


class RuntimeClassRefusal(Invalid):
    """The API server's RuntimeClass admission refuses the template's pods (``shared.kernel.runtimeclass``):
    a class that is missing or changed may be created or fixed later, so a submitted workload re-read
    after a class changed keeps what it was admitted with (``AdmissionCore._evaluate``)."""


def admitted_spec(spec: Mapping[str, Any], where: str,
                  runtime_classes: Mapping[str, Mapping[str, Any]] | None) -> Mapping[str, Any]:
    """The spec the pods of a template get from the API server: its RuntimeClass's overhead and scheduling
    merged in (None: ``spec`` is a pod's own, which the API server already admitted)."""
    if runtime_classes is None:
        return spec
    try:
        return runtimeclass.admit(spec, runtime_classes)
    except runtimeclass.Missing as exc:
        raise RuntimeClassRefusal(f"{where}.runtimeClassName: {exc}: the API server refuses its pods until "
                                  f"the RuntimeClass is created") from None
    except runtimeclass.Refused as exc:
        raise RuntimeClassRefusal(f"{where}.runtimeClassName: {exc}: the API server refuses such a pod, "
                                  f"so none is made") from None


def pod_set(name: str, count: int, template: object, where: str, *, in_gang: bool = True,
            extra: q.Resources | None = None, namespace: str = "default",
            runtime_classes: Mapping[str, Mapping[str, Any]] | None = None) -> PodSet:
    """A pod set from a template (``metadata`` + ``spec``) at path ``where`` ("" for a Pod itself).

    ``extra`` adds per-pod resources (a SidecarMode RayJob's submitter container in the head);
    ``namespace`` is where its claims are looked up; ``runtime_classes`` (a template's, not a pod's) are
    the RuntimeClasses by name whose overhead and scheduling the API server will give its pods.
    """
    at = f"{where}." if where else ""
    tpl = mapping(template, where or "pod")
    meta = opt_mapping(tpl.get("metadata"), f"{at}metadata")
    annotations = string_map(meta.get("annotations"), f"{at}metadata.annotations")
    spec = mapping(tpl.get("spec"), f"{at}spec")
    if runtime_classes is not None:
        quantities(spec.get("overhead"), f"{at}spec.overhead")
        spec = admitted_spec(spec, f"{at}spec", runtime_classes)
    resources = pod_resources(spec, f"{at}spec")
    if extra:
        resources = q.add(resources, extra)
    share, memory = gpu_request(annotations, resources, f"{at}metadata")
    labels = string_map(meta.get("labels"), f"{at}metadata.labels")
    try:
        pod_affinity = podconstraints.pod_affinity(spec, f"{at}spec")
        spread = podconstraints.spread(spec, f"{at}spec")
    except podconstraints.ConstraintError as exc:
        raise Invalid(str(exc)) from None
    return PodSet(name=name, count=count, in_gang=in_gang, resources=resources, gpu_share=share, gpu_memory=memory,
                  node_selector=string_map(spec.get("nodeSelector"), f"{at}spec.nodeSelector"),
                  tolerations=tolerations(spec, f"{at}spec"),
                  affinity=required_affinity(spec, f"{at}spec"), labels=labels, pod_affinity=pod_affinity,
                  spread=spread, preferred=preferred_affinity(spec, f"{at}spec"),
                  host_ports=host_ports(spec, f"{at}spec"), volumes=volumes(spec, f"{at}spec", namespace))
