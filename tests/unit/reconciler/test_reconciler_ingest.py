from services.reconciler.ingest import observe, watch_envelope
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


def test_observe_drops_managed_fields_and_keeps_the_rest():
    obj = ray_cluster("rc", namespace="team-a")
    sent = {**obj, "metadata": {**obj["metadata"], "managedFields": [
        {"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]}}
    change = observe("Modified", sent)
    assert change.object == obj
    assert "managedFields" in sent["metadata"]  # the caller's object is left as it was


def _versioned(obj: dict, uid: str, version: str) -> dict:
    obj["metadata"].update(uid=uid, resourceVersion=version)
    return obj


def test_a_watch_envelope_is_named_by_the_object_version_not_the_moment_seen():
    obj = _versioned(node("n1"), "u1", "7")
    seen_first = watch_envelope("Added", obj, at=100.0)
    relisted = watch_envelope("Modified", obj, at=500.0)
    assert seen_first.id == relisted.id  # a restarted watcher re-sends it under the same id
    assert (seen_first.source, seen_first.occurred_at, seen_first.causation_id) == ("ingest", 100.0, None)
    assert seen_first.correlation_id == seen_first.id
    assert seen_first.payload == observe("Added", obj)


def test_a_new_version_a_new_incarnation_and_a_deletion_get_new_ids():
    base = watch_envelope("Added", _versioned(node("n1"), "u1", "7"), at=1.0).id
    newer = watch_envelope("Modified", _versioned(node("n1"), "u1", "8"), at=1.0).id
    recreated = watch_envelope("Added", _versioned(node("n1"), "u2", "7"), at=1.0).id
    deleted = watch_envelope("Deleted", _versioned(node("n1"), "u1", "7"), at=1.0).id
    assert len({base, newer, recreated, deleted}) == 4
