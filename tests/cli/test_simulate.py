"""``muster simulate`` through typer's CliRunner: the result contract, --check, --policy, exit codes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders.cli import clean_exit as _clean_exit, flat as _flat, invoke as _invoke
from tests.builders.shared import VOLCANO, minimal_scenario, ray_cluster_manifest, volcano_scenario, write_scenario


# --------------------------------------------------------------------------- the result document
@pytest.fixture(scope="module")
def volcano_result(tmp_path_factory) -> tuple[Any, dict[str, Any]]:
    out = tmp_path_factory.mktemp("json") / "result.json"
    result = _invoke("simulate", VOLCANO, "--json", out, "--check")
    return result, json.loads(out.read_text())


def test_volcano_check_passes(volcano_result):
    result, _ = volcano_result
    _clean_exit(result, 0)
    assert "CHECK PASSED: every expectation holds" in _flat(result.stdout)
    assert result.stderr == ""


def test_json_has_exactly_the_contract_fields(volcano_result):
    _, doc = volcano_result
    assert set(doc) == {"scenario", "workloads", "queues", "stats"}
    assert set(doc["stats"]) == {"events", "decisions", "wall_seconds"}
    assert set(doc["workloads"]) == {"default/test-cluster-0", "default/test-cluster-1"}
    for key, w in doc["workloads"].items():
        assert set(w) == {"kind", "queue", "priority", "gang", "phase", "transitions", "pods"}, key
        assert set(w["gang"]) == {"min_member", "resources"}
        assert all(set(tr) == {"t", "phase", "reason"} for tr in w["transitions"])
        assert all(set(p) == {"name", "pod_set", "node", "gpu", "bound"} for p in w["pods"])
        assert all(isinstance(tr["t"], float) and tr["reason"] for tr in w["transitions"])
    for name, qv in doc["queues"].items():
        # ARCHITECTURE.md names usage/active/backoff; docs/scenarios.md adds pending (with positions)
        assert {"usage", "active", "backoff"} <= set(qv), name
        assert set(qv) == {"usage", "active", "pending", "backoff"}, name
    assert isinstance(doc["stats"]["events"], int) and isinstance(doc["stats"]["decisions"], int)
    assert isinstance(doc["stats"]["wall_seconds"], float)


def test_json_values_for_volcano(volcano_result):
    _, doc = volcano_result
    assert doc["scenario"] == "volcano-gang-queue"
    first, second = doc["workloads"]["default/test-cluster-0"], doc["workloads"]["default/test-cluster-1"]
    for w in (first, second):
        assert (w["kind"], w["queue"], w["priority"], w["gang"]) == \
            ("RayCluster", "kuberay-test-queue", 0, {"min_member": 3, "resources": {"cpu": "3", "memory": "4Gi"}})
    assert [(tr["t"], tr["phase"]) for tr in first["transitions"]] == \
        [(1.0, "Queued"), (1.0, "Admitted"), (3.0, "Running"), (120.0, "Deleted")]
    assert [(tr["t"], tr["phase"]) for tr in second["transitions"]] == \
        [(10.0, "Queued"), (10.0, "Queued"), (120.0, "Admitted"), (122.0, "Running")]
    assert second["transitions"][1]["reason"] == (
        "3/3 tasks in gang unschedulable: pod group is not ready, 3 Pending, 3 minAvailable; "
        "queue kuberay-test-queue capability cpu 4: used 3, requested 3")
    assert (first["phase"], second["phase"]) == ("Deleted", "Running")
    for w, prefix, bound in ((first, "test-cluster-0", [[1.0, 120.0]]), (second, "test-cluster-1", [[120.0, None]])):
        assert sorted(p["pod_set"] for p in w["pods"]) == ["head", "worker", "worker"]
        for p in w["pods"]:
            assert re.fullmatch(rf"{prefix}-(head|worker-worker)-[a-z0-9]{{5}}", p["name"]), p["name"]
            assert (p["node"], p["gpu"], p["bound"]) == ("kind-worker", None, bound)
    assert doc["queues"] == {"kuberay-test-queue": {"usage": {"cpu": "3", "memory": "4Gi"},
                                                    "active": ["default/test-cluster-1"], "pending": [],
                                                    "backoff": []}}
    assert doc["stats"]["events"] > doc["stats"]["decisions"] > 0


def test_result_is_identical_on_every_run_but_wall_seconds(tmp_path, volcano_result):
    _, doc = volcano_result
    out = tmp_path / "again.json"
    _clean_exit(_invoke("simulate", VOLCANO, "--json", out, "-q"), 0)
    again = json.loads(out.read_text())
    doc = json.loads(json.dumps(doc))  # a copy: the fixture is shared
    doc["stats"].pop("wall_seconds")
    again["stats"].pop("wall_seconds")
    assert again == doc


def test_json_file_is_indented_and_ends_with_newline(tmp_path):
    out = tmp_path / "r.json"
    _clean_exit(_invoke("simulate", write_scenario(tmp_path, minimal_scenario()), "--json", out, "-q"), 0)
    text = out.read_text()
    assert text.endswith("}\n") and text.startswith('{\n  "scenario": "mini"')


# --------------------------------------------------------------------------- --check
def _volcano_with(tmp_path: Path, *expect: dict[str, Any]) -> Path:
    data = volcano_scenario()
    data["expect"] = list(expect)
    return write_scenario(tmp_path, data)


@pytest.mark.parametrize("expectation, line", [
    ({"at": "60s", "workload": "default/test-cluster-0", "pods_bound": 2},
     "at 60s default/test-cluster-0: pods_bound: expected 2, got 3"),
    ({"at": "200s", "workload": "default/test-cluster-0", "phase": "Running"},
     "at 200s default/test-cluster-0: phase: expected 'Running', got 'Deleted (deleted by its owner)'"),
    ({"at": "60s", "workload": "default/test-cluster-0", "min_member": 4},
     "at 60s default/test-cluster-0: min_member: expected 4, got 3"),
    ({"at": "60s", "workload": "default/test-cluster-0", "resources": {"cpu": "4", "memory": "4Gi"}},
     "at 60s default/test-cluster-0: resources: expected {'cpu': '4', 'memory': '4Gi'}, "
     "got {'cpu': '3', 'memory': '4Gi'}"),
    ({"at": "5s", "workload": "default/test-cluster-0", "reason_contains": "unschedulable"},
     "at 5s default/test-cluster-0: reason_contains: expected 'unschedulable', "
     "got '3/3 gang pods bound and Running'"),
    ({"at": "60s", "workload": "default/nobody", "phase": "Running"},
     "at 60s default/nobody: workload: expected 'known to muster', got 'never seen'"),
])
@pytest.mark.parametrize("quiet", [False, True], ids=["timeline", "quiet"])
def test_wrong_expectation_exits_1_with_the_failing_field(tmp_path, expectation, line, quiet):
    ok = {"at": "60s", "workload": "default/test-cluster-1", "phase": "Queued"}
    path = _volcano_with(tmp_path, ok, expectation)
    result = _invoke("simulate", path, "--check", *(["-q"] if quiet else []))
    _clean_exit(result, 1)
    if quiet:
        assert result.stdout == ""
        assert _flat(result.stderr) == f"✗ {line}"
    else:
        out = _flat(result.stdout)
        assert f"CHECK FAILED (1): ✗ {line}" in out
        assert out.endswith(line)


def test_every_failure_is_listed(tmp_path):
    path = _volcano_with(tmp_path,
                         {"at": "60s", "workload": "default/test-cluster-0", "pods_bound": 2, "min_member": 2},
                         {"at": "60s", "workload": "default/test-cluster-1", "phase": "Running"})
    result = _invoke("simulate", path, "--check", "-q")
    _clean_exit(result, 1)
    lines = [_flat(line) for line in result.stderr.split("✗")[1:]]
    assert [line.split(":")[1].strip() for line in lines] == ["pods_bound", "min_member", "phase"]


def test_without_check_expectations_are_not_judged(tmp_path):
    path = _volcano_with(tmp_path, {"at": "60s", "workload": "default/test-cluster-0", "pods_bound": 2})
    result = _invoke("simulate", path)
    _clean_exit(result, 0)
    assert "CHECK" not in result.stdout


def test_quiet_passing_run_prints_nothing():
    result = _invoke("simulate", VOLCANO, "--check", "-q")
    _clean_exit(result, 0)
    assert (result.stdout, result.stderr) == ("", "")


# --------------------------------------------------------------------------- --policy
def _admitted_reason(tmp_path: Path, scenario: dict[str, Any], *args: Any) -> str:
    out = tmp_path / "r.json"
    result = _invoke("simulate", write_scenario(tmp_path, scenario), "--json", out, "-q", *args)
    _clean_exit(result, 0)
    transitions = json.loads(out.read_text())["workloads"]["default/rc"]["transitions"]
    return next(tr["reason"] for tr in transitions if tr["phase"] == "Admitted")


def test_policy_file_applies_and_scenario_block_wins(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("placement: spread\n")
    assert _admitted_reason(tmp_path, minimal_scenario()).endswith("(binpack)")
    assert _admitted_reason(tmp_path, minimal_scenario(), "--policy", policy).endswith("(spread)")
    assert _admitted_reason(tmp_path, minimal_scenario(policy={"placement": "binpack"}),
                            "--policy", policy).endswith("(binpack)")


# --------------------------------------------------------------------------- exit 2
_BAD_SCENARIOS: list[tuple[str, Any, list[str]]] = [
    ("malformed-yaml", "name: x\nsteps: [1, }\n", ["error:", "malformed YAML"]),
    ("not-a-mapping", "- 1\n- 2\n", ["error:", "a scenario is a mapping with name, cluster, steps, until"]),
    ("unknown-key", {"name": "x", "bogus": 1}, ["error:", "bogus: Extra inputs are not permitted"]),
    ("apply-and-delete", {"name": "x", "steps": [{"at": "1s", "apply": "kind: A", "delete": {"kind": "A", "name": "b"}}]},
     ["error:", "steps.0: Value error, a step needs exactly one of 'apply' or 'delete'"]),
    ("node-name-and-count", {"name": "x", "cluster": {"nodes": [{"name": "n", "count": 2, "capacity": {"cpu": 1}}]}},
     ["error:", "cluster.nodes.0: Value error, a node entry needs exactly one of 'name' or 'count'"]),
    ("bad-duration", {"name": "x", "until": "forever"}, ["error:", "until: Value error", "'forever' is not a duration"]),
    ("malformed-apply", {"name": "x", "steps": [{"at": "1s", "apply": "a: [1, }"}]},
     ["error:", "steps[0].apply: malformed YAML"]),
    ("manifest-without-apiVersion", {"name": "x", "steps": [{"at": "1s", "apply": "kind: RayCluster\nmetadata: {name: r}\n"}]},
     ["error:", "steps[0]: RayCluster r: apiVersion must be a non-empty string, got None"]),
    ("delete-missing-object", {"name": "x", "steps": [{"at": "1s", "delete": {"kind": "RayCluster", "name": "nope"}}]},
     ["error:", "steps[0]: RayCluster default/nope: cannot delete, it does not exist"]),
    ("node-manifest-without-name", {"name": "x", "steps": [{"at": "1s", "apply": "apiVersion: v1\nkind: Node\nmetadata: {name: ''}\n"}]},
     ["error:", "steps[0].apply document 1 (Node ): metadata.name: missing"]),
    ("invalid-policy-block", {"name": "x", "policy": {"queueng": "StrictFIFO"}},
     ["error:", "x: invalid policy: queueng: Extra inputs are not permitted"]),
    ("misspelled-ray-kind", {"name": "x", "steps": [{"at": "1s", "apply": "apiVersion: ray.io/v1\nkind: RayClustr\n"
                                                                        "metadata: {name: r}\n"}]},
     ["error:", "steps[0].apply document 1 (RayClustr r): no kind 'RayClustr' in ray.io; did you mean RayCluster?"]),
    ("wrong-ray-version", {"name": "x", "steps": [{"at": "1s", "apply": "apiVersion: ray.io/v2\nkind: RayJob\n"
                                                                      "metadata: {name: r}\n"}]},
     ["error:", "no version 'v2' of ray.io for RayJob (served: ray.io/v1, ray.io/v1alpha1)"]),
    ("misspelled-core-kind", {"name": "x", "steps": [{"at": "1s", "apply": "apiVersion: v1\nkind: pod\n"
                                                                         "metadata: {name: p}\n"}]},
     ["error:", "no kind 'pod' in the core API; did you mean Pod?"]),
]


@pytest.mark.parametrize("content, fragments", [c[1:] for c in _BAD_SCENARIOS], ids=[c[0] for c in _BAD_SCENARIOS])
def test_malformed_scenario_exits_2_with_a_message(tmp_path, content, fragments):
    result = _invoke("simulate", write_scenario(tmp_path, content), "--check")
    _clean_exit(result, 2)
    err = _flat(result.stderr)
    for fragment in fragments:
        assert fragment in err
    assert result.stdout == ""


def test_missing_scenario_file_exits_2(tmp_path):
    result = _invoke("simulate", tmp_path / "nope.yaml")
    _clean_exit(result, 2)
    assert _flat(result.stderr) == f"error: cannot read scenario {tmp_path / 'nope.yaml'}: No such file or directory"


@pytest.mark.parametrize("text, fragments", [
    ("queueng: StrictFIFO\n", ["error: invalid policy", "queueng", "Extra inputs are not permitted"]),
    ("queues: {q: {placement: diagonal}}\n", ["error: invalid policy", "queues.q.placement"]),
    ("queueing: [\n", ["error: cannot read policy", "while parsing"]),
    (None, ["error: cannot read policy", "No such file or directory"]),
])
def test_invalid_policy_exits_2(tmp_path, text, fragments):
    policy = tmp_path / "policy.yaml"
    if text is not None:
        policy.write_text(text)
    result = _invoke("simulate", VOLCANO, "--policy", policy)
    _clean_exit(result, 2)
    err = _flat(result.stderr)
    for fragment in fragments:
        assert fragment in err


def test_infinite_quantity_is_a_rejection_not_a_crash(tmp_path):
    """docs/semantics.md: bad input never crashes the scheduler. (parse_quantity itself still lets OverflowError out for
    .inf, see tests/unit/shared/test_quantity.py; admission and placement guard against it.)"""
    out = tmp_path / "r.json"
    scenario = minimal_scenario(steps=[{"at": "1s", "apply": yaml.safe_dump(ray_cluster_manifest(head_cpu=float("inf")))}])
    result = _invoke("simulate", write_scenario(tmp_path, scenario), "--json", out, "-q")
    _clean_exit(result, 0)
    workload = json.loads(out.read_text())["workloads"]["default/rc"]
    assert workload["phase"] == "Rejected"
    assert "resources.requests.cpu" in workload["transitions"][-1]["reason"]


# --------------------------------------------------------------------------- known bugs
def test_malformed_yaml_quoting_brackets_exits_2(tmp_path):
    result = _invoke("simulate", write_scenario(tmp_path, "name: x\nsteps: [/tmp] ]\n"))
    _clean_exit(result, 2)
    assert "malformed YAML" in _flat(result.stderr)


def test_policy_error_keeps_the_offending_value(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("queueng: StrictFIFO\n")
    result = _invoke("simulate", VOLCANO, "--policy", policy)
    _clean_exit(result, 2)
    assert "queueng: Extra inputs are not permitted (got 'StrictFIFO')" in _flat(result.stderr)


def test_timeline_shows_rejection_reason_verbatim(tmp_path):
    scenario = minimal_scenario(steps=[{"at": "1s", "apply": yaml.safe_dump(ray_cluster_manifest(head_cpu="lots"))}])
    result = _invoke("simulate", write_scenario(tmp_path, scenario))
    _clean_exit(result, 0)
    assert "containers[ray-head].resources.requests.cpu: 'lots' is not a quantity" in _flat(result.stdout)


def test_scheduler_names_narrow_what_muster_binds(tmp_path):
    """Without the flag muster answers to what the simulated KubeRay names (volcano here); naming
    only muster leaves the Volcano-named pods to a scheduler the simulated cluster does not run."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(Path(VOLCANO).read_text())
    wide, narrow = tmp_path / "wide.json", tmp_path / "narrow.json"
    _clean_exit(_invoke("simulate", scenario, "--json", wide, "-q"), 0)
    _clean_exit(_invoke("simulate", scenario, "--json", narrow, "-q", "--scheduler-names", "muster"), 0)
    bound = [any(p["bound"] for p in w["pods"]) for w in json.loads(wide.read_text())["workloads"].values()]
    assert any(bound)
    for w in json.loads(narrow.read_text())["workloads"].values():
        assert all(not p["bound"] for p in w["pods"])


def test_an_empty_scheduler_names_flag_exits_2():
    result = _invoke("simulate", VOLCANO, "--scheduler-names", " ,")
    _clean_exit(result, 2)
    assert "--scheduler-names" in _flat(result.stderr)


def test_a_kind_of_an_unknown_api_group_is_reported_and_ignored(tmp_path):
    doc = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n"
    scenario = minimal_scenario()
    scenario["steps"].append({"at": "1s", "apply": doc})
    result = _invoke("simulate", write_scenario(tmp_path, scenario), "-q")
    _clean_exit(result, 0)
    assert "note: steps[1].apply document 1 (Widget w): example.com/v1 Widget is not served by the simulated " \
           "cluster (no such API group): ignored" in _flat(result.stderr)


def test_an_unwritable_result_path_exits_2_before_the_run(tmp_path):
    result = _invoke("simulate", VOLCANO, "--json", tmp_path / "missing" / "out.json")
    _clean_exit(result, 2)
    assert _flat(result.stderr) == f"error: cannot write the result document {tmp_path / 'missing' / 'out.json'}: " \
                                   f"folder {tmp_path / 'missing'} does not exist"
    assert result.stdout == ""
