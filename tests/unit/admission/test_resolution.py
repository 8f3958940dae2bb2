"""Queue resolution order and priority resolution (PriorityClass objects, KAI built-ins, globalDefault)."""

from __future__ import annotations

import pytest

from shared.kernel.events import WorkloadRejected, WorkloadSubmitted
from shared.kernel.policy import Policy
from tests.builders import ray_cluster, ray_job
from tests.builders.admission import (
    AdmissionDriver,
    kai_queue,
    elastic_quota_tree,
    eqt_node,
    priority_class,
    volcano_queue,
)

ALL_QUEUE_LABELS = {
    "volcano.sh/queue-name": "from-volcano",
    "kai.scheduler/queue": "from-kai",
    "quota.scheduling.alibabacloud.com/name": "from-kube-queue",
}
VOLCANO_ANNOTATION = {"scheduling.volcano.sh/queue-name": "from-volcano-annotation"}


def tree_with_leaf_for(namespace: str) -> dict:
    return elastic_quota_tree(eqt_node("root", children=[
        eqt_node("parent-lists-it-too", namespaces=[namespace], children=[eqt_node("team-leaf", namespaces=[namespace])]),
    ]))


@pytest.mark.parametrize(
    ("labels", "annotations", "expected"),
    [
        (ALL_QUEUE_LABELS, VOLCANO_ANNOTATION, "from-volcano"),
        ({k: v for k, v in ALL_QUEUE_LABELS.items() if k != "volcano.sh/queue-name"}, VOLCANO_ANNOTATION,
         "from-volcano-annotation"),
        ({k: v for k, v in ALL_QUEUE_LABELS.items() if k != "volcano.sh/queue-name"}, {}, "from-kai"),
        ({"quota.scheduling.alibabacloud.com/name": "from-kube-queue"}, {}, "from-kube-queue"),
        ({}, {}, "team-leaf"),
        ({"volcano.sh/queue-name": ""}, {}, "team-leaf"),  # an empty label is no choice
    ],
)
def test_queue_resolution_first_match_wins(labels: dict, annotations: dict, expected: str) -> None:
    d = AdmissionDriver()
    d.send(tree_with_leaf_for("ml"))
    assert d.submitted(ray_cluster("rc", "ml", labels=labels, annotations=annotations)).queue == expected


def test_namespace_not_in_any_leaf_goes_to_the_policy_default_queue() -> None:
    d = AdmissionDriver(Policy(default_queue="fallback"))
    d.send(tree_with_leaf_for("ml"))
    assert d.submitted(ray_cluster("rc", "other")).queue == "fallback"


def test_rayjob_queue_comes_from_its_own_labels() -> None:
    d = AdmissionDriver()
    d.send(volcano_queue("q"))
    assert d.submitted(ray_job(labels={"volcano.sh/queue-name": "q"})).queue == "q"


# --------------------------------------------------------------------------- priority
@pytest.mark.parametrize(
    ("name", "priority", "preemptible"),
    [("train", 50, True), ("build-preemptible", 75, True), ("build", 100, False), ("inference", 125, False)],
)
def test_kai_builtin_priority_classes(name: str, priority: int, preemptible: bool) -> None:
    d = AdmissionDriver()
    d.send(kai_queue("k"))
    spec = d.submitted(ray_cluster(labels={"priorityClassName": name, "kai.scheduler/queue": "k"}))
    assert (spec.priority, spec.priority_class, spec.preemptible) == (priority, name, preemptible)
    other = AdmissionDriver().submitted(ray_cluster(labels={"priorityClassName": name}))  # default queue: no cap
    assert (other.priority, other.preemptible) == (priority, True)


def test_no_class_means_priority_zero_and_preemptible() -> None:
    spec = AdmissionDriver().submitted(ray_cluster())
    assert (spec.priority, spec.priority_class, spec.preemptible) == (0, None, True)


def test_user_priority_class_overrides_a_builtin_of_the_same_name() -> None:
    d = AdmissionDriver()
    assert d.send(priority_class("build", 20)) == []
    spec = d.submitted(ray_cluster(labels={"priorityClassName": "build"}))
    assert (spec.priority, spec.preemptible) == (20, True)


@pytest.mark.parametrize(
    ("labels", "head_class", "expected"),
    [
        ({"priorityClassName": "high"}, "low", 1000),
        ({"ray.io/priority-class-name": "high"}, "low", 1000),
        ({"priorityClassName": "high", "ray.io/priority-class-name": "low"}, None, 1000),
        ({}, "low", 10),
    ],
)
def test_class_name_from_labels_then_head_template(labels: dict, head_class: str | None, expected: int) -> None:
    d = AdmissionDriver()
    d.add(priority_class("high", 1000), priority_class("low", 10))
    rc = ray_cluster(labels=labels)
    if head_class:
        rc["spec"]["headGroupSpec"]["template"]["spec"]["priorityClassName"] = head_class
    assert d.submitted(rc).priority == expected


def test_rayjob_head_template_priority_class() -> None:
    job = ray_job()
    job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["priorityClassName"] = "inference"
    assert AdmissionDriver().submitted(job).priority == 125


def test_global_default_applies_to_workloads_naming_none_lowest_value_wins() -> None:
    d = AdmissionDriver()
    d.add(priority_class("normal", 500, global_default=True), priority_class("meh", 300, global_default=True),
          priority_class("other", 7))
    spec = d.submitted(ray_cluster())
    assert (spec.priority, spec.priority_class, spec.preemptible) == (300, "meh", True)
    assert d.submitted(ray_cluster("named", labels={"priorityClassName": "other"})).priority == 7


def test_deleted_priority_class_falls_back_to_the_builtin() -> None:
    d = AdmissionDriver()
    d.send(priority_class("train", 5))
    d.send(priority_class("train", 5), "Deleted")
    assert d.submitted(ray_cluster(labels={"priorityClassName": "train"})).priority == 50


@pytest.mark.parametrize(
    ("priority", "label", "expected"),
    [(99, None, True), (100, None, False), (125, "preemptible", True), (50, "non-preemptible", False)],
)
def test_preemptibility_in_a_kai_queue(priority: int, label: str | None, expected: bool) -> None:
    d = AdmissionDriver()
    d.add(kai_queue("k"), priority_class("p", priority))
    labels = {"priorityClassName": "p", "kai.scheduler/queue": "k"}
    if label:
        labels["kai.scheduler/preemptibility"] = label
    assert d.submitted(ray_cluster(labels=labels)).preemptible is expected


def test_priority_class_defined_later_admits_the_rejected_workload() -> None:
    d = AdmissionDriver()
    rc = ray_cluster(labels={"priorityClassName": "urgent"})
    assert d.rejected(rc, at=1.0) == "metadata.labels.priorityClassName: priority class 'urgent' does not exist"
    out = d.send(priority_class("urgent", 900), at=2.0)
    assert len(out) == 1 and isinstance(out[0], WorkloadSubmitted)
    assert (out[0].workload.priority, out[0].workload.submitted_at) == (900, 1.0)


def test_invalid_priority_class_value_is_the_reason() -> None:
    d = AdmissionDriver()
    assert d.send(priority_class("bad", "high")) == []
    assert d.rejected(ray_cluster(labels={"priorityClassName": "bad"})) == \
        "metadata.labels.priorityClassName: priority class 'bad' is invalid: value: 'high' is not an integer"


def test_a_priority_class_value_beyond_int32_is_the_reason() -> None:
    d = AdmissionDriver()
    assert d.send(priority_class("huge", 2**40)) == []
    assert d.rejected(ray_cluster(labels={"priorityClassName": "huge"})) == \
        "metadata.labels.priorityClassName: priority class 'huge' is invalid: value: 1099511627776 is more than 2147483647"
    assert d.send(priority_class("low", -2**31)) == []  # the int32 bounds themselves are fine


def test_queue_defined_later_admits_a_workload_rejected_for_its_absence() -> None:
    d = AdmissionDriver(unknown_queue="reject")
    rc = ray_cluster(labels={"kai.scheduler/queue": "team"})
    assert d.rejected(rc) == "queue team does not exist (metadata.labels.kai.scheduler/queue)"
    out = d.send(volcano_queue("team"))
    assert [type(e).__name__ for e in out] == ["QueueDefined", "WorkloadSubmitted"]
    assert out[1].workload.queue == "team"


def test_raising_a_limit_under_a_gang_too_big_for_it_is_the_queue_cores_to_act_on() -> None:
    d = AdmissionDriver()
    d.send(volcano_queue("q", capability={"cpu": 1}))
    assert d.submitted(ray_cluster(labels={"volcano.sh/queue-name": "q"})).queue == "q"
    out = d.send(volcano_queue("q", capability={"cpu": 2}), "Modified")
    assert [type(e).__name__ for e in out] == ["QueueDefined"]


def test_lowering_a_limit_does_not_reject_what_was_submitted() -> None:
    d = AdmissionDriver()
    d.send(volcano_queue("q", capability={"cpu": 8}))
    d.submitted(ray_cluster(labels={"volcano.sh/queue-name": "q"}))
    out = d.send(volcano_queue("q", capability={"cpu": 1}), "Modified")
    assert [type(e).__name__ for e in out] == ["QueueDefined"]
    assert not any(isinstance(e, WorkloadRejected) for e in out)
