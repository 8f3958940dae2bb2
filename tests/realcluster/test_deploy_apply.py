"""deploy/k8s as a user installs it, on a real API server: server-side apply, strict field validation,
the restricted Pod Security Standard of muster's namespace, and the controllers that act on it."""

from __future__ import annotations

import yaml

from shared.parts.devcluster import DevCluster
from tests.realcluster.conftest import DEPLOY, NAMESPACE, eventually, get


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
