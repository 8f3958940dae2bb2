import json

import pytest

from shared.sim import ScenarioError, SimCluster
from shared.sim.cluster import EVENT_TTL
from tests.builders import node, pod, ray_cluster, ray_job, worker_group
from tests.builders.sim import SimHarness, effect


# --------------------------------------------------------------------------- store and watch stream
def test_watch_stream_order_for_a_cluster_and_its_pods():
    sim = SimCluster()
    sim.apply(node("n1"), 0.0)
    sim.apply(ray_cluster("rc", workers=[]), 1.0)
    events = sim.take_watch_events()
    head = events[2][1]["metadata"]["name"]
    assert [(c, o["kind"], o["metadata"]["name"]) for c, o in events] == [
        ("Added", "Node", "n1"), ("Added", "RayCluster", "rc"), ("Added", "Pod", head)]
    assert sim.take_watch_events() == []
    sim.perform(effect("bind", "Pod", head, node="n1"), 2.0)
    assert sim.take_timer_requests() == [(4.0, f"sim/pod-running|default|{head}|{events[2][1]['metadata']['uid']}")]
    sim.fire(f"sim/pod-running|default|{head}|{events[2][1]['metadata']['uid']}", 4.0)
    assert [(c, o["kind"], o["metadata"]["name"], o["status"]) for c, o in sim.take_watch_events()] == [
        ("Modified", "Pod", head, {"phase": "Pending"}),
        ("Modified", "Pod", head, {"phase": "Running"}),
        ("Modified", "RayCluster", "rc", {"state": "ready"}),
    ]


def test_a_version_sent_on_the_watch_stream_never_changes_afterwards():
    """Copy on write: the watch stream hands out the stored versions, so no later write (patch,
    re-apply, binding, status, deletion) may change one that was sent."""
    h = SimHarness()
    sent: list[tuple[dict, str]] = []

    def step(_: SimHarness) -> None:
        sent.extend((obj, json.dumps(obj, sort_keys=True)) for _, obj in h.watch[len(sent):])

    step(h.apply(node("n1"), ray_cluster("rc", workers=[worker_group("w", 2)]), at=0.0))
    step(h.apply(ray_job("rj", annotations={"muster.dev/sim-duration": "5s"}, suspend=False), at=0.0))
    step(h.bind_all("n1", at=1.0))
    step(h.advance(4.0))
    step(h.bind_all("n1", at=4.0))
    step(h.advance(8.0))
    step(h.perform(effect("annotate", "RayCluster", "rc", annotations={"a": "b"}), at=9.0))
    step(h.apply(ray_cluster("rc", labels={"edited": "yes"}, workers=[worker_group("w", 1)]), at=10.0))
    step(h.perform(effect("suspend", "RayCluster", "rc"), at=11.0))
    step(h.delete("RayCluster", "rc", at=12.0))
    step(h.delete("Node", "n1", namespace=None, at=13.0))
    kinds = {obj["kind"] for obj, _ in sent}
    assert kinds >= {"Node", "RayCluster", "RayJob", "Pod"} and len(sent) > 30
    assert [json.dumps(obj, sort_keys=True) for obj, _ in sent] == [text for _, text in sent]


def test_get_returns_a_copy_the_caller_may_change():
    sim = SimCluster()
    sim.apply(node("n1"), 0.0)
    sim.get("Node", None, "n1")["metadata"]["labels"]["x"] = "y"
    assert sim.get("Node", None, "n1")["metadata"]["labels"] == {}


def test_resource_version_uid_and_namespace_bookkeeping():
    sim = SimCluster()
    sim.apply(node("n1"), 0.0)
    sim.apply(pod("p", namespace="team"), 0.0)
    n, p = sim.get("Node", None, "n1"), sim.get("Pod", "team", "p")
    assert "namespace" not in n["metadata"]
    assert p["metadata"]["namespace"] == "team"
    assert (n["metadata"]["resourceVersion"], p["metadata"]["resourceVersion"]) == ("1", "2")
    assert n["metadata"]["generation"] == 1
    assert sim.get("Node", "", "n1") == n
    other = SimCluster()
    other.apply(node("n1"), 0.0)
    assert other.get("Node", None, "n1")["metadata"]["uid"] == n["metadata"]["uid"]


def test_default_namespace_and_cluster_scoped_kinds():
    sim = SimCluster()
    sim.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {}}, 0.0)
    sim.apply({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "q"},
               "spec": {"weight": 1}}, 0.0)
    assert sim.get("ConfigMap", None, "cm")["metadata"]["namespace"] == "default"
    assert sim.get("ConfigMap", "default", "cm") is not None
    assert "namespace" not in sim.get("Queue", None, "q")["metadata"]


def test_reapplying_unchanged_object_emits_nothing_and_changes_emit_modified():
    sim = SimCluster()
    sim.apply(node("n1", cpu="8"), 0.0)
    sim.take_watch_events()
    sim.apply(node("n1", cpu="8"), 1.0)
    assert sim.take_watch_events() == []
    sim.apply(node("n1", cpu="16"), 2.0)
    (change, obj), = sim.take_watch_events()
    assert change == "Modified"
    assert obj["status"]["allocatable"]["cpu"] == "16"
    assert obj["metadata"]["resourceVersion"] == "2"


def test_recreated_object_gets_a_new_uid():
    sim = SimCluster()
    sim.apply(node("n1"), 0.0)
    first = sim.get("Node", None, "n1")["metadata"]["uid"]
    sim.delete("Node", None, "n1", 1.0)
    sim.apply(node("n1"), 2.0)
    assert sim.get("Node", None, "n1")["metadata"]["uid"] != first


# --------------------------------------------------------------------------- nodes and kubelet
def test_node_apply_and_delete():
    h = SimHarness().apply(node("n1"), node("n2"))
    h.take_watch()
    h.delete("Node", "n2", namespace=None, at=5.0)
    assert h.sim.get("Node", None, "n2") is None
    assert h.take_watch() == [("Deleted", "Node", "n2")]


def test_deleting_a_node_deletes_its_pods_and_kuberay_recreates_them():
    h = SimHarness().apply(node("n1"), ray_cluster("rc", workers=[]))
    (head,) = h.pod_names()
    h.bind_all("n1", at=1.0).advance(5.0)
    h.delete("Node", "n1", namespace=None, at=6.0)
    (replacement,) = h.pod_names()
    assert replacement != head
    assert h.sim.get("Pod", "default", replacement)["status"] == {"phase": "Pending"}


def test_scenario_pod_already_bound_starts_after_pod_startup():
    h = SimHarness(pod_startup=5.0).apply(node("n1"), pod("other", node_name="n1", scheduler="default-scheduler"),
                                          at=10.0)
    assert h.phases() == {"other": "Pending"}
    h.advance(14.0)
    assert h.phases() == {"other": "Pending"}
    h.advance(15.0)
    assert h.phases() == {"other": "Running"}


def test_unbound_scenario_pod_is_stored_as_given():
    h = SimHarness().apply(pod("p", labels={"scheduling.x-k8s.io/pod-group": "g"}))
    stored = h.sim.get("Pod", "default", "p")
    assert stored["metadata"]["labels"] == {"scheduling.x-k8s.io/pod-group": "g"}
    assert stored["status"] == {"phase": "Pending"}
    h.advance(100.0)
    assert h.phases() == {"p": "Pending"}


def test_pod_bound_to_missing_node_does_not_start():
    h = SimHarness().apply(pod("p"))
    h.perform(effect("bind", "Pod", "p", node="ghost"), at=1.0).advance(10.0)
    assert h.phases() == {"p": "Pending"}


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("manifest, message", [
    ({"kind": "Pod", "metadata": {"name": "p"}}, "Pod p: apiVersion must be a non-empty string, got None"),
    ({"apiVersion": "v1", "kind": 7, "metadata": {"name": "p"}}, "object p: kind must be a non-empty string, got 7"),
    ({"apiVersion": "v1", "kind": "Pod", "metadata": {}}, "Pod <unnamed>: metadata.name must be a non-empty string"),
    ({"apiVersion": "v1", "kind": "Pod"}, "Pod <unnamed>: metadata must be a mapping, got None"),
    ({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": 1}}},
     "Pod p: metadata.labels.a must be a string, got 1"),
    ({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": 3}},
     "Pod p: metadata.namespace must be a non-empty string, got 3"),
    (["not", "a", "mapping"], "a manifest must be a mapping, got list"),
    ({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}},
     "Pod p: spec.containers[0].image: Required value"),
    ({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "c", "image": "busybox", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}},
     "Pod p: spec.containers[0].resources.limits: Required value: Limit must be set for non overcommitable"),
])
def test_bad_manifests_raise_scenario_error_naming_object_and_problem(manifest, message):
    sim = SimCluster()
    with pytest.raises(ScenarioError) as err:
        sim.apply(manifest, 0.0)
    assert str(err.value).startswith(message)
    assert sim.take_watch_events() == []


def test_bad_sim_annotations_are_scenario_errors():
    sim = SimCluster()
    with pytest.raises(ScenarioError, match=r"^RayJob rj: annotation muster.dev/sim-duration: 'soon' is not a duration"):
        sim.apply(ray_job("rj", annotations={"muster.dev/sim-duration": "soon"}), 0.0)
    with pytest.raises(ScenarioError, match=r"^RayJob rj: annotation muster.dev/sim-outcome: 'Maybe' must be"):
        sim.apply(ray_job("rj", annotations={"muster.dev/sim-outcome": "Maybe"}), 0.0)


def test_scenario_error_is_a_value_error():
    assert issubclass(ScenarioError, ValueError)


def test_deleting_a_missing_object_is_a_scenario_error():
    with pytest.raises(ScenarioError, match="RayCluster default/nope: cannot delete, it does not exist"):
        SimCluster().delete("RayCluster", "default", "nope", 0.0)


def test_malformed_workload_specs_are_stored_for_admission_to_reject():
    sim = SimCluster()
    sim.apply({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "rj"}, "spec": "oops"}, 0.0)
    assert sim.get("RayJob", "default", "rj")["spec"] == "oops"


# --------------------------------------------------------------------------- effects
def test_annotate_merges_and_records_history():
    h = SimHarness().apply(ray_cluster("rc", annotations={"user": "x"}))
    h.take_watch()
    h.perform(effect("annotate", "RayCluster", "rc", annotations={"muster.dev/queue": "q"}), at=1.0)
    h.perform(effect("annotate", "RayCluster", "rc", annotations={"muster.dev/queue": "q"}), at=2.0)
    h.perform(effect("annotate", "RayCluster", "rc", annotations={"muster.dev/status": "Queued: x"}), at=3.0)
    assert h.take_watch() == [("Modified", "RayCluster", "rc"), ("Modified", "RayCluster", "rc")]
    assert h.sim.annotation_history("RayCluster", "default", "rc") == [
        (1.0, {"user": "x", "muster.dev/queue": "q"}),
        (3.0, {"user": "x", "muster.dev/queue": "q", "muster.dev/status": "Queued: x"}),
    ]


def test_annotate_without_kind_resolves_the_workload():
    h = SimHarness().apply(ray_job("rj"), ray_cluster("rc"))
    h.perform(effect("annotate", "", "rj", annotations={"a": "1"}), effect("annotate", "", "rc", annotations={"b": "2"}),
              effect("annotate", "", "ghost", annotations={"c": "3"}), at=1.0)
    assert h.sim.get("RayJob", "default", "rj")["metadata"]["annotations"] == {"a": "1"}
    assert h.sim.get("RayCluster", "default", "rc")["metadata"]["annotations"] == {"b": "2"}
    assert h.sim.annotation_history("RayJob", "default", "rj") == [(1.0, {"a": "1"})]


def test_event_effect_appends_a_core_v1_event_once():
    h = SimHarness().apply(ray_cluster("rc"))
    warn = effect("event", "RayCluster", "rc", reason="Unschedulable", message="0/1 nodes", event_type="Warning")
    h.perform(warn, at=7.0).perform(warn, at=8.0)
    (event,) = h.sim.events
    uid = h.sim.get("RayCluster", "default", "rc")["metadata"]["uid"]
    assert event["kind"] == "Event" and event["apiVersion"] == "v1"
    assert event["involvedObject"] == {"apiVersion": "ray.io/v1", "kind": "RayCluster", "namespace": "default",
                                       "name": "rc", "uid": uid}
    assert (event["reason"], event["message"], event["type"]) == ("Unschedulable", "0/1 nodes", "Warning")
    assert event["firstTimestamp"] == "1970-01-01T00:00:07Z" and event["simTime"] == 7.0
    assert [c for c, kind, _ in h.take_watch() if kind == "Event"] == []
    h.perform(effect("event", "RayCluster", "rc", reason="Scheduled", message="ok"), at=9.0)
    assert [e["reason"] for e in h.sim.events] == ["Unschedulable", "Scheduled"]


def test_effects_on_missing_objects_are_ignored():
    sim = SimCluster()
    for op in ("suspend", "unsuspend", "bind", "annotate", "evict", "event"):
        sim.perform(effect(op, "Pod" if op in ("bind", "evict") else "RayJob", "ghost", node="n1",
                           annotations={"a": "b"}), 1.0)
    assert sim.take_watch_events() == [] and sim.events == [] and sim.take_timer_requests() == []


def test_suspend_effects_are_idempotent():
    h = SimHarness().apply(ray_job("rj"))
    h.take_watch()
    h.perform(effect("suspend", "RayJob", "rj"), at=1.0)
    assert h.take_watch() == []
    h.perform(effect("unsuspend", "RayJob", "rj"), at=2.0)
    before = len(h.take_watch())
    h.perform(effect("unsuspend", "RayJob", "rj"), at=3.0)
    assert before > 0 and h.take_watch() == []


def test_bind_records_annotation_history_for_the_pod():
    h = SimHarness().apply(node("n1"), pod("p"))
    h.perform(effect("bind", "Pod", "p", node="n1", annotations={"gpu-fraction": "0.5"}), at=2.0)
    assert h.sim.annotation_history("Pod", "default", "p") == [(2.0, {"gpu-fraction": "0.5"})]


def test_a_manifest_that_contains_itself_is_refused_with_its_name():
    data: dict = {}
    data["self"] = data  # what a YAML alias inside its own anchor loads as
    with pytest.raises(ScenarioError, match="ConfigMap default/cm: nested too deeply"):
        SimCluster().apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": data}, 0.0)


def test_a_pod_change_the_controllers_cannot_act_on_does_not_run_them():
    """Binding a pod (no new phase) and the cluster's own new pods queue no sync; a phase does."""
    h = SimHarness()
    h.apply(node("n1"), at=0.0)
    synced: list[str] = []
    sync = h.sim.kuberay.sync_cluster
    h.sim.kuberay.sync_cluster = lambda ns, name, now: (synced.append(name), sync(ns, name, now))[1]  # type: ignore[method-assign]
    h.apply(ray_cluster("rc", workers=[worker_group("w", 2)]), at=1.0)
    assert synced == ["rc"]  # once for the cluster; not again for each of the 3 pods it created
    h.bind_all("n1", at=2.0)
    assert synced == ["rc"] and len(h.pod_names(cluster="rc")) == 3
    h.advance(4.0)  # the pods turn Running: a phase the controller reads (then its own status changes)
    assert synced[1:] == ["rc"] * 4
    assert h.sim.get("RayCluster", "default", "rc")["status"]["state"] == "ready"


def test_events_expire_after_the_api_servers_event_ttl_and_names_never_repeat():
    h = SimHarness().apply(ray_cluster("rc"))
    h.perform(effect("event", "RayCluster", "rc", reason="A", message="first"), at=10.0)
    h.perform(effect("event", "RayCluster", "rc", reason="B", message="second"), at=10.0 + EVENT_TTL - 1)
    assert [e["reason"] for e in h.sim.events] == ["A", "B"]
    h.perform(effect("event", "RayCluster", "rc", reason="C", message="third"), at=10.0 + EVENT_TTL + 1)
    assert [(e["reason"], e["metadata"]["name"]) for e in h.sim.events] == [("B", "rc.2"), ("C", "rc.3")]


def test_a_cluster_made_again_under_its_name_gets_pods_never_named_before():
    """What the simulated KubeRay keeps of a deleted cluster is dropped, but for its slots' counts."""
    h = SimHarness().apply(ray_cluster("rc"))
    first = h.pod_names(cluster="rc")
    h.delete("RayCluster", "rc")
    assert h.pod_names(cluster="rc") == [] and not h.sim.kuberay._slot_pods
    h.apply(ray_cluster("rc"))
    again = h.pod_names(cluster="rc")
    assert len(again) == len(first) and not set(again) & set(first)


def test_kuberay_makes_no_pod_the_api_server_would_refuse():
    """A template requesting a GPU without a limit: KubeRay's creates fail (it retries), no pod appears."""
    sim = SimCluster()
    sim.apply(ray_cluster("rc", workers=[worker_group("gpu", 2, {"cpu": "1", "nvidia.com/gpu": "1"}, limits={})]), 0.0)
    pods = [o["metadata"]["name"] for c, o in sim.take_watch_events() if o["kind"] == "Pod"]
    assert len(pods) == 1 and "-head-" in pods[0]  # the head asks for no GPU
