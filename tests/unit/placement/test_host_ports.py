"""Host ports (kube-scheduler's NodePorts filter): a pod binding a host port goes to no node where a pod
already there, or a gang member placed in the same attempt, holds it; protocol and host IP as
``HostPortInfo.CheckConflict`` compares them (``pkg/scheduler/framework/types_test.go``, ``nodeports/node_ports_test.go``)."""

from __future__ import annotations

import numpy as np
import pytest

from services.placement.gang import pod_demand
from services.placement.nodes import port_taken
from services.placement.pods import host_ports
from shared.kernel.events import GangPlaced, PlacementFailed
from shared.kernel.model import HostPort
from shared.runtime.statecodec import decode, encode
from tests.builders import gang, node, pod, pod_set, workload
from tests.builders.placement import PlacementDriver, bound, one

HTTP = HostPort(port=8080)


def _ported(ps, *ports: HostPort):
    return ps.model_copy(update={"host_ports": ports})


@pytest.mark.parametrize("have, want, taken", [
    (HostPort(port=80), HostPort(port=80), True),
    (HostPort(port=80), HostPort(port=81), False),
    (HostPort(port=80), HostPort(port=80, protocol="UDP"), False),
    (HostPort(port=80, ip="127.0.0.1"), HostPort(port=80, ip="127.0.0.2"), False),
    (HostPort(port=80, ip="127.0.0.1"), HostPort(port=80, ip="127.0.0.1"), True),
    (HostPort(port=80, ip="127.0.0.1"), HostPort(port=80), True),  # 0.0.0.0 wants every address
    (HostPort(port=80), HostPort(port=80, ip="127.0.0.1"), True),
])
def test_conflicts_as_host_port_info_checks_them(have: HostPort, want: HostPort, taken: bool) -> None:
    assert port_taken({have: 1}, (want,)) is taken


def test_two_members_of_one_gang_binding_one_host_port_take_two_nodes() -> None:
    d = PlacementDriver(None, node("n1", cpu="16"), node("n2", cpu="16"))
    placed = one(d.dequeue(workload("ns/w", gang_=gang(_ported(pod_set("worker", 2, cpu="1"), HTTP)))), GangPlaced)
    assert sorted(s.node for s in placed.slots) == ["n1", "n2"]


def test_a_third_member_waits_with_kube_schedulers_reason_and_nothing_is_reserved() -> None:
    d = PlacementDriver(None, node("n1", cpu="16"), node("n2", cpu="16"))
    failed = one(d.dequeue(workload("ns/w", gang_=gang(_ported(pod_set("worker", 3, cpu="1"), HTTP)))), PlacementFailed)
    assert "0/2 nodes are available: 2 node(s) didn't have free ports for the requested pod ports." in failed.reason
    assert failed.capacity_short  # a pod leaving frees its port: it waits for room
    assert not d.core.nodes.ports


def test_a_bound_pod_of_another_scheduler_holds_its_port_until_it_goes() -> None:
    d = PlacementDriver(None, node("n1", cpu="16"), node("n2", cpu="16"))
    other = pod("daemon", scheduler="default-scheduler")
    other["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    d.pod(bound(other, "n1", "Running"))
    placed = one(d.dequeue(workload("ns/a", gang_=gang(_ported(pod_set("head", 1, cpu="1"), HTTP)))), GangPlaced)
    assert [s.node for s in placed.slots] == ["n2"]  # binpack alone would take n1, as full as n2
    d.pod(bound(other, "n1", "Succeeded"))
    placed = one(d.dequeue(workload("ns/b", gang_=gang(_ported(pod_set("head", 1, cpu="1"), HTTP)))), GangPlaced)
    assert [s.node for s in placed.slots] == ["n1"]


def test_ports_of_another_protocol_or_address_share_a_node() -> None:
    d = PlacementDriver(None, node("n1", cpu="16"), node("n2", cpu="16"))
    one(d.dequeue(workload("ns/a", gang_=gang(_ported(pod_set("head", 1, cpu="1"), HostPort(port=53, ip="10.0.0.1"))))),
        GangPlaced)
    udp = one(d.dequeue(workload("ns/b", gang_=gang(_ported(pod_set("head", 1, cpu="1"), HostPort(port=53, protocol="UDP"))))),
              GangPlaced)
    other_ip = one(d.dequeue(workload("ns/c", gang_=gang(_ported(pod_set("head", 1, cpu="1"),
                                                                 HostPort(port=53, ip="10.0.0.2"))))), GangPlaced)
    any_ip = one(d.dequeue(workload("ns/d", gang_=gang(_ported(pod_set("head", 1, cpu="1"), HostPort(port=53))))),
                 GangPlaced)
    assert [udp.slots[0].node, other_ip.slots[0].node, any_ip.slots[0].node] == ["n1", "n1", "n2"]


def test_the_port_filter_comes_before_resources_in_the_histogram() -> None:
    d = PlacementDriver(None, node("n1", cpu="4"), node("n2", cpu="2"))
    one(d.dequeue(workload("ns/a", gang_=gang(_ported(pod_set("head", 1, cpu="3"), HTTP)))), GangPlaced)  # on n1
    # n1 is short of cpu too, but NodePorts rejects it first
    failed = one(d.dequeue(workload("ns/b", gang_=gang(_ported(pod_set("head", 1, cpu="3"), HTTP)))), PlacementFailed)
    assert "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't have free ports for the requested pod ports." \
        in failed.reason


def test_kept_score_vectors_see_ports_taken_and_freed() -> None:
    d = PlacementDriver(None, *(node(f"n{i}", cpu="16") for i in range(4)))
    table = d.core.nodes
    ps = _ported(pod_set("head", 1, cpu="1"), HTTP)
    for i in range(3):
        one(d.dequeue(workload(f"ns/w{i}", gang_=gang(ps))), GangPlaced)
        demand = pod_demand(table, ps)
        kept = table.scores(demand, ps, "binpack").copy()
        fresh = np.where(table.feasible(demand, table.static_mask(ps), slice(0, table.n)),
                         table.score(demand, "binpack", slice(0, table.n)), -np.inf)
        assert np.array_equal(kept, fresh)
        assert int(np.isinf(kept).sum()) == i + 1


def test_ports_held_survive_a_snapshot_round_trip() -> None:
    d = PlacementDriver(None, node("n1", cpu="16"), node("n2", cpu="16"))
    one(d.dequeue(workload("ns/a", gang_=gang(_ported(pod_set("head", 1, cpu="1"), HTTP)))), GangPlaced)
    restored = decode(encode(d.core))
    assert restored.nodes.ports == d.core.nodes.ports == {0: {HTTP: 1}}


def test_a_pods_host_ports_are_read_leniently_and_only_where_kubernetes_holds_them() -> None:
    spec = {"initContainers": [{"ports": [{"hostPort": 1}]}, {"restartPolicy": "Always", "ports": [{"hostPort": 2}]}],
            "containers": [{"ports": [{"hostPort": 3, "protocol": "UDP"}, {"hostPort": "x"}, {"containerPort": 4}, 5]},
                           {"ports": "nope"}]}
    assert host_ports(spec) == (HostPort(port=2), HostPort(port=3, protocol="UDP"))
