"""The simulated cluster does around a binding what the real one does: the ephemeral volume controller
makes a pod's ``<pod>-<volume>`` claims once the pod exists, and a bind writes the node on the pod's
delayed claims before the pod is bound (scenario ``placement-volumes-provisioned``)."""

from __future__ import annotations

from pathlib import Path

from shared.kernel import kube
from shared.kernel.events import ObjectChanged, kube_effect
from shared.runtime.simulate import simulate
from shared.sim.cluster import SimCluster
from shared.sim.ephemeral import SELECTED_NODE
from shared.sim.scenario import load_scenario

SCENARIO = Path(__file__).parents[2] / "scenarios" / "placement-volumes-provisioned.yaml"


def test_each_delayed_claim_is_given_its_pods_node_before_the_pod_is_bound() -> None:
    run = simulate(load_scenario(SCENARIO))
    assert not run.check()
    cluster = run.runtime.cluster
    pods = {kube.labels(p).get(kube.RAY_CLUSTER, "") + "/" + kube.labels(p).get(kube.RAY_NODE_TYPE, ""):
            kube.meta(p)["name"] for p in cluster.api.objects("Pod", "default")}
    head, worker = pods["writer/head"], pods["writer/worker"]
    scratch = cluster.get("PersistentVolumeClaim", "default", f"{worker}-scratch")
    assert scratch is not None and kube.meta(scratch)["ownerReferences"][0]["name"] == worker
    selected = {name: kube.annotations(cluster.get("PersistentVolumeClaim", "default", name) or {}).get(SELECTED_NODE)
                for name in ("checkpoints", f"{worker}-scratch", "pinned")}
    assert selected == {"checkpoints": "zone-b-1", f"{worker}-scratch": "zone-b-1", "pinned": "zone-a-1"}
    # in the watch stream, each claim's node comes before its pod's binding
    order: list[tuple[str, str]] = []
    for env in run.runtime.log:
        p = env.payload
        if isinstance(p, ObjectChanged) and p.kind == "PersistentVolumeClaim" and SELECTED_NODE in kube.annotations(p.object):
            order.append(("claim", p.name))
        elif isinstance(p, ObjectChanged) and p.kind == "Pod" and kube.mapping(p.object.get("spec")).get("nodeName"):
            order.append(("pod", p.name))
    first = {what: order.index(what) for what in dict.fromkeys(order)}
    assert first[("claim", "checkpoints")] < first[("pod", head)]
    assert first[("claim", f"{worker}-scratch")] < first[("pod", worker)]


def test_a_claim_gone_or_given_another_node_stops_the_bind() -> None:
    cluster = SimCluster()
    cluster.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}, 0.0)
    cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
                   "spec": {"containers": [{"name": "c", "image": "i"}]}}, 0.0)
    cluster.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                   "metadata": {"name": "c", "namespace": "default", "annotations": {SELECTED_NODE: "n2"}},
                   "spec": {"storageClassName": "wffc"}}, 0.0)
    for claims in (("missing",), ("c",)):
        cluster.perform(kube_effect("bind", "Pod", "default", "p", node="n1", claims=claims), 1.0)
        assert not kube.mapping((cluster.get("Pod", "default", "p") or {}).get("spec")).get("nodeName")
