"""The real-cluster tier: muster's deployment against a real API server (``shared.parts.devcluster``).

Helpers shared by the tests here: installing ``deploy/k8s`` by server-side apply, a kubeconfig with
the token the API server issues to muster's ServiceAccount (TokenRequest, as a pod's projected token
is), KWOK nodes, and waiting for the cluster to reach a state. Every test uses the session's cluster
(``devcluster``), emptied first (``clean_cluster`` or ``DevCluster.reset``).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from shared.parts import kwok
from shared.parts.devcluster import DevCluster
from tests.conftest import eventually as shared_eventually

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "k8s"
NAMESPACE = "muster-system"
ACCOUNT = "muster-cluster"
USER = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
"""How the API server names muster's ServiceAccount when it authorizes its requests."""


def install(cluster: DevCluster, *, services: bool = False) -> None:
    """``kubectl apply --server-side -k deploy/k8s`` (the demo overlay: namespace, ServiceAccounts, RBAC,
    Deployments, PDBs, the migration Job). KWOK runs no containers, so unless ``services`` the
    Deployments are scaled to none and the Job removed: their pods would take KWOK nodes' capacity
    from the workloads a test schedules (the services run as processes beside the cluster)."""
    cluster.kubectl("apply", "--server-side", "-k", str(DEPLOY))
    if not services:
        cluster.kubectl("scale", "deployment", "--all", "--replicas=0", "-n", NAMESPACE)
        cluster.kubectl("delete", "job", "--all", "-n", NAMESPACE, "--wait=false")


def token_kubeconfig(cluster: DevCluster, path: Path, *, seconds: int = 3600) -> Path:
    """A kubeconfig holding a token the API server issued to muster's ServiceAccount (TokenRequest:
    ``kubectl create token``), so every request it makes goes through the real RBAC authorizer."""
    token = cluster.kubectl("create", "token", ACCOUNT, "-n", NAMESPACE, f"--duration={seconds}s").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "muster",
              "clusters": admin["clusters"],
              "users": [{"name": ACCOUNT, "user": {"token": token}}],
              "contexts": [{"name": "muster", "context": {"cluster": admin["clusters"][0]["name"], "user": ACCOUNT,
                                                          "namespace": NAMESPACE}}]}
    path.write_text(yaml.safe_dump(config))
    return path


def create(cluster: DevCluster, *objects: dict[str, Any]) -> None:
    """Create (server-side apply, as the admin) the given objects."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                    input="\n---\n".join(yaml.safe_dump(o) for o in objects))


def node(name: str, cpu: str = "16", memory: str = "64Gi") -> dict[str, Any]:
    """A KWOK node of this capacity (KWOK keeps it Ready and runs the pods bound to it)."""
    return kwok.node(name, {"cpu": cpu, "memory": memory})


def get(cluster: DevCluster, resource: str, name: str = "", namespace: str = "") -> Any:
    """The object (or list) as JSON, None when it does not exist."""
    args = ["get", resource, *([name] if name else []), "-o", "json"]
    if namespace:
        args += ["-n", namespace]
    done = cluster.kubectl(*args, check=False)
    if done.returncode != 0:
        if "NotFound" in done.stderr:
            return None
        raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return json.loads(done.stdout)


eventually = partial(shared_eventually, timeout=60.0, every=0.2)
"""``tests.conftest.eventually`` with a real cluster's patience (its controllers take longer than the emulator)."""


def can_i(cluster: DevCluster, verb: str, resource: str, group: str = "", namespace: str = "") -> bool:
    """``kubectl auth can-i VERB RESOURCE --as`` muster's ServiceAccount: what RBAC allows it now
    (``resource`` may name a subresource: ``pods/binding``)."""
    plural, _, sub = resource.partition("/")
    args = ["auth", "can-i", verb, f"{plural}.{group}" if group else plural, f"--as={USER}"]
    args += [f"--subresource={sub}"] if sub else []
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    return cluster.kubectl(*args, check=False).stdout.strip() == "yes"


def probe(port: int, path: str) -> int:
    """The status code of GET http://127.0.0.1:PORT/PATH (0 when nothing answers): a Deployment's probes."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0
