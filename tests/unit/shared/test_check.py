"""shared/sim/check.py: every expectation key judged against a hand-made ResultProjection."""

from __future__ import annotations

from typing import Any

import pytest

from shared.kernel.projection import PodView, ResultProjection, WorkloadView
from shared.sim.check import Failure, check
from shared.sim.scenario import Expectation

KEY = "ns/w"
GI = 1024**3 * 1000


def _history() -> ResultProjection:
    """ns/w: Queued at 10s, Admitted at 20s, Running at 22s, Deleted at 100s; a gang of head + 2 workers
    (plus a RayJob-style submitter) on two nodes, workers sharing GPU device 0."""
    h = ResultProjection("demo")
    view = WorkloadView(key=KEY, kind="RayCluster", queue="q", min_member=3,
                        resources={"cpu": 3_000, "memory": 4 * GI})
    view.transition(10.0, "Queued", "3/3 tasks in gang unschedulable: queue q capability cpu 4")
    view.transition(20.0, "Admitted", "3/3 pods placed on 2 node(s) (binpack)")
    view.transition(22.0, "Running", "3/3 gang pods bound and Running")
    view.transition(100.0, "Deleted", "deleted by its owner")
    view.warnings.append({"t": 10.0, "reason": "label volcano.sh/queue is not read by muster"})
    h.workloads[KEY] = view
    gpu0 = {"devices": [0], "fraction": 0.5}
    h.pods[KEY] = {p.name: p for p in [
        PodView("w-head", "head", node="n1", bound=[[20.0, 100.0]]),
        PodView("w-worker-a", "worker", node="n2", gpu=gpu0, bound=[[20.0, 100.0]]),
        PodView("w-worker-b", "worker", node="n2", gpu=gpu0, bound=[[20.0, 50.0], [60.0, 100.0]]),
        PodView("w-submitter", "submitter", node="n1", bound=[[25.0, 100.0]]),
    ]}
    return h


def _check(annotations: Any = None, **fields: Any) -> list[tuple[str, Any, Any]]:
    e = Expectation(workload=fields.pop("workload", KEY), **{"at": 30.0, **fields})
    return [(f.field, f.expected, f.actual) for f in check(_history(), [e], annotations)]


def test_unknown_workload():
    assert _check(workload="ns/nobody", phase="Running") == [("workload", "known to muster", "never seen")]


@pytest.mark.parametrize("at, phase, failures", [
    (30.0, "Running", []),
    (22.0, "Running", []),                       # a transition counts from its own instant
    (21.9, "Admitted", []),
    (100.0, "Deleted", []),
    (30.0, "Queued", [("phase", "Queued", "Running (3/3 gang pods bound and Running)")]),
    (5.0, "Queued", [("phase", "Queued", None)]),  # nothing happened yet: no reason appended
])
def test_phase(at, phase, failures):
    assert _check(at=at, phase=phase) == failures


@pytest.mark.parametrize("at, text, failures", [
    (15.0, "3/3 tasks in gang unschedulable", []),
    (15.0, "capability cpu 4", []),
    (15.0, "capability cpu 5", [("reason_contains", "capability cpu 5",
                                 "3/3 tasks in gang unschedulable: queue q capability cpu 4")]),
    (30.0, "unschedulable", [("reason_contains", "unschedulable", "3/3 gang pods bound and Running")]),
    (5.0, "anything", [("reason_contains", "anything", "")]),
])
def test_reason_contains_uses_the_latest_reason_at_that_time(at, text, failures):
    assert _check(at=at, reason_contains=text) == failures


@pytest.mark.parametrize("at, count, failures", [
    (19.9, 0, []),
    (20.0, 3, []),       # bound_at is inclusive at the start
    (30.0, 3, []),       # submitter bound since 25s does not count
    (55.0, 2, []),       # one worker unbound between 50s and 60s
    (100.0, 0, []),      # exclusive at the end
    (30.0, 4, [("pods_bound", 4, 3)]),
])
def test_pods_bound_excludes_the_submitter(at, count, failures):
    assert _check(at=at, pods_bound=count) == failures


def test_distinct_nodes():
    assert _check(distinct_nodes=["head", "worker"]) == [
        ("distinct_nodes", "every bound head/worker pod on a node of its own",
         [("w-head", "n1"), ("w-worker-a", "n2"), ("w-worker-b", "n2")])]
    assert _check(distinct_nodes=["head", "worker"], at=55.0) == []  # worker-b is between two bindings
    assert _check(distinct_nodes=["nonexistent"]) == [
        ("distinct_nodes", "every bound nonexistent pod on a node of its own", [])]


def test_pods_per_node():
    assert _check(pods_per_node={"n1": 2, "n2": 2}) == []
    assert _check(pods_per_node={"n1": 2, "n2": 1}) == [("pods_per_node", {"n1": 2, "n2": 1}, {"n1": 2, "n2": 2})]


def test_same_node():
    assert _check(same_node=["worker"]) == []
    assert _check(same_node=["head", "submitter"]) == []
    assert _check(same_node=["head", "worker"]) == [
        ("same_node", "all bound head/worker pods on one node",
         [("w-head", "n1", None), ("w-worker-a", "n2", [0]), ("w-worker-b", "n2", [0])])]
    # nothing bound is not "all on one node"
    assert _check(at=5.0, same_node=["worker"]) == [("same_node", "all bound worker pods on one node", [])]
    assert _check(same_node=["nonexistent"]) == [("same_node", "all bound nonexistent pods on one node", [])]


def test_same_gpu():
    assert _check(same_gpu=["worker"]) == []
    assert _check(same_gpu=["head"]) == [("same_gpu", "all bound head pods on one GPU", [("w-head", "n1", None)])]
    # only one worker is bound at 55s: trivially on one GPU
    assert _check(at=55.0, same_gpu=["worker"]) == []


def test_same_gpu_needs_the_same_device_not_just_the_same_node():
    h = _history()
    h.pods[KEY]["w-worker-b"].gpu = {"devices": [1], "fraction": 0.5}
    failures = check(h, [Expectation(at=30.0, workload=KEY, same_gpu=["worker"], same_node=["worker"])])
    assert [(f.field, f.actual) for f in failures] == [
        ("same_gpu", [("w-worker-a", "n2", [0]), ("w-worker-b", "n2", [1])])]


@pytest.mark.parametrize("value, failures", [(3, []), (4, [("min_member", 4, 3)])])
def test_min_member(value, failures):
    assert _check(min_member=value) == failures


@pytest.mark.parametrize("resources, failures", [
    ({"cpu": "3", "memory": "4Gi"}, []),
    ({"cpu": 3, "memory": "4096Mi"}, []),                       # compared after parsing
    ({"cpu": "3000m", "memory": "4294967296"}, []),
    ({"cpu": "3"}, [("resources", {"cpu": "3"}, {"cpu": "3", "memory": "4Gi"})]),   # exact: missing memory fails
    ({"cpu": "3", "memory": "4Gi", "nvidia.com/gpu": "1"},
     [("resources", {"cpu": "3", "memory": "4Gi", "nvidia.com/gpu": "1"}, {"cpu": "3", "memory": "4Gi"})]),
    ({"cpu": "3", "memory": "4G"}, [("resources", {"cpu": "3", "memory": "4G"}, {"cpu": "3", "memory": "4Gi"})]),
    ({"cpu": "lots", "memory": "4Gi"}, [("resources", {"cpu": "lots", "memory": "4Gi"},
                                         "unparseable expectation: expect.resources.cpu: 'lots' is not a quantity")]),
])
def test_resources_exact_equality_after_parsing(resources, failures):
    assert _check(resources=resources) == failures


def test_resources_explicit_zero_is_not_a_difference():
    assert _check(resources={"cpu": "3", "memory": "4Gi", "nvidia.com/gpu": "0"}) == []


def _writes(kind: str, ns: str, name: str) -> list[tuple[float, dict[str, str]]]:
    assert (kind, ns, name) == ("RayCluster", "ns", "w")
    return [(20.0, {"muster.dev/queue": "q"}), (40.0, {"muster.dev/queue": "q", "muster.dev/node": "n1"})]


@pytest.mark.parametrize("at, wanted, failures", [
    (30.0, ["muster.dev/queue"], []),
    (30.0, {"muster.dev/queue": "q"}, []),
    (30.0, ["muster.dev/queue", "muster.dev/node"],
     [("annotations_present", ["muster.dev/queue", "muster.dev/node"], {"muster.dev/node": None})]),  # written at 40s
    (40.0, ["muster.dev/queue", "muster.dev/node"], []),
    (30.0, {"muster.dev/queue": "other"}, [("annotations_present", {"muster.dev/queue": "other"},
                                            {"muster.dev/queue": "q"})]),
    (10.0, ["muster.dev/queue"], [("annotations_present", ["muster.dev/queue"], {"muster.dev/queue": None})]),
])
def test_annotations_present_list_or_map(at, wanted, failures):
    assert _check(_writes, at=at, annotations_present=wanted) == failures


def test_annotations_without_a_lookup_are_all_missing():
    assert _check(annotations_present=["a"]) == [("annotations_present", ["a"], {"a": None})]


@pytest.mark.parametrize(("at", "text", "failures"), [
    (30.0, "volcano.sh/queue is not read", []),
    (5.0, "volcano.sh/queue is not read", [("warning_contains", "volcano.sh/queue is not read", [])]),
    (5.0, "", []),
    (30.0, "", [("warning_contains", "", ["label volcano.sh/queue is not read by muster"])]),
])
def test_warning_contains_reads_every_warning_told_by_then(at, text, failures):
    assert _check(at=at, warning_contains=text) == failures


def test_failures_in_order_with_readable_text():
    e1 = Expectation(at=30.0, workload=KEY, phase="Queued", pods_bound=2, min_member=4)
    e2 = Expectation(at=1.5, workload="ns/ghost")
    e3 = Expectation(at=30.0, workload=KEY, phase="Running")
    failures = check(_history(), [e1, e2, e3])
    assert [str(f) for f in failures] == [
        "at 30s ns/w: phase: expected 'Queued', got 'Running (3/3 gang pods bound and Running)'",
        "at 30s ns/w: pods_bound: expected 2, got 3",
        "at 30s ns/w: min_member: expected 4, got 3",
        "at 1.5s ns/ghost: workload: expected 'known to muster', got 'never seen'",
    ]
    assert failures[0] == Failure(e1, "phase", "Queued", "Running (3/3 gang pods bound and Running)")


def test_no_expectations_no_failures():
    assert check(_history(), []) == []
