from services.reconciler.ingest import observe
from tests.builders import node, ray_cluster


def test_observe_takes_identity_from_the_object():
    obj = ray_cluster("rc", namespace="team-a")
    change = observe("Added", obj)
    assert (change.change, change.kind, change.api_version, change.namespace, change.name) == \
        ("Added", "RayCluster", "ray.io/v1", "team-a", "rc")
    assert change.object == obj
    assert change.subject == "RayCluster/team-a/rc"


def test_observe_cluster_scoped_object_has_no_namespace():
    change = observe("Deleted", node("n1"))
    assert (change.change, change.kind, change.api_version, change.namespace, change.name) == \
        ("Deleted", "Node", "v1", "", "n1")
    assert change.subject == "Node/n1"


def test_observe_is_pure_and_tolerates_malformed_objects():
    obj = {"kind": 3, "metadata": "nope"}
    first, second = observe("Modified", obj), observe("Modified", obj)
    assert first == second
    assert (first.kind, first.api_version, first.namespace, first.name) == ("", "", "", "")
    assert obj == {"kind": 3, "metadata": "nope"}
