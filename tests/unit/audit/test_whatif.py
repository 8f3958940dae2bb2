"""shared/audit/derive.py and whatif.py: a log becomes a scenario that gives its decisions back; another
policy on the same history shows what changes; shared/audit/metrics.py sums a history up."""

from __future__ import annotations

import pytest
import yaml

from shared.audit.derive import derive, manifest, user_view
from shared.audit.errors import ApplyRefused, CannotReproduce
from shared.audit.fold import fold
from shared.audit.metrics import WorkloadFigures, per_queue, percentile, summary, workload_figures
from shared.kernel.duration import parse_duration
from shared.audit.whatif import (comparison, decisions_by_service, first_difference, table_rows, what_if,
                                 with_extra)
from shared.runtime.simulate import simulate
from shared.sim.scenario import parse_scenario
from tests.builders.audit import SCENARIO_FILES, scenario_run


@pytest.mark.parametrize("name", [p.stem for p in SCENARIO_FILES])
def test_the_scenario_derived_from_a_log_gives_its_decisions_back(name: str) -> None:
    run = scenario_run(name)
    doc = derive(run.runtime.log, name=name, until=run.scenario.until)
    again = simulate(parse_scenario(yaml.safe_dump(doc), origin="derived"), run.policy)
    assert first_difference(decisions_by_service(run.runtime.log), decisions_by_service(again.runtime.log)) == ""


def test_derived_steps_are_the_users_objects_only() -> None:
    run = scenario_run("rayjob-submission-modes")
    doc = derive(run.runtime.log, name="x", until=None)
    kinds = {d["kind"] for step in doc["steps"] if "apply" in step for d in yaml.safe_load_all(step["apply"])}
    assert "Pod" not in kinds and {"Node", "RayJob"} <= kinds  # KubeRay's pods are the simulator's to make
    assert doc["until"] == run.runtime.log[-1].occurred_at
    assert doc["cluster"]["pod_startup"] == run.scenario.startup_seconds


def test_a_pod_muster_binds_with_its_own_gpu_fraction_is_applied_once() -> None:
    # The binder writes gpu-fraction again (with the user's value): that is no edit of the user's.
    run = scenario_run("single-pods-gpu-fraction")
    doc = derive(run.runtime.log, name="x", until=None)
    applied = [d["metadata"]["name"] for step in doc["steps"] if "apply" in step
               for d in yaml.safe_load_all(step["apply"]) if d["kind"] == "Pod"]
    assert sorted(applied) == ["notebook-1", "notebook-2", "notebook-3", "trainer", "web"]


def test_what_the_api_server_stamps_is_not_applied_again() -> None:
    obj = {"kind": "RayCluster", "metadata": {"name": "a", "uid": "u", "resourceVersion": "9", "generation": 2,
                                              "creationTimestamp": "t", "annotations": {"mine": "1", "muster": "x"}},
           "spec": {"suspend": False, "x": 1}, "status": {"state": "ready"}}
    assert manifest(obj) == {"kind": "RayCluster", "metadata": {"name": "a", "annotations": {"mine": "1", "muster": "x"}},
                             "spec": {"suspend": False, "x": 1}, "status": {"state": "ready"}}
    assert user_view(obj, {"muster"}) == {"kind": "RayCluster", "metadata": {"name": "a", "annotations": {"mine": "1"}},
                                          "spec": {"x": 1}}


def test_a_rayjob_without_a_simulated_run_time_gets_the_one_observed() -> None:
    run = scenario_run("rayjob-submission-modes")
    stripped = []
    for env in run.runtime.log:
        if env.type == "ObjectChanged" and env.payload.kind == "RayJob":
            obj = dict(env.payload.object)
            meta = dict(obj["metadata"])
            meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items()
                                   if k != "muster.dev/sim-duration"}
            obj["metadata"] = meta
            env = env.model_copy(update={"payload": env.payload.model_copy(update={"object": obj})})
        stripped.append(env)
    doc = derive(stripped, name="x", until=None)
    jobs = [d for step in doc["steps"] if "apply" in step for d in yaml.safe_load_all(step["apply"])
            if d["kind"] == "RayJob"]
    given = {d["metadata"]["name"]: d["metadata"]["annotations"].get("muster.dev/sim-duration") for d in jobs}
    finished = {e.subject.split("/")[1] for e in run.runtime.log if e.type == "WorkloadFinished"}
    original = {e.payload.name: e.payload.object["metadata"]["annotations"]["muster.dev/sim-duration"]
                for e in run.runtime.log if e.type == "ObjectChanged" and e.payload.kind == "RayJob"}
    assert finished
    for name in finished:  # the run time the log shows is the one the scenario asked for
        assert parse_duration(given[name]) == parse_duration(original[name])


def test_a_longer_minimum_runtime_spares_the_preempted_workload() -> None:
    run = scenario_run("kai-priority-preemption")
    outcome = what_if(run.runtime.log, name="x", until=run.scenario.until, recorded_policy=run.policy,
                      change={"min_runtime_seconds": 600}, extra=[])
    assert outcome.faithful and outcome.difference == ""
    doc = comparison(outcome, run.policy)
    assert doc["queues"]["recorded"]["team-a"]["preemptions"] == 1
    assert doc["queues"]["new"]["team-a"]["preemptions"] == 0
    assert doc["policy"]["new"]["min_runtime_seconds"] == 600
    change = doc["workloads"]["default/train-cluster"]["change"]
    assert "no longer preempted" in change and any(c.startswith("waited shorter by 170s") for c in change)
    assert doc["changed"] == ["default/build-cluster", "default/train-cluster"]


def test_the_same_policy_changes_nothing() -> None:
    run = scenario_run("fair-share-two-teams")
    doc = comparison(what_if(run.runtime.log, name="x", until=run.scenario.until, recorded_policy=run.policy,
                             change={}, extra=[]), run.policy)
    assert doc["changed"] == [] and doc["queues"]["recorded"] == doc["queues"]["new"]


def test_applied_manifests_stand_in_for_the_queues_of_their_name() -> None:
    run = scenario_run("volcano-gang-queue")
    bigger = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "kuberay-test-queue"},
              "spec": {"weight": 1, "capability": {"cpu": "100", "memory": "100Gi"}}}
    doc = derive(run.runtime.log, name="x", until=None)
    queues = [d for step in with_extra(doc, [bigger])["steps"] if "apply" in step
              for d in yaml.safe_load_all(step["apply"]) if d["kind"] == "Queue"]
    assert queues and all(d == bigger for d in queues)
    result = comparison(what_if(run.runtime.log, name="x", until=run.scenario.until, recorded_policy=run.policy,
                                change=None, extra=[bigger]), run.policy)
    assert result["queues"]["new"]["kuberay-test-queue"]["wait_max"] < result["queues"]["recorded"][
        "kuberay-test-queue"]["wait_max"]


def test_a_log_the_simulator_cannot_follow_is_refused_unless_approximate() -> None:
    run = scenario_run("kai-priority-preemption")
    log = [e for e in run.runtime.log if not (e.type == "ObjectChanged" and e.payload.kind == "Node")]
    with pytest.raises(CannotReproduce, match="does not give its decisions back"):
        what_if(log, name="x", until=None, recorded_policy=run.policy, change=None, extra=[])
    outcome = what_if(log, name="x", until=None, recorded_policy=run.policy, change=None, extra=[], approximate=True)
    assert not outcome.faithful and outcome.difference


def test_percentiles_are_values_that_occurred() -> None:
    assert percentile([], 50) is None
    assert [percentile([5.0, 1.0, 3.0, 2.0], p) for p in (50, 95, 100)] == [2.0, 5.0, 5.0]


def test_waits_gpu_hours_and_finished_jobs() -> None:
    run = scenario_run("kai-priority-preemption")
    history = fold(run.runtime.log)
    figures = workload_figures(history, run.scenario.until)
    train = figures["default/train-cluster"]
    assert train.preempted == 1 and train.waits[-1] == 170.0 and train.first_admitted is not None
    gpu_pods = [p for p in history.pods_of("default/train-cluster") if p.gpu]
    expected = sum(len(p.gpu["devices"]) * p.gpu["fraction"] * ((e if e is not None else run.scenario.until) - s)
                   for p in gpu_pods for s, e in p.bound) / 3600
    assert train.gpu_hours == pytest.approx(expected)
    stats = per_queue(figures)
    assert stats["(all)"]["preemptions"] == 1 and stats["team-a"]["workloads"] == 2
    jobs = workload_figures(fold(scenario_run("rayjob-submission-modes").runtime.log), 1e9)
    assert any(f.finished for f in jobs.values())


# --------------------------------------------------------------------------- --apply that admission refuses
def _volcano_queue(**capability: object) -> dict:
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "kuberay-test-queue"},
            "spec": {"weight": 1, "capability": {"cpu": 4, "memory": "6Gi", **capability}}}


def _admissions_word(doc: dict) -> str:
    """What admission says of ``doc`` when a scenario applies it directly (the reason of its refusal)."""
    text = yaml.safe_dump({"name": "direct", "cluster": {"nodes": []}, "until": 1,
                           "steps": [{"at": 0, "apply": yaml.safe_dump(doc)}]})
    log = simulate(parse_scenario(text)).runtime.log
    return next(e.payload.reason for e in log if e.type in ("QueueRejected", "WorkloadRejected"))


def _what_if_volcano(**kwargs: object) -> object:
    run = scenario_run("volcano-gang-queue")
    return what_if(run.runtime.log, name="x", until=run.scenario.until, recorded_policy=run.policy,
                   **{"change": None, "extra": [], **kwargs})


@pytest.mark.parametrize("capability", [{"cpu": "9" * 40}, {"memory": "1e400Gi"}, {"cpu": "-5"}, {"cpu": "lots"}])
def test_a_queue_admission_refuses_in_apply_stops_the_what_if_with_admissions_reason(capability: dict) -> None:
    queue = _volcano_queue(**capability)
    reason = _admissions_word(queue)
    with pytest.raises(ApplyRefused) as caught:
        _what_if_volcano(extra=[queue], origins=["bigger.yaml"])
    assert str(caught.value) == f"--apply bigger.yaml: Queue kuberay-test-queue: {reason}"
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("namespaced", [True, False], ids=["namespace-given", "namespace-left-to-default"])
def test_a_workload_admission_refuses_in_apply_stops_the_what_if(namespaced: bool) -> None:
    run = scenario_run("volcano-gang-queue")
    cluster = next(d for step in derive(run.runtime.log, name="x", until=None)["steps"] if "apply" in step
                   for d in yaml.safe_load_all(step["apply"]) if d["metadata"]["name"] == "test-cluster-1")
    cluster["spec"]["workerGroupSpecs"][0].update(replicas=300000000, minReplicas=300000000, maxReplicas=300000000)
    if not namespaced:  # it stands in for default/test-cluster-1 all the same, as kubectl apply would
        del cluster["metadata"]["namespace"]
    with pytest.raises(ApplyRefused, match=r"^--apply big\.yaml: RayCluster default/test-cluster-1: gang of "):
        _what_if_volcano(extra=[cluster], origins=["big.yaml"])


def test_an_apply_manifest_the_api_server_refuses_stops_the_what_if() -> None:
    typo = {"apiVersion": "ray.io/v1", "kind": "RayClustr", "metadata": {"name": "c", "namespace": "default"}}
    with pytest.raises(ApplyRefused, match=r"^--apply x\.yaml: RayClustr default/c: no kind 'RayClustr' in ray\.io; "
                                           r"did you mean RayCluster\?$"):
        _what_if_volcano(extra=[typo], origins=["x.yaml"])


def test_an_invalid_priority_class_in_apply_stops_the_what_if() -> None:
    pc = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "build"}, "value": "lots"}
    with pytest.raises(ApplyRefused, match=r"^--apply pc\.yaml: PriorityClass build: value: "):
        _what_if_volcano(extra=[pc], origins=["pc.yaml"])


def test_a_workload_rejected_under_the_new_policy_is_reported_as_such_in_its_queue() -> None:
    doc = comparison(_what_if_volcano(change={"max_gang_pods": 2}), scenario_run("volcano-gang-queue").policy)
    change = doc["workloads"]["default/test-cluster-1"]["change"]
    assert change == ["rejected under the new policy: gang of 3 pods is larger than muster accepts (policy "
                      "max_gang_pods 2)"]
    assert "(none)" not in doc["queues"]["new"]
    assert doc["queues"]["new"]["kuberay-test-queue"]["workloads"] == 2


# --------------------------------------------------------------------------- waits no admission ended
def test_a_workload_left_waiting_to_the_end_counts_in_its_queues_waits_as_a_lower_bound() -> None:
    small = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "kind-worker"},
             "status": {"capacity": {"cpu": "2", "memory": "64Gi", "pods": "110"},
                        "allocatable": {"cpu": "2", "memory": "64Gi", "pods": "110"}}}
    doc = comparison(_what_if_volcano(extra=[small]), scenario_run("volcano-gang-queue").policy)
    new = doc["queues"]["new"]["kuberay-test-queue"]
    # test-cluster-0 waits from 1s until deleted at 120s; test-cluster-1 from 10s to the end, 300s
    assert doc["workloads"]["default/test-cluster-0"]["new"]["unadmitted_waits"] == [119.0]
    assert doc["workloads"]["default/test-cluster-1"]["new"]["unadmitted_waits"] == [290.0]
    assert (new["wait_p50"], new["wait_max"], new["admissions"], new["unadmitted"]) == (119.0, 290.0, 0, 2)
    assert new["wait_lower_bounds"] == ["wait_p50", "wait_p95", "wait_max"] and new["still_waiting"] == 1
    assert doc["queues"]["recorded"]["kuberay-test-queue"]["wait_lower_bounds"] == []
    cells = dict(table_rows(doc))["kuberay-test-queue"]
    assert cells[2] == "110 -> ≥290"
    assert doc["workloads"]["default/test-cluster-1"]["change"] == [
        "waited longer by 180s (110s -> 290s)", "never admitted", "ends Queued (was Running)"]


def test_a_workload_deleted_while_waiting_counts_with_the_wait_it_had() -> None:
    run = scenario_run("kai-priority-preemption")
    low = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "build"}, "value": 10,
           "preemptionPolicy": "PreemptLowerPriority"}
    doc = comparison(what_if(run.runtime.log, name="x", until=run.scenario.until, recorded_policy=run.policy,
                             change=None, extra=[low]), run.policy)
    new = doc["queues"]["new"]["team-a"]
    assert (new["wait_max"], new["wait_lower_bounds"]) == (170.0, ["wait_p95", "wait_max"])


def test_a_percentile_is_a_lower_bound_only_when_a_wait_no_admission_ended_is_at_or_below_it() -> None:
    figures = [WorkloadFigures("a", "q", "Running", waits=[1.0, 2.0, 3.0]),
               WorkloadFigures("b", "q", "Queued", unadmitted=[50.0])]
    s = summary(figures)
    assert (s["wait_p50"], s["wait_max"], s["wait_lower_bounds"]) == (2.0, 50.0, ["wait_p95", "wait_max"])
