"""The ephemeral volume controller, and what a binding writes on a pod's claims first.

A generic ephemeral volume's claim is made by kube-controller-manager's ephemeral volume controller
(``pkg/controller/volume/ephemeral/controller.go``, ``handleVolume``) once the pod exists: named
``<pod>-<volume>`` (``ephemeral.VolumeClaimName``), from the volume's ``volumeClaimTemplate`` (its labels,
annotations and spec), controlled by the pod (``ownerReferences`` with ``controller: true``), so the
garbage collector deletes it with the pod. A claim of that name that exists already is left as it is
(the real controller reports it: the pod is not its owner, and kube-scheduler then never binds it).

Before a binding, the cluster link writes ``volume.kubernetes.io/selected-node`` on the claims the
effect names (VolumeBinding's PreBind); ``select_node`` does the same here and tells whether the pod may
be bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from shared.kernel import kube

if TYPE_CHECKING:
    from shared.sim.cluster import ApiServer

SELECTED_NODE = "volume.kubernetes.io/selected-node"


def make_claims(api: ApiServer, namespace: str, name: str, now: float) -> None:
    """The claims of the pod's ephemeral volumes that do not exist yet, made as the controller makes them."""
    pod = api.obj("Pod", namespace, name)
    if pod is None:
        return
    meta, spec = kube.meta(pod), kube.mapping(pod.get("spec"))
    volumes = spec.get("volumes")
    for volume in volumes if isinstance(volumes, list) else []:
        if not isinstance(volume, Mapping) or not isinstance(volume.get("ephemeral"), Mapping):
            continue
        claim_name = f"{name}-{volume.get('name')}"
        if api.obj("PersistentVolumeClaim", namespace, claim_name) is not None:
            continue
        template = kube.mapping(volume["ephemeral"].get("volumeClaimTemplate"))
        template_meta = kube.mapping(template.get("metadata"))
        metadata: dict[str, Any] = {
            "name": claim_name, "namespace": namespace,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": meta.get("uid", ""),
                                 "controller": True, "blockOwnerDeletion": True}]}
        for field in ("labels", "annotations"):
            if isinstance(template_meta.get(field), Mapping):
                metadata[field] = dict(template_meta[field])
        api.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata,
                    "spec": dict(kube.mapping(template.get("spec"))), "status": {"phase": "Pending"}}, now)


def has_ephemeral(pod: Mapping[str, Any]) -> bool:
    """Whether the pod mounts a generic ephemeral volume (the controller has claims to make for it)."""
    volumes = kube.mapping(pod.get("spec")).get("volumes")
    return isinstance(volumes, list) and any(isinstance(v, Mapping) and v.get("ephemeral") is not None for v in volumes)


def select_node(api: ApiServer, namespace: str, claims: tuple[str, ...], node: str) -> bool:
    """Write ``node`` on each claim (as the link does before a bind); False when one is gone or was given
    another node, and then the pod is not bound."""
    for name in claims:
        claim = api.obj("PersistentVolumeClaim", namespace, name)
        if claim is None:
            return False
        selected = kube.annotations(claim).get(SELECTED_NODE)
        if selected == node or kube.mapping(claim.get("spec")).get("volumeName"):
            continue
        if selected:
            return False
        api.patch("PersistentVolumeClaim", namespace, name,
                  lambda o: o["metadata"].__setitem__("annotations",
                                                      {**(o["metadata"].get("annotations") or {}), SELECTED_NODE: node}))
    return True
