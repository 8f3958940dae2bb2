"""Each queue dialect's rules reach the specs: who is preemptible, what caps a non-preemptible gang,
and the rule values a QueueSpec carries for the cores (services/admission/dialects.py)."""

from __future__ import annotations

import pytest

from services.admission.dialects import DIALECTS
from shared.kernel.events import QueueDefined, WorkloadRejected, WorkloadSubmitted, WorkloadUpdated
from tests.builders import pod, ray_cluster, ray_job, worker_group
from tests.builders.admission import (
    AdmissionDriver,
    elastic_quota_tree,
    eqt_node,
    gang_pod,
    kai_queue,
    kai_resource,
    pod_group,
    priority_class,
    volcano_queue,
)

QUEUES = {
    "volcano": (volcano_queue("v"), {"volcano.sh/queue-name": "v"}),
    "kai": (kai_queue("k"), {"kai.scheduler/queue": "k"}),
    "elasticquotatree": (elastic_quota_tree(eqt_node("root", children=[eqt_node("leaf", namespaces=["default"])])),
                         {}),
    "builtin": (None, {}),
}


def _driver(dialect: str) -> tuple[AdmissionDriver, dict]:
    d = AdmissionDriver()
    queue, labels = QUEUES[dialect]
    if queue is not None:
        d.send(queue)
    return d, labels


# --------------------------------------------------------------------------- priority and preemptibility
@pytest.mark.parametrize("dialect", ["volcano", "elasticquotatree", "builtin"])
@pytest.mark.parametrize("value", [100, 1000, 100000, 2000000000])
def test_outside_kai_any_priority_value_is_preemptible(dialect: str, value: int) -> None:
    d, labels = _driver(dialect)
    d.send(priority_class("high", value))
    spec = d.submitted(ray_cluster(labels={**labels, "priorityClassName": "high"}))
    assert (spec.priority, spec.preemptible) == (value, True)


def test_in_a_kai_queue_priority_100_and_above_is_non_preemptible_unless_labelled() -> None:
    d, labels = _driver("kai")
    assert d.submitted(ray_cluster("a", labels={**labels, "priorityClassName": "build"})).preemptible is False
    assert d.submitted(ray_cluster("b", labels={**labels, "priorityClassName": "build",
                                                 "kai.scheduler/preemptibility": "preemptible"})).preemptible is True


@pytest.mark.parametrize("dialect", ["volcano", "elasticquotatree", "builtin", "kai"])
def test_the_kai_opt_out_label_holds_in_every_queue(dialect: str) -> None:
    d, labels = _driver(dialect)
    spec = d.submitted(ray_cluster(labels={**labels, "kai.scheduler/preemptibility": "non-preemptible"}))
    assert spec.preemptible is False


def test_a_workload_waiting_for_its_queue_becomes_non_preemptible_when_it_turns_out_to_be_kai() -> None:
    d = AdmissionDriver()
    first = d.submitted(ray_cluster(labels={"kai.scheduler/queue": "k", "priorityClassName": "inference"}), at=1.0)
    assert first.preemptible is True  # unknown queue: no dialect caps it yet
    out = d.send(kai_queue("k"), at=2.0)
    updated = [e for e in out if isinstance(e, WorkloadUpdated)]
    assert len(updated) == 1 and updated[0].workload.preemptible is False
    assert updated[0].workload.submitted_at == 1.0


# --------------------------------------------------------------------------- Volcano's opt-out
def _rc_with(where: str, value: str, kind: str = "RayCluster") -> dict:
    """A RayCluster / RayJob carrying ``volcano.sh/preemptable`` at ``where``."""
    obj = (ray_cluster if kind == "RayCluster" else ray_job)(
        "w", labels={"volcano.sh/queue-name": "v"}, workers=[worker_group("cpu", 1), worker_group("gpu", 2)])
    spec = obj["spec"] if kind == "RayCluster" else obj["spec"]["rayClusterSpec"]
    target = {"annotation": obj["metadata"].setdefault("annotations", {}),
              "label": obj["metadata"]["labels"],
              "head": spec["headGroupSpec"]["template"].setdefault("metadata", {}).setdefault("annotations", {}),
              "worker": spec["workerGroupSpecs"][1]["template"].setdefault("metadata", {}).setdefault("labels", {})}
    if kind == "RayJob":
        obj["spec"]["submitterPodTemplate"] = {"metadata": {"annotations": {}},
                                               "spec": {"containers": [{"name": "s", "image": "ray"}]}}
        target["submitter"] = obj["spec"]["submitterPodTemplate"]["metadata"]["annotations"]
    target[where]["volcano.sh/preemptable"] = value
    return obj


@pytest.mark.parametrize("kind", ["RayCluster", "RayJob"])
@pytest.mark.parametrize("where", ["annotation", "label", "head", "worker"])
def test_volcano_preemptable_false_anywhere_on_a_ray_workload_pins_the_whole_gang(kind: str, where: str) -> None:
    d, _ = _driver("volcano")
    assert d.submitted(_rc_with(where, "false", kind)).preemptible is False
    d2, _ = _driver("volcano")
    assert d2.submitted(_rc_with(where, "true", kind)).preemptible is True


@pytest.mark.parametrize(("where", "parts"), [("head", ("head",)), ("worker", ("gpu",)), ("annotation", ())])
def test_volcano_reads_the_opt_out_per_pod_set_so_the_other_pod_sets_elastic_pods_stay_preemptible(
        where: str, parts: tuple) -> None:
    d, _ = _driver("volcano")
    spec = d.submitted(_rc_with(where, "false"))
    assert (spec.preemptible, spec.pinned_pod_sets) == (False, parts)
    assert spec.elastic_preemptible("cpu") is (where != "annotation")  # the object's own opt-out pins every pod
    assert spec.elastic_preemptible("gpu") is (where == "head")


def test_a_pinned_worker_group_without_pods_yet_still_keeps_the_gang() -> None:
    """A holder keeps the preemptibility it was admitted with: the pods a scale-up brings must stay."""
    d, _ = _driver("volcano")
    obj = _rc_with("worker", "false")
    obj["spec"]["workerGroupSpecs"][1]["replicas"] = 0
    spec = d.submitted(obj)
    assert (spec.preemptible, spec.pinned_pod_sets, spec.elastic_preemptible("gpu")) == (False, ("gpu",), False)


@pytest.mark.parametrize("dialect", ["kai", "elasticquotatree", "builtin"])
def test_elsewhere_one_pinned_pod_template_still_pins_the_whole_workload(dialect: str) -> None:
    d, labels = _driver(dialect)
    obj = _rc_with("head", "false")
    obj["metadata"]["labels"] = dict(labels)
    spec = d.submitted(obj)
    assert (spec.preemptible, spec.pinned_pod_sets, spec.elastic_preemptible("gpu")) == (False, (), False)


def test_a_volcano_pod_group_whose_pinned_pods_form_a_pod_set_of_their_own_leaves_the_others_preemptible() -> None:
    d, _ = _driver("volcano")
    d.send(gang_pod("a", "g", min_available="1", labels={"volcano.sh/queue-name": "v"}, requests={"cpu": "2"}))
    [out] = d.send(gang_pod("b", "g", min_available="1", labels={"volcano.sh/preemptable": "false"}))
    spec = out.workload
    pinned = [ps.name for ps in spec.gang.pod_sets if ps.resources.get("cpu") != 2000]
    assert (spec.preemptible, spec.pinned_pod_sets) == (False, tuple(pinned))


def test_a_rayjob_submitter_template_can_pin_it_too() -> None:
    d, _ = _driver("volcano")
    assert d.submitted(_rc_with("submitter", "0", "RayJob")).preemptible is False


def test_the_annotation_wins_over_the_label_as_volcano_reads_it() -> None:
    d, _ = _driver("volcano")
    rc = ray_cluster(labels={"volcano.sh/queue-name": "v", "volcano.sh/preemptable": "false"},
                     annotations={"volcano.sh/preemptable": "true"})
    assert d.submitted(rc).preemptible is True


def test_a_value_go_cannot_parse_is_rejected_naming_the_field() -> None:
    d, _ = _driver("volcano")
    reason = d.rejected(_rc_with("head", "nope"))
    assert reason == ("spec.headGroupSpec.template.metadata.annotations.volcano.sh/preemptable: 'nope' is not "
                      "true or false")


def test_a_plain_pod_or_its_podgroup_pins_a_pod_gang() -> None:
    d, _ = _driver("volcano")
    d.send(gang_pod("a", "g", min_available="2", labels={"volcano.sh/queue-name": "v"}))
    [out] = d.send(gang_pod("b", "g", min_available="2", annotations={"volcano.sh/preemptable": "false"}))
    assert isinstance(out, WorkloadSubmitted) and out.workload.preemptible is False
    d2, _ = _driver("volcano")
    d2.send(pod_group("h", 2, annotations={"volcano.sh/preemptable": "false"}))
    d2.send(gang_pod("a", "h", labels={"volcano.sh/queue-name": "v"}))
    [out] = d2.send(gang_pod("b", "h"))
    assert isinstance(out, WorkloadSubmitted) and out.workload.preemptible is False


def test_a_pinned_pod_beyond_the_minimum_pins_the_whole_pod_group_and_a_single_pod_pins_itself() -> None:
    """Elastic pods are members too: one of them pinned keeps the group (its elastic pods included)
    from being a victim; a gang of one reads its own pod."""
    d, _ = _driver("volcano")
    d.send(gang_pod("a", "g", min_available="1", labels={"volcano.sh/queue-name": "v"}))
    [out] = d.send(gang_pod("b", "g", min_available="1", labels={"volcano.sh/preemptable": "false"}))
    assert isinstance(out, WorkloadUpdated)
    assert [(ps.count, ps.elastic) for ps in out.workload.gang.pod_sets] == [(1, 1)]
    assert out.workload.preemptible is False
    d2, _ = _driver("volcano")
    spec = d2.submitted(pod("solo", labels={"volcano.sh/queue-name": "v", "volcano.sh/preemptable": "false"}))
    assert (spec.kind, spec.preemptible) == ("Pod", False)


def test_the_podgroup_kuberay_made_for_a_ray_workload_can_pin_it() -> None:
    d, labels = _driver("volcano")
    rc = ray_cluster("rc", labels=labels)
    assert d.submitted(rc).preemptible is True
    group = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
             "metadata": {"name": "ray-rc-pg", "namespace": "default",
                          "annotations": {"volcano.sh/preemptable": "false"},
                          "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "rc",
                                               "uid": "u-1", "controller": True}]},
             "spec": {"minMember": 2, "queue": "v"}}
    [out] = d.send(group)
    assert isinstance(out, WorkloadUpdated) and out.workload.preemptible is False


# --------------------------------------------------------------------------- never waiting without a reason
def test_a_non_preemptible_gang_above_its_kai_quota_is_submitted_for_its_queue_to_hold() -> None:
    """KAI keeps such a job pending (NonPreemptibleOverQuota), it does not refuse it: a quota can grow.
    The queue core says why it waits; making it preemptible is an edit like any other."""
    d = AdmissionDriver()
    d.send(kai_queue("k", gpu=kai_resource(quota=2, limit=8)))
    job = ray_cluster(labels={"kai.scheduler/queue": "k", "priorityClassName": "build"},
                      workers=[worker_group("gpu", 4, {"cpu": "1", "nvidia.com/gpu": "1"})])
    spec = d.submitted(job)
    assert (spec.queue, spec.preemptible, spec.gang.quota_demand["nvidia.com/gpu"]) == ("k", False, 4000)
    job["metadata"]["labels"]["kai.scheduler/preemptibility"] = "preemptible"
    out = d.send(job, "Modified")
    assert isinstance(out[0], WorkloadUpdated) and out[0].workload.preemptible is True


def test_the_same_gang_in_a_volcano_queue_is_not_capped_by_its_guarantee() -> None:
    d = AdmissionDriver()
    d.send(volcano_queue("v", guarantee={"nvidia.com/gpu": "2"}, capability={"nvidia.com/gpu": "8"}))
    job = ray_cluster(labels={"volcano.sh/queue-name": "v"}, annotations={"volcano.sh/preemptable": "false"},
                      workers=[worker_group("gpu", 4, {"cpu": "1", "nvidia.com/gpu": "1"})])
    spec = d.submitted(job)
    assert spec.preemptible is False


def test_a_kai_queue_defined_later_pins_the_gang_it_cannot_hold_yet_and_rejects_nothing() -> None:
    d = AdmissionDriver()
    d.submitted(ray_cluster(labels={"kai.scheduler/queue": "k", "priorityClassName": "inference"},
                            workers=[worker_group("gpu", 4, {"cpu": "1", "nvidia.com/gpu": "1"})]), at=1.0)
    out = d.send(kai_queue("k", gpu=kai_resource(quota=1, limit=-1)), at=2.0)
    assert not any(isinstance(e, WorkloadRejected) for e in out)
    [update] = [e for e in out if isinstance(e, WorkloadUpdated)]
    assert (update.workload.preemptible, update.workload.submitted_at) == (False, 1.0)


# --------------------------------------------------------------------------- rule values on the queue
@pytest.mark.parametrize(("dialect", "words", "caps", "below", "stale", "by_priority", "reserves"), [
    ("volcano", ("capability", "guarantee"), False, False, False, True, True),
    ("kai", ("limit", "quota"), True, True, True, False, False),
    ("elasticquotatree", ("max", "min"), False, False, False, False, False),
])
def test_each_dialect_fills_its_rule_values(dialect: str, words: tuple, caps: bool, below: bool, stale: bool,
                                            by_priority: bool, reserves: bool) -> None:
    d, _ = _driver("builtin")
    out = d.send(QUEUES[dialect][0])
    spec = [e for e in out if isinstance(e, QueueDefined)][-1].queue
    assert (spec.limit_word, spec.guarantee_word) == words
    assert (spec.guarantee_caps_non_preemptible, spec.reclaim_below_guarantee) == (caps, below)
    assert spec.evicts_stale_gangs == stale   # KAI's stalegangeviction; the others keep a short gang's place
    assert spec.consolidates == stale         # KAI's consolidation action too; the others have none
    assert spec.victim_queues_by_priority == by_priority  # Volcano's victim queue order: lowest priority first
    assert spec.reserves_guarantee == reserves  # Volcano's capacity plugin holds a guarantee for its queue
    assert spec.kind == DIALECTS[dialect].kind


def test_the_implicit_default_queue_has_the_builtin_rules() -> None:
    from shared.kernel.model import QueueSpec
    spec = QueueSpec(name="default")
    rules = DIALECTS["builtin"]
    assert (spec.guarantee_caps_non_preemptible, spec.reclaim_below_guarantee, spec.evicts_stale_gangs,
            spec.consolidates, spec.victim_queues_by_priority, spec.reserves_guarantee) == \
        (rules.guarantee_caps_non_preemptible, rules.reclaim_below_guarantee, rules.evicts_stale_gangs,
         rules.consolidates, rules.victim_queues_by_priority, rules.reserves_guarantee)
    assert (spec.limit_word, spec.guarantee_word) == (rules.limit_word, rules.guarantee_word)


# --------------------------------------------------------------------------- who preempts for priority
@pytest.mark.parametrize(("dialect", "suspended", "preempts"), [
    ("volcano", True, True), ("kai", True, True),
    ("elasticquotatree", True, False), ("builtin", True, False),
    ("elasticquotatree", False, True), ("builtin", False, True),
])
def test_a_suspended_workload_preempts_only_where_its_dialect_does(dialect: str, suspended: bool,
                                                                    preempts: bool) -> None:
    d, labels = _driver(dialect)
    spec = d.submitted(ray_job(labels=labels, suspend=suspended))
    assert (spec.gate, spec.preempts) == ("suspend" if suspended else "pods", preempts)
