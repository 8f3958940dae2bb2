"""Every rejection, with a reason that names the field and the value; never an exception."""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest

from shared.kernel.events import WorkloadRejected, WorkloadSubmitted
from tests.builders import pod_template, ray_cluster, ray_job, worker_group
from tests.builders.admission import AdmissionDriver, elastic_quota_tree, eqt_node, kai_queue, kai_resource, volcano_queue


def edited(obj: dict, change: Callable[[dict], Any]) -> dict:
    out = copy.deepcopy(obj)
    change(out)
    return out


def head_spec(obj: dict) -> dict:
    return obj["spec"]["headGroupSpec"]["template"]["spec"]


def first_group(obj: dict) -> dict:
    return obj["spec"]["workerGroupSpecs"][0]


RC = ray_cluster("rc")
W = "spec.workerGroupSpecs[worker]"

CASES: list[tuple[str, dict, str]] = [
    ("missing headGroupSpec", edited(RC, lambda o: o["spec"].pop("headGroupSpec")), "spec.headGroupSpec: missing"),
    ("head cpu not a quantity",
     edited(RC, lambda o: o["spec"]["headGroupSpec"].update(template=pod_template({"cpu": "lots"}, name="ray-head"))),
     "spec.headGroupSpec.template.spec.containers[ray-head].resources.requests.cpu: 'lots' is not a quantity"),
    ("negative limit", ray_cluster(workers=[worker_group("worker", 1, {"cpu": "1"}, limits={"memory": "-1Gi"})]),
     f"{W}.template.spec.containers[ray].resources.limits.memory: '-1Gi' is negative"),
    ("gpu requested without a limit",
     ray_cluster(workers=[worker_group("worker", 1, {"cpu": "1", "nvidia.com/gpu": "1"}, limits={})]),
     f"{W}.template.spec.containers[0].resources.limits: Required value: Limit must be set for non "
     "overcommitable resources (nvidia.com/gpu is requested): the API server refuses such a pod, so none is made"),
    ("gpu limit other than the request",
     ray_cluster(workers=[worker_group("worker", 1, {"nvidia.com/gpu": "1"}, limits={"nvidia.com/gpu": "2"})]),
     f"{W}.template.spec.containers[0].resources.requests: Invalid value: must be equal to nvidia.com/gpu limit of 2"
     ": the API server refuses such a pod, so none is made"),
    ("cpu request above its limit", ray_cluster(workers=[worker_group("worker", 1, {"cpu": "2"}, limits={"cpu": "1"})]),
     f"{W}.template.spec.containers[0].resources.requests: Invalid value: must be less than or equal to cpu limit of 1"
     ": the API server refuses such a pod, so none is made"),
    ("minReplicas > maxReplicas", ray_cluster(workers=[worker_group(min_replicas=3, max_replicas=2)]),
     f"{W}.minReplicas: 3 is greater than maxReplicas 2"),
    ("negative replicas", ray_cluster(workers=[worker_group(replicas=-1)]), f"{W}.replicas: -1 is negative"),
    ("replicas beyond int32", ray_cluster(workers=[worker_group(replicas=2**31)]),
     f"{W}.replicas: 2147483648 is more than 2147483647"),
    ("replicas astronomically large", ray_cluster(workers=[worker_group(replicas=10**400)]),
     f"{W}.replicas: a 1329-bit number is more than 2147483647"),
    ("cpu 1e999990", edited(RC, lambda o: o["spec"]["headGroupSpec"].update(template=pod_template({"cpu": "1e999990"}, name="ray-head"))),
     "spec.headGroupSpec.template.spec.containers[ray-head].resources.requests.cpu: '1e999990' is too large "
     "(muster holds at most 9223372036854775 units, 2**63-1 milli-units)"),
    ("gang total beyond 64 bits", ray_cluster(workers=[worker_group("worker", 3, {"memory": "8Pi"})]),
     "gang.memory: the total 27021599911706624 is too large (muster holds at most 9223372036854775 units)"),
    ("replicas as a string", ray_cluster(workers=[worker_group(replicas="2")]), f"{W}.replicas: '2' is not an integer"),
    ("replicas fractional", ray_cluster(workers=[worker_group(replicas=1.5)]), f"{W}.replicas: 1.5 is not an integer"),
    ("numOfHosts 0", ray_cluster(workers=[worker_group(num_of_hosts=0)]), f"{W}.numOfHosts: 0 is less than 1"),
    ("gpu-fraction out of range", ray_cluster(workers=[worker_group(annotations={"gpu-fraction": "1.5"})]),
     f"{W}.template.metadata.annotations.gpu-fraction: '1.5' must be a number between 0 and 1 (whole GPUs are asked with nvidia.com/gpu)"),
    ("gpu-fraction of a whole GPU", ray_cluster(workers=[worker_group(annotations={"gpu-fraction": "1"})]),
     f"{W}.template.metadata.annotations.gpu-fraction: '1' must be a number between 0 and 1 (whole GPUs are asked "
     "with nvidia.com/gpu)"),
    ("gpu-fraction not a number", ray_cluster(workers=[worker_group(annotations={"gpu-fraction": "half"})]),
     f"{W}.template.metadata.annotations.gpu-fraction: 'half' is not a number"),
    ("an init container is a string",
     edited(RC, lambda o: o["spec"]["headGroupSpec"]["template"]["spec"].update(initContainers=["setup"])),
     "spec.headGroupSpec.template.spec.initContainers[0]: 'setup' is not a mapping"),
    ("an init container's cpu is no quantity",
     edited(RC, lambda o: o["spec"]["headGroupSpec"]["template"]["spec"].update(
         initContainers=[{"name": "setup", "resources": {"requests": {"cpu": "lots"}}}])),
     "spec.headGroupSpec.template.spec.initContainers[setup].resources.requests.cpu: 'lots' is not a quantity"),
    ("an overhead that is no quantity",
     edited(RC, lambda o: o["spec"]["headGroupSpec"]["template"]["spec"].update(overhead={"cpu": "x"})),
     "spec.headGroupSpec.template.spec.overhead.cpu: 'x' is not a quantity"),
    ("an overhead without a RuntimeClass, which the API server refuses",
     edited(RC, lambda o: o["spec"]["headGroupSpec"]["template"]["spec"].update(overhead={"cpu": "1"})),
     "spec.headGroupSpec.template.spec.overhead: pod rejected: Pod Overhead set without corresponding RuntimeClass "
     "defined Overhead: the API server refuses such a pod, so none is made"),
    ("autoscaler resources that are no quantity",
     edited(RC, lambda o: o["spec"].update(enableInTreeAutoscaling=True,
                                           autoscalerOptions={"resources": {"requests": {"cpu": "lots"}}})),
     "spec.autoscalerOptions.resources.requests.cpu: 'lots' is not a quantity"),
    ("spec is a string", {**RC, "spec": "abc"}, "spec: 'abc' is not a mapping"),
    ("spec is a list", {**RC, "spec": [1, 2]}, "spec: a list is not a mapping"),
    ("spec missing", {k: v for k, v in RC.items() if k != "spec"}, "spec: missing"),
    ("workerGroupSpecs not a list", edited(RC, lambda o: o["spec"].update(workerGroupSpecs={"a": 1})),
     "spec.workerGroupSpecs: a mapping is not a list"),
    ("worker group not a mapping", edited(RC, lambda o: o["spec"].update(workerGroupSpecs=["w"])),
     "spec.workerGroupSpecs[0]: 'w' is not a mapping"),
    ("groupName missing", edited(RC, lambda o: first_group(o).pop("groupName")), "spec.workerGroupSpecs[0].groupName: missing"),
    ("groupName twice", ray_cluster(workers=[worker_group("w"), worker_group("w")]),
     "spec.workerGroupSpecs[1].groupName: 'w' names another pod set of this workload"),
    ("groupName head", ray_cluster(workers=[worker_group("head")]),
     "spec.workerGroupSpecs[0].groupName: 'head' names another pod set of this workload"),
    ("no containers", edited(RC, lambda o: head_spec(o).update(containers=[])),
     "spec.headGroupSpec.template.spec.containers: missing (a pod needs at least one container)"),
    ("container not a mapping", edited(RC, lambda o: head_spec(o).update(containers=["ray"])),
     "spec.headGroupSpec.template.spec.containers[0]: 'ray' is not a mapping"),
    ("requests a list", edited(RC, lambda o: head_spec(o)["containers"][0]["resources"].update(requests=["cpu"])),
     "spec.headGroupSpec.template.spec.containers[ray].resources.requests: a list is not a mapping"),
    ("template missing", edited(RC, lambda o: o["spec"]["headGroupSpec"].pop("template")),
     "spec.headGroupSpec.template: missing"),
    ("autoscaling flag a string", edited(RC, lambda o: o["spec"].update(enableInTreeAutoscaling="yes")),
     "spec.enableInTreeAutoscaling: 'yes' is not true or false"),
    ("labels a list", edited(RC, lambda o: o["metadata"].update(labels=["a"])), "metadata.labels: a list is not a mapping"),
    ("label value a number", edited(RC, lambda o: o["metadata"].update(labels={"kai.scheduler/queue": 7})),
     "metadata.labels.kai.scheduler/queue: 7 is not a string"),
    ("toleration operator", ray_cluster(workers=[worker_group(tolerations=[{"key": "a", "operator": "Maybe"}])]),
     f"{W}.template.spec.tolerations[0].operator: 'Maybe' is not one of Equal, Exists"),
    ("affinity operator", ray_cluster(workers=[worker_group(affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gen", "operator": "Above", "values": ["3"]}]}]}}})]),
     f"{W}.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     ".matchExpressions[0].operator: 'Above' is not supported (one of In, NotIn, Exists, DoesNotExist, Gt, Lt)"),
    ("affinity Gt of two values", ray_cluster(workers=[worker_group(affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["3", "4"]}]}]}}})]),
     f"{W}.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     ".matchExpressions[0].values: Required value: must be specified single value when `operator` is 'Lt' or 'Gt': "
     "the API server refuses such a pod, so none is made"),
    ("pod anti-affinity without topologyKey", ray_cluster(workers=[worker_group(affinity={"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"a": "b"}}}]}})]),
     f"{W}.template.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey: "
     "missing (the API server requires it)"),
    ("pod affinity namespaceSelector with labels", ray_cluster(workers=[worker_group(affinity={"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone", "labelSelector": {},
                                                             "namespaceSelector": {"matchLabels": {"team": "a"}}}]}})]),
     f"{W}.template.spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].namespaceSelector: "
     "selecting namespaces by their labels is not supported by muster (it does not watch Namespaces); list them in "
     "namespaces, or use {} for all"),
    ("preferred weight out of range", ray_cluster(workers=[worker_group(affinity={"podAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "podAffinityTerm": {"topologyKey": "z"}}]}})]),
     f"{W}.template.spec.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight: 0 is not in 1..100"),
    ("spread maxSkew 0", ray_cluster(workers=[worker_group(topologySpreadConstraints=[
        {"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}])]),
     f"{W}.template.spec.topologySpreadConstraints[0].maxSkew: 0 must be greater than zero"),
    ("spread whenUnsatisfiable", ray_cluster(workers=[worker_group(topologySpreadConstraints=[
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Never"}])]),
     f"{W}.template.spec.topologySpreadConstraints[0].whenUnsatisfiable: 'Never' is not one of DoNotSchedule, ScheduleAnyway"),
    ("spread minDomains with ScheduleAnyway", ray_cluster(workers=[worker_group(topologySpreadConstraints=[
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway", "minDomains": 2}])]),
     f"{W}.template.spec.topologySpreadConstraints[0].minDomains: only allowed with whenUnsatisfiable DoNotSchedule"),
    ("spread labelSelector operator", ray_cluster(workers=[worker_group(topologySpreadConstraints=[
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
         "labelSelector": {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}}])]),
     f"{W}.template.spec.topologySpreadConstraints[0].labelSelector.matchExpressions[0].operator: 'Gt' is not one of "
     "In, NotIn, Exists, DoesNotExist"),
    ("unknown priority class", ray_cluster(labels={"priorityClassName": "urgent"}),
     "metadata.labels.priorityClassName: priority class 'urgent' does not exist"),
    ("unknown head priority class", edited(RC, lambda o: head_spec(o).update(priorityClassName="urgent")),
     "spec.headGroupSpec.template.spec.priorityClassName: priority class 'urgent' does not exist"),
    ("bad preemptibility label", ray_cluster(labels={"kai.scheduler/preemptibility": "maybe"}),
     "metadata.labels.kai.scheduler/preemptibility: 'maybe' is not one of preemptible, non-preemptible"),
]


@pytest.mark.parametrize(("obj", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_ray_cluster_rejections(obj: dict, reason: str) -> None:
    assert AdmissionDriver().send(obj) == [WorkloadRejected(key="default/rc", kind="RayCluster", reason=reason)]


JOB = ray_job("rj")

JOB_CASES: list[tuple[str, dict, str]] = [
    ("missing rayClusterSpec", edited(JOB, lambda o: o["spec"].pop("rayClusterSpec")), "spec.rayClusterSpec: missing"),
    ("missing headGroupSpec", edited(JOB, lambda o: o["spec"]["rayClusterSpec"].pop("headGroupSpec")),
     "spec.rayClusterSpec.headGroupSpec: missing"),
    ("bad head quantity", edited(JOB, lambda o: o["spec"]["rayClusterSpec"]["headGroupSpec"].update(
        template=pod_template({"cpu": "lots"}, name="ray-head"))),
     "spec.rayClusterSpec.headGroupSpec.template.spec.containers[ray-head].resources.requests.cpu: 'lots' is not a quantity"),
    ("bad worker count", ray_job("rj", workers=[worker_group("small", min_replicas=4, max_replicas=1)]),
     "spec.rayClusterSpec.workerGroupSpecs[small].minReplicas: 4 is greater than maxReplicas 1"),
    ("bad submission mode", ray_job("rj", submission_mode="BatchMode"),
     "spec.submissionMode: 'BatchMode' is not one of K8sJobMode, HTTPMode, SidecarMode, InteractiveMode"),
    ("bad submitter template", edited(JOB, lambda o: o["spec"].update(submitterPodTemplate=pod_template({"memory": "1Q"}, name="s"))),
     "spec.submitterPodTemplate.spec.containers[s].resources.requests.memory: '1Q' is not a quantity"),
    ("cluster selector", edited(JOB, lambda o: o["spec"].update(clusterSelector={"ray.io/cluster": "shared"})),
     "spec.clusterSelector: a RayJob that runs on an existing RayCluster has no gang of its own; "
     "muster admits that RayCluster instead"),
    ("suspended without shutdownAfterJobFinishes", ray_job("rj", suspend=True, shutdown=False),
     "spec.shutdownAfterJobFinishes: false is not allowed with spec.suspend: true (KubeRay: a RayJob with "
     "shutdownAfterJobFinishes set to false is not allowed to be suspended)"),
    ("suspended with shutdownAfterJobFinishes unset", edited(JOB, lambda o: o["spec"].pop("shutdownAfterJobFinishes")),
     "spec.shutdownAfterJobFinishes: false is not allowed with spec.suspend: true (KubeRay: a RayJob with "
     "shutdownAfterJobFinishes set to false is not allowed to be suspended)"),
    ("shutdownAfterJobFinishes a string", edited(JOB, lambda o: o["spec"].update(shutdownAfterJobFinishes="yes")),
     "spec.shutdownAfterJobFinishes: 'yes' is not true or false"),
]


@pytest.mark.parametrize(("obj", "reason"), [c[1:] for c in JOB_CASES], ids=[c[0] for c in JOB_CASES])
def test_ray_job_rejections(obj: dict, reason: str) -> None:
    assert AdmissionDriver().send(obj) == [WorkloadRejected(key="default/rj", kind="RayJob", reason=reason)]


# --------------------------------------------------------------------------- queues: unknown, too small
def test_unknown_queue_is_rejected_when_policy_says_reject() -> None:
    d = AdmissionDriver(unknown_queue="reject")
    assert d.rejected(ray_cluster(labels={"volcano.sh/queue-name": "nope"})) == \
        "queue nope does not exist (metadata.labels.volcano.sh/queue-name)"


def test_an_unknown_queue_rejected_by_policy_names_the_queues_that_come_close() -> None:
    d = AdmissionDriver(unknown_queue="reject")
    d.send(volcano_queue("team-a"))
    assert d.rejected(ray_cluster(labels={"volcano.sh/queue-name": "team_a"})) == \
        "queue team_a does not exist (metadata.labels.volcano.sh/queue-name); did you mean team-a?"
    assert d.rejected(ray_cluster("other", labels={"kai.scheduler/queue": "defualt"})) == \
        "queue defualt does not exist (metadata.labels.kai.scheduler/queue); did you mean default?"


def test_unknown_queue_waits_by_default() -> None:
    spec = AdmissionDriver().submitted(ray_cluster(labels={"kai.scheduler/queue": "later"}))
    assert spec.queue == "later"


def test_default_queue_always_exists_even_when_rejecting_unknown_queues() -> None:
    assert AdmissionDriver(unknown_queue="reject").submitted(ray_cluster()).queue == "default"


def test_a_gang_larger_than_its_queue_or_an_ancestor_is_submitted_for_the_queue_to_hold() -> None:
    """Volcano (``queue resource quota insufficient``), KAI (``OverLimit``), Kueue (``ExceedsMaxQuota``) and
    kube-queue keep such a job pending; a queue's limits can change, so it is no bad input."""
    d = AdmissionDriver()
    d.send(volcano_queue("small", capability={"cpu": 4, "memory": "6Gi"}))
    d.send(kai_queue("dept", cpu=kai_resource(limit=2000)))
    d.send(kai_queue("team", parent="dept"))
    d.send(kai_queue("gpu", gpu=kai_resource(limit=0.5)))
    d.send(volcano_queue("default", capability={"cpu": 1}))
    cases = [
        ray_cluster("a", labels={"volcano.sh/queue-name": "small"},
                    workers=[worker_group("worker", 5, {"cpu": "1", "memory": "1Gi"})]),
        ray_cluster("b", labels={"kai.scheduler/queue": "team"}, workers=[worker_group("worker", 2, {"cpu": "1"})]),
        ray_cluster("c", labels={"kai.scheduler/queue": "gpu"},
                    workers=[worker_group("w", 2, {"cpu": "1"}, annotations={"gpu-fraction": "0.5"})]),
        ray_cluster("d"),
    ]
    assert [d.submitted(rc).queue for rc in cases] == ["small", "team", "gpu", "default"]


def test_the_demand_counts_fractional_gpus_and_the_submitter_where_the_dialect_charges_it() -> None:
    d = AdmissionDriver()
    d.send(kai_queue("gpu", gpu=kai_resource(limit=0.5)))
    rc = ray_cluster(labels={"kai.scheduler/queue": "gpu"},
                     workers=[worker_group("w", 2, {"cpu": "1"}, annotations={"gpu-fraction": "0.5"})])
    assert d.submitted(rc).gang.quota_demand["nvidia.com/gpu"] == 1000
    d.send(elastic_quota_tree(eqt_node("root", max={"cpu": 2})))
    job = ray_job("rj", labels={"quota.scheduling.alibabacloud.com/name": "root"}, head={"cpu": "1"},
                  workers=[worker_group("w", 1, {"cpu": "1"})])
    assert d.submitted(job).gang.quota_demand["cpu"] == 2000  # kube-queue charges head + Σ replicas, not the submitter (ACK)
    d.send(volcano_queue("v", capability={"cpu": 2}))
    job = ray_job("rj2", labels={"volcano.sh/queue-name": "v"}, head={"cpu": "1"},
                  workers=[worker_group("w", 1, {"cpu": "1"})])
    assert d.submitted(job).gang.quota_demand["cpu"] == 2500


def test_gang_exactly_at_the_limit_fits() -> None:
    d = AdmissionDriver()
    d.send(volcano_queue("q", capability={"cpu": 3, "memory": "4Gi"}))
    rc = ray_cluster(labels={"volcano.sh/queue-name": "q"}, workers=[worker_group("worker", 2, {"cpu": "1", "memory": "1Gi"})])
    assert d.submitted(rc).gang.quota_demand == {"cpu": 3000, "memory": 4 * 1024**3 * 1000}


def test_rejected_then_fixed_is_evaluated_again_with_its_original_submission_time() -> None:
    d = AdmissionDriver()
    bad = ray_cluster(workers=[worker_group(replicas=-1)])
    assert d.rejected(bad, at=5.0) == f"{W}.replicas: -1 is negative"
    assert d.send(bad, "Modified", at=6.0) == []  # the same rejection is not repeated
    out = d.send(ray_cluster(), "Modified", at=9.0)
    assert len(out) == 1 and isinstance(out[0], WorkloadSubmitted)
    assert out[0].workload.submitted_at == 5.0


def test_a_different_reason_is_reported() -> None:
    d = AdmissionDriver()
    d.rejected(ray_cluster(workers=[worker_group(replicas=-1)]))
    assert d.rejected(ray_cluster(workers=[worker_group(replicas=-2)]), "Modified") == f"{W}.replicas: -2 is negative"


def test_a_pod_gated_ray_job_may_keep_its_cluster() -> None:
    """Only suspending is refused: a RayJob that is not suspended may keep its cluster after it finishes."""
    spec = AdmissionDriver().submitted(ray_job("rj", suspend=False, shutdown=False))
    assert spec.gate == "pods"


def test_a_refused_suspended_ray_job_is_admitted_once_it_shuts_down_its_cluster() -> None:
    d = AdmissionDriver()
    assert d.rejected(ray_job("rj", suspend=True, shutdown=False), at=1.0).startswith("spec.shutdownAfterJobFinishes")
    out = d.send(ray_job("rj", suspend=True, shutdown=True), "Modified", at=2.0)
    assert len(out) == 1 and isinstance(out[0], WorkloadSubmitted) and out[0].workload.gate == "suspend"


@pytest.mark.parametrize(("obj", "field", "value"), [
    (edited(RC, lambda o: o["spec"]["headGroupSpec"].update(template=pod_template({"cpu": float("inf")}, name="ray-head"))),
     "spec.headGroupSpec.template.spec.containers[ray-head].resources.requests.cpu", "inf"),
    (ray_cluster(workers=[worker_group("worker", 1, {"cpu": "1"}, limits={"memory": float("nan")})]),
     f"{W}.template.spec.containers[ray].resources.limits.memory", "nan"),
    (ray_cluster(workers=[worker_group("worker", 1, {"cpu": "1e1000000"})]),
     f"{W}.template.spec.containers[ray].resources.requests.cpu", "'1e1000000'"),
], ids=["cpu .inf", "memory .nan", "cpu 1e1000000"])
def test_non_finite_quantities_are_rejected_naming_the_field(obj: dict, field: str, value: str) -> None:
    """YAML .inf/.nan and exponents beyond any decimal are no quantities: a rejection naming the field,
    never an exception or a "cannot be read" last resort (whatever shared.kernel.quantity raises for them)."""
    reason = AdmissionDriver().rejected(obj)
    assert reason.startswith(f"{field}: {value} is not a "), reason
    assert "quantity" in reason


def test_gpu_fraction_below_one_thousandth_and_fraction_with_whole_gpus_are_rejected() -> None:
    from shared.kernel.events import WorkloadRejected
    from tests.builders import ray_cluster, worker_group
    from tests.builders.admission import AdmissionDriver

    tiny = ray_cluster("tiny", workers=[worker_group("w", 1, annotations={"gpu-fraction": "0.0004"})])
    [out] = AdmissionDriver().send(tiny)
    assert isinstance(out, WorkloadRejected)
    assert out.reason == ("spec.workerGroupSpecs[w].template.metadata.annotations.gpu-fraction: '0.0004' is below "
                          "the smallest share, 0.001")
    both = ray_cluster("both", workers=[worker_group("w", 1, annotations={"gpu-fraction": "0.5"},
                                                    limits={"nvidia.com/gpu": "2"})])
    [out] = AdmissionDriver().send(both)
    assert isinstance(out, WorkloadRejected)
    assert "a pod asks for a fraction of one GPU or for whole GPUs (nvidia.com/gpu: 2), not both" in out.reason


def test_oversized_gang_is_rejected_with_the_policy_bound() -> None:
    from shared.kernel.events import WorkloadRejected
    from shared.kernel.policy import Policy
    from tests.builders import ray_cluster, worker_group
    from tests.builders.admission import AdmissionDriver

    huge = ray_cluster("huge", workers=[worker_group("w", 3_000_000)])
    [out] = AdmissionDriver().send(huge)
    assert isinstance(out, WorkloadRejected)
    assert out.reason == "gang of 3000001 pods is larger than muster accepts (policy max_gang_pods 10000)"
    [ok] = AdmissionDriver(Policy(max_gang_pods=4)).send(ray_cluster("small", workers=[worker_group("w", 3)]))
    assert ok.type == "WorkloadSubmitted"


def test_an_object_ingest_refused_is_rejected_with_ingest_reason() -> None:
    from services.reconciler.ingest import observe
    obj = observe("Added", ray_cluster("rc", labels={"app": "-x"})).object
    reason = AdmissionDriver().rejected(obj)
    assert reason.startswith("refused at ingest: metadata.labels.app: '-x' is not a label value")


def test_a_queue_ingest_refused_is_rejected_with_ingest_reason() -> None:
    from services.reconciler.ingest import observe
    from shared.kernel.events import QueueRejected
    queue = volcano_queue("q")
    queue["metadata"]["labels"] = {"team": "x" * 64}
    out = AdmissionDriver().send(observe("Added", queue).object)
    assert len(out) == 1 and isinstance(out[0], QueueRejected) and out[0].reason.startswith("refused at ingest: ")


@pytest.mark.parametrize("meta", [{"annotations": {1: "x"}}, {"labels": {2: "y"}, "annotations": {None: "z"}}])
def test_a_key_that_is_no_text_is_read_as_text_never_a_crash(meta: dict) -> None:
    """JSON from an API server has text keys only; a hand-made object may not, and is read as text."""
    obj = edited(RC, lambda o: o["metadata"].update(meta))
    assert [type(x).__name__ for x in AdmissionDriver().send(obj)] == ["WorkloadSubmitted"]
