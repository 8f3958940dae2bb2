"""Inter-pod affinity, anti-affinity and topology spread (``services/placement/interpod.py``), after
kube-scheduler's InterPodAffinity and PodTopologySpread filters and their tests
(pkg/scheduler/framework/plugins/interpodaffinity/filtering_test.go, podtopologyspread/filtering_test.go)."""

from __future__ import annotations

from typing import Any

from services.placement import interpod
from shared.kernel import podconstraints
from shared.kernel.events import GangPlaced, PlacementFailed
from shared.kernel.model import PodSet
from shared.runtime.statecodec import decode, encode
from tests.builders import gang, node, pod, pod_set, workload
from tests.builders.placement import PlacementDriver, bound, one

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def with_spec(ps: PodSet, spec: dict[str, Any], labels: dict[str, str] | None = None) -> PodSet:
    """The pod set with the inter-pod constraints of a pod ``spec`` (read as admission reads them)."""
    return ps.model_copy(update={"labels": dict(labels or {}),
                                 "pod_affinity": podconstraints.pod_affinity(spec, "spec"),
                                 "spread": podconstraints.spread(spec, "spec")})


def anti(key: str, **match: str) -> dict[str, Any]:
    return {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": key, "labelSelector": {"matchLabels": match}}]}}}


def affinity(key: str, **match: str) -> dict[str, Any]:
    return {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": key, "labelSelector": {"matchLabels": match}}]}}}


def spread(key: str, skew: int = 1, when: str = "DoNotSchedule", **extra: Any) -> dict[str, Any]:
    return {"topologySpreadConstraints": [{"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": when,
                                           "labelSelector": {"matchLabels": {"app": "web"}}, **extra}]}


def hosts(*names: str, zone: dict[str, str] | None = None, cpu: str = "16") -> list[dict]:
    return [node(n, cpu=cpu, labels={HOST: n, **({ZONE: zone[n]} if zone else {})}) for n in names]


def nodes_of(out: list[Any]) -> list[str]:
    return [s.node for s in one(out, GangPlaced).slots]


WEB = {"app": "web"}


def test_workers_that_must_not_share_a_node_go_one_per_node():
    d = PlacementDriver(None, *hosts("a", "b", "c"))
    workers = with_spec(pod_set("worker", 3), anti(HOST, app="web"), WEB)
    assert sorted(nodes_of(d.dequeue(workload("ns/w", gang_=gang(workers))))) == ["a", "b", "c"]


def test_too_few_nodes_for_anti_affinity_waits_with_kube_schedulers_reason():
    d = PlacementDriver(None, *hosts("a", "b", "c"), node("small", cpu="500m", labels={HOST: "small"}))
    workers = with_spec(pod_set("worker", 4), anti(HOST, app="web"), WEB)
    out = d.dequeue(workload("ns/w", gang_=gang(workers)))
    assert "1/4 tasks could not be placed: 0/4 nodes are available: 1 Insufficient cpu, " \
           "3 node(s) didn't match pod anti-affinity rules." in one(out, PlacementFailed).reason
    assert d.core.nodes.pods_on.anti_pods == 0  # the rolled-back attempt left nothing counted
    assert all(not rows for rows in d.core.nodes.pods_on.rows)


def test_a_running_pods_anti_affinity_keeps_matching_pods_off_its_node():
    """kube-scheduler checks both directions: the incoming pod has no constraint of its own."""
    loner = {**pod("loner", "ns", node_name="a", labels={"app": "db"}, scheduler="other")}
    loner["spec"].update(anti(HOST, app="web"))
    d = PlacementDriver(None, *hosts("a", "b"))
    d.pod(loner)
    assert d.core.nodes.marking  # a running pod with anti-affinity turns the index on
    assert nodes_of(d.dequeue(workload("ns/w", gang_=gang(with_spec(pod_set("head"), {}, WEB)))))== ["b"]
    d2 = PlacementDriver(None, *hosts("a"))
    d2.pod(loner)
    out = d2.dequeue(workload("ns/w", gang_=gang(with_spec(pod_set("head"), {}, WEB))))
    assert "0/1 nodes are available: 1 node(s) didn't satisfy existing pods anti-affinity rules." \
           in one(out, PlacementFailed).reason
    # another namespace: the term reads the loner's own namespace only
    assert nodes_of(d2.dequeue(workload("other/w", gang_=gang(with_spec(pod_set("head"), {}, WEB))))) == ["a"]


def test_required_affinity_follows_the_pods_it_names_and_the_first_of_a_group_goes_anywhere():
    d = PlacementDriver(None, *hosts("a", "b", zone={"a": "z1", "b": "z2"}))
    d.pod(bound(pod("db", "ns", labels={"app": "db"}, scheduler="other"), "b", "Running"))
    near_db = with_spec(pod_set("head"), affinity(ZONE, app="db"))
    d.core.nodes.marking or d.dequeue(workload("ns/warm", gang_=gang(near_db)))  # turns the index on
    d.withdraw("ns/warm")
    assert nodes_of(d.dequeue(workload("ns/w", gang_=gang(near_db)))) == ["b"]
    # nothing matches and the pod does not match itself: no node
    out = d.dequeue(workload("ns/x", gang_=gang(with_spec(pod_set("head"), affinity(ZONE, app="cache")))))
    assert "2 node(s) didn't match pod affinity rules" in one(out, PlacementFailed).reason
    # nothing matches but the pod matches its own term: the first of its group is placed
    first = with_spec(pod_set("head", 2), affinity(ZONE, app="cache"), {"app": "cache"})
    placed = nodes_of(d.dequeue(workload("ns/y", gang_=gang(first))))
    assert len(placed) == 2 and len(set(placed)) == 1  # and the second follows the first


def test_spread_with_max_skew_one_over_zones_counts_the_gangs_own_pods():
    zones = {"a1": "z1", "a2": "z1", "b1": "z2"}
    d = PlacementDriver(None, *hosts("a1", "a2", "b1", zone=zones))
    workers = with_spec(pod_set("worker", 4), spread(ZONE), WEB)
    placed = nodes_of(d.dequeue(workload("ns/w", gang_=gang(workers))))
    assert sorted(zones[n] for n in placed) == ["z1", "z1", "z2", "z2"]


def test_spread_counts_running_pods_and_missing_labels_have_their_own_reason():
    d = PlacementDriver(None, *hosts("a1", "b1", zone={"a1": "z1", "b1": "z2"}), node("bare", labels={HOST: "bare"}))
    for i in range(2):
        d.pod(bound(pod(f"web-{i}", "ns", labels=WEB, scheduler="other"), "a1", "Running"))
    workers = with_spec(pod_set("worker", 3), spread(ZONE), WEB)
    out = d.dequeue(workload("ns/w", gang_=gang(workers)))
    # z1 holds 2: the next two go to z2, then z1 and z2 are even and the third may go to either (a1: binpack)
    assert nodes_of(out) == ["b1", "b1", "a1"]
    d2 = PlacementDriver(None, *hosts("a1", zone={"a1": "z1"}), node("bare", labels={HOST: "bare"}))
    for i in range(2):
        d2.pod(bound(pod(f"web-{i}", "ns", labels=WEB, scheduler="other"), "a1", "Running"))
    out = d2.dequeue(workload("ns/w", gang_=gang(with_spec(pod_set("worker", 1), spread(ZONE, minDomains=2), WEB))))
    reason = one(out, PlacementFailed).reason
    assert reason.endswith("0/2 nodes are available: 1 node(s) didn't match pod topology spread constraints, "
                           "1 node(s) didn't match pod topology spread constraints (missing required label).")


def test_an_empty_spread_selector_counts_no_pod_though_the_pod_itself_matches():
    """kube-scheduler's ``countPodsMatchSelector`` returns 0 for ``labelSelector: {}``: running pods and the
    gang's own count nothing, the pod counts itself, so any zone takes it (found by the differential test:
    kube-scheduler bound such pods where muster, counting every pod, refused)."""
    zones = {"a1": "z1", "b1": "z2"}
    d = PlacementDriver(None, *hosts("a1", "b1", zone=zones))
    for i in range(3):
        d.pod(bound(pod(f"web-{i}", "ns", labels=WEB, scheduler="other"), "a1", "Running"))
    everything = {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
                                                 "labelSelector": {}, "nodeAffinityPolicy": "Ignore"}]}
    workers = with_spec(pod_set("worker", 3, node_selector={HOST: "a1"}), everything, WEB)  # z2 counts too: Ignore
    assert nodes_of(d.dequeue(workload("ns/w", gang_=gang(workers)))) == ["a1", "a1", "a1"]
    counted = with_spec(pod_set("worker", 1, node_selector={HOST: "a1"}), spread(ZONE, nodeAffinityPolicy="Ignore"), WEB)
    assert "didn't match pod topology spread constraints" in one(
        d.dequeue(workload("ns/x", gang_=gang(counted))), PlacementFailed).reason


def test_node_inclusion_policies_decide_which_nodes_count():
    """nodeAffinityPolicy Honor (the default) counts only nodes the pod's node selector admits."""
    zones = {"a": "z1", "b": "z2", "c": "z3"}
    d = PlacementDriver(None, *[node(n, labels={HOST: n, ZONE: z, "pool": "p" if n != "c" else "q"})
                                for n, z in zones.items()])
    workers = with_spec(pod_set("worker", 2, node_selector={"pool": "p"}), spread(ZONE), WEB)
    assert sorted(nodes_of(d.dequeue(workload("ns/w", gang_=gang(workers))))) == ["a", "b"]


def test_schedule_anyway_and_preferred_anti_affinity_order_nodes_but_never_refuse():
    zones = {"a1": "z1", "a2": "z1", "b1": "z2"}
    d = PlacementDriver(None, *hosts("a1", "a2", "b1", zone=zones))
    soft = with_spec(pod_set("worker", 2), spread(ZONE, when="ScheduleAnyway"), WEB)
    assert sorted(zones[n] for n in nodes_of(d.dequeue(workload("ns/w", gang_=gang(soft))))) == ["z1", "z2"]
    pref = {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "api"}}}}]}}}
    d2 = PlacementDriver(None, *hosts("a", "b"))
    api = with_spec(pod_set("worker", 3), pref, {"app": "api"})
    placed = nodes_of(d2.dequeue(workload("ns/api", gang_=gang(api))))
    assert sorted(set(placed)) == ["a", "b"] and len(placed) == 3  # preferred: spread, yet all placed


def test_a_cluster_without_inter_pod_constraints_never_turns_the_index_on():
    d = PlacementDriver(None, *hosts("a", "b"))
    out = d.dequeue(workload("ns/w", gang_=gang(pod_set("head"), pod_set("worker", 2))))
    d.run(workload("ns/w", gang_=gang(pod_set("head"), pod_set("worker", 2))), out)
    assert not d.core.nodes.marking
    assert not d.core.nodes.pods_on.marks


def test_turning_the_index_on_marks_what_already_runs_and_reserves():
    d = PlacementDriver(None, *hosts("a", "b"))
    plain = workload("ns/plain", gang_=gang(with_spec(pod_set("head"), {}, WEB)))
    d.dequeue(plain)  # reserved on a (binpack), not bound yet
    workers = with_spec(pod_set("worker", 1), anti(HOST, app="web"), WEB)
    assert nodes_of(d.dequeue(workload("ns/w", gang_=gang(workers)))) == ["b"]


def test_kuberay_labels_are_what_a_gangs_pods_show():
    spec = interpod.marked_spec(workload("ns/rc", gang_=gang(pod_set("head"), pod_set("workers", 2))))
    head, workers = spec.gang.pod_sets
    assert head.labels == {"ray.io/cluster": "rc", "ray.io/node-type": "head", "ray.io/group": "headgroup"}
    assert workers.labels["ray.io/group"] == "workers" and workers.namespace == "ns"


def test_the_index_survives_a_snapshot_round_trip_and_decides_alike():
    def fresh() -> PlacementDriver:
        d = PlacementDriver(None, *hosts("a", "b", "c"))
        first = with_spec(pod_set("worker", 2), anti(HOST, app="web"), WEB)
        d.dequeue(workload("ns/w1", gang_=gang(first)))  # reserved: the slots show the pod set's labels
        return d
    d, restored = fresh(), fresh()
    restored.core = decode(encode(restored.core))
    assert restored.core.nodes.pods_on.rows == d.core.nodes.pods_on.rows
    second = with_spec(pod_set("worker", 2), anti(HOST, app="web"), WEB)
    out_a = d.dequeue(workload("ns/w2", gang_=gang(second)))
    out_b = restored.dequeue(workload("ns/w2", gang_=gang(second)))
    assert one(out_a, PlacementFailed).reason == one(out_b, PlacementFailed).reason
    assert "didn't match pod anti-affinity rules" in one(out_a, PlacementFailed).reason


def test_compaction_moves_the_counts_with_their_rows():
    d = PlacementDriver(None, *hosts("a", "b"))
    workers = with_spec(pod_set("worker", 1), anti(HOST, app="web"), WEB)
    d.dequeue(workload("ns/w", gang_=gang(workers)))
    before = {d.core.nodes.names[r]: c for rows in d.core.nodes.pods_on.rows for r, c in rows.items()}
    d.core.nodes.pods_on.remap([1, 0])  # as compaction would swap two rows' numbers
    d.core.nodes.pods_on.remap([1, 0])
    after = {d.core.nodes.names[r]: c for rows in d.core.nodes.pods_on.rows for r, c in rows.items()}
    assert before == after == {"a": 1}
