"""shared/kernel/topology.py: which inbox every envelope goes to."""

from __future__ import annotations

import pytest

from services.reconciler.ingest import observe
from shared.kernel.events import PAYLOAD_TYPES, ObjectsListed
from shared.kernel.topology import ADMISSION_KINDS, PLACEMENT_KINDS, ROUTES, SERVICES, destinations, admission_reads_pod
from tests.builders import node, pod, ray_cluster
from tests.builders.shared import at, sample_payloads


def _watch(obj: dict, change: str = "Added"):
    return at(observe(change, obj), 0.0, source="ingest")  # type: ignore[arg-type]


@pytest.mark.parametrize("labels, expected", [
    ({}, ("admission", "placement")),                        # a plain pod may be a gang of one
    ({"ray.io/cluster": "rc", "ray.io/node-type": "head"}, ("placement",)),
    ({"ray.io/originated-from-crd": "RayJob", "muster.dev/pod-set": "submitter"}, ("placement",)),
    ({"scheduling.x-k8s.io/pod-group": "g"}, ("admission", "placement")),
    ({"pod-group.scheduling.sigs.k8s.io/name": "g", "pod-group.scheduling.sigs.k8s.io/min-available": "2"},
     ("admission", "placement")),
    ({"ray.io/cluster": "rc", "scheduling.x-k8s.io/pod-group": "rc"}, ("placement",)),  # KubeRay's, whatever group
])
@pytest.mark.parametrize("change", ["Added", "Modified", "Deleted"])
def test_pod_routing(labels, expected, change):
    if change == "Deleted":  # every pod's: a refused KubeRay pod that is gone no longer holds its workload back,
        expected = ("admission", "placement", "reconciler")  # and nothing is written on a pod that is gone
    assert destinations(_watch(pod("p", labels=labels), change)) == expected


def test_a_kuberay_pod_ingest_refused_goes_to_admission_too():
    refused = pod("p", labels={"ray.io/cluster": "rc", "ray.io/node-type": "head", "note": "x" * 64})
    assert destinations(_watch(refused, "Modified")) == ("admission", "placement")


@pytest.mark.parametrize("obj", [
    {"metadata": None}, {"metadata": {"labels": None}}, {}, {"metadata": {"name": "p"}},
])
def test_admission_reads_plain_pods_even_with_missing_metadata(obj):
    assert admission_reads_pod(obj) is True


def test_node_routes_to_placement_only():
    assert destinations(_watch(node("n1"))) == ("placement",)
    assert destinations(_watch(node("n1"), "Deleted")) == ("placement",)


@pytest.mark.parametrize("kind", ["PersistentVolumeClaim", "PersistentVolume", "StorageClass"])
def test_storage_routes_to_placement_only(kind):
    obj = {"apiVersion": "v1", "kind": kind, "metadata": {"name": "x", "namespace": "default"}}
    assert destinations(_watch(obj)) == ("placement",)
    assert destinations(_watch(obj, "Deleted")) == ("placement",)


@pytest.mark.parametrize("kind", sorted(ADMISSION_KINDS) + ["ConfigMap", "Namespace", "Deployment", ""])
def test_every_other_kind_routes_to_admission(kind):
    obj = ray_cluster("x")
    obj["kind"] = kind
    assert destinations(_watch(obj)) == ("admission",)


@pytest.mark.parametrize("kind, expected", [
    ("Pod", ("admission", "placement")), ("Node", ("placement",)), ("RayCluster", ("admission",)),
    ("Queue", ("admission",)), ("PriorityClass", ("admission",)), ("RuntimeClass", ("admission",)),
    ("PersistentVolumeClaim", ("placement",)),
    ("PersistentVolume", ("placement",)), ("StorageClass", ("placement",)),
])
def test_a_listing_goes_to_every_core_that_reads_that_kind(kind, expected):
    listing = ObjectsListed(kind=kind, api_version="v1", resource_version="9", part=0, keys=(), last=True)
    assert destinations(at(listing, 0.0, source="ingest")) == expected


def test_kind_sets():
    assert PLACEMENT_KINDS == {"Node", "Pod", "PersistentVolumeClaim", "PersistentVolume", "StorageClass"}
    assert ADMISSION_KINDS == {"RayCluster", "RayJob", "PodGroup", "Queue", "ElasticQuotaTree", "PriorityClass",
                               "RuntimeClass"}
    assert SERVICES == ("admission", "queue", "placement", "reconciler")


def test_timer_fired_has_no_route():
    assert destinations(at(sample_payloads()["TimerFired"], 0.0, source="clock")) == ()


def test_routes_refer_to_real_payload_types_and_real_inboxes():
    assert set(ROUTES) <= set(PAYLOAD_TYPES)
    # every payload but the two special cases must be routable, or destinations() raises KeyError
    assert set(PAYLOAD_TYPES) - set(ROUTES) == {"ObjectChanged", "ObjectsListed", "TimerFired"}
    for type_, inboxes in ROUTES.items():
        assert inboxes or type_ == "PolicyApplied", type_  # a fact for the log alone: no service reads it
        assert len(set(inboxes)) == len(inboxes), type_
        assert set(inboxes) <= set(SERVICES) | {"cluster", "clock"}, type_


@pytest.mark.parametrize("type_", sorted(ROUTES))
def test_destinations_follow_routes(type_):
    assert destinations(at(sample_payloads()[type_], 0.0, source="test")) == ROUTES[type_]


@pytest.mark.parametrize("type_, inboxes", [
    ("WorkloadSubmitted", ("queue", "reconciler")),
    ("Dequeued", ("placement", "reconciler")),
    ("GangPlaced", ("queue", "reconciler")),
    ("PodAssigned", ("reconciler",)),
    ("PlacementFailed", ("queue", "reconciler")),
    ("PreemptionRequested", ("queue", "reconciler")),
    ("CapacityChanged", ("queue",)),
    ("KubeEffect", ("cluster",)),
    ("TimerSet", ("clock",)),
    ("QueueDefined", ("queue", "placement", "reconciler")),
])
def test_routes_match_the_documented_flow(type_, inboxes):
    assert ROUTES[type_] == inboxes


def test_a_type_with_a_route_goes_by_it_and_nothing_else() -> None:
    """``destinations`` looks ``ROUTES`` up first: each routed type's answer is the table's own tuple (a
    replay tells a ``TimerSet`` by it), whatever else the envelope holds."""
    for kind, payload in sample_payloads().items():
        if kind in ROUTES:
            assert destinations(at(payload, 0.0, source="queue")) is ROUTES[kind]
