"""Objects deleted while no watch was open: ``ObjectsListed`` after a (re)list, and the cores that
hold objects (admission, placement) reporting what the listing lacks as deleted (shared/kernel/listing.py)."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from services.reconciler.ingest import LISTING_PART_CHARS, listing_envelopes, observe
from shared.runtime import statecodec
from shared.kernel.events import (
    CapacityChanged, ObjectChanged, ObjectsListed, QueueRemoved, WorkloadDeleted, WorkloadSubmitted,
)
from shared.kernel.kube import REFUSED
from shared.kernel.listing import WatchBook, last_state
from tests.builders import envelope, node, pod, ray_cluster
from tests.builders.admission import AdmissionDriver, changed, gang_pod, volcano_queue
from tests.builders.placement import PlacementDriver, fits, of_type, one


def listing(kind: str, *keys: str, api_version: str = "v1", version: str = "7", part: int = 0,
            last: bool = True) -> ObjectsListed:
    return ObjectsListed(kind=kind, api_version=api_version, resource_version=version, part=part, keys=keys, last=last)


# --------------------------------------------------------------------------- the book
def test_a_listing_reports_every_held_object_it_lacks_in_key_order_with_its_last_state():
    book = WatchBook()
    for name in ("c", "a", "b"):
        book.observe(observe("Added", pod(name, "ns", labels={"app": name}, node_name="n1")))
    gone = book.listed(listing("Pod", "ns/b"))
    assert [(p.change, p.kind, p.api_version, p.namespace, p.name) for p in gone] == [
        ("Deleted", "Pod", "v1", "ns", "a"), ("Deleted", "Pod", "v1", "ns", "c")]
    state = gone[0].object
    assert state["metadata"]["labels"] == {"app": "a"} and state["spec"]["nodeName"] == "n1"
    assert "containers" not in state["spec"]  # only what a deletion is read for
    assert book.listed(listing("Pod", "ns/b", version="8")) == []  # each is reported once


def test_a_deletion_seen_or_an_object_listed_is_not_reported():
    book = WatchBook()
    book.observe(observe("Added", pod("a")))
    book.observe(observe("Added", pod("b")))
    book.observe(observe("Deleted", pod("a")))
    assert book.listed(listing("Pod", "default/b")) == []
    assert book.held == {"Pod.v1": {"default/b": book.held["Pod.v1"]["default/b"]}}


def test_a_listing_in_parts_is_judged_at_its_last_part_only():
    book = WatchBook()
    for name in ("a", "b", "c"):
        book.observe(observe("Added", pod(name)))
    assert book.listed(listing("Pod", "default/a", last=False)) == []
    assert book.listed(listing("Pod", "default/b", part=1, last=False)) == []
    assert [p.name for p in book.listed(listing("Pod", part=2))] == ["c"]


def test_a_part_out_of_sequence_drops_the_listing_and_the_next_one_counts():
    book = WatchBook()
    for name in ("a", "b"):
        book.observe(observe("Added", pod(name)))
    assert book.listed(listing("Pod", "default/a", last=False)) == []
    # the link restarted within the listing: part 0 of another list comes, then a stray part 1 of the first
    assert book.listed(listing("Pod", "default/a", "default/b", version="9", last=False)) == []
    assert book.listed(listing("Pod", version="7", part=1)) == []
    assert book.listed(listing("Pod", "default/b", version="9", part=1)) == []
    assert [p.name for p in book.listed(listing("Pod", "default/b", version="10"))] == ["a"]


def test_listings_of_one_kind_in_two_api_groups_are_apart():
    book = WatchBook()
    volcano = volcano_queue("q")
    kai = {**copy.deepcopy(volcano), "apiVersion": "scheduling.run.ai/v2"}
    book.observe(observe("Added", volcano))
    book.observe(observe("Added", kai))
    gone = book.listed(listing("Queue", api_version="scheduling.run.ai/v2"))
    assert [(p.api_version, p.name) for p in gone] == [("scheduling.run.ai/v2", "q")]
    assert list(book.held) == ["Queue.scheduling.volcano.sh/v1beta1"]


def test_the_book_shares_nothing_with_the_objects_so_a_snapshot_stays_plain_json():
    d = AdmissionDriver()
    d.add(ray_cluster("rc"))
    held = d.core.book.held["RayCluster.ray.io/v1"]["default/rc"]
    assert held["metadata"]["labels"] is not d.core.workloads["RayCluster:default/rc"].obj["metadata"].get("labels")
    encoder = statecodec._Encoder()
    encoder.node(d.core)
    assert not encoder.shared_raw
    restored = statecodec.decode(statecodec.encode(d.core))
    out = restored.handle(envelope(listing("RayCluster", api_version="ray.io/v1")))
    assert out == [WorkloadDeleted(key="default/rc")]


# --------------------------------------------------------------------------- the link's envelopes
def test_listing_envelopes_cover_every_key_in_parts_within_the_bound():
    pods = [pod(f"p-{i:05d}", f"ns-{i % 7}") for i in range(3000)]
    parts = listing_envelopes("Pod", "v1", "123", pods, 5.0, part_chars=10_000)
    assert len(parts) >= 4
    assert [e.payload.part for e in parts] == list(range(len(parts)))
    assert [e.payload.last for e in parts] == [False] * (len(parts) - 1) + [True]
    assert all(sum(len(k) + 1 for k in e.payload.keys) <= 10_000 for e in parts)
    assert sorted(k for e in parts for k in e.payload.keys) == sorted(f"ns-{i % 7}/p-{i:05d}" for i in range(3000))
    again = listing_envelopes("Pod", "v1", "123", list(reversed(pods)), 9.0, part_chars=10_000)
    assert [e.id for e in again] == [e.id for e in parts]  # the same list, the same ids: copies are dropped
    assert listing_envelopes("Pod", "v1", "124", pods, 5.0, part_chars=10_000)[0].id != parts[0].id
    assert LISTING_PART_CHARS * 2 < 1_000_000  # a part stays far below the broker's record limit


def test_an_empty_list_is_one_last_part_and_a_cluster_scoped_key_has_no_namespace():
    (only,) = listing_envelopes("Node", "v1", "5", [], 1.0)
    assert only.payload.keys == () and only.payload.last
    (nodes,) = listing_envelopes("Node", "v1", "5", [node("n1")], 1.0)
    assert nodes.payload.keys == ("/n1",)
    assert observe("Added", node("n1")).namespace == ""  # the book keys it "/n1" too


# --------------------------------------------------------------------------- admission
def test_admission_deletes_a_ray_workload_the_listing_lacks_and_only_that():
    d = AdmissionDriver()
    d.add(ray_cluster("kept"), ray_cluster("gone"))
    out = d.core.handle(envelope(listing("RayCluster", "default/kept", api_version="ray.io/v1")))
    assert out == [WorkloadDeleted(key="default/gone")]
    assert "RayCluster:default/gone" not in d.core.workloads
    out = d.core.handle(envelope(listing("RayCluster", "default/kept", api_version="ray.io/v1", version="8")))
    assert out == []


def test_admission_removes_a_queue_and_ends_a_plain_pod_gang_the_listings_lack():
    d = AdmissionDriver()
    d.add(volcano_queue("q"))
    d.add(gang_pod("g-0", "g", min_available=1))
    assert of_type(d.core.handle(envelope(listing("Pod"))), WorkloadDeleted) == [WorkloadDeleted(key="default/g")]
    out = d.core.handle(envelope(listing("Queue", api_version="scheduling.volcano.sh/v1beta1")))
    assert of_type(out, QueueRemoved) == [QueueRemoved(name="q")]


def test_admission_reads_a_listing_after_a_restart_from_its_inbox_alone():
    """The link restarted and remembers nothing: the listing alone ends the workload."""
    d = AdmissionDriver()
    assert isinstance(d.add(ray_cluster("rc"))[0], WorkloadSubmitted)
    d.core.handle(envelope(changed(ray_cluster("other"))))
    out = d.core.handle(envelope(listing("RayCluster", "default/other", api_version="ray.io/v1")))
    assert out == [WorkloadDeleted(key="default/rc")]


# --------------------------------------------------------------------------- placement
def test_placement_frees_a_pod_and_drops_a_node_the_listings_lack():
    d = PlacementDriver(None, node("n1", cpu="4"), node("n2", cpu="4"))
    d.pod(pod("daemon", "kube-system", requests={"cpu": "3"}, node_name="n1", scheduler="default-scheduler"))
    d.settle()
    d.feed(listing("Pod", "kube-system/other"))  # the daemon pod went while no watch was open
    d.settle()
    out = d.feed(listing("Node", "/n1"))
    assert one(out, CapacityChanged).nodes == 1
    assert fits(d, "4") and not fits(d, "5")  # n1 alone, all of it free again


def test_of_a_node_only_its_identity_is_held():
    book = WatchBook()
    book.observe(observe("Added", node("n1", labels={"zone": "a"})))
    assert book.held["Node.v1"]["/n1"]["metadata"].keys() <= {"name", "namespace", "uid"}


# --------------------------------------------------------------------------- held by reference
_LEAF = st.one_of(st.text(max_size=3), st.integers(-2, 2), st.sampled_from([1.0, -0.0, True, False, None]))
_JSON = st.recursive(_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.text(max_size=3), inner, max_size=3)),
                     max_leaves=8)
_POD_VERSION = st.fixed_dictionaries({
    "name": st.sampled_from(["a", "b"]), "labels": _JSON, "annotations": _JSON, "owners": _JSON,
    "node": st.sampled_from(["", "n1", 1]), "change": st.sampled_from(["Added", "Modified", "Deleted"]),
})


def _version(v: dict) -> ObjectChanged:
    obj = pod(v["name"], "ns")
    obj["metadata"].update(labels=v["labels"], annotations=v["annotations"], ownerReferences=v["owners"])
    obj["spec"]["nodeName"] = v["node"]
    return ObjectChanged(change=v["change"], kind="Pod", api_version="v1", namespace="ns", name=v["name"], object=obj)


def _exact(value: object) -> str:
    """``value`` with its types and key order: ``1``, ``1.0`` and ``true`` are equal but not the same."""
    return repr(value)


def _containers(value: object) -> list[int]:
    if isinstance(value, dict):
        return [id(value)] + [i for v in value.values() for i in _containers(v)]
    if isinstance(value, list):
        return [id(value)] + [i for v in value for i in _containers(v)]
    return []


@settings(max_examples=200, deadline=None)
@given(st.lists(_POD_VERSION, min_size=1, max_size=6), st.sampled_from([(), ("ns/a",), ("ns/b",)]))
def test_a_book_holding_pods_by_reference_reports_what_a_copying_book_reports(versions, kept):
    """Held by reference, a pod's ``last_state`` is taken when a listing lacks it: of the version
    observed last, exactly what the copying book took at once (types and key order included), and
    sharing no container with that version's object."""
    copying, referencing = WatchBook(), WatchBook(by_reference=frozenset({"Pod"}))
    for v in versions:
        event = _version(v)
        assert copying.observe(event) is None
        held = referencing.observe(event)
        assert (held is None) == (event.change == "Deleted") and (held is None or held.obj is event.object)
    objects = {f"ns/{v['name']}": _version(v).object for v in versions}
    expected, got = copying.listed(listing("Pod", *kept)), referencing.listed(listing("Pod", *kept))
    assert _exact([p.model_dump() for p in got]) == _exact([p.model_dump() for p in expected])
    for p in got:
        assert not set(_containers(p.object)) & set(_containers(objects[f"{p.namespace}/{p.name}"]))


def test_last_state_copies_every_container_and_keeps_types_and_order():
    owners = [{"kind": "RayCluster", "controller": True, "n": 1, "f": 1.0, "nested": {"x": [1, "y", None]}}]
    obj = pod("p", "ns", labels={"b": "1", "a": "2"}, node_name="n1")
    obj["metadata"].update(ownerReferences=owners, annotations={"k": ["v", {"w": False}]})
    state = last_state(obj)
    assert _exact(state["metadata"]["ownerReferences"]) == _exact(owners)
    assert list(state["metadata"]["labels"]) == ["b", "a"]
    assert not set(_containers(state)) & set(_containers(obj))


def test_placement_keeps_the_books_held_pod_so_a_snapshot_stays_plain_json_and_decides_alike():
    """Placement's PodRecord keeps the book's ``Held``, not the object: one reference, so its state
    is still written as plain JSON; a refused version leaves the record on the readable one."""
    d = PlacementDriver(None, node("n1", cpu="4"))
    d.pod(pod("daemon", "kube-system", requests={"cpu": "1"}, node_name="n1", scheduler="default-scheduler"))
    readable = pod("other", "kube-system", requests={"cpu": "1"}, node_name="n1", scheduler="default-scheduler")
    d.pod(readable)
    refused = {**readable, "metadata": {**readable["metadata"], "annotations": {REFUSED: "too long"}}}
    d.pod(refused, "Modified")
    d.settle()
    rec = d.core.pods["kube-system/other"]
    assert rec.obj == readable
    assert d.core.book.held["Pod.v1"]["kube-system/other"].obj == last_state(refused)  # a copy: no part shared
    assert d.core.pods["kube-system/daemon"].held is d.core.book.held["Pod.v1"]["kube-system/daemon"]
    encoder = statecodec._Encoder()
    encoder.node(d.core)
    assert not encoder.shared_raw
    restored = statecodec.decode(statecodec.encode(d.core))
    assert restored.pods["kube-system/daemon"].held is restored.book.held["Pod.v1"]["kube-system/daemon"]
    gone = listing("Pod", "kube-system/daemon")
    assert restored.handle(envelope(gone)) == d.core.handle(envelope(gone))
    assert fits(d, "3") and not fits(d, "4")  # the daemon's cpu is still charged; "other"'s is free again
