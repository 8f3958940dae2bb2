"""deploy/k8s: the kustomize installation, rendered with ``kubectl kustomize`` and checked offline.

- every rendered object is valid against the Kubernetes OpenAPI schemas (``kubernetes-validate``,
  strict: no unknown fields), and the CRDs accept the queue manifests users write;
- the RBAC is exactly what the cluster adapter uses (``shared.kubernetes.resources.access``), and
  every muster pod runs non-root, read-only, without privilege escalation, with resources and probes;
- the path of README and docs/operations.md, Running on a cluster (the overlay applied, the services run as their Deployments say, the first
  RayJob admitted and its pods bound) is walked on a real cluster: tests/realcluster/test_deploy_apply.py.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from shared.kubernetes.resources import LEASE, access

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "k8s"
VERSION = "1.30"
"""The Kubernetes API version the manifests are validated against (kubernetes-validate ships it)."""

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl renders the overlays")


def render(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: render(DEPLOY / name) for name in (".", "overlays/demo", "overlays/external", "crds")}


def named(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


# --------------------------------------------------------------------------- offline
@pytest.mark.parametrize("which", [".", "overlays/demo", "overlays/external", "crds"])
def test_every_object_is_valid_for_kubernetes(rendered, which):
    import kubernetes_validate

    for obj in rendered[which]:
        try:
            kubernetes_validate.validate(obj, VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {exc.message} at {list(exc.path)}")


def test_the_top_level_installation_is_the_demo(rendered):
    assert rendered["."] == rendered["overlays/demo"]


def test_everything_muster_runs_lives_in_its_namespace(rendered):
    for which in ("overlays/demo", "overlays/external"):
        for obj in rendered[which]:
            if obj["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
                assert obj["metadata"].get("namespace") == "muster-system", (which, obj["kind"], obj["metadata"])


def _rules(objs: list[dict[str, Any]], kind: str) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for obj in objs if obj["kind"] == kind for rule in obj["rules"]
            for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]}


def test_rbac_is_exactly_what_the_adapter_calls(rendered):
    objs = rendered["overlays/external"]
    granted = _rules(objs, "ClusterRole")
    lease_granted = _rules(objs, "Role")
    needed = {(a.resource.group, a.rule_resource, verb) for a in access() for verb in a.verbs if a.resource != LEASE}
    lease_needed = {(a.resource.group, a.rule_resource, verb) for a in access() for verb in a.verbs
                    if a.resource == LEASE}
    assert granted - needed == set(), "granted without a call that needs it"
    assert needed - granted == set(), "called without a grant"
    assert lease_granted == lease_needed
    binding = named(objs, "ClusterRoleBinding", "muster-cluster")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "muster-cluster", "namespace": "muster-system"}]


def _pod_specs(objs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in objs:
        if obj["kind"] in ("Deployment", "Job"):
            yield obj["metadata"]["name"], obj["spec"]["template"]["spec"]


def test_every_pod_is_locked_down_and_sized(rendered):
    for name, spec in _pod_specs(rendered["overlays/demo"]):
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in spec["containers"]:
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False and security["capabilities"] == {"drop": ["ALL"]}, name
            assert container["resources"]["requests"] and container["resources"]["limits"]["memory"], name
            if container["image"].startswith("muster"):
                assert security["readOnlyRootFilesystem"] is True, name
        token = spec.get("automountServiceAccountToken")
        assert token is (name == "muster-cluster"), f"{name}: only the cluster bridge gets an API token"


def test_every_muster_service_has_probes_on_its_metrics_port(rendered):
    services = [(n, s) for n, s in _pod_specs(rendered["overlays/demo"]) if s["containers"][0]["image"].startswith("muster")
                and n != "muster-db-upgrade"]
    assert {n for n, _ in services} == {f"muster-{s}" for s in
                                        ("admission", "queue", "placement", "reconciler", "projector", "cluster")}
    for name, spec in services:
        container = spec["containers"][0]
        assert container["ports"] == [{"name": "metrics", "containerPort": 9464}], name
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}, name
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}, name
        assert {"name": "MUSTER_METRICS_PORT", "value": "9464"} in container["env"], name
    budgets = {o["metadata"]["name"]: o["spec"] for o in rendered["overlays/external"] if o["kind"] == "PodDisruptionBudget"}
    assert budgets["muster-cluster"]["minAvailable"] == 1
    service = named(rendered["overlays/external"], "Service", "muster-metrics")
    assert service["spec"]["ports"][0]["port"] == 9464


def test_the_external_overlay_takes_kafka_and_postgres_settings_from_a_secret(rendered):
    objs = rendered["overlays/external"]
    secrets = [o for o in objs if o["kind"] == "Secret"]
    connection = next(o for o in secrets if o["metadata"]["name"].startswith("muster-connection"))
    keys = set(connection["data"])
    assert {"MUSTER_KAFKA", "MUSTER_STORE", "MUSTER_KAFKA_SECURITY", "MUSTER_KAFKA_SASL_MECHANISM",
            "MUSTER_KAFKA_SASL_USERNAME", "MUSTER_KAFKA_SASL_PASSWORD", "MUSTER_KAFKA_SSL_CAFILE"} <= keys
    cafile = base64.b64decode(connection["data"]["MUSTER_KAFKA_SSL_CAFILE"]).decode()
    for name, spec in _pod_specs(objs):
        container = spec["containers"][0]
        assert container["envFrom"] == [{"secretRef": {"name": connection["metadata"]["name"]}}], name
        if name != "muster-db-upgrade":
            mounts = {m["mountPath"] for m in container["volumeMounts"]}
            assert str(Path(cafile).parent) in mounts, name


def _crd_schema(objs: list[dict[str, Any]], group: str, kind: str) -> dict[str, Any]:
    crd = next(o for o in objs if o["spec"]["group"] == group and o["spec"]["names"]["kind"] == kind)
    # status is a subresource, but for Volcano's PodGroup, whose own CRD has none (status is a field)
    expected = {} if (group, kind) == ("scheduling.volcano.sh", "PodGroup") else {"status": {}}
    assert crd["spec"]["versions"][0].get("subresources", {}) == expected
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _queue_manifests() -> list[dict[str, Any]]:
    """Every Volcano/KAI Queue and ElasticQuotaTree the examples, the shared scenarios and the
    first RayJob (README, docs/operations.md) apply."""
    docs: list[Any] = list(yaml.safe_load_all((DEPLOY / "examples" / "first-rayjob.yaml").read_text()))
    for path in [*(ROOT / "examples").glob("*.yaml"), *(ROOT.parent / "shared" / "scenarios").glob("*.yaml")]:
        for step in yaml.safe_load(path.read_text()).get("steps", []):
            docs += list(yaml.safe_load_all(step.get("apply") or ""))
    return [d for d in docs if isinstance(d, dict) and d.get("kind") in ("Queue", "ElasticQuotaTree")]


def test_the_crds_accept_the_queues_users_write(rendered):
    import jsonschema

    manifests = _queue_manifests()
    assert {m["apiVersion"] for m in manifests} >= {"scheduling.volcano.sh/v1beta1", "scheduling.run.ai/v2",
                                                     "scheduling.sigs.k8s.io/v1beta1"}
    for manifest in manifests:
        group = manifest["apiVersion"].split("/")[0]
        jsonschema.validate(manifest, _crd_schema(rendered["crds"], group, manifest["kind"]))
    bad = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "q"},
           "spec": {"weight": "heavy"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, _crd_schema(rendered["crds"], "scheduling.volcano.sh", "Queue"))


def test_the_crds_hold_the_status_muster_writes(rendered):
    import jsonschema

    from tests.unit.sim.test_sim_status import run_until

    cluster = run_until("volcano-gang-queue.yaml", 60)
    checks = [("scheduling.volcano.sh", "Queue", cluster.get("Queue", None, "kuberay-test-queue")),
              ("scheduling.volcano.sh", "PodGroup", cluster.get("PodGroup", "default", "ray-test-cluster-1-pg"))]
    tree = run_until("kube-queue-quota-tree-rayjobs.yaml", 60).get("ElasticQuotaTree", "kube-system", "elasticquotatree")
    kai = run_until("kai-queues-gpu-sharing.yaml", 60).get("Queue", None, "team-a")
    checks += [("scheduling.sigs.k8s.io", "ElasticQuotaTree", tree), ("scheduling.run.ai", "Queue", kai)]
    for group, kind, obj in checks:
        assert obj["status"], kind
        jsonschema.validate(obj, _crd_schema(rendered["crds"], group, kind))


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A NetworkPolicy's podSelector (matchLabels and matchExpressions In) against a pod's labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    return all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []))


def _allowed(objs: list[dict[str, Any]], labels: dict[str, str], direction: str) -> set[str]:
    """The ports a pod with ``labels`` may use in ``direction`` (``egress``, ``ingress``) under the policies."""
    ports = set()
    for policy in (o for o in objs if o["kind"] == "NetworkPolicy"):
        if _selects(policy["spec"]["podSelector"], labels):
            for rule in policy["spec"].get(direction, []):
                ports |= {f"{p['port']}/{p.get('protocol', 'TCP')}" for p in rule.get("ports", [])}
    return ports


DNS = {"53/UDP", "53/TCP"}
SERVICE_EGRESS = DNS | {"9092/TCP", "4317/TCP", "4318/TCP"}


@pytest.mark.parametrize("which", [".", "overlays/external"])
def test_network_policies_let_each_process_reach_only_what_it_needs(rendered, which):
    """Default deny, then per process what it talks to (issue 33, exposure): the cluster link alone reaches
    the API server, the projector and the schema upgrade alone PostgreSQL, Prometheus alone the metrics port."""
    objs = rendered[which]
    deny = named(objs, "NetworkPolicy", "muster-default-deny")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    expected = {"admission": SERVICE_EGRESS, "queue": SERVICE_EGRESS, "placement": SERVICE_EGRESS,
                "reconciler": SERVICE_EGRESS, "projector": SERVICE_EGRESS | {"5432/TCP"},
                "cluster": SERVICE_EGRESS | {"443/TCP", "6443/TCP"}, "db-upgrade": DNS | {"5432/TCP"}}
    seen = {}
    for name, spec in _pod_specs(objs):
        obj = next(o for o in objs if o["kind"] in ("Deployment", "Job") and o["metadata"]["name"] == name)
        labels = obj["spec"]["template"]["metadata"]["labels"]
        if labels["app.kubernetes.io/name"] not in ("muster", "muster-db-upgrade"):
            continue  # the demo's Kafka and PostgreSQL: the next test
        process = labels.get("app.kubernetes.io/component") or spec["containers"][0]["name"]
        seen[process] = _allowed(objs, labels, "egress")
        inbound = _allowed(objs, labels, "ingress")
        assert inbound == ({"9464/TCP"} if process != "db-upgrade" else set()), (process, inbound)
    assert seen == expected


def test_the_demo_kafka_and_postgres_take_connections_from_muster_only(rendered):
    objs = rendered["overlays/demo"]
    kafka = named(objs, "NetworkPolicy", "muster-kafka")["spec"]["ingress"]
    assert kafka == [{"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "muster"}}}],
                      "ports": [{"protocol": "TCP", "port": 9092}]}]
    store = named(objs, "NetworkPolicy", "muster-postgres")["spec"]["ingress"]
    assert [f["podSelector"]["matchLabels"] for f in store[0]["from"]] == [
        {"app.kubernetes.io/name": "muster", "app.kubernetes.io/component": "projector"},
        {"app.kubernetes.io/name": "muster-db-upgrade"}]
    for name in ("muster-kafka", "muster-postgres"):
        labels = {"app.kubernetes.io/name": name}
        assert _allowed(objs, labels, "egress") == DNS


def test_the_external_overlay_gives_the_four_services_the_snapshot_key_and_no_one_else(rendered):
    """A mounted Secret the services read and a topic writer does not hold (components/snapshot-key);
    the demo runs without (its services say snapshots are off and replay their inboxes)."""
    deciders = {f"muster-{s}" for s in ("admission", "queue", "placement", "reconciler")}
    for overlay, signed in (("overlays/external", deciders), ("overlays/demo", set())):
        for name, spec in _pod_specs(rendered[overlay]):
            container = spec["containers"][0]
            env = {e["name"]: e.get("value") for e in container.get("env", ())}
            volumes = {v["name"]: v for v in spec.get("volumes", ())}
            if name in signed:
                path = Path(env["MUSTER_SNAPSHOT_KEY_FILE"])
                mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(path.parent))
                assert mount["readOnly"] is True and volumes[mount["name"]]["secret"]["secretName"] == "muster-snapshot-key"
                assert volumes[mount["name"]]["secret"]["defaultMode"] == 0o440  # readable by its group only:
                assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]  # the service's
            else:
                assert "MUSTER_SNAPSHOT_KEY_FILE" not in env and "snapshot-key" not in volumes, (overlay, name)
