"""Gang arithmetic exactly as KubeRay's batch schedulers compute it, with the acceptance scenarios' numbers."""

from __future__ import annotations

import pytest

from services.admission.dialects import DIALECTS, KUBERAY
from services.admission.fields import Invalid
from services.admission.workloads import MAX_REPLICAS_DEFAULT, worker_counts
from shared.kernel.kube import rayjob_cluster_name
from shared.kernel.model import MatchExpression, PodSet, Toleration
from shared.kernel.quantity import format_resources, parse_resources
from tests.builders import container, pod_template, ray_cluster, ray_job, worker_group
from tests.builders.admission import AdmissionDriver, elastic_quota_tree, eqt_node, kai_queue, volcano_queue

GI = 1024**3 * 1000


def res(**amounts: str) -> dict[str, int]:
    return parse_resources(amounts)


# --------------------------------------------------------------------------- worker group counts
@pytest.mark.parametrize(
    ("group", "autoscaling", "expected"),
    [
        ({"replicas": 2}, False, (2, 2)),
        ({}, False, (0, 0)),                                                     # replicas default 0, min 0
        ({"minReplicas": 2}, False, (2, 2)),                                     # replicas missing → clamp up to min
        ({"replicas": 1, "minReplicas": 3, "maxReplicas": 5}, False, (3, 3)),    # clamp up
        ({"replicas": 9, "minReplicas": 1, "maxReplicas": 5}, False, (5, 5)),    # clamp down
        ({"replicas": 2, "minReplicas": 2, "maxReplicas": 2}, False, (2, 2)),    # volcano scenario
        ({"replicas": 2, "numOfHosts": 4}, False, (8, 8)),                       # multi-host (TPU) groups
        ({"replicas": 3, "minReplicas": 1, "maxReplicas": 5, "numOfHosts": 2}, False, (6, 6)),
        ({"replicas": 3, "suspend": True}, False, (0, 0)),                       # suspended group
        ({"replicas": 3, "minReplicas": 2, "suspend": True}, True, (0, 0)),
        ({"replicas": 5, "minReplicas": 1, "numOfHosts": 2}, True, (2, 10)),     # autoscaling: min × hosts, rest elastic
        ({"replicas": 5}, True, (0, 5)),                                         # autoscaling, min default 0
        ({"replicas": 5, "minReplicas": 5, "maxReplicas": 5}, True, (5, 5)),
        ({"replicas": 2.0}, False, (2, 2)),                                      # whole float from a JSON decoder
        ({"replicas": 3, "maxReplicas": MAX_REPLICAS_DEFAULT}, False, (3, 3)),
    ],
)
def test_worker_group_counts_as_kuberay_and_volcano(group: dict, autoscaling: bool, expected: tuple[int, int]) -> None:
    """(minimum, desired): KubeRay creates clamp(replicas) × hosts; Volcano's PodGroup counts minReplicas
    when in-tree autoscaling is on (volcano_scheduler.go calculatePodGroupParams)."""
    assert worker_counts(group, "spec.workerGroupSpecs[g]", autoscaling, KUBERAY) == expected


@pytest.mark.parametrize(
    ("dialect", "group", "autoscaling", "expected"),
    [
        ("kai", {"replicas": 4, "minReplicas": 1}, False, (1, 4)),           # KAI: minReplicas whenever it is set
        ("kai", {"replicas": 4, "minReplicas": 1, "numOfHosts": 2}, True, (2, 8)),
        ("kai", {"replicas": 4}, False, (4, 4)),                             # no minReplicas: the desired replicas
        ("kai", {"replicas": 0, "minReplicas": 0}, False, (0, 0)),
        ("volcano", {"replicas": 4, "minReplicas": 1}, False, (4, 4)),       # Volcano: min only with autoscaling
        ("elasticquotatree", {"replicas": 4, "minReplicas": 1}, True, (4, 4)),  # kube-queue: head + Σ replicas
        ("builtin", {"replicas": 4, "minReplicas": 1}, True, (1, 4)),
    ],
)
def test_worker_group_counts_per_dialect(dialect: str, group: dict, autoscaling: bool,
                                         expected: tuple[int, int]) -> None:
    assert worker_counts(group, "spec.workerGroupSpecs[g]", autoscaling, DIALECTS[dialect].gang) == expected


def test_worker_count_rejects_min_above_max_instead_of_using_max() -> None:
    with pytest.raises(Invalid) as err:
        worker_counts({"replicas": 1, "minReplicas": 3, "maxReplicas": 2}, "spec.workerGroupSpecs[g]", False, KUBERAY)
    assert err.value.reason == "spec.workerGroupSpecs[g].minReplicas: 3 is greater than maxReplicas 2"


# --------------------------------------------------------------------------- the scenarios' gangs
def test_volcano_scenario_cluster_is_three_pods_of_3_cpu_4gi() -> None:
    d = AdmissionDriver()
    d.add(volcano_queue("kuberay-test-queue", capability={"cpu": 4, "memory": "6Gi"}, weight=1))
    rc = ray_cluster("test-cluster-0", labels={"volcano.sh/queue-name": "kuberay-test-queue"},
                     head={"cpu": "1", "memory": "2Gi"},
                     workers=[worker_group("worker", 2, {"cpu": "1", "memory": "1Gi"}, min_replicas=2, max_replicas=2,
                                           limits={"cpu": "1", "memory": "1Gi"})])
    spec = d.submitted(rc, at=1.0)
    assert spec.gang.min_member == 3
    assert format_resources(spec.gang.resources) == {"cpu": "3", "memory": "4Gi"}
    assert [(ps.name, ps.count, ps.in_gang) for ps in spec.gang.pod_sets] == [("head", 1, True), ("worker", 2, True)]
    assert spec.kind == "RayCluster" and spec.cluster_name == "test-cluster-0" and spec.gate == "pods"
    assert spec.queue == "kuberay-test-queue" and spec.submitted_at == 1.0


def test_kai_half_gpu_cluster_takes_requests_from_limits_and_shares_one_gpu() -> None:
    d = AdmissionDriver()
    d.add(kai_queue("department-1"), kai_queue("team-a", parent="department-1"))
    rc = ray_cluster("raycluster-half-gpu", labels={"kai.scheduler/queue": "team-a"},
                     workers=[worker_group("shared-gpu", 2, {}, min_replicas=2, limits={"cpu": "1", "memory": "2Gi"},
                                           annotations={"gpu-fraction": "0.5"})])
    rc["spec"]["headGroupSpec"]["template"] = pod_template(None, {"cpu": "1", "memory": "2Gi"}, name="head")
    spec = d.submitted(rc)
    assert spec.gang.min_member == 3
    assert format_resources(spec.gang.resources) == {"cpu": "3", "memory": "6Gi"}
    head, workers = spec.gang.pod_sets
    assert head == PodSet(name="head", count=1, resources=res(cpu="1", memory="2Gi"))
    assert workers == PodSet(name="shared-gpu", count=2, resources=res(cpu="1", memory="2Gi"), gpu_share=500)
    assert spec.gang.gpu_share_total == 1000
    assert spec.gang.quota_demand == {"cpu": 3000, "memory": 6 * GI, "nvidia.com/gpu": 1000}
    assert spec.queue == "team-a"


def test_kube_queue_rayjob_is_31_in_gang_plus_an_out_of_gang_submitter() -> None:
    d = AdmissionDriver()
    job = ray_job("rayjob-sample", "algorithm-text",
                  labels={"quota.scheduling.alibabacloud.com/name": "algorithm-text"},
                  head={"cpu": "1"}, workers=[worker_group("small-group", 30, {"cpu": "1"}, limits={"cpu": "1"})])
    spec = d.submitted(job)
    assert spec.gang.min_member == 31
    assert [(ps.name, ps.count, ps.in_gang) for ps in spec.gang.pod_sets] == [
        ("head", 1, True), ("small-group", 30, True), ("submitter", 1, False)]
    assert spec.gang.pod_sets[2].resources == res(cpu="500m", memory="200Mi")
    assert spec.gang.resources == {"cpu": 31_500, "memory": 200 * 1024**2 * 1000}
    assert spec.gate == "suspend" and spec.kind == "RayJob" and spec.key == "algorithm-text/rayjob-sample"


@pytest.mark.parametrize(
    ("workers", "autoscaling", "min_member", "counts"),
    [
        ([worker_group("a", 2), worker_group("b", 3)], False, 6, [1, 2, 3]),
        ([worker_group("a", 2, num_of_hosts=4)], False, 9, [1, 8]),
        ([worker_group("a", 5, min_replicas=1, max_replicas=10, num_of_hosts=2)], True, 3, [1, 2]),
        ([{**worker_group("a", 5), "suspend": True}, worker_group("b", 1)], False, 2, [1, 0, 1]),
        ([], False, 1, [1]),
    ],
)
def test_cluster_min_member_sums_head_and_groups(workers: list, autoscaling: bool, min_member: int,
                                                 counts: list[int]) -> None:
    rc = ray_cluster(workers=workers, enableInTreeAutoscaling=autoscaling)
    spec = AdmissionDriver().submitted(rc)
    assert spec.gang.min_member == min_member
    assert [ps.count for ps in spec.gang.pod_sets] == counts


# --------------------------------------------------------------------------- RayJob submission modes
SUBMITTER = res(cpu="500m", memory="200Mi")


@pytest.mark.parametrize(
    ("mode", "head", "sets"),
    [
        (None, res(cpu="1", memory="2Gi"), ["head", "worker", "submitter"]),
        ("K8sJobMode", res(cpu="1", memory="2Gi"), ["head", "worker", "submitter"]),
        ("SidecarMode", res(cpu="1500m", memory="2248Mi"), ["head", "worker"]),
        ("HTTPMode", res(cpu="1", memory="2Gi"), ["head", "worker"]),
        ("InteractiveMode", res(cpu="1", memory="2Gi"), ["head", "worker"]),
    ],
)
def test_submission_modes(mode: str | None, head: dict, sets: list[str]) -> None:
    spec = AdmissionDriver().submitted(ray_job(submission_mode=mode))
    assert [ps.name for ps in spec.gang.pod_sets] == sets
    assert spec.gang.pod_sets[0].resources == head
    assert spec.gang.min_member == 2
    if "submitter" in sets:
        assert spec.gang.pod_sets[-1] == PodSet(name="submitter", count=1, in_gang=False, resources=SUBMITTER)


def test_submitter_pod_template_replaces_the_default_resources() -> None:
    job = ray_job()
    job["spec"]["submitterPodTemplate"] = pod_template({"cpu": "2", "memory": "1Gi"}, name="submitter")
    spec = AdmissionDriver().submitted(job)
    assert spec.gang.pod_sets[-1] == PodSet(name="submitter", count=1, in_gang=False, resources=res(cpu="2", memory="1Gi"))
    assert spec.gang.min_member == 2


def test_rayjob_cluster_name_is_the_generated_one() -> None:
    spec = AdmissionDriver().submitted(ray_job("my-job"))
    assert spec.cluster_name == rayjob_cluster_name("my-job") != "my-job"


# --------------------------------------------------------------------------- pod resources and constraints
def test_requests_default_to_limits_and_containers_sum() -> None:
    rc = ray_cluster()
    rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"] = [
        container("ray-head", {"cpu": "1"}, {"cpu": "2", "memory": "4Gi"}),
        container("sidecar", None, {"cpu": "250m", "memory": "256Mi"}),
        container("empty"),
    ]
    spec = AdmissionDriver().submitted(rc)
    assert spec.gang.pod_sets[0].resources == res(cpu="1250m", memory="4352Mi")


def test_an_init_container_larger_than_the_containers_counts_as_kube_scheduler_counts_it() -> None:
    rc = ray_cluster()
    rc["spec"]["headGroupSpec"]["template"]["spec"]["initContainers"] = [container("init", {"cpu": "8"})]
    assert AdmissionDriver().submitted(rc).gang.pod_sets[0].resources == res(cpu="8", memory="2Gi")


def test_whole_gpus_are_a_resource_not_a_share() -> None:
    rc = ray_cluster(workers=[worker_group("gpu", 1, {"cpu": "1"}, limits={"nvidia.com/gpu": "1"})])
    spec = AdmissionDriver().submitted(rc)
    assert spec.gang.pod_sets[1].resources == {"cpu": 1000, "nvidia.com/gpu": 1000}
    assert spec.gang.pod_sets[1].gpu_share == 0


def test_node_selector_tolerations_and_required_affinity_come_from_the_template() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]},
                              {"key": "spot", "operator": "DoesNotExist"}]},
        {"matchExpressions": [{"key": "pool", "operator": "Exists"}]},
    ]}}}
    rc = ray_cluster(workers=[worker_group(
        "w", 1, nodeSelector={"nvidia.com/gpu.product": "A100"},
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
                     {"key": "team", "value": "a", "effect": "NoExecute", "tolerationSeconds": 30}],
        affinity=affinity)])
    ps = AdmissionDriver().submitted(rc).gang.pod_sets[1]
    assert ps.node_selector == {"nvidia.com/gpu.product": "A100"}
    assert ps.tolerations == (Toleration(key="gpu", operator="Exists", effect="NoSchedule"),
                              Toleration(key="team", operator="Equal", value="a", effect="NoExecute"))
    assert ps.affinity == (
        (MatchExpression(key="zone", operator="In", values=("a", "b")),
         MatchExpression(key="spot", operator="DoesNotExist")),
        (MatchExpression(key="pool", operator="Exists"),),
    )


def test_gt_lt_and_empty_terms_are_read_as_kube_scheduler_reads_them() -> None:
    """Gt/Lt are node affinity operators like the others; an empty term is kept (it matches no node), not
    dropped, which made a pod whose only term is empty fit everywhere (found by the differential test)."""
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["3"]},
                              {"key": "gen", "operator": "Lt", "values": ["7"]}]},
        {},
    ]}}}
    rc = ray_cluster(workers=[worker_group("w", 1, affinity=affinity)])
    assert AdmissionDriver().submitted(rc).gang.pod_sets[1].affinity == (
        (MatchExpression(key="gen", operator="Gt", values=("3",)), MatchExpression(key="gen", operator="Lt", values=("7",))),
        (),
    )


# --------------------------------------------------------------------------- what each dialect counts and charges
def test_volcano_autoscaling_cluster_gang_is_min_replicas_and_the_rest_elastic() -> None:
    d = AdmissionDriver()
    d.send(volcano_queue("v"))
    rc = ray_cluster(labels={"volcano.sh/queue-name": "v"}, enableInTreeAutoscaling=True,
                     workers=[worker_group("w", 4, {"cpu": "1"}, min_replicas=1, max_replicas=8)])
    gang = d.submitted(rc).gang
    assert gang.min_member == 2 and [(ps.count, ps.elastic) for ps in gang.pod_sets] == [(1, 0), (1, 3)]
    assert gang.quota_demand["cpu"] == 2500  # the minimum (the head with KubeRay's 500m autoscaler) is charged;
    # elastic pods as they bind


def test_kai_cluster_gang_is_head_plus_min_replicas_with_or_without_autoscaling() -> None:
    d = AdmissionDriver()
    d.send(kai_queue("k"))
    rc = ray_cluster(labels={"kai.scheduler/queue": "k"},
                     workers=[worker_group("a", 3, min_replicas=1), worker_group("b", 2)])
    gang = d.submitted(rc).gang
    assert [(ps.name, ps.count, ps.elastic) for ps in gang.pod_sets] == [("head", 1, 0), ("a", 1, 2), ("b", 2, 0)]
    assert gang.min_member == 4


def test_kube_queue_rayjob_charges_head_and_replicas_but_not_the_submitter() -> None:
    d = AdmissionDriver()
    d.send(elastic_quota_tree(eqt_node("root", children=[eqt_node("video", namespaces=["video"])])))
    job = ray_job("rj", "video", head={"cpu": "4"}, enableInTreeAutoscaling=True,
                  workers=[worker_group("w", 2, {"cpu": "4"}, min_replicas=1)])
    spec = d.submitted(job)
    assert spec.queue == "video" and [(ps.count, ps.elastic) for ps in spec.gang.pod_sets] == [(1, 0), (2, 0), (1, 0)]
    assert spec.gang.pod_sets[-1].charged is False
    # the head's pod has KubeRay's autoscaler container (500m, 512Mi) beside its own: it runs, so it is
    # charged; the submitter's 500m CPU, 200Mi are not in it
    assert spec.gang.quota_demand == {"cpu": 12_500, "memory": 512 * 2**20 * 1000}
    assert spec.gang.resources["cpu"] == 13_000     # placed with the gang all the same: it needs a node


def test_a_queue_defined_later_recounts_the_gang_by_its_dialect() -> None:
    d = AdmissionDriver()
    rc = ray_cluster(labels={"kai.scheduler/queue": "k"}, workers=[worker_group("a", 3, min_replicas=1)])
    assert d.submitted(rc).gang.min_member == 4          # the queue is unknown yet: KubeRay's own count
    out = d.send(kai_queue("k"))
    updated = [x for x in out if x.type == "WorkloadUpdated"]
    assert updated[0].workload.gang.min_member == 2


def test_a_pod_set_asks_what_kube_scheduler_counts_init_containers_sidecars_and_overhead_included() -> None:
    """The head's init container (3 CPU) runs alone, so the head needs 3; a worker's sidecar (1 CPU) runs
    beside its container (1 CPU) and its overhead (250m) comes on top: 2.25 each."""
    rc = ray_cluster("rc", head={"cpu": "1", "memory": "1Gi"},
                     workers=[worker_group("worker", 2, {"cpu": "1", "memory": "1Gi"})])
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]
    head["initContainers"] = [container("fetch", {"cpu": "3", "memory": "512Mi"})]
    worker = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    worker["initContainers"] = [{**container("proxy", {"cpu": "1"}), "restartPolicy": "Always"}]
    worker["runtimeClassName"] = "kata"  # the API server gives its pods the class's overhead
    d = AdmissionDriver()
    d.send({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "kata"}, "handler": "kata",
            "overhead": {"podFixed": {"cpu": "250m"}}})
    spec = d.submitted(rc, at=1.0)
    assert {ps.name: format_resources(ps.resources) for ps in spec.gang.pod_sets} == {
        "head": {"cpu": "3", "memory": "1Gi"}, "worker": {"cpu": "2250m", "memory": "1Gi"}}


@pytest.mark.parametrize("options, autoscaler", [
    (None, {"cpu": "500m", "memory": "512Mi"}),                                     # KubeRay's default
    ({"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}, {"cpu": "1", "memory": "1Gi"}),
])
def test_a_head_with_in_tree_autoscaling_asks_for_kuberays_autoscaler_container_too(options, autoscaler) -> None:
    """KubeRay adds an autoscaler container to the head pod (``BuildAutoscalerContainer``: 500m CPU and
    512Mi unless ``autoscalerOptions.resources`` replaces them): the head pod asks for it as well."""
    rc = ray_cluster("rc", head={"cpu": "1", "memory": "1Gi"}, workers=[worker_group("worker", 1, {"cpu": "1"})])
    rc["spec"]["enableInTreeAutoscaling"] = True
    if options is not None:
        rc["spec"]["autoscalerOptions"] = options
    head = AdmissionDriver().submitted(rc).gang.pod_sets[0]
    assert head.resources == parse_resources({"cpu": "1", "memory": "1Gi"}) | {
        r: v + parse_resources({"cpu": "1", "memory": "1Gi"})[r] for r, v in parse_resources(autoscaler).items()}


def test_pod_affinity_spread_and_labels_are_read_from_the_template():
    template = pod_template({"cpu": "1"}, affinity={
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "w"}},
             "namespaceSelector": {}}]},
        "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "podAffinityTerm": {"topologyKey": "zone", "namespaces": ["data"],
                                               "labelSelector": {"matchExpressions": [{"key": "db", "operator": "Exists"}]}}}]}},
        topologySpreadConstraints=[{"maxSkew": 2, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                                    "minDomains": 3, "nodeTaintsPolicy": "Honor", "matchLabelKeys": ["app"],
                                    "labelSelector": {"matchLabels": {"app": "w"}}}])
    template["metadata"] = {"labels": {"app": "w"}}
    out = AdmissionDriver().send(ray_cluster("rc", workers=[{"groupName": "workers", "replicas": 2, "template": template}]))
    workers = out[0].workload.gang.pod_sets[1]
    assert workers.labels == {"app": "w"}
    (anti,) = workers.pod_affinity.required_anti
    assert (anti.topology_key, anti.all_namespaces, anti.selector.match_labels) == ("kubernetes.io/hostname", True,
                                                                                    (("app", "w"),))
    (preferred,) = workers.pod_affinity.preferred
    assert (preferred.weight, preferred.namespaces, preferred.selector.match_expressions[0].operator) == (
        10, ("data",), "Exists")
    (spread,) = workers.spread
    assert (spread.max_skew, spread.hard, spread.min_domains, spread.node_affinity_policy, spread.node_taints_policy,
            spread.match_label_keys) == (2, True, 3, "Honor", "Honor", ("app",))
    assert workers.shape != out[0].workload.gang.pod_sets[0].shape  # inter-pod constraints tell shapes apart
