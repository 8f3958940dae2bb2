"""Which nodes a pod's PersistentVolumeClaims let it use: kube-scheduler's VolumeBinding filter.

Placement watches claims, volumes and storage classes (only what ingest keeps of them) in a
``VolumeBook`` and judges a pod set's claims (``PodSet.volumes``, read once at admission) against it,
as ``pkg/scheduler/framework/plugins/volumebinding`` does, in its order:

1. PreFilter (``podHasPVCs``, then ``GetPodVolumeClaims``), for the pod as a whole: a claim that does not
   exist, that lost its volume or that is being deleted, then any claim unbound whose binding is not
   delayed (no class, a class not found, ``Immediate``, or pre-bound to a volume not bound yet), then
   (VolumeZone's PreFilter, ``getPVbyPod``) a bound claim whose volume does not exist, make it wait with
   kube-scheduler's words (``Verdict.wait``), on every node alike.
2. Filter (``FindPodVolumes``), node by node: a bound claim's volume must exist and its
   ``nodeAffinity`` match the node (``checkBoundClaims``); an unbound claim of a
   ``WaitForFirstConsumer`` class can only be provisioned where the class's ``allowedTopologies`` match
   (``checkVolumeProvisions``). Each is a requirement with the reason a node failing it gets
   (``Verdict.needs``); the node table folds them into the pod set's static mask.

A delayed claim already annotated ``volume.kubernetes.io/selected-node`` (``AnnSelectedNode``) can only
be provisioned on that node: ``FindPodVolumes`` fails every other node with ``ErrReasonBindConflict``.

A generic ephemeral volume's claim is named ``<pod>-<volume>`` and made by the ephemeral volume controller
when the pod is; muster places a gang before its pods exist (KubeRay names them then), so it cannot look
that claim up. It judges it as the claim it will be: unbound, of its template's class; a
``WaitForFirstConsumer`` class's ``allowedTopologies`` hold, any other class restricts nothing here.

Before a pod is bound (``prebind``), once it exists and has its node: its ephemeral claims must exist and
be its own (VolumeBinding's PreFilter, ``podHasPVCs``: until then the pod waits), no claim may have been
given to another node, and each unbound delayed claim is to be annotated with the node first, as
VolumeBinding's PreBind does (``AssumePodVolumes`` sets ``AnnSelectedNode``, ``bindAPIUpdate`` writes it),
so that the provisioner makes the volume where the pod goes.

Everything here can change (a claim created, a volume bound, a class added), so nothing is a rejection:
a pod set whose claims do not let it anywhere waits, and any change of a claim, volume or class wakes
the gangs that wait with claims (``PlacementCore``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from services.placement.filters import affinity_matches
from shared.kernel import kube
from shared.kernel.events import ObjectChanged
from shared.kernel.model import AffinityOperator, MatchExpression, Volumes
from shared.kernel.validation import one_of

Terms = tuple[tuple[MatchExpression, ...], ...]
"""Node selector terms: OR over terms, AND within one; ``()`` matches every node, an empty term none."""
NEVER: Terms = ((),)
"""Terms no node matches (an empty term selects nothing, as in Kubernetes)."""

SELECTED_NODE = "volume.kubernetes.io/selected-node"
"""``AnnSelectedNode`` (``k8s.io/component-helpers/storage/volume``): the node a delayed claim is provisioned for."""
NODE_CONFLICT = "node(s) didn't match PersistentVolume's node affinity"
BIND_CONFLICT = "node(s) didn't find available persistent volumes to bind"
"""``ErrReasonNodeConflict`` (v1.34's words, as the differential test read them), ``ErrReasonBindConflict`` of
``volumebinding/binder.go``. (Its ``ErrReasonPVNotExist``
never shows: VolumeZone's PreFilter, which runs first, makes the pod wait on a bound claim's missing volume.)"""
UNBOUND_IMMEDIATE = "pod has unbound immediate PersistentVolumeClaims"
"""``VolumeBinding.PreFilter``'s reason when a claim that should be bound already is not."""
DELAYED = "WaitForFirstConsumer"
_OPERATORS: tuple[AffinityOperator, ...] = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True)
class Claim:
    """What the filter reads of a PersistentVolumeClaim."""

    volume: str
    """``spec.volumeName``: the volume it is bound (or pre-bound) to, "" when none."""
    storage_class: str
    phase: str
    deleting: bool
    selected_node: str = ""
    """``volume.kubernetes.io/selected-node``: the node it is to be provisioned for, "" when none."""
    owner: str = ""
    """The uid of its controller (``ownerReferences`` with ``controller: true``), "" when none."""

    @property
    def bound(self) -> bool:
        """Bound to its volume (the PV controller sets phase Bound once ``bind-completed`` is written)."""
        return self.phase == "Bound" and bool(self.volume)


@dataclass(frozen=True)
class StorageClass:
    delayed: bool
    """``volumeBindingMode: WaitForFirstConsumer``: bound (provisioned) where its first pod goes."""
    topologies: Terms
    """``allowedTopologies`` as node selector terms (``()`` when it has none: everywhere)."""


@dataclass(frozen=True)
class Verdict:
    """A pod set's claims judged against the book: why it waits whatever the node, else what a node must match."""

    wait: str = ""
    needs: tuple[tuple[Terms, str, bool], ...] = ()
    """(terms, the reason of a node that fails them, whether they come from a bound claim): bound claims'
    first, in volume order (a node gets the first one it fails, as ``checkBoundClaims`` returns at it),
    then the delayed claims' (one reason, as ``checkVolumeProvisions`` returns at the first)."""
    pinned: frozenset[str] = frozenset()
    """The nodes delayed claims were already given (``selected-node``): a node must be each of them."""

    def allows(self, labels: Mapping[str, str], node: str) -> bool:
        """Whether node ``node`` with ``labels`` can reach every volume (and nothing makes the pod wait everywhere)."""
        return not self.wait and all(affinity_matches(labels, terms) for terms, _, _ in self.needs) \
            and all(pin == node for pin in self.pinned)

    def reasons(self, labels: Mapping[str, str], node: str) -> list[str]:
        """Why node ``node`` with ``labels`` is ruled out (``FindPodVolumes``'s reasons for it), [] when it is not."""
        out = [next((reason for terms, reason, bound in self.needs
                     if bound and not affinity_matches(labels, terms)), "")]
        if any(pin != node for pin in self.pinned) or any(
                not bound and not affinity_matches(labels, terms) for terms, _, bound in self.needs):
            out.append(BIND_CONFLICT)
        return [reason for reason in out if reason]

    @property
    def restricts(self) -> bool:
        """Whether some node may be ruled out by the claims."""
        return bool(self.needs or self.pinned)


@dataclass(frozen=True)
class Prebind:
    """What must happen before one pod is bound to its node (``VolumeBook.prebind``)."""

    wait: str = ""
    """Why it may not be bound yet (kube-scheduler's words), "" when it may."""
    claims: tuple[str, ...] = ()
    """Names (in the pod's namespace) of the unbound delayed claims to annotate with the node first."""


@dataclass
class VolumeBook:
    """The claims (``namespace/name``), volumes and storage classes placement was told of."""

    claims: dict[str, Claim] = field(default_factory=dict)
    volumes: dict[str, Terms | None] = field(default_factory=dict)
    """Volume name -> its ``nodeAffinity.required`` terms (None: it restricts nothing)."""
    classes: dict[str, StorageClass] = field(default_factory=dict)

    def observe(self, p: ObjectChanged) -> bool:
        """Take one watch event of a claim, volume or class; True when what the filter reads changed."""
        obj = p.object
        gone = p.change == "Deleted"
        if p.kind == "PersistentVolumeClaim":
            return _put(self.claims, f"{p.namespace or 'default'}/{p.name}", _GONE if gone else _claim(obj))
        if p.kind == "PersistentVolume":
            return _put(self.volumes, p.name, _GONE if gone else _volume_terms(obj))
        if p.kind == "StorageClass":
            return _put(self.classes, p.name, _GONE if gone else _storage_class(obj))
        return False

    def verdict(self, volumes: Volumes) -> Verdict:
        """``volumes`` judged now (see the module)."""
        claims: list[Claim] = []
        for key in volumes.claims:
            claim, name = self.claims.get(key), key.partition("/")[2]
            if claim is None:
                return Verdict(wait=f'persistentvolumeclaim "{name}" not found')
            if claim.phase == "Lost":
                return Verdict(wait=f'persistentvolumeclaim "{name}" bound to non-existent persistentvolume '
                                    f'"{claim.volume}"')
            if claim.deleting:
                return Verdict(wait=f'persistentvolumeclaim "{name}" is being deleted')
            claims.append(claim)
        bound: list[tuple[Terms, str, bool]] = []
        delayed: list[tuple[Terms, str, bool]] = []
        pinned: set[str] = set()
        for claim in claims:
            if not claim.bound and not self._delayed(claim):
                return Verdict(wait=UNBOUND_IMMEDIATE)
        for claim in claims:  # VolumeZone's PreFilter, after VolumeBinding's, looks each bound claim's volume up
            if claim.bound and claim.volume not in self.volumes:
                return Verdict(wait=f'persistentvolume "{claim.volume}" not found')
        for claim in claims:
            if claim.bound:
                terms = self.volumes[claim.volume]
                if terms is not None:
                    bound.append((terms, NODE_CONFLICT, True))
                continue
            topologies = self.classes[claim.storage_class].topologies
            if claim.selected_node:
                pinned.add(claim.selected_node)
            if topologies:
                delayed.append((topologies, BIND_CONFLICT, False))
        for name in volumes.ephemeral:
            ephemeral_class = self.classes.get(name) if name else None
            if ephemeral_class is not None and ephemeral_class.delayed and ephemeral_class.topologies:
                delayed.append((ephemeral_class.topologies, BIND_CONFLICT, False))
        return Verdict(needs=(*bound, *delayed), pinned=frozenset(pinned))

    def prebind(self, pod: Mapping[str, Any], node: str) -> Prebind:
        """What binding ``pod`` (as the watch holds it) to ``node`` needs first, or why it must wait.

        Its claims in volume order: an ephemeral volume's claim ``<pod>-<volume>`` must exist (else
        "waiting for ephemeral volume controller to create the persistentvolumeclaim") and be controlled by
        the pod (``ephemeral.VolumeIsForPod``); a claim given to another node makes it wait (the pod set's
        placement already kept away from claims known to be so; one annotated since must not be bound
        there either); each unbound claim of a ``WaitForFirstConsumer`` class not yet given ``node`` is
        to be annotated with it (VolumeBinding's PreBind). The rest was judged when the gang was placed."""
        meta, spec = kube.meta(pod), kube.mapping(pod.get("spec"))
        namespace, name = meta.get("namespace") or "default", meta.get("name") or ""
        raw = spec.get("volumes")
        claims: list[str] = []
        for item in raw if isinstance(raw, list) else []:
            volume = kube.mapping(item)
            source = kube.mapping(volume.get("persistentVolumeClaim"))
            if isinstance(source.get("claimName"), str):
                claim_name, ephemeral = source["claimName"], False
            elif volume.get("ephemeral") is not None and isinstance(volume.get("name"), str):
                claim_name, ephemeral = f"{name}-{volume['name']}", True
            else:
                continue
            claim = self.claims.get(f"{namespace}/{claim_name}")
            if claim is None:
                if ephemeral:
                    return Prebind(wait='waiting for ephemeral volume controller to create the '
                                        f'persistentvolumeclaim "{claim_name}"')
                return Prebind(wait=f'persistentvolumeclaim "{claim_name}" not found')
            if ephemeral and (not claim.owner or claim.owner != meta.get("uid")):
                return Prebind(wait=f"PVC {namespace}/{claim_name} was not created for pod {namespace}/{name} "
                                    "(pod is not owner)")
            if claim.bound or claim.volume:
                continue
            storage_class = self.classes.get(claim.storage_class) if claim.storage_class else None
            if storage_class is None or not storage_class.delayed:
                continue  # an immediate claim unbound made the pod set wait (``verdict``)
            if claim.selected_node and claim.selected_node != node:
                return Prebind(wait=f'persistentvolumeclaim "{claim_name}" is to be provisioned on node '
                                    f'"{claim.selected_node}", not "{node}"')
            if claim.selected_node != node and claim_name not in claims:
                claims.append(claim_name)
        return Prebind(claims=tuple(claims))

    def _delayed(self, claim: Claim) -> bool:
        """An unbound claim whose binding waits for its pod: a ``WaitForFirstConsumer`` class it has, and no
        volume named yet (a pre-bound claim should be bound already: ``GetPodVolumeClaims``)."""
        storage_class = self.classes.get(claim.storage_class) if claim.storage_class else None
        return storage_class is not None and storage_class.delayed and not claim.volume


_GONE = object()
"""``_put``'s value for an object deleted (a volume's own value may be None: it restricts nothing)."""


def _put(table: dict[str, Any], key: str, value: Any) -> bool:
    """Set ``table[key]`` (remove it for ``_GONE``); True when that changed what the table holds."""
    if value is _GONE:
        return table.pop(key, _GONE) is not _GONE
    if key in table and table[key] == value:
        return False
    table[key] = value
    return True


def _claim(obj: Mapping[str, Any]) -> Claim:
    spec, status = kube.mapping(obj.get("spec")), kube.mapping(obj.get("status"))
    volume, storage_class, phase = spec.get("volumeName"), spec.get("storageClassName"), status.get("phase")
    selected = kube.annotations(obj).get(SELECTED_NODE)
    refs = kube.meta(obj).get("ownerReferences")
    owner = next((ref.get("uid") for ref in refs if isinstance(ref, Mapping) and ref.get("controller") is True
                  and isinstance(ref.get("uid"), str)), "") if isinstance(refs, list) else ""
    return Claim(volume=volume if isinstance(volume, str) else "",
                 storage_class=storage_class if isinstance(storage_class, str) else "",
                 phase=phase if isinstance(phase, str) else "Pending",
                 deleting=kube.meta(obj).get("deletionTimestamp") is not None,
                 selected_node=selected if isinstance(selected, str) else "", owner=owner or "")


def _volume_terms(obj: Mapping[str, Any]) -> Terms | None:
    """``spec.nodeAffinity.required.nodeSelectorTerms`` (``volume.CheckNodeAffinity``): None without any. A term
    with ``matchFields`` or an operator muster does not read (``Gt``, ``Lt``) matches no node here: the
    volume is never taken to be reachable where it may not be."""
    affinity = kube.mapping(kube.mapping(obj.get("spec")).get("nodeAffinity"))
    required = affinity.get("required")
    if not isinstance(required, Mapping):
        return None
    raw_terms = required.get("nodeSelectorTerms")
    terms: list[tuple[MatchExpression, ...]] = []
    for raw in raw_terms if isinstance(raw_terms, list) else []:
        term = kube.mapping(raw)
        terms.append(() if term.get("matchFields") else _expressions(term.get("matchExpressions"), operator=None))
    return tuple(terms) or NEVER


def _storage_class(obj: Mapping[str, Any]) -> StorageClass:
    raw = obj.get("allowedTopologies")
    terms = tuple(_expressions(kube.mapping(term).get("matchLabelExpressions"), operator="In")
                  for term in (raw if isinstance(raw, list) else []))
    return StorageClass(delayed=obj.get("volumeBindingMode") == DELAYED, topologies=terms)


def _expressions(raw: Any, operator: str | None) -> tuple[MatchExpression, ...]:
    """Expressions of one term (``operator`` fixed for a topology term's ``matchLabelExpressions``); () when
    any cannot be read, so the term selects nothing."""
    out: list[MatchExpression] = []
    for item in raw if isinstance(raw, list) else []:
        e = kube.mapping(item)
        op, key, values = operator or e.get("operator"), e.get("key"), e.get("values") or []
        if not isinstance(key, str) or not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            return ()
        if one_of(op, _OPERATORS):
            out.append(MatchExpression(key=key, operator=op, values=tuple(values)))
        else:
            return ()
    return tuple(out)
