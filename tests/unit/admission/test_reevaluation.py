"""Queues and PriorityClasses re-resolve every workload, so the order of documents in one apply never matters.

Each test drives ``AdmissionCore`` with both orders and compares what the queue core ends up told.
"""

from __future__ import annotations

from typing import Any

from services.admission.dialects import queue_fields
from shared.kernel.events import (QueueDefined, QueueRejected, WorkloadRejected, WorkloadSubmitted, WorkloadUpdated)
from shared.kernel.model import QueueSpec, WorkloadSpec
from tests.builders import ray_cluster, ray_job, worker_group
from tests.builders.admission import (
    AdmissionDriver,
    elastic_quota_tree,
    eqt_node,
    gang_pod,
    kai_queue,
    priority_class,
    volcano_queue,
    with_status,
)
from tests.builders.queue import QueueDriver, capacity, placed


def tree(leaf_max_cpu: int = 16) -> dict:
    return elastic_quota_tree(eqt_node("root", max={"cpu": 100}, children=[
        eqt_node("team-leaf", max={"cpu": leaf_max_cpu}, namespaces=["ml"])]))


def told(out: list[Any]) -> dict[str, WorkloadSpec | str]:
    """What the queue core was last told per workload: its spec, or ``rejected: <reason>``."""
    last: dict[str, WorkloadSpec | str] = {}
    for e in out:
        if isinstance(e, (WorkloadSubmitted, WorkloadUpdated)):
            last[e.workload.key] = e.workload
        elif isinstance(e, WorkloadRejected):
            last[e.key] = f"rejected: {e.reason}"
    return last


def both_orders(*objs: dict) -> tuple[list[Any], list[Any]]:
    """Outputs of one apply (all at t=1) in the given order and in the reverse order."""
    return AdmissionDriver().add(*objs, at=1.0), AdmissionDriver().add(*reversed(objs), at=1.0)


# --------------------------------------------------------------------------- queues
def test_raycluster_before_its_elastic_quota_tree_moves_to_the_leaf() -> None:
    rc = ray_cluster("rc", "ml")
    first, second = both_orders(rc, tree())
    assert [(type(e).__name__, getattr(e, "workload", None) and e.workload.queue) for e in first] == [
        ("WorkloadSubmitted", "default"), ("QueueDefined", None), ("QueueDefined", None),
        ("WorkloadUpdated", "team-leaf")]
    assert [type(e).__name__ for e in second] == ["QueueDefined", "QueueDefined", "WorkloadSubmitted"]
    assert told(first) == told(second)
    spec = told(first)["ml/rc"]
    assert isinstance(spec, WorkloadSpec) and (spec.queue, spec.submitted_at) == ("team-leaf", 1.0)


def test_a_later_tree_change_moves_the_workload_again_and_removing_it_sends_it_home() -> None:
    d = AdmissionDriver()
    d.add(ray_cluster("rc", "ml"), at=1.0)
    d.send(tree(), at=2.0)
    other = elastic_quota_tree(eqt_node("root", max={"cpu": 100}, children=[
        eqt_node("elsewhere", max={"cpu": 16}, namespaces=["ml"])]))
    out = d.send(other, "Modified", at=3.0)
    assert [type(e).__name__ for e in out] == ["QueueRemoved", "QueueDefined", "WorkloadUpdated"]
    assert (out[-1].workload.queue, out[-1].workload.submitted_at) == ("elsewhere", 1.0)
    out = d.send(other, "Deleted", at=4.0)
    assert [type(e).__name__ for e in out] == ["QueueRemoved", "QueueRemoved", "WorkloadUpdated"]
    assert out[-1].workload.queue == "default"


def test_a_queue_named_by_label_that_arrives_later_changes_nothing() -> None:
    d = AdmissionDriver()
    d.submitted(ray_cluster(labels={"volcano.sh/queue-name": "q"}))
    assert [type(e).__name__ for e in d.send(volcano_queue("q"))] == ["QueueDefined"]


def test_moving_into_a_leaf_too_small_for_it_moves_it_as_the_other_order_does() -> None:
    """The queue core holds it there ("can never fit in queue team-leaf as it is"), in either order."""
    big = ray_cluster("big", "ml", workers=[worker_group("w", 20)])   # head 1 CPU + 20 workers of 1 CPU
    first, second = both_orders(big, tree(leaf_max_cpu=16))
    assert told(first) == told(second)
    spec = told(first)["ml/big"]
    assert isinstance(spec, WorkloadSpec) and (spec.queue, spec.gang.quota_demand["cpu"]) == ("team-leaf", 21000)
    assert isinstance(first[0], WorkloadSubmitted) and isinstance(first[-1], WorkloadUpdated)


def test_a_leaf_that_grows_under_a_workload_too_big_for_it_changes_nothing_at_admission() -> None:
    d = AdmissionDriver()
    d.add(ray_cluster("big", "ml", workers=[worker_group("w", 20)]), tree(leaf_max_cpu=16), at=1.0)
    out = d.send(tree(leaf_max_cpu=32), "Modified", at=2.0)
    assert [type(e).__name__ for e in out] == ["QueueDefined"]  # the queue core lets it go


def test_a_limit_lowered_under_a_submitted_workload_that_stays_put_does_not_reject_it() -> None:
    d = AdmissionDriver()
    d.add(tree(leaf_max_cpu=16), ray_cluster("rc", "ml"))
    assert [type(e).__name__ for e in d.send(tree(leaf_max_cpu=1), "Modified")] == ["QueueDefined"]


def test_a_status_update_after_the_limit_was_lowered_is_still_no_change_but_an_edit_is_passed_on() -> None:
    d = AdmissionDriver()
    rc = ray_cluster("rc", "ml")                                   # head 1 CPU + 1 worker of 1 CPU
    d.add(tree(leaf_max_cpu=16), rc)
    d.send(tree(leaf_max_cpu=1), "Modified")
    assert d.send(with_status(rc, state="ready"), "Modified") == []
    bigger = ray_cluster("rc", "ml", workers=[worker_group("w", 3)])
    spec = told(d.send(bigger, "Modified"))["ml/rc"]
    assert isinstance(spec, WorkloadSpec) and spec.gang.quota_demand["cpu"] == 4000


def test_a_status_update_after_the_class_was_deleted_is_no_change_but_naming_another_missing_one_is() -> None:
    d = AdmissionDriver()
    d.send(priority_class("urgent", 900))
    rc = ray_cluster(labels={"priorityClassName": "urgent"})
    d.submitted(rc)
    assert d.send(priority_class("urgent", 900), "Deleted") == []
    assert d.send(with_status(rc, state="ready"), "Modified") == []
    assert d.rejected(ray_cluster(labels={"priorityClassName": "gone"}), "Modified") == (
        "metadata.labels.priorityClassName: priority class 'gone' does not exist")


def test_finished_and_deleted_workloads_are_not_re_resolved() -> None:
    d = AdmissionDriver()
    job = ray_job("done", "ml")
    d.add(job, ray_cluster("gone", "ml"))
    d.send(with_status(job, jobStatus="SUCCEEDED"), "Modified")
    d.send(ray_cluster("gone", "ml"), "Deleted")
    assert [type(e).__name__ for e in d.send(tree())] == ["QueueDefined", "QueueDefined"]


def test_a_plain_pod_gang_moves_to_the_leaf_too() -> None:
    pods = [gang_pod(f"p-{i}", "g", min_available="2", namespace="ml") for i in range(2)]
    first, second = both_orders(*pods, tree())
    spec = told(first)["ml/g"]
    assert isinstance(spec, WorkloadSpec) and spec.queue == "team-leaf"
    assert told(first) == told(second)


# --------------------------------------------------------------------------- priority classes
def test_global_default_priority_class_that_comes_second_still_applies() -> None:
    rc = ray_cluster("rc")
    first, second = both_orders(rc, priority_class("normal", 500, global_default=True))
    assert [type(e).__name__ for e in first] == ["WorkloadSubmitted", "WorkloadUpdated"]
    assert (first[0].workload.priority, first[0].workload.preemptible) == (0, True)
    assert [type(e).__name__ for e in second] == ["WorkloadSubmitted"]
    assert told(first) == told(second)
    spec = told(first)["default/rc"]
    assert isinstance(spec, WorkloadSpec)
    assert (spec.priority, spec.priority_class, spec.preemptible) == (500, "normal", True)  # no cap: default queue


def test_a_user_class_overriding_a_builtin_that_comes_second_still_applies() -> None:
    rc = ray_cluster("rc", labels={"priorityClassName": "build"})
    first, second = both_orders(rc, priority_class("build", 20))
    assert told(first) == told(second)
    spec = told(first)["default/rc"]
    assert isinstance(spec, WorkloadSpec) and (spec.priority, spec.preemptible) == (20, True)


def test_class_value_changes_update_and_a_class_that_stops_resolving_keeps_the_priority() -> None:
    d = AdmissionDriver()
    d.add(kai_queue("k"), priority_class("urgent", 900))
    d.submitted(ray_cluster(labels={"priorityClassName": "urgent", "kai.scheduler/queue": "k"}))
    [out] = d.send(priority_class("urgent", 800), "Modified")
    assert isinstance(out, WorkloadUpdated) and (out.workload.priority, out.workload.preemptible) == (800, False)
    assert d.send(priority_class("urgent", 800), "Deleted") == []          # like a pod, it keeps its priority
    assert d.send(priority_class("other", 1)) == []                        # and nothing is repeated later
    d.send(priority_class("train", 5))
    d.submitted(ray_cluster("t", labels={"priorityClassName": "train", "kai.scheduler/queue": "k"}))
    [out] = d.send(priority_class("train", 5), "Deleted")                  # the built-in train comes back
    assert out.workload.priority == 50


def test_same_priority_under_another_default_class_name_is_an_update_of_the_class_only() -> None:
    d = AdmissionDriver()
    d.add(kai_queue("k"), priority_class("a", 300, global_default=True))
    d.submitted(ray_cluster(labels={"kai.scheduler/queue": "k"}))
    assert d.send(priority_class("b", 300, global_default=True)) == []   # a tie keeps the first default
    [out] = d.send(priority_class("a", 300, global_default=True), "Deleted")
    assert isinstance(out, WorkloadUpdated)
    assert (out.workload.priority, out.workload.priority_class, out.workload.preemptible) == (300, "b", False)


# --------------------------------------------------------------------------- through the queue core
def _queue_core_view(objs: list[dict], *, admit_before: int | None = None) -> dict:
    """Feed admission's output for ``objs`` (all at t=1) into a queue core; ``admit_before``: the
    workload is placed (holds quota) before the object at that index arrives."""
    a, q = AdmissionDriver(), QueueDriver()
    q.step(capacity(cpu="64", memory="256Gi"), 0.0)
    q.now = 1.0
    for i, obj in enumerate(objs):
        if i == admit_before:
            q.settle()
            q.step(placed("ml/rc", "default"))
        for e in a.send(obj, at=1.0):
            q.send(e)
    q.settle()
    return {name: (s["active"], [p["workload"] for p in s["pending"]]) for name, s in q.core.status().items()
            if s["active"] or s["pending"]}


def test_queue_core_takes_the_move_while_the_workload_waits_in_the_same_instant() -> None:
    rc = ray_cluster("rc", "ml")
    assert _queue_core_view([rc, tree()]) == _queue_core_view([tree(), rc]) == {"team-leaf": (["ml/rc"], [])}


def test_queue_core_keeps_a_quota_holder_where_it_was_admitted() -> None:
    assert _queue_core_view([ray_cluster("rc", "ml"), tree()], admit_before=1) == {"default": (["ml/rc"], [])}


# --------------------------------------------------------------------------- parent cycles
def test_a_parent_cycle_is_rejected_naming_it_and_the_previous_definition_stays() -> None:
    d = AdmissionDriver()
    d.add(volcano_queue("a", capability={"cpu": 4}), volcano_queue("b", parent="a"))
    assert d.send(volcano_queue("a", capability={"cpu": 8}, parent="b"), "Modified") == [
        QueueRejected(name="a", kind="Queue", reason="spec.parent: 'b' would make a cycle (a -> b -> a)")]
    kept = d.core.queues.specs["a"].model_copy(update={"source": None})
    assert kept == QueueSpec(name="a", **queue_fields("volcano"), limit={"cpu": 4000})
    assert d.send(volcano_queue("a", capability={"cpu": 8}), "Modified")[0].queue.limit == {"cpu": 8000}


def test_a_longer_kai_cycle_is_rejected_naming_every_queue_on_it() -> None:
    d = AdmissionDriver()
    d.add(kai_queue("x"), kai_queue("y", parent="x"), kai_queue("z", parent="y"))
    assert d.send(kai_queue("x", parent="z"), "Modified") == [QueueRejected(
        name="x", kind="Queue", reason="spec.parentQueue: 'z' would make a cycle (x -> z -> y -> x)")]
    assert d.core.queues.specs["x"].parent is None


def test_admission_and_the_queue_core_agree_on_cycles() -> None:
    """Everything admission defines, the queue core accepts: their trees stay the same."""
    a, q = AdmissionDriver(), QueueDriver()
    objs = [(volcano_queue("a"), "Added"), (volcano_queue("b", parent="a"), "Added"),
            (volcano_queue("a", parent="b"), "Modified"), (volcano_queue("b"), "Deleted"),
            (volcano_queue("b", parent="a"), "Added"), (volcano_queue("a", parent="b"), "Modified")]
    for obj, change in objs:
        for e in a.send(obj, change):
            q.send(e)
    assert {n: s.parent for n, s in a.core.queues.specs.items()} == {"a": None, "b": "a"}
    assert {n: q.core.tree.parent_of(n) for n in ("a", "b")} == {"a": None, "b": "a"}
    assert not any(isinstance(x, QueueRejected) for _, x in q.log)


def test_a_cycle_through_a_removed_queue_is_still_refused() -> None:
    d = AdmissionDriver()
    d.add(volcano_queue("a"), volcano_queue("b", parent="a"), volcano_queue("c", parent="b"))
    d.send(volcano_queue("b", parent="a"), "Deleted")        # c still names b
    d.send(volcano_queue("b"))
    out = d.send(volcano_queue("b", parent="c"), "Modified")
    assert out == [QueueRejected(name="b", kind="Queue", reason="spec.parent: 'c' would make a cycle (b -> c -> b)")]
    assert isinstance(d.send(volcano_queue("b", parent="a"), "Modified")[0], QueueDefined)


def _evaluated(d: AdmissionDriver) -> list[str]:
    """Keys of the workloads the core reads again from now on (a spy on the real method)."""
    seen: list[str] = []
    real = d.core._evaluate

    def spy(w: Any, again: bool = False) -> list[Any]:
        seen.append(w.key)
        return real(w, again)

    d.core._evaluate = spy  # type: ignore[method-assign]
    return seen


def test_a_queue_event_reads_again_only_the_workloads_of_the_queues_it_changed():
    d = AdmissionDriver()
    d.add(volcano_queue("a"), volcano_queue("b"), at=0.0)
    for i in range(3):
        d.submitted(ray_cluster(f"in-a-{i}", labels={"volcano.sh/queue-name": "a"}), at=1.0)
    d.submitted(ray_cluster("in-b", labels={"volcano.sh/queue-name": "b"}), at=1.0)
    seen = _evaluated(d)
    d.send(volcano_queue("b", capability={"cpu": "8"}), "Modified", at=2.0)
    assert seen == ["default/in-b"]


def test_a_priority_class_event_reads_again_only_its_workloads_and_those_of_the_default_class():
    d = AdmissionDriver()
    d.add(priority_class("high", 1000), priority_class("low", 1), at=0.0)
    d.submitted(ray_cluster("hi", labels={"ray.io/priority-class-name": "high"}), at=1.0)
    d.submitted(ray_cluster("lo", labels={"ray.io/priority-class-name": "low"}), at=1.0)
    d.submitted(ray_cluster("none"), at=1.0)
    seen = _evaluated(d)
    d.send(priority_class("low", 2), "Modified", at=2.0)
    assert sorted(seen) == ["default/lo", "default/none"]  # no class at all: a new default may apply to it
