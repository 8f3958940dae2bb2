"""kubelet (and the pod garbage collector): bound pods start after a delay; pods of a gone node go.

Timer keys look like ``sim/pod-running|<namespace>|<name>|<uid>`` so a timer set for a pod that
was deleted and re-created under the same name never starts the new one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from shared.kernel import kube

if TYPE_CHECKING:
    from shared.sim.cluster import ApiServer

TIMER_PREFIX = "sim/pod-running|"


def _timer_key(pod: Mapping) -> str:
    m = kube.meta(pod)
    return f"{TIMER_PREFIX}{m.get('namespace', '')}|{m['name']}|{m.get('uid', '')}"


def _phase(pod: Mapping) -> str:
    status = pod.get("status")
    return status.get("phase", "") if isinstance(status, Mapping) else ""


def node_of(pod: Mapping) -> str:
    spec = pod.get("spec")
    return (spec.get("nodeName") or "") if isinstance(spec, Mapping) else ""


def admit(api: ApiServer, pod: dict | None, now: float, startup: float) -> None:
    """A pod that arrives bound (a scenario's own pods) starts like any other bound pod."""
    if pod is not None and node_of(pod) and _phase(pod) == "Pending":
        api.request_timer(now + startup, _timer_key(pod))


def bind(api: ApiServer, namespace: str, name: str, node: str, annotations: Mapping[str, str], now: float,
         startup: float) -> bool:
    """Bind an unbound pod to ``node`` (the binding subresource); True if its annotations changed.

    A pod bound elsewhere keeps its node (the API server refuses a second binding); binding again to
    the same node only merges annotations, so a repeated effect changes nothing.
    """
    pod = api.obj("Pod", namespace, name)
    if pod is None or not isinstance(pod.get("spec"), dict) or node_of(pod) not in ("", node):
        return False
    before = dict(kube.annotations(pod))

    def change(obj: dict) -> None:
        obj["spec"]["nodeName"] = node
        metadata = obj["metadata"]
        metadata["annotations"] = {**(metadata.get("annotations") or {}), **annotations}

    newly_bound = not node_of(pod)
    api.patch("Pod", namespace, name, change)
    pod = api.obj("Pod", namespace, name)
    assert pod is not None
    if newly_bound:
        admit(api, pod, now, startup)
    return dict(kube.annotations(pod)) != before


def fire(api: ApiServer, key: str) -> None:
    """The pod's startup delay is over: it runs, if it is still the same bound, pending pod on a node."""
    try:
        _, namespace, name, uid = key.split("|")
    except ValueError:
        return
    pod = api.obj("Pod", namespace, name)
    if pod is None or kube.meta(pod).get("uid") != uid or _phase(pod) != "Pending":
        return
    node = node_of(pod)
    if not node or api.obj("Node", None, node) is None:
        return
    api.patch("Pod", namespace, name, _running)


def _running(pod: dict) -> None:
    status = pod.get("status")
    pod["status"] = {**(status if isinstance(status, dict) else {}), "phase": "Running"}


def collect_orphans(api: ApiServer, node: str) -> None:
    """Pods bound to a node that no longer exists are deleted (PodGC); KubeRay recreates its own."""
    for pod in list(api.objects("Pod")):
        if node_of(pod) == node:
            m = kube.meta(pod)
            api.remove("Pod", m.get("namespace"), m["name"])
