from services.reconciler.ingest import ANNOTATION_PREFIXES, kept, observe, watch_envelope
from shared.kernel.events import from_json, to_json
from shared.kernel.kube import REFUSED, refused
from tests.builders import node, ray_cluster
from tests.builders.secrets import SECRET, secret_rayjob

def test_ingest_keeps_what_scheduling_reads_and_drops_every_secret():
    change = observe("Added", secret_rayjob())
    assert SECRET not in to_json(watch_envelope("Added", secret_rayjob(), 1.0)).decode()
    job = change.object
    assert job["metadata"]["annotations"] == {"muster.dev/sim-duration": "60s"}
    assert job["metadata"]["labels"] == {"volcano.sh/queue-name": "q"}
    assert (job["metadata"]["uid"], job["metadata"]["resourceVersion"]) == ("u1", "1")
    spec = job["spec"]
    assert set(spec) == {"shutdownAfterJobFinishes", "submitterPodTemplate", "rayClusterSpec"}
    worker = spec["rayClusterSpec"]["workerGroupSpecs"][0]
    assert {k: worker[k] for k in ("groupName", "replicas", "minReplicas", "maxReplicas")} == \
        {"groupName": "workers", "replicas": 2, "minReplicas": 1, "maxReplicas": 3}
    pod = worker["template"]["spec"]
    assert pod["containers"] == [{"name": "worker", "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                                   "limits": {"cpu": "2"}}}]
    assert set(pod) == {"containers", "initContainers", "nodeSelector", "schedulerName", "priorityClassName",
                        "tolerations", "affinity"}
    assert [set(c) for c in pod["initContainers"]] == [{"name", "resources"}]
    assert worker["template"]["metadata"]["annotations"] == {"gpu-fraction": "0.5"}
    assert job["status"] == {"jobDeploymentStatus": "Running"}


def test_kais_gpu_sharing_requests_are_kept_and_its_binders_mark_is_not():
    from tests.builders import pod
    obj = pod("p", annotations={"gpu-memory": "20480", "gpu-fraction": "0.5", "received-resource-type": "Fraction",
                                "muster.dev/gpu-portion": "0.51", "note": "x"})
    assert kept(obj)["metadata"]["annotations"] == {"gpu-memory": "20480", "gpu-fraction": "0.5",
                                                    "muster.dev/gpu-portion": "0.51"}


def test_the_cores_read_the_same_workload_from_the_kept_object():
    """Admission's reading of the full manifest and of what ingest kept are the same spec."""
    from services.admission.core import AdmissionCore
    from shared.kernel.events import ObjectChanged
    from shared.kernel.events import wrap
    from shared.kernel.policy import Policy

    def admitted(obj: dict) -> list:
        core = AdmissionCore(Policy())
        payload = ObjectChanged(change="Added", kind="RayJob", api_version="ray.io/v1", namespace="team-a",
                                name="job", object=obj)
        return [p.model_dump() for p in core.handle(wrap(payload, source="ingest", cause=None, index=0, at=0.0))]

    decided = admitted(kept(secret_rayjob()))
    assert [d["type"] for d in decided] == ["WorkloadSubmitted"]
    assert decided == admitted(secret_rayjob())


def test_node_keeps_capacity_labels_taints():
    obj = {**node("n1"), "status": {"capacity": {"cpu": "4"}, "allocatable": {"cpu": "4"},
                                    "images": [{"names": [SECRET]}], "nodeInfo": {"bootID": SECRET}}}
    obj["spec"] = {"taints": [{"key": "k", "effect": "NoSchedule"}], "providerID": SECRET}
    got = kept(obj)
    assert got["status"] == {"capacity": {"cpu": "4"}, "allocatable": {"cpu": "4"}}
    assert got["spec"] == {"taints": [{"key": "k", "effect": "NoSchedule"}]}
    assert SECRET not in str(got)


def test_config_kinds_are_kept_whole_but_their_metadata():
    queue = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
             "metadata": {"name": "q", "annotations": {"kubectl.kubernetes.io/last-applied-configuration": SECRET}},
             "spec": {"weight": 2, "capability": {"cpu": "4"}, "parent": "root"}}
    got = kept(queue)
    assert got["spec"] == queue["spec"] and got["metadata"] == {"name": "q", "annotations": {}}


def test_unknown_kinds_keep_only_identity():
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "a"},
              "data": {"token": SECRET}, "stringData": {"t": SECRET}}
    assert kept(secret) == {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "a"}}


def test_a_kind_that_is_no_string_keeps_only_identity():  # found by tests/property/test_fuzz_manifests.py
    obj = {"apiVersion": "v1", "kind": {"not": "text"}, "metadata": {"name": "x"}, "spec": {"env": "secret"}}
    assert kept(obj) == {"apiVersion": "v1", "kind": {"not": "text"}, "metadata": {"name": "x"}}


def test_wrong_shapes_are_kept_as_written_for_admission_to_reject():
    obj = ray_cluster("rc", namespace="team-a")
    obj["spec"]["workerGroupSpecs"] = "not a list"
    assert kept(obj)["spec"]["workerGroupSpecs"] == "not a list"


def _refusal(obj: dict) -> str:
    change = observe("Added", obj)
    to_json(watch_envelope("Added", obj, 1.0))  # always encodable
    reason = refused(change.object)
    assert reason is not None and "\n" not in reason
    assert set(change.object["metadata"]) <= {"name", "namespace", "uid", "resourceVersion", "annotations"}
    return reason


def test_a_name_the_api_server_refuses_is_refused_at_ingest():
    assert "metadata.name" in _refusal(ray_cluster("Not_A_Name", namespace="team-a"))
    assert "longer than 253" in _refusal(ray_cluster("a" * 254, namespace="team-a"))
    assert "metadata.namespace" in _refusal(ray_cluster("rc", namespace="Team A"))


def test_label_keys_and_values_as_kubernetes_validates_them():
    obj = ray_cluster("rc", namespace="team-a")
    obj["metadata"]["labels"] = {"app": "x" * 64}
    assert "label value" in _refusal(obj)
    obj["metadata"]["labels"] = {"bad key!": "v"}
    assert "qualified name" in _refusal(obj)
    obj["metadata"]["labels"] = {"app": "-leading"}
    assert "label value" in _refusal(obj)


def test_lone_surrogates_are_refused_and_escaped_so_the_envelope_encodes():
    obj = ray_cluster("rc\ud800", namespace="team-a")
    reason = _refusal(obj)
    env = watch_envelope("Added", obj, 1.0)
    assert from_json(to_json(env)).payload.name == "rc\\ud800"
    assert "rc" in reason
    obj = ray_cluster("rc", namespace="team-a")
    obj["metadata"]["labels"] = {"app": "a\udc80b"}
    assert "lone surrogate" in _refusal(obj)


def test_nesting_and_size_bounds():
    obj = ray_cluster("rc", namespace="team-a")
    deep: dict = {}
    cursor = deep
    for _ in range(10_000):  # iterative walk: no RecursionError
        cursor["x"] = {}
        cursor = cursor["x"]
    obj["spec"]["headGroupSpec"]["template"]["spec"]["affinity"] = deep
    assert "nested deeper than 64" in _refusal(obj)
    big = ray_cluster("rc", namespace="team-a")
    big["metadata"]["annotations"] = {"muster.dev/blob": "x" * (600 * 1024)}
    assert "larger than 512 KiB" in _refusal(big)


def test_a_deletion_is_taken_whatever_its_labels():
    obj = ray_cluster("rc", namespace="team-a")
    obj["metadata"]["labels"] = {"app": "x" * 64}
    assert refused(observe("Deleted", obj).object) is None


def test_the_annotation_prefixes_are_those_of_schedulers_muster_reads():
    assert all(p.endswith("/") for p in ANNOTATION_PREFIXES)
    assert REFUSED.startswith(ANNOTATION_PREFIXES)  # a refusal survives a second pass through ingest


def test_observe_takes_identity_from_the_object():
    obj = ray_cluster("rc", namespace="team-a")
    change = observe("Added", obj)
    assert (change.change, change.kind, change.api_version, change.namespace, change.name) == \
        ("Added", "RayCluster", "ray.io/v1", "team-a", "rc")
    assert change.object == kept(obj)
    assert change.subject == "RayCluster/team-a/rc"


def test_observe_cluster_scoped_object_has_no_namespace():
    change = observe("Deleted", node("n1"))
    assert (change.change, change.kind, change.api_version, change.namespace, change.name) == \
        ("Deleted", "Node", "v1", "", "n1")
    assert change.subject == "Node/n1"


def test_observe_is_pure_and_tolerates_malformed_objects():
    obj = {"kind": 3, "metadata": "nope"}
    first, second = observe("Modified", obj), observe("Modified", obj)
    assert first == second
    assert (first.kind, first.api_version, first.namespace, first.name) == ("", "", "", "")
    assert obj == {"kind": 3, "metadata": "nope"}


def test_observe_drops_managed_fields_and_keeps_the_rest():
    obj = ray_cluster("rc", namespace="team-a")
    sent = {**obj, "metadata": {**obj["metadata"], "managedFields": [
        {"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]}}
    change = observe("Modified", sent)
    assert change.object == kept(obj) and "managedFields" not in change.object["metadata"]
    assert "managedFields" in sent["metadata"]  # the caller's object is left as it was


def _versioned(obj: dict, uid: str, version: str) -> dict:
    obj["metadata"].update(uid=uid, resourceVersion=version)
    return obj


def test_a_watch_envelope_is_named_by_the_object_version_not_the_moment_seen():
    obj = _versioned(node("n1"), "u1", "7")
    seen_first = watch_envelope("Added", obj, at=100.0)
    relisted = watch_envelope("Modified", obj, at=500.0)
    assert seen_first.id == relisted.id  # a restarted watcher re-sends it under the same id
    assert (seen_first.source, seen_first.occurred_at, seen_first.causation_id) == ("ingest", 100.0, None)
    assert seen_first.correlation_id == seen_first.id
    assert seen_first.payload == observe("Added", obj)


def test_a_new_version_a_new_incarnation_and_a_deletion_get_new_ids():
    base = watch_envelope("Added", _versioned(node("n1"), "u1", "7"), at=1.0).id
    newer = watch_envelope("Modified", _versioned(node("n1"), "u1", "8"), at=1.0).id
    recreated = watch_envelope("Added", _versioned(node("n1"), "u2", "7"), at=1.0).id
    deleted = watch_envelope("Deleted", _versioned(node("n1"), "u1", "7"), at=1.0).id
    assert len({base, newer, recreated, deleted}) == 4


def test_a_refused_pod_keeps_what_names_its_workload_when_that_is_valid():
    from tests.builders import pod

    obj = pod("rc-head-x1", "team-a", node_name="n1", labels={
        "ray.io/cluster": "rc", "ray.io/node-type": "head", "app": "x" * 64, "scheduling.x-k8s.io/pod-group": "-bad-"},
        annotations={"scheduling.k8s.io/group-name": "ray-rc-pg", "other": "secret"})
    sent = observe("Modified", obj).object
    assert "label value" in refused(sent)
    assert sent["metadata"]["labels"] == {"ray.io/cluster": "rc", "ray.io/node-type": "head"}
    assert sent["metadata"]["annotations"] == {REFUSED: refused(sent), "scheduling.k8s.io/group-name": "ray-rc-pg"}
    assert sent["spec"] == {"schedulerName": "muster", "nodeName": "n1"}
    assert "containers" not in sent["spec"] and "status" not in sent
    assert observe("Modified", sent).object == sent  # a second pass through ingest keeps it as it is


def test_observe_builds_the_event_validation_would():
    """``observe`` skips pydantic's validation of the event it makes when validation would take it as
    it is; what it builds must equal the validated event, field for field (a config kind keeps keys
    of any kind, which still go through validation)."""
    from shared.kernel.events import ObjectChanged

    for change, obj in [("Added", ray_cluster("rc", namespace="team-a")), ("Deleted", node("n1")),
                        ("Modified", {"apiVersion": "v1", "kind": "PriorityClass", "metadata": {"name": "p"},
                                      "value": 5})]:
        made = observe(change, obj)
        validated = ObjectChanged.model_validate(made.model_dump())
        assert made == validated and made.model_dump() == validated.model_dump()
        assert made.model_fields_set == validated.model_fields_set
        assert to_json(watch_envelope(change, obj, 1.0)) == to_json(watch_envelope(change, obj, 1.0))


def test_what_a_pods_requests_depend_on_besides_its_containers_is_kept():
    """Init containers (their resources and whether they are sidecars), pod-level requests and the overhead
    are what kube-scheduler adds to the containers' requests (``kube.effective_requests``); their commands
    and env are not kept."""
    from tests.builders import pod
    obj = pod("p", requests={"cpu": "1"})
    obj["spec"]["initContainers"] = [{"name": "setup", "image": "x", "command": ["sh"], "env": [{"name": "K", "value": "v"}],
                                      "resources": {"requests": {"cpu": "2"}}, "restartPolicy": "Always"}]
    obj["spec"]["overhead"] = {"cpu": "250m"}
    obj["spec"]["resources"] = {"requests": {"memory": "1Gi"}, "claims": [{"name": "c"}]}
    spec = kept(obj)["spec"]
    assert spec["initContainers"] == [{"name": "setup", "resources": {"requests": {"cpu": "2"}}, "restartPolicy": "Always"}]
    assert spec["overhead"] == {"cpu": "250m"} and spec["resources"] == {"requests": {"memory": "1Gi"}}


def test_host_ports_and_claims_are_kept_and_other_ports_and_volumes_are_not():
    from tests.builders import pod
    obj = pod("p")
    obj["spec"]["containers"][0]["ports"] = [{"name": "dash", "containerPort": 8265},
                                             {"name": "gcs", "containerPort": 80, "hostPort": 8080, "protocol": "TCP"}]
    obj["spec"]["volumes"] = [
        {"name": "conf", "configMap": {"name": "secret-config"}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}},
        {"name": "tmp", "ephemeral": {"volumeClaimTemplate": {"metadata": {"labels": {"a": "b"}}, "spec": {
            "storageClassName": "local", "accessModes": ["ReadWriteOnce"]}}}}]
    spec = kept(obj)["spec"]
    assert spec["containers"][0]["ports"] == [{"hostPort": 8080, "protocol": "TCP"}]
    assert spec["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                               {"name": "tmp", "ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": "local"}}}}]
    plain = pod("q")
    plain["spec"]["containers"][0]["ports"] = [{"containerPort": 8265}]
    plain["spec"]["volumes"] = [{"name": "conf", "emptyDir": {}}]
    assert "ports" not in kept(plain)["spec"]["containers"][0] and "volumes" not in kept(plain)["spec"]


def test_storage_objects_keep_what_the_volume_filter_reads():
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "d", "namespace": "n"},
             "spec": {"volumeName": "pv-1", "storageClassName": "zonal", "accessModes": ["ReadWriteOnce"],
                      "resources": {"requests": {"storage": "1Gi"}}},
             "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}}
    assert kept(claim)["spec"] == {"volumeName": "pv-1", "storageClassName": "zonal"}
    assert kept(claim)["status"] == {"phase": "Bound"}
    affinity = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}]}}
    volume = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-1"},
              "spec": {"nodeAffinity": affinity, "csi": {"driver": "x", "volumeHandle": "secret-handle"},
                       "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "n", "name": "d", "uid": "u",
                                    "resourceVersion": "7"}}}
    assert kept(volume)["spec"] == {"nodeAffinity": affinity, "claimRef": {"namespace": "n", "name": "d", "uid": "u"}}
    topologies = [{"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": ["a"]}]}]
    storage_class = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "zonal"},
                     "provisioner": "x", "parameters": {"secret": "s"}, "volumeBindingMode": "WaitForFirstConsumer",
                     "allowedTopologies": topologies}
    assert kept(storage_class) == {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                                   "metadata": {"name": "zonal"}, "volumeBindingMode": "WaitForFirstConsumer",
                                   "allowedTopologies": topologies}
