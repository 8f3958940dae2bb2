"""A pod's claims as kube-scheduler's VolumeBinding plugin judges them (``volumebinding/volume_binding.go``
PreFilter and Filter, ``binder.go`` ``GetPodVolumeClaims``, ``FindPodVolumes``; its cases follow
``volume_binding_test.go`` ``TestVolumeBinding`` and ``binder_test.go`` ``TestFindPodVolumesWithoutProvisioning``
and ``TestFindPodVolumesWithProvisioning``)."""

from __future__ import annotations

from typing import Any

import pytest

from services.placement import volumes as v
from shared.kernel.events import CapacityChanged, GangPlaced, ObjectChanged, ObjectsListed, PlacementFailed, PodAssigned
from shared.kernel.model import Volumes
from shared.runtime.statecodec import decode, encode
from tests.builders import gang, node, pod_set, workload
from tests.builders.placement import PlacementDriver, of_type, one, pod_changed, ray_pod

ZONE = "topology.kubernetes.io/zone"


def claim(name: str, *, volume: str = "", storage_class: str | None = None, phase: str = "Pending",
          deleting: bool = False, namespace: str = "ns", selected: str = "", owner: str = "") -> ObjectChanged:
    spec: dict[str, Any] = {"volumeName": volume} if volume else {}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    if selected:
        meta["annotations"] = {v.SELECTED_NODE: selected}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": owner, "controller": True}]
    return ObjectChanged(change="Added", kind="PersistentVolumeClaim", api_version="v1", namespace=namespace, name=name,
                         object={"kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec,
                                 "status": {"phase": phase}})


def volume(name: str, *zones: str, terms: list | None = None) -> ObjectChanged:
    spec: dict[str, Any] = {}
    if zones or terms is not None:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": terms if terms is not None else [
            {"matchExpressions": [{"key": ZONE, "operator": "In", "values": list(zones)}]}]}}
    return ObjectChanged(change="Added", kind="PersistentVolume", api_version="v1", name=name,
                         object={"kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec})


def storage_class(name: str, *zones: str, mode: str = "WaitForFirstConsumer") -> ObjectChanged:
    obj: dict[str, Any] = {"kind": "StorageClass", "metadata": {"name": name}, "volumeBindingMode": mode}
    if zones:
        obj["allowedTopologies"] = [{"matchLabelExpressions": [{"key": ZONE, "values": list(zones)}]}]
    return ObjectChanged(change="Added", kind="StorageClass", api_version="storage.k8s.io/v1", name=name, object=obj)


def gone(p: ObjectChanged) -> ObjectChanged:
    return p.model_copy(update={"change": "Deleted"})


def mounting(*claims: str, ephemeral: tuple[str, ...] = (), count: int = 1, cpu: str = "1"):
    return pod_set("worker", count, cpu=cpu).model_copy(update={"volumes": Volumes(
        claims=tuple(f"ns/{c}" for c in claims), ephemeral=ephemeral)})


def _book(*events: ObjectChanged) -> v.VolumeBook:
    book = v.VolumeBook()
    for p in events:
        book.observe(p)
    return book


@pytest.mark.parametrize("events, wait", [
    ((), 'persistentvolumeclaim "a" not found'),
    ((claim("a", volume="pv", phase="Lost"),), 'persistentvolumeclaim "a" bound to non-existent persistentvolume "pv"'),
    ((claim("a", volume="pv", phase="Bound", deleting=True),), 'persistentvolumeclaim "a" is being deleted'),
    ((claim("a"),), v.UNBOUND_IMMEDIATE),  # no class: immediate binding
    ((claim("a", storage_class="gone"),), v.UNBOUND_IMMEDIATE),  # a class not found is immediate (IsDelayBindingMode)
    ((claim("a", storage_class="fast"), storage_class("fast", mode="Immediate")), v.UNBOUND_IMMEDIATE),
    ((claim("a", storage_class="wffc", volume="pv"), storage_class("wffc")), v.UNBOUND_IMMEDIATE),  # pre-bound
])
def test_prefilter_makes_the_pod_wait_with_kube_schedulers_words(events: tuple, wait: str) -> None:
    assert _book(*events).verdict(Volumes(claims=("ns/a",))).wait == wait


def test_the_first_claim_in_volume_order_names_the_wait() -> None:
    book = _book(claim("b"))
    # existence is checked for every claim before any binding (podHasPVCs, then GetPodVolumeClaims)
    assert book.verdict(Volumes(claims=("ns/b", "ns/a"))).wait == 'persistentvolumeclaim "a" not found'


def test_a_bound_claim_follows_its_volumes_node_affinity() -> None:
    book = _book(claim("a", volume="pv", phase="Bound"), volume("pv", "a"))
    verdict = book.verdict(Volumes(claims=("ns/a",)))
    assert (verdict.allows({ZONE: "a"}, "n"), verdict.allows({ZONE: "b"}, "n")) == (True, False)
    assert verdict.reasons({ZONE: "b"}, "n") == [v.NODE_CONFLICT]
    free = _book(claim("a", volume="pv", phase="Bound"), volume("pv")).verdict(Volumes(claims=("ns/a",)))
    assert free.needs == () and free.allows({}, "n")


def test_a_bound_claims_missing_volume_makes_the_pod_wait_as_volume_zone_says() -> None:
    """kube-scheduler's VolumeZone PreFilter looks the volume up (``persistentvolume "pv" not found``) before
    any node is filtered: found by the differential test against kube-scheduler v1.34, where VolumeBinding's
    per-node ``ErrReasonPVNotExist`` never shows. VolumeBinding's own waits come first."""
    verdict = _book(claim("a", volume="pv", phase="Bound"), volume("b-pv", "a"), claim("b", volume="b-pv", phase="Bound")
                    ).verdict(Volumes(claims=("ns/b", "ns/a")))
    assert verdict.wait == 'persistentvolume "pv" not found' and not verdict.allows({ZONE: "a"}, "n")
    immediate = _book(claim("a", volume="pv", phase="Bound"), claim("c", storage_class="")
                      ).verdict(Volumes(claims=("ns/a", "ns/c")))
    assert immediate.wait == v.UNBOUND_IMMEDIATE


def test_a_delayed_claim_follows_its_classes_allowed_topologies_and_both_reasons_can_count() -> None:
    book = _book(claim("a", volume="pv", phase="Bound"), volume("pv", "a"), claim("b", storage_class="wffc"),
                 storage_class("wffc", "b"))
    verdict = book.verdict(Volumes(claims=("ns/a", "ns/b")))
    assert verdict.reasons({ZONE: "a"}, "n") == [v.BIND_CONFLICT]
    assert verdict.reasons({ZONE: "b"}, "n") == [v.NODE_CONFLICT]
    assert verdict.reasons({ZONE: "c"}, "n") == [v.NODE_CONFLICT, v.BIND_CONFLICT]
    anywhere = _book(claim("b", storage_class="wffc"), storage_class("wffc")).verdict(Volumes(claims=("ns/b",)))
    assert anywhere.needs == () and anywhere.allows({}, "n")


def test_ephemeral_volumes_are_judged_by_their_class_alone() -> None:
    book = _book(storage_class("wffc", "b"), storage_class("fast", "b", mode="Immediate"))
    assert book.verdict(Volumes(ephemeral=("wffc",))).reasons({ZONE: "a"}, "n") == [v.BIND_CONFLICT]
    for name in ("fast", "", "unknown"):
        assert book.verdict(Volumes(ephemeral=(name,))) == v.Verdict()


def test_volume_terms_muster_cannot_read_match_no_node() -> None:
    fields = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
    greater = [{"matchExpressions": [{"key": "rank", "operator": "Gt", "values": ["1"]}]},
               {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["a"]}]}]
    book = _book(claim("a", volume="f", phase="Bound"), volume("f", terms=fields),
                 claim("b", volume="g", phase="Bound"), volume("g", terms=greater))
    assert not book.verdict(Volumes(claims=("ns/a",))).allows({ZONE: "a"}, "n")
    assert book.verdict(Volumes(claims=("ns/b",))).allows({ZONE: "a", "rank": "5"}, "n")  # the other term still holds


def test_a_gang_member_goes_only_where_its_volume_is_and_the_histogram_reads_as_kube_schedulers() -> None:
    d = PlacementDriver(None, node("b1", labels={ZONE: "b"}), node("a1", cpu="2", labels={ZONE: "a"}))
    for p in (claim("data", volume="pv", phase="Bound"), volume("pv", "a")):
        d.feed(p)
    placed = one(d.dequeue(workload("ns/w", gang_=gang(pod_set("head", 1, cpu="1"), mounting("data")))), GangPlaced)
    assert [s.node for s in placed.slots if s.pod_set == "worker"] == ["a1"]
    failed = one(d.dequeue(workload("ns/x", gang_=gang(mounting("data", cpu="2")))), PlacementFailed)
    # a1 is short of cpu, and NodeResourcesFit runs before VolumeBinding
    assert "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't match PersistentVolume's node affinity." in failed.reason
    assert failed.capacity_short


def test_a_missing_claim_waits_and_its_creation_wakes_the_queue() -> None:
    d = PlacementDriver(None, node("n1"))
    failed = one(d.dequeue(workload("ns/w", gang_=gang(mounting("later")))), PlacementFailed)
    assert 'tasks could not be placed: 0/1 nodes are available: persistentvolumeclaim "later" not found.' in failed.reason
    assert not failed.capacity_short
    woken = one(d.feed(claim("later", volume="pv", phase="Bound")), CapacityChanged)
    assert woken.released and woken.room is None
    failed = one(d.dequeue(workload("ns/w", gang_=gang(mounting("later")))), PlacementFailed)
    assert '0/1 nodes are available: persistentvolume "pv" not found.' in failed.reason
    one(d.feed(volume("pv")), CapacityChanged)
    one(d.dequeue(workload("ns/w", gang_=gang(mounting("later")))), GangPlaced)


def test_storage_changes_are_silent_while_no_gang_with_claims_waits() -> None:
    d = PlacementDriver(None, node("n1"))
    assert d.feed(claim("x")) == [] and d.feed(claim("x")) == []
    one(d.dequeue(workload("ns/w", gang_=gang(pod_set("head", 1)))), GangPlaced)
    assert d.feed(storage_class("wffc")) == []
    assert d.feed(gone(claim("x"))) == []


def test_a_listing_that_lacks_a_claim_forgets_it() -> None:
    d = PlacementDriver(None, node("n1"))
    d.feed(claim("a", volume="pv", phase="Bound"))
    d.feed(volume("pv"))
    d.feed(ObjectsListed(kind="PersistentVolumeClaim", api_version="v1", resource_version="2", part=0, keys=(),
                         last=True))
    assert "ns/a" not in d.core.nodes.volumes.claims
    failed = one(d.dequeue(workload("ns/w", gang_=gang(mounting("a")))), PlacementFailed)
    assert 'persistentvolumeclaim "a" not found' in failed.reason


def test_the_volume_book_survives_a_snapshot_round_trip() -> None:
    d = PlacementDriver(None, node("b1", labels={ZONE: "b"}), node("a1", labels={ZONE: "a"}))
    for p in (claim("data", volume="pv", phase="Bound"), volume("pv", "a"), storage_class("wffc", "b")):
        d.feed(p)
    one(d.dequeue(workload("ns/w", gang_=gang(mounting("data")))), GangPlaced)
    restored = decode(encode(d.core))
    assert restored.nodes.volumes == d.core.nodes.volumes
    assert restored.nodes.static_mask(mounting("data")).tolist() == [False, True]


# --------------------------------------------------------------------------- PreBind: selected-node
def _pod(*volumes: dict, uid: str = "pod-uid") -> dict:
    return {"kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "uid": uid}, "spec": {"volumes": list(volumes)}}


NAMED = {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}
SCRATCH = {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": "wffc"}}}}


def test_a_claim_given_a_node_can_only_be_provisioned_there() -> None:
    """``FindPodVolumes``: a delayed claim whose ``AnnSelectedNode`` names another node fails that node with
    ``ErrReasonBindConflict`` at once, and is provisioned on the node it names."""
    book = _book(claim("a", storage_class="wffc", selected="n2"), storage_class("wffc"))
    verdict = book.verdict(Volumes(claims=("ns/a",)))
    assert (verdict.allows({}, "n1"), verdict.allows({}, "n2")) == (False, True)
    assert verdict.reasons({}, "n1") == [v.BIND_CONFLICT] and verdict.reasons({}, "n2") == []
    two = _book(claim("a", storage_class="wffc", selected="n2"), claim("b", storage_class="wffc", selected="n3"),
                storage_class("wffc")).verdict(Volumes(claims=("ns/a", "ns/b")))
    assert not two.allows({}, "n2") and not two.allows({}, "n3")


def test_a_pods_unbound_delayed_claims_are_given_its_node_before_it_is_bound() -> None:
    """PreBind (``AssumePodVolumes``, ``bindAPIUpdate``): each unbound ``WaitForFirstConsumer`` claim gets
    ``selected-node``; a bound claim, an immediate class's and one already given this node need nothing."""
    book = _book(claim("data", storage_class="wffc"), claim("p-scratch", storage_class="wffc", owner="pod-uid"),
                 claim("done", storage_class="wffc", volume="pv", phase="Bound"),
                 claim("mine", storage_class="wffc", selected="n1"), storage_class("wffc"))
    done = {"name": "d", "persistentVolumeClaim": {"claimName": "done"}}
    mine = {"name": "m", "persistentVolumeClaim": {"claimName": "mine"}}
    assert book.prebind(_pod(NAMED, SCRATCH, done, mine, NAMED), "n1") == v.Prebind(claims=("data", "p-scratch"))
    assert book.prebind(_pod({"name": "e", "emptyDir": {}}), "n1") == v.Prebind()


def test_a_claim_given_another_node_keeps_the_pod_back() -> None:
    book = _book(claim("data", storage_class="wffc", selected="n2"), storage_class("wffc"))
    assert book.prebind(_pod(NAMED), "n1").wait == 'persistentvolumeclaim "data" is to be provisioned on node "n2", not "n1"'
    assert book.prebind(_pod(NAMED), "n2") == v.Prebind()


def test_a_pod_waits_for_its_ephemeral_claim_as_kube_scheduler_does() -> None:
    """``podHasPVCs``: an ephemeral volume's claim missing is the ephemeral volume controller's to make, and
    one the pod does not control is not its own (``ephemeral.VolumeIsForPod``)."""
    book = _book(storage_class("wffc"))
    assert book.prebind(_pod(SCRATCH), "n1").wait == \
        'waiting for ephemeral volume controller to create the persistentvolumeclaim "p-scratch"'
    book.observe(claim("p-scratch", storage_class="wffc", owner="someone-else"))
    assert book.prebind(_pod(SCRATCH), "n1").wait == "PVC ns/p-scratch was not created for pod ns/p (pod is not owner)"
    book.observe(claim("p-scratch", storage_class="wffc", owner="pod-uid"))
    assert book.prebind(_pod(SCRATCH), "n1") == v.Prebind(claims=("p-scratch",))


def test_a_pod_is_told_where_to_go_once_its_ephemeral_claim_exists_with_the_claims_to_mark() -> None:
    d = PlacementDriver(None, node("n1"))
    d.feed(storage_class("wffc"))
    spec = workload("ns/w", gang_=gang(pod_set("head", 1).model_copy(update={"volumes": Volumes(ephemeral=("wffc",))})))
    one(d.dequeue(spec), GangPlaced)
    obj = ray_pod("w", namespace="ns", name="p")
    obj["metadata"]["uid"] = "pod-uid"
    obj["spec"]["volumes"] = [SCRATCH]
    assert of_type(d.feed(pod_changed(obj)), PodAssigned) == []  # its claim is not made yet
    told = one(d.feed(claim("p-scratch", storage_class="wffc", owner="pod-uid")), PodAssigned)
    assert (told.pod, told.node, told.claims) == ("p", "n1", ("p-scratch",))
    assert of_type(d.feed(claim("p-scratch", storage_class="wffc", owner="pod-uid", selected="n1")), PodAssigned) == []
