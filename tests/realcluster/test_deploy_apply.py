"""deploy/k8s as a user installs it, on a real API server: server-side apply, strict field validation,
the restricted Pod Security Standard of muster's namespace, and the controllers that act on it; then
the path of README and docs/operations.md: the services run as their Deployments say, and the first RayJob is admitted and
real KubeRay's pods bound."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from shared.parts.devcluster import DevCluster
from shared.parts.localbroker import free_port
from tests.integration.test_deploy import named, render
from tests.realcluster.conftest import (DEPLOY, NAMESPACE, ROOT, create, eventually, get, install, node, probe,
                                     token_kubeconfig)


def test_deploy_k8s_passes_the_real_api_servers_validation(clean_cluster: DevCluster) -> None:
    cluster = clean_cluster
    # kubectl apply --server-side -k deploy/k8s: strict field validation (an unknown field fails it)
    done = cluster.kubectl("apply", "--server-side", "-k", str(DEPLOY))
    applied = done.stdout.splitlines()
    for kind in ("namespace/muster-system", "clusterrole.rbac.authorization.k8s.io/muster-cluster",
                 "role.rbac.authorization.k8s.io/muster-cluster-lease", "deployment.apps/muster-cluster",
                 "poddisruptionbudget.policy/muster-cluster", "job.batch/muster-db-upgrade"):
        assert any(line.startswith(f"{kind} ") for line in applied), (kind, applied)
    # the CRDs and the external overlay: dry-run on the server, once the namespace exists (a dry run
    # creates nothing, so on a fresh cluster every namespaced object of an overlay is NotFound). The
    # cluster has the peers' own CRDs, which ours must not replace; the external overlay's Job is left
    # out: a Job's pod template is immutable, and the external Secret's name differs from the demo's
    dry = ["apply", "--server-side", "--dry-run=server", "--force-conflicts", "-f", "-"]
    for which in ("crds", "overlays/external"):
        rendered = [d for d in yaml.safe_load_all(cluster.kubectl("kustomize", str(DEPLOY / which)).stdout)
                    if d and d["kind"] != "Job"]
        done = cluster.kubectl(*dry, input="\n---\n".join(yaml.safe_dump(d) for d in rendered))
        assert done.stdout.count("(server dry run)") == len(rendered), done.stdout

    # every Deployment's pods pass admission (restricted Pod Security): the ReplicaSet made them all
    deployments = get(cluster, "deployments", namespace=NAMESPACE)["items"]
    assert deployments

    def all_made() -> bool:
        made = {d["metadata"]["name"]: (d.get("status") or {}).get("replicas", 0) for d in
                get(cluster, "deployments", namespace=NAMESPACE)["items"]}
        return all(made[d["metadata"]["name"]] == d["spec"]["replicas"] for d in deployments)

    eventually(all_made, "every Deployment's pods to be created")
    refused = [e["message"] for e in get(cluster, "events", namespace=NAMESPACE)["items"]
               if e["reason"] in ("FailedCreate", "FailedCreatePodSandBox")]
    assert refused == []

    # the disruption controller took both budgets in hand
    def observed() -> bool:
        budgets = get(cluster, "poddisruptionbudgets", namespace=NAMESPACE)["items"]
        return len(budgets) == 2 and all((b.get("status") or {}).get("observedGeneration") == b["metadata"]["generation"]
                                         for b in budgets)

    eventually(observed, "the PodDisruptionBudgets to be observed")


def test_kubectl_apply_then_the_first_rayjob_is_admitted_and_its_pods_bound(
        clean_cluster: DevCluster, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    """The path of README and docs/operations.md on a real cluster: ``kubectl apply -k deploy/k8s``, each muster Deployment's
    container run as a process with the arguments and environment the Deployment gives it (KWOK runs
    no containers) and the token the API server issued to its ServiceAccount, then ``kubectl apply -f
    deploy/k8s/examples/first-rayjob.yaml``: muster admits the RayJob, real KubeRay makes its cluster
    and pods, muster binds them, and the probes answer on the ports the Deployments name."""
    cluster = clean_cluster
    install(cluster)
    create(cluster, node("n1"))
    demo = render(DEPLOY)
    policy = tmp_path / "policy.yaml"
    policy.write_text(named(demo, "ConfigMap", "muster-policy")["data"]["policy.yaml"])
    secret = next(o for o in demo if o["kind"] == "Secret")
    kubeconfig = token_kubeconfig(cluster, tmp_path / "muster-cluster.kubeconfig")  # the only one that calls it
    processes: list[subprocess.Popen[bytes]] = []
    ports: dict[str, int] = {}
    try:
        for deployment in [o for o in demo if o["kind"] == "Deployment"
                           and o["spec"]["template"]["spec"]["containers"][0]["image"].startswith("muster")]:
            name = deployment["metadata"]["name"]
            if name == "muster-projector":
                continue  # writes the history store; the admission path does not need it
            container = deployment["spec"]["template"]["spec"]["containers"][0]
            ports[name] = free_port()  # the probes' port, one per process on this one machine
            overrides = {"MUSTER_KAFKA": kafka_bootstrap, "MUSTER_TOPIC_PREFIX": topic_prefix,
                         "MUSTER_METRICS_PORT": str(ports[name]), "POD_NAMESPACE": NAMESPACE,
                         "POD_NAME": f"{name}-0"}
            if name == "muster-cluster":
                overrides["MUSTER_KUBECONFIG"] = str(kubeconfig)
            log = (tmp_path / f"{name}.log").open("ab")
            processes.append(subprocess.Popen([sys.executable, "-m", "shared.cli.main", *container["args"]],
                                              env=environment(container, secret, policy, overrides),
                                              stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))

        cluster.kubectl("apply", "-f", str(DEPLOY / "examples" / "first-rayjob.yaml"))

        def job() -> dict[str, Any]:
            return get(cluster, "rayjobs.ray.io", "hello-muster", "default") or {}

        def waiting(check: Any, what: str) -> None:
            try:
                eventually(check, what)
            except AssertionError as exc:
                tails = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(tmp_path.glob("*.log")))
                raise AssertionError(f"{exc}\n{tails}") from None

        waiting(lambda: job().get("spec", {}).get("suspend") is False, "the RayJob to be unsuspended")

        def bound() -> list[str]:  # the RayJob's cluster's pods, labelled by real KubeRay with the cluster only
            pods = get(cluster, "pods", namespace="default")["items"]
            return [p["spec"].get("nodeName", "") for p in pods
                    if p["metadata"].get("labels", {}).get("ray.io/cluster", "").startswith("hello-muster-")]

        waiting(lambda: bound() == ["n1"] * 3, "the head and both workers to be bound")
        waiting(lambda: job().get("metadata", {}).get("annotations", {}).get(
            "muster.dev/status", "").startswith("Running: "), "the Running status, once KWOK runs the pods")
        admitted = [e["message"] for e in get(cluster, "events", namespace="default")["items"]
                    if e["involvedObject"]["name"] == "hello-muster" and e["source"].get("component") == "muster"]
        assert "4/4 pods placed on 1 node(s) (binpack)" in admitted  # the head, two workers, the submitter
        lease = get(cluster, "leases", "muster-cluster", NAMESPACE)
        assert lease["spec"]["holderIdentity"] == "muster-cluster-0"
        for name, port in ports.items():  # what the Deployments' probes ask, on the port they name
            waiting(lambda port=port: probe(port, "/healthz") == 200, f"{name}'s /healthz")
            waiting(lambda port=port: probe(port, "/readyz") == 200, f"{name}'s /readyz")
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def environment(container: dict[str, Any], secret: dict[str, Any], policy: Path, overrides: dict[str, str]) -> dict[str, str]:
    """What the kubelet would give the container (literal env, the Secret's keys), for this machine."""
    env = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
    env["MUSTER_POLICY"] = str(policy) if "MUSTER_POLICY" in env else ""
    return {**{k: v for k, v in os.environ.items()}, **{k: v for k, v in env.items() if v}, **overrides,
            "PYTHONUNBUFFERED": "1"}
