"""What admission reads once of a pod template beyond its requests: host ports (kube-scheduler's NodePorts),
preferred node affinity (the NodeAffinity score) and the claims its volumes mount (VolumeBinding), and the
one-line reason for each malformed value."""

from __future__ import annotations

import pytest

from shared.kernel.model import HostPort, MatchExpression, PreferredTerm, Volumes
from tests.builders import container, pod, ray_cluster, worker_group
from tests.builders.admission import AdmissionDriver

W = "spec.workerGroupSpecs[w].template.spec"


def _cluster(namespace: str = "default", **spec: object) -> dict:
    return ray_cluster("rc", namespace, workers=[worker_group("w", 2, {"cpu": "1"}, **spec)])


def _ported(*ports: dict) -> list[dict]:
    return [{**container("ray", {"cpu": "1"}), "ports": list(ports)}]


def test_host_ports_are_read_with_kubernetes_defaults_and_container_ports_without_one_ignored() -> None:
    spec = AdmissionDriver().submitted(_cluster(containers=_ported(
        {"containerPort": 8265}, {"containerPort": 80, "hostPort": 8080},
        {"containerPort": 53, "hostPort": 53, "protocol": "UDP", "hostIP": "10.0.0.1"},
        {"containerPort": 81, "hostPort": 8080})))
    head, workers = spec.gang.pod_sets
    assert head.host_ports == ()
    assert workers.host_ports == (HostPort(port=8080), HostPort(port=53, protocol="UDP", ip="10.0.0.1"))


def test_only_restartable_init_containers_hold_host_ports() -> None:
    init = [{**container("setup", {"cpu": "1"}), "ports": [{"containerPort": 1, "hostPort": 7000}]},
            {**container("proxy", {"cpu": "1"}), "restartPolicy": "Always",
             "ports": [{"containerPort": 2, "hostPort": 7001}]}]
    spec = AdmissionDriver().submitted(_cluster(initContainers=init))
    assert spec.gang.pod_sets[1].host_ports == (HostPort(port=7001),)


@pytest.mark.parametrize("port, reason", [
    ({"hostPort": "8080"}, f"{W}.containers[ray].ports[0].hostPort: '8080' is not a port number (1-65535)"),
    ({"hostPort": 70000}, f"{W}.containers[ray].ports[0].hostPort: 70000 is not a port number (1-65535)"),
    ({"hostPort": True}, f"{W}.containers[ray].ports[0].hostPort: true is not a port number (1-65535)"),
    ({"hostPort": 80, "protocol": "HTTP"}, f"{W}.containers[ray].ports[0].protocol: 'HTTP' is not one of TCP, UDP, SCTP"),
    ({"hostPort": 80, "hostIP": 10}, f"{W}.containers[ray].ports[0].hostIP: 10 is not a string"),
])
def test_a_malformed_host_port_is_one_line(port: dict, reason: str) -> None:
    assert AdmissionDriver().rejected(_cluster(containers=_ported(port))) == reason


def test_preferred_node_affinity_is_read_term_by_term() -> None:
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 80, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}},
        {"weight": 1, "preference": {}}]}}
    workers = AdmissionDriver().submitted(_cluster(affinity=affinity)).gang.pod_sets[1]
    assert workers.preferred == (PreferredTerm(weight=80, expressions=(MatchExpression(key="zone", operator="In",
                                                                                          values=("a",)),)),
                                 PreferredTerm(weight=1))
    assert workers.affinity == ()


@pytest.mark.parametrize("term, reason", [
    ({"weight": 0, "preference": {}}, "[0].weight: 0 is not a whole number from 1 to 100"),
    ({"weight": "5", "preference": {}}, "[0].weight: '5' is not a whole number from 1 to 100"),
    ({"weight": 5}, "[0].preference: missing"),
    ({"weight": 5, "preference": {"matchExpressions": [{"key": "z", "operator": "Above", "values": ["1"]}]}},
     "[0].preference.matchExpressions[0].operator: 'Above' is not supported (one of In, NotIn, Exists, DoesNotExist, "
     "Gt, Lt)"),
])
def test_a_malformed_preference_is_one_line(term: dict, reason: str) -> None:
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}
    assert AdmissionDriver().rejected(_cluster(affinity=affinity)) == \
        f"{W}.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution{reason}"


def test_claims_are_read_in_the_workloads_namespace_and_ephemeral_volumes_by_their_class() -> None:
    volumes = [{"name": "cache", "emptyDir": {}},
               {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
               {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": "local"}}}},
               {"name": "again", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}},
               {"name": "tmp", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]
    spec = AdmissionDriver().submitted(_cluster("team-a", volumes=volumes))
    head, workers = spec.gang.pod_sets
    assert head.volumes == Volumes() and not head.volumes
    assert workers.volumes == Volumes(claims=("team-a/data",), ephemeral=("local", ""))
    assert workers.constraint_key != head.constraint_key


@pytest.mark.parametrize("volume, reason", [
    ({"name": "data", "persistentVolumeClaim": {"claimName": 5}},
     f"{W}.volumes[data].persistentVolumeClaim.claimName: 5 is not a claim name"),
    ({"name": "data", "persistentVolumeClaim": {}}, f"{W}.volumes[data].persistentVolumeClaim.claimName: null is not "
                                                     "a claim name"),
    ({"name": "data", "persistentVolumeClaim": "data"}, f"{W}.volumes[data].persistentVolumeClaim: 'data' is not a mapping"),
    ("data", f"{W}.volumes[0]: 'data' is not a mapping"),
    ({"name": "s", "ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": 3}}}},
     f"{W}.volumes[s].ephemeral.volumeClaimTemplate.spec.storageClassName: 3 is not a string"),
])
def test_a_malformed_volume_is_one_line(volume: object, reason: str) -> None:
    assert AdmissionDriver().rejected(_cluster(volumes=[volume])) == reason


def test_a_plain_pod_reads_the_same_constraints() -> None:
    obj = pod("p", "ns")
    obj["spec"]["volumes"] = [{"name": "d", "persistentVolumeClaim": {"claimName": "d"}}]
    obj["spec"]["containers"][0]["ports"] = [{"containerPort": 1, "hostPort": 9000}]
    (ps,) = AdmissionDriver().submitted(obj).gang.pod_sets
    assert (ps.volumes.claims, ps.host_ports) == (("ns/d",), (HostPort(port=9000),))
