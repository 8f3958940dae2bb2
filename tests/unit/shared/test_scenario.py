"""shared/sim/scenario.py: strict scenario loading; every error names the place."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from shared.kernel.policy import Policy, QueuePolicy
from shared.sim.scenario import NodeSpec, Scenario, ScenarioError, load_scenario, parse_scenario
from tests.builders.shared import SCENARIOS


def _error(text: str) -> str:
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(textwrap.dedent(text), origin="s.yaml")
    return str(exc.value)


@pytest.mark.parametrize("text, expected", [
    ("name: a\nbogus: 1\n", "s.yaml: bogus: Extra inputs are not permitted"),
    ("cluster: {}\n", "s.yaml: name: Field required"),
    ("name: a\ncluster: {nodes: [], bogus: 1}\n", "s.yaml: cluster.bogus: Extra inputs are not permitted"),
    ("name: a\nsteps: [{at: 1s, apply: 'kind: X', delete: {kind: A, name: b}}]\n",
     "s.yaml: steps.0: Value error, a step needs exactly one of 'apply' or 'delete'"),
    ("name: a\nsteps: [{at: 1s}]\n", "s.yaml: steps.0: Value error, a step needs exactly one of 'apply' or 'delete'"),
    ("name: a\nsteps: [{at: 1s, delete: {kind: A}}]\n", "s.yaml: steps.0.delete.name: Field required"),
    ("name: a\nsteps: [{at: 1s, delete: {kind: A, name: b, uid: x}}]\n",
     "s.yaml: steps.0.delete.uid: Extra inputs are not permitted"),
    ("name: a\nsteps: [{apply: 'a: 1'}]\n", "s.yaml: steps.0.at: Field required"),
    ("name: a\nsteps: [{at: soon, apply: 'a: 1'}]\n",
     "s.yaml: steps.0.at: Value error, duration: 'soon' is not a duration (write e.g. 30s, 5m, 1h30m)"),
    ("name: a\nsteps: [{at: -1, apply: 'a: 1'}]\n", "s.yaml: steps.0.at: Value error, duration: -1 is negative"),
    ("name: a\nuntil: 5x\n", "s.yaml: until: Value error, duration: '5x' is not a duration (write e.g. 30s, 5m, 1h30m)"),
    ("name: a\npod_startup: later\n",
     "s.yaml: pod_startup: Value error, duration: 'later' is not a duration (write e.g. 30s, 5m, 1h30m)"),
    ("name: a\ncluster: {nodes: [{capacity: {cpu: 1}}]}\n",
     "s.yaml: cluster.nodes.0: Value error, a node entry needs exactly one of 'name' or 'count'"),
    ("name: a\ncluster: {nodes: [{name: x, count: 2, capacity: {cpu: 1}}]}\n",
     "s.yaml: cluster.nodes.0: Value error, a node entry needs exactly one of 'name' or 'count'"),
    ("name: a\ncluster: {nodes: [{count: 0, capacity: {cpu: 1}}]}\n",
     "s.yaml: cluster.nodes.0.count: Input should be greater than or equal to 1"),
    ("name: a\ncluster: {nodes: [{name: x}]}\n", "s.yaml: cluster.nodes.0.capacity: Field required"),
    ("name: a\nexpect: [{at: 1s, workload: a/b, bogus: 1}]\n", "s.yaml: expect.0.bogus: Extra inputs are not permitted"),
    ("name: a\nexpect: [{at: 1s}]\n", "s.yaml: expect.0.workload: Field required"),
    ("- a\n- b\n", "s.yaml: a scenario is a mapping with name, cluster, steps, until"),
    ("", "s.yaml: a scenario is a mapping with name, cluster, steps, until"),
    ("just text\n", "s.yaml: a scenario is a mapping with name, cluster, steps, until"),
])
def test_validation_errors_name_the_place(text, expected):
    assert _error(text) == expected


def test_malformed_yaml_names_the_file_and_line():
    message = _error("name: a\nsteps: [1, }\n")
    assert message == "s.yaml:2:12: malformed YAML: did not find expected node content (while parsing a flow node)"


@pytest.mark.parametrize("steps, expected", [
    ("steps:\n  - {at: 0s, apply: 'kind: A'}\n  - {at: 1s, apply: 'a: ['}\n", "steps[1].apply: malformed YAML: "),
    ("steps:\n  - {at: 1s, apply: '- 1'}\n", "steps[0].apply document 1: expected a mapping, got list"),
    ("steps:\n  - at: 1s\n    apply: |\n      kind: A\n      ---\n      just a string\n",
     "steps[0].apply document 2: expected a mapping, got str"),
])
def test_apply_documents_are_checked_when_loading_naming_the_step(steps, expected):
    assert _error("name: a\n" + steps).startswith("s.yaml: " + expected)


def test_apply_documents_skip_empty_ones():
    scenario = parse_scenario("name: a\nsteps:\n  - at: 2s\n    apply: |\n      ---\n      kind: A\n      ---\n"
                              "      ---\n      kind: B\n")
    assert scenario.steps[0].at == 2.0
    assert scenario.steps[0].objects(0) == [{"kind": "A"}, {"kind": "B"}]


def test_node_count_expands_with_name_prefix():
    scenario = parse_scenario(textwrap.dedent("""\
        name: a
        cluster:
          nodes:
            - {count: 3, name_prefix: gpu-, capacity: {cpu: 1, memory: 1Gi, nvidia.com/gpu: 0.5},
               labels: {pool: a}, taints: [{key: k, value: v, effect: NoSchedule}]}
            - {count: 2, capacity: {cpu: "2"}}
            - {name: solo, capacity: {cpu: "4"}}
        """))
    manifests = [m for spec in scenario.cluster.nodes for m in spec.manifests()]
    assert [m["metadata"]["name"] for m in manifests] == ["gpu-1", "gpu-2", "gpu-3", "node-1", "node-2", "solo"]
    assert manifests[0] == {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "gpu-1", "labels": {"pool": "a"}},
        "spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]},
        "status": {"capacity": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "0.5"},
                   "allocatable": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "0.5"}},
    }
    assert manifests[5]["spec"] == {}
    # each manifest owns its dicts: mutating one node does not change its siblings
    manifests[0]["metadata"]["labels"]["pool"] = "changed"
    manifests[0]["status"]["capacity"]["cpu"] = "99"
    assert manifests[1]["metadata"]["labels"] == {"pool": "a"}
    assert manifests[1]["status"]["allocatable"]["cpu"] == "1"


@pytest.mark.parametrize("text, seconds", [
    ("name: a\n", 2.0),
    ("name: a\ncluster: {pod_startup: 5s}\n", 5.0),
    ("name: a\npod_startup: 1s\n", 1.0),
    ("name: a\npod_startup: 1s\ncluster: {pod_startup: 5s}\n", 1.0),   # top level wins
    ("name: a\ncluster: {pod_startup: 0s}\n", 0.0),                     # zero is a value, not "unset"
    ("name: a\npod_startup: 500ms\n", 0.5),
])
def test_pod_startup_at_top_level_or_under_cluster(text, seconds):
    assert parse_scenario(text).startup_seconds == seconds


def test_defaults():
    s = parse_scenario("name: a\n")
    assert (s.until, s.steps, s.expect, s.policy, s.cluster.nodes, s.description) == (600.0, [], [], None, [], None)


def test_expectation_fields_parse():
    s = parse_scenario(textwrap.dedent("""\
        name: a
        expect:
          - {at: 1m, workload: ns/w, phase: Running, reason_contains: x, pods_bound: 3, same_node: [head, worker],
             same_gpu: [worker], min_member: 3, resources: {cpu: "3", memory: 4Gi}, annotations_present: [a/b]}
          - {at: 90, workload: ns/w, annotations_present: {a/b: c}}
        """))
    first, second = s.expect
    assert (first.at, first.workload, first.phase, first.reason_contains, first.pods_bound, first.same_node,
            first.same_gpu, first.min_member, first.resources, first.annotations_present) == \
        (60.0, "ns/w", "Running", "x", 3, ["head", "worker"], ["worker"], 3, {"cpu": "3", "memory": "4Gi"}, ["a/b"])
    assert (second.at, second.annotations_present, second.phase) == (90.0, {"a/b": "c"}, None)


def test_effective_policy_layers_scenario_over_base_over_defaults():
    s = parse_scenario("name: a\npolicy: {queueing: StrictFIFO, queues: {q1: {placement: spread}}}\n")
    base = Policy(queueing="BestEffortFIFO", placement="spread", min_runtime_seconds=5)
    p = s.effective_policy(base)
    assert (p.queueing, p.placement, p.min_runtime_seconds, p.backoff_max_seconds) == ("StrictFIFO", "spread", 5.0, 60.0)
    assert p.queues == {"q1": QueuePolicy(placement="spread")}
    assert s.effective_policy() == Policy(queueing="StrictFIFO", queues={"q1": QueuePolicy(placement="spread")},
                                          scheduler_names=["muster", "default-scheduler"])
    widened = base.model_copy(update={"scheduler_names": ("muster", "default-scheduler")})
    assert parse_scenario("name: a\n").effective_policy(base) == widened


@pytest.mark.parametrize("policy, fragment", [
    ("{queueng: StrictFIFO}", "a: invalid policy: queueng: Extra inputs are not permitted"),
    ("{placement: diagonal}", "a: invalid policy: placement: Input should be 'binpack', 'spread' or 'fragmentation'"),
    ("{queues: {q: {bogus: 1}}}", "a: invalid policy: queues.q.bogus: Extra inputs are not permitted"),
])
def test_effective_policy_errors_are_scenario_errors(policy, fragment):
    s = parse_scenario(f"name: a\npolicy: {policy}\n")
    with pytest.raises(ScenarioError) as exc:
        s.effective_policy()
    assert str(exc.value) == fragment


def test_load_scenario_file_errors(tmp_path):
    with pytest.raises(ScenarioError, match=r"^cannot read scenario .*nope\.yaml: No such file or directory$"):
        load_scenario(tmp_path / "nope.yaml")
    with pytest.raises(ScenarioError, match=r"^cannot read scenario .*: Is a directory$"):
        load_scenario(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [\n")
    with pytest.raises(ScenarioError, match=r"bad\.yaml:2:1: malformed YAML: [^\n]*$"):
        load_scenario(bad)


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_repository_scenario_loads(path):
    scenario = load_scenario(path)
    assert isinstance(scenario, Scenario)
    for i, step in enumerate(scenario.steps):
        assert step.objects(i) or step.delete is not None


def test_node_spec_is_frozen_and_strict():
    spec = NodeSpec(name="n", capacity={"cpu": "1"})
    with pytest.raises(Exception):
        spec.name = "m"  # type: ignore[misc]


def test_scenario_policy_queues_layer_per_queue_over_the_policy_file() -> None:
    from shared.kernel.policy import Policy

    scenario = parse_scenario("name: x\npolicy: {queues: {a: {placement: spread}}}\n")
    base = Policy.from_mapping({"queueing": "StrictFIFO",
                                "queues": {"a": {"queueing": "StrictFIFO"}, "b": {"queueing": "StrictFIFO"}}})
    policy = scenario.effective_policy(base)
    assert policy.queueing == "StrictFIFO"
    assert policy.queueing_for("b") == "StrictFIFO"
    assert policy.placement_for("a") == "spread"
    assert policy.queueing_for("a") == "StrictFIFO"  # the file's global value; the scenario replaced queue a's entry


def test_an_empty_node_name_is_an_error() -> None:
    with pytest.raises(ScenarioError, match="name"):
        parse_scenario('name: x\ncluster: {nodes: [{name: "", capacity: {cpu: "1"}}]}\n')


def test_a_node_capacity_that_is_not_a_quantity_is_an_error() -> None:
    with pytest.raises(ScenarioError, match="capacity.cpu: 'lots' is not a quantity"):
        parse_scenario('name: x\ncluster: {nodes: [{name: n1, capacity: {cpu: lots}}]}\n')


def _ray(kind: str, labels: dict, **spec: object) -> str:
    return yaml.safe_dump({"apiVersion": "ray.io/v1", "kind": kind,
                           "metadata": {"name": "w", "labels": labels}, "spec": spec})


@pytest.mark.parametrize("labels, kind, spec, setting", [
    ({"volcano.sh/queue-name": "q"}, "RayCluster", {}, "volcano"),
    ({"ray.io/scheduler-name": "volcano"}, "RayCluster", {}, "volcano"),
    ({"kai.scheduler/queue": "q"}, "RayCluster", {}, "kai-scheduler"),
    ({"kai.scheduler/queue": "q"}, "RayJob", {"submissionMode": "HTTPMode", "rayClusterSpec": {}}, "kai-scheduler"),
    ({"kai.scheduler/queue": "q"}, "RayJob", {"rayClusterSpec": {}}, "none"),  # KAI refuses K8sJobMode
    ({"quota.scheduling.alibabacloud.com/name": "q"}, "RayJob", {"rayClusterSpec": {}}, "none"),
    ({}, "RayCluster", {}, "none"),
])
def test_the_batch_scheduler_is_the_one_the_manifests_imply(labels, kind, spec, setting):
    s = parse_scenario(yaml.safe_dump({"name": "a", "steps": [{"at": 0, "apply": _ray(kind, labels, **spec)}]}))
    assert s.batch_scheduler == setting


def test_a_named_batch_scheduler_wins_and_widens_the_names_muster_answers_to():
    text = {"name": "a", "cluster": {"kuberay": {"batch_scheduler": "scheduler-plugins"}},
            "steps": [{"at": 0, "apply": _ray("RayCluster", {"volcano.sh/queue-name": "q"})}]}
    s = parse_scenario(yaml.safe_dump(text))
    assert s.batch_scheduler == "scheduler-plugins"
    assert s.effective_policy().scheduler_names == ("muster", "scheduler-plugins-scheduler", "default-scheduler")


def test_under_another_setting_the_scenario_names_it_and_answers_to_its_pods_scheduler():
    s = parse_scenario(yaml.safe_dump({"name": "a", "steps": [
        {"at": 0, "apply": _ray("RayCluster", {"volcano.sh/queue-name": "q"})}]}))
    assert s.batch_scheduler == "volcano"  # read (and cached) before the copy is made
    plain = s.under("none")
    assert (plain.batch_scheduler, plain.cluster.kuberay.batch_scheduler) == ("none", "none")
    assert plain.effective_policy().scheduler_names == ("muster", "default-scheduler")
    assert s.batch_scheduler == "volcano" and s.cluster.kuberay.batch_scheduler is None


def test_names_given_by_the_scenario_or_the_policy_file_are_kept_as_they_are():
    s = parse_scenario("name: a\npolicy: {scheduler_names: [muster]}\n")
    assert s.effective_policy().scheduler_names == ("muster",)
    plain = parse_scenario("name: a\n")
    assert plain.effective_policy(Policy(scheduler_names=["muster"])).scheduler_names == ("muster",)


def test_an_unknown_batch_scheduler_is_refused():
    with pytest.raises(ScenarioError, match="batch_scheduler"):
        parse_scenario("name: a\ncluster: {kuberay: {batch_scheduler: yunikorn}}\n")


# --------------------------------------------------------------------------- input bounds
def _laughs(levels: int, fan: int) -> str:
    lines = ["a0: &a0 [lol]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fan)}]")
    return "\n".join(lines) + "\n"


def test_many_yaml_aliases_are_refused_before_expansion():
    message = _error("name: a\n" + _laughs(12, 10))
    assert message.startswith("s.yaml: ") and "more than 100 YAML aliases" in message


def test_few_aliases_expanding_to_billions_are_refused_without_expanding():
    message = _error("name: a\n" + _laughs(10, 9))  # 81 aliases, 9**9 values once expanded
    assert message == "s.yaml: more than 200000 values (YAML aliases count each time they are used)"


def test_aliases_inside_an_apply_text_are_bounded_too():
    apply = "\n".join("      " + line for line in _laughs(10, 9).splitlines())
    message = _error(f"name: a\nsteps:\n  - at: 1s\n    apply: |\n      kind: ConfigMap\n{apply}\n")
    assert message == ("s.yaml: steps[0].apply document 1 (ConfigMap): "
                       "more than 200000 values (YAML aliases count each time they are used)")


@pytest.mark.parametrize("text", ["name: a\nx: " + "[" * 10_000 + "]" * 10_000 + "\n",
                                  "name: a\nx: " + "{a: " * 5_000 + "1" + "}" * 5_000 + "\n"],
                         ids=["lists", "mappings"])
def test_deep_nesting_is_one_line_not_a_recursion_error(text):
    message = _error(text)  # libyaml stops at 1,000 levels; the pure-Python parser's RecursionError is caught
    assert message.startswith("s.yaml:") and "nesting" in message and "\n" not in message


def test_a_number_of_thousands_of_digits_is_refused():
    message = _error("name: a\nuntil: " + "9" * 5_000 + "\n")
    assert message.startswith("s.yaml: ") and "\n" not in message and len(message) < 300


def test_node_count_is_bounded():
    assert _error("name: a\ncluster: {nodes: [{count: 1000000000, capacity: {cpu: 1}}]}\n") == \
        "s.yaml: cluster.nodes.0.count: Input should be less than or equal to 20000"
    entries = ", ".join("{count: 15000, name_prefix: p%d-, capacity: {cpu: 1}}" % i for i in range(2))
    assert _error(f"name: a\ncluster: {{nodes: [{entries}]}}\n") == \
        "s.yaml: cluster.nodes: 30000 nodes, more than the 20000 muster simulates"


@pytest.mark.parametrize("node, expected", [
    ("{name: Node_1, capacity: {cpu: 1}}", "cluster.nodes.0: Value error, name: 'Node_1' is not a DNS-1123 subdomain"),
    ("{count: 2, name_prefix: 'GPU ', capacity: {cpu: 1}}", "cluster.nodes.0: Value error, name_prefix: 'GPU 2' is not a DNS-1123"),
    ("{name: n, labels: {pool: '-gpu'}, capacity: {cpu: 1}}", "cluster.nodes.0: Value error, labels.pool: '-gpu' is not a label value"),
])
def test_simulated_node_names_and_labels_as_kubernetes_validates_them(node, expected):
    assert _error(f"name: a\ncluster: {{nodes: [{node}]}}\n").startswith(f"s.yaml: {expected}")


@pytest.mark.parametrize("doc, expected", [
    ("{apiVersion: v1, kind: Pod, metadata: {name: My_Pod}}", "metadata.name: 'My_Pod' is not a DNS-1123 subdomain"),
    ("{apiVersion: v1, kind: Pod, metadata: {name: p, namespace: Team}}", "metadata.namespace: 'Team' is not a DNS-1123 label"),
    ("{apiVersion: v1, kind: Pod, metadata: {name: p, labels: {app: " + "x" * 64 + "}}}", "metadata.labels.app: 'xxx"),
    ("{apiVersion: v1, kind: Pod, metadata: {name: p, labels: {'a/b/c': x}}}", "'a/b/c' has an invalid prefix"),
])
def test_apply_documents_names_and_labels_as_the_api_server_validates_them(doc, expected):
    message = _error("name: a\nsteps:\n  - at: 1s\n    apply: |\n      " + doc + "\n")
    assert message.startswith("s.yaml: steps[0].apply document 1 (Pod ") and expected in message
    assert "\n" not in message


def test_load_scenario_a_binary_file_is_a_scenario_error(tmp_path):
    path = tmp_path / "scenario.bin"
    path.write_bytes(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(ScenarioError, match=r"^cannot read scenario .*scenario\.bin: not UTF-8 text \(byte 0x89 at offset 0\)$"):
        load_scenario(path)
