"""The cluster link's requests against the real API server, where tests/kubeapi.py once answered:
effects on workloads, queues and pods (bindings, evictions with a PodDisruptionBudget or a terminating
victim in the way), status written where the CRD keeps it, Events, refusals by the real authorizer,
lists and watches. docs/design/runtime.md, "What the real API server taught us", lists what differed.

The module empties the session's cluster once and gives it two nodes; each test works in a namespace
of its own (and names its cluster-scoped objects after it), so no test waits for a reset.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import time
from typing import Any, Iterator

import pytest
from shared.kernel.events import kube_effect
from shared.kubernetes.cluster import ClusterBridge, KubeTarget
from shared.kubernetes.cluster_watch import WatchProcess
from shared.kubernetes.kubeapi import SELECTED_NODE, KubeApplier, Refused, Watcher, connect
from shared.kubernetes.resources import NODE, POD, VOLCANO_POD_GROUP, VOLCANO_QUEUE, Resource
from shared.parts import catalog
from shared.parts.devcluster import DevCluster
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.topics import Topics
from tests.kubeapi import MALFORMED_BINDINGS, post_binding
from tests.realcluster.conftest import create, eventually, get, node

VOLCANO = "scheduling.volcano.sh/v1beta1"
KAI = "scheduling.run.ai/v2"
HELD = ("h1", "h2")
"""Nodes KWOK does not manage (no ``kwok.x-k8s.io/node`` annotation): an evicted pod there stays
terminating, as on a node whose kubelet has not yet stopped it, until the test deletes it (the kubelet's
part; on KWOK's nodes it goes at once)."""
_numbers = itertools.count(1)


@pytest.fixture(scope="module")
def cluster(devcluster: DevCluster) -> DevCluster:
    devcluster.reset()
    if devcluster.batch_scheduler != "none":
        devcluster.start_kuberay("none")
    devcluster.kube_scheduler(True)
    create(devcluster, node("n1"), node("n2"), node("n3"),
           *({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}} for name in HELD))
    return devcluster


class Link:
    """The applier and watcher on a loop of this test's own, as the admin (RBAC is test_rbac.py's), and
    the test's namespace (``ns``)."""

    def __init__(self, cluster: DevCluster, ns: str, kubeconfig: str = "") -> None:
        self.cluster = cluster
        self.ns = ns
        self.loop = asyncio.new_event_loop()
        self.api = self.run(connect(kubeconfig=kubeconfig or str(cluster.kubeconfig)))
        self.applier = KubeApplier(self.api, victim_wait=1.0, status_interval=0.0)
        self.watcher = Watcher(self.api, watch_timeout=2)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.run(self.api.close())
        self.loop.close()

    def apply(self, op: str, kind: str, name: str, namespace: str | None = None, **fields: Any) -> str:
        ns = self.ns if namespace is None else namespace
        return str(self.run(self.applier.apply(kube_effect(op=op, kind=kind, namespace=ns, name=name, **fields),
                                               f"{op}-{name}-{fields.get('node', '')}")))

    def pod(self, name: str, labels: dict[str, str] | None = None, *, node: str = "") -> dict[str, Any]:
        """A pod muster schedules, bound to ``node`` from its creation when given (as a kubelet's own)."""
        spec: dict[str, Any] = {"schedulerName": "muster", "containers": [{"name": "c", "image": "busybox"}]}
        if node:
            spec["nodeName"] = node
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": self.ns,
                                                                "labels": labels or {}}, "spec": spec}

    def ray_cluster(self, name: str) -> dict[str, Any]:
        """A suspended RayCluster (real KubeRay makes no pods for it) with an annotation of its user's."""
        head = {"rayStartParams": {}, "template": {"spec": {"schedulerName": "muster", "containers": [
            {"name": "ray-head", "image": "rayproject/ray:2.9.0"}]}}}
        return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
                "metadata": {"name": name, "namespace": self.ns, "annotations": {"keep": "me"}},
                "spec": {"suspend": True, "headGroupSpec": head}}

    def release(self, name: str) -> None:
        """A terminating pod on a node of ``HELD`` goes (its kubelet's final delete)."""
        self.cluster.kubectl("delete", "pod", name, "-n", self.ns, "--grace-period=0", "--force", "--wait=true")


@pytest.fixture
def link(cluster: DevCluster) -> Iterator[Link]:
    ns = f"api-{next(_numbers)}"
    cluster.kubectl("create", "namespace", ns)
    one = Link(cluster, ns)
    try:
        yield one
    finally:
        one.close()
        cluster.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", "--wait=false")
        cluster.kubectl("delete", "namespace", ns, "--wait=false")


def volcano_queue(name: str) -> dict[str, Any]:
    return {"apiVersion": VOLCANO, "kind": "Queue", "metadata": {"name": name}, "spec": {"weight": 1}}


# --------------------------------------------------------------------------- workloads and queues
def test_a_workload_is_unsuspended_and_annotated_and_the_same_effects_again_change_nothing(link: Link) -> None:
    create(link.cluster, link.ray_cluster("rc"))
    assert link.apply("unsuspend", "", "rc") == "applied"  # found by namespace and name among the workload kinds
    assert link.apply("annotate", "RayCluster", "rc", annotations={"muster.dev/queue": "q"}) == "applied"
    live = get(link.cluster, "rayclusters.ray.io", "rc", link.ns)
    assert live["spec"]["suspend"] is False
    assert live["metadata"]["annotations"] == {"keep": "me", "muster.dev/queue": "q"}
    generation = live["metadata"]["generation"]
    assert link.apply("unsuspend", "RayCluster", "rc") == "applied"
    assert get(link.cluster, "rayclusters.ray.io", "rc", link.ns)["metadata"]["generation"] == generation
    # an object no controller writes: the same annotation again leaves even its resourceVersion
    queue = f"{link.ns}-q"
    create(link.cluster, volcano_queue(queue))
    assert link.apply("annotate", "Queue", queue, "", annotations={"a": "b"}) == "applied"
    version = get(link.cluster, "queues.scheduling.volcano.sh", queue)["metadata"]["resourceVersion"]
    assert link.apply("annotate", "Queue", queue, "", annotations={"a": "b"}) == "applied"
    assert get(link.cluster, "queues.scheduling.volcano.sh", queue)["metadata"]["resourceVersion"] == version


def test_a_cluster_scoped_queue_is_annotated_in_its_group_and_its_events_go_to_the_default_namespace(
        link: Link) -> None:
    queue = f"{link.ns}-kai"
    create(link.cluster, {"apiVersion": KAI, "kind": "Queue", "metadata": {"name": queue}, "spec": {}})
    assert link.apply("annotate", "Queue", queue, "", annotations={"muster.dev/status": "Rejected: bad"}) == "applied"
    assert get(link.cluster, "queues.scheduling.run.ai", queue)["metadata"]["annotations"] == {
        "muster.dev/status": "Rejected: bad"}
    assert link.apply("event", "Queue", queue, "", reason="Rejected", message="bad", event_type="Warning") == "applied"
    (event,) = [e for e in get(link.cluster, "events", namespace="default")["items"]
                if e["involvedObject"]["name"] == queue]
    assert event["involvedObject"]["kind"] == "Queue" and "namespace" not in event["involvedObject"]


def test_effects_on_objects_that_are_not_there_are_absent_not_errors(link: Link) -> None:
    assert [link.apply("unsuspend", "", "gone"), link.apply("bind", "Pod", "gone", node="n1"),
            link.apply("annotate", "RayJob", "gone", annotations={"a": "b"}),
            link.apply("evict", "Pod", "gone")] == ["absent"] * 4


def test_a_refusal_by_the_authorizer_names_the_request_and_the_status(link: Link) -> None:
    create(link.cluster, link.ray_cluster("rc"))
    nobody = Link(link.cluster, link.ns, str(link.cluster.client(f"nobody-{link.ns}", groups=())))
    try:
        with pytest.raises(Refused, match=rf"unsuspend RayCluster {link.ns}/rc: 403 Forbidden"):
            nobody.apply("unsuspend", "RayCluster", "rc")
    finally:
        nobody.close()
    assert get(link.cluster, "rayclusters.ray.io", "rc", link.ns)["spec"]["suspend"] is True


# --------------------------------------------------------------------------- bindings and evictions
def test_a_binding_sets_the_node_and_annotations_once_and_a_second_is_unchanged_or_a_conflict(link: Link) -> None:
    create(link.cluster, link.pod("p"))
    assert link.apply("bind", "Pod", "p", node="n1", annotations={"gpu-fraction": "0.5"}) == "applied"
    bound = get(link.cluster, "pods", "p", link.ns)
    assert bound["spec"]["nodeName"] == "n1" and bound["metadata"]["annotations"]["gpu-fraction"] == "0.5"
    assert link.apply("bind", "Pod", "p", node="n1") == "unchanged"   # the server's 409, then a read
    assert link.apply("bind", "Pod", "p", node="n2") == "conflict"
    assert get(link.cluster, "pods", "p", link.ns)["spec"]["nodeName"] == "n1"


def _watch(link: Link, resource: str) -> subprocess.Popen[str]:
    """``kubectl get --watch`` of a resource in the test's namespace, every version as one JSON line."""
    return subprocess.Popen([catalog.binary("kubernetes", "kubectl"), "--kubeconfig", str(link.cluster.kubeconfig),
                             "get", resource, "-n", link.ns, "--watch", "--output-watch-events", "-o", "json"],
                            stdout=subprocess.PIPE, text=True)


def _versions(watch: subprocess.Popen[str]) -> list[dict[str, Any]]:
    watch.terminate()
    out, _ = watch.communicate(timeout=10)
    return [event["object"] for event in map(json.loads, _json_documents(out))]


def _json_documents(text: str) -> list[str]:
    """``kubectl -o json --watch`` writes pretty-printed documents one after another."""
    decoder, at, docs = json.JSONDecoder(), 0, []
    while (at := text.find("{", at)) != -1:
        obj, end = decoder.raw_decode(text, at)
        docs.append(text[at:end])
        at = end
    return docs


def test_a_pods_delayed_claims_are_given_its_node_before_it_is_bound(link: Link) -> None:
    """VolumeBinding's PreBind on the real API server: the named claim and the one kube-controller-manager's
    ephemeral volume controller makes for the pod get ``volume.kubernetes.io/selected-node`` before the
    binding (etcd's revisions order the versions both watches saw); a claim given another node stops the bind."""
    wffc = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": f"wffc-{link.ns}"},
            "provisioner": "example.com/none", "volumeBindingMode": "WaitForFirstConsumer"}
    def claim(name: str, **annotations: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "namespace": link.ns, "annotations": annotations},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                         "storageClassName": wffc["metadata"]["name"]}}
    pod = link.pod("p")
    pod["spec"]["volumes"] = [
        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": claim("x")["spec"]}}}]
    create(link.cluster, wffc, claim("data"), pod)
    try:
        made = eventually(lambda: get(link.cluster, "pvc", "p-scratch", link.ns), "the ephemeral volume controller's claim")
        assert made["metadata"]["ownerReferences"][0]["name"] == "p"
        claims, pods = _watch(link, "persistentvolumeclaims"), _watch(link, "pods")
        time.sleep(1.0)  # both watches open
        assert link.apply("bind", "Pod", "p", node="n1", claims=("data", "p-scratch")) == "applied"
        eventually(lambda: get(link.cluster, "pods", "p", link.ns)["spec"].get("nodeName") == "n1", "the binding")
        time.sleep(1.0)
        claim_versions, pod_versions = _versions(claims), _versions(pods)
        bound_at = min(int(p["metadata"]["resourceVersion"]) for p in pod_versions if p["spec"].get("nodeName"))
        for name in ("data", "p-scratch"):
            given = [int(c["metadata"]["resourceVersion"]) for c in claim_versions if c["metadata"]["name"] == name
                     and (c["metadata"].get("annotations") or {}).get(SELECTED_NODE) == "n1"]
            assert given and min(given) < bound_at, name
        # the same effect again changes nothing; a claim given another node stops a bind there
        assert link.apply("bind", "Pod", "p", node="n1", claims=("data", "p-scratch")) == "unchanged"
        create(link.cluster, claim("elsewhere", **{SELECTED_NODE: "n2"}), link.pod("q"))
        assert link.apply("bind", "Pod", "q", node="n1", claims=("elsewhere",)) == "conflict"
        assert link.apply("bind", "Pod", "q", node="n1", claims=("missing",)) == "conflict"
        assert not get(link.cluster, "pods", "q", link.ns)["spec"].get("nodeName")
    finally:
        link.cluster.kubectl("delete", "storageclass", wffc["metadata"]["name"], "--wait=false")


def test_a_bind_without_a_node_is_refused_before_it_is_sent(link: Link) -> None:
    """The server would answer 500 (below), which the link retries as an outage, for ever."""
    create(link.cluster, link.pod("p"))
    with pytest.raises(Refused, match=rf"bind Pod {link.ns}/p: no node to bind it to"):
        link.apply("bind", "Pod", "p", node="")
    assert "nodeName" not in get(link.cluster, "pods", "p", link.ns)["spec"]


def test_malformed_bindings_are_refused_with_the_codes_the_emulator_gives(link: Link) -> None:
    """tests/kubeapi.py validates a Binding so that a malformed one cannot pass the fast tests
    (test_kubeapi.py sends it these bodies); these are the real server's answers it must give. A
    Binding whose target is not a named node is a 500, not a 422: ``BindingREST.Create``
    (pkg/registry/core/pod/storage/storage.go) returns ``ValidatePodBinding``'s errors as an aggregate,
    which is no API status."""
    create(link.cluster, link.pod("p"))
    assert [link.run(post_binding(link.api, link.ns, body)) for body, _ in MALFORMED_BINDINGS] == \
        [code for _, code in MALFORMED_BINDINGS]
    assert "nodeName" not in get(link.cluster, "pods", "p", link.ns)["spec"]


def test_an_eviction_a_disruption_budget_forbids_is_refused_with_its_reason_not_retried(link: Link) -> None:
    create(link.cluster, link.pod("guarded", {"app": "db"}), {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "db", "namespace": link.ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}})
    assert link.apply("bind", "Pod", "guarded", node="n1") == "applied"
    eventually(lambda: get(link.cluster, "pods", "guarded", link.ns)["status"].get("conditions") and all(
        c["status"] == "True" for c in get(link.cluster, "pods", "guarded", link.ns)["status"]["conditions"]
        if c["type"] == "Ready"), "KWOK to make the pod Ready")
    eventually(lambda: (get(link.cluster, "pdb", "db", link.ns).get("status") or {}).get("currentHealthy") == 1,
               "the disruption controller to count the pod")
    with pytest.raises(Refused, match="disruption budget"):
        link.apply("evict", "Pod", "guarded")
    assert get(link.cluster, "pods", "guarded", link.ns) is not None
    assert not link.applier.leaving  # a bind to n1 does not wait for a pod that stays
    # without a budget in the way the same effect evicts it
    link.cluster.kubectl("delete", "pdb", "db", "-n", link.ns)
    assert link.apply("evict", "Pod", "guarded") == "applied"


def test_a_bind_waits_until_the_pods_evicted_from_its_node_are_gone(link: Link) -> None:
    create(link.cluster, link.pod("victim", node="h1"), link.pod("elsewhere", node="h2"),
           link.pod("preemptor"))
    link.applier.victim_wait = 60.0
    order: list[str] = []

    async def work() -> None:
        async def sink(change: str, obj: dict[str, Any]) -> None:
            if change == "Deleted" and obj["metadata"]["namespace"] == link.ns:
                order.append(f"gone {obj['metadata']['name']}")
                await link.applier.pod_gone(link.ns, obj["metadata"]["name"])

        watching = asyncio.create_task(link.watcher.run(POD, sink))
        try:
            for name in ("victim", "elsewhere"):
                await link.applier.apply(kube_effect("evict", "Pod", link.ns, name), f"evict-{name}")
            binding = asyncio.create_task(link.applier.apply(kube_effect("bind", "Pod", link.ns, "preemptor",
                                                                         node="h1"), "bind"))
            await asyncio.sleep(1.0)
            assert not binding.done()  # the victim is still terminating on h1
            held = await asyncio.to_thread(get, link.cluster, "pods", "victim", link.ns)
            assert held["metadata"]["deletionTimestamp"]
            await asyncio.to_thread(link.release, "victim")
            order.append(await asyncio.wait_for(binding, 30))
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)

    link.run(work())
    assert order == ["gone victim", "applied"]
    assert get(link.cluster, "pods", "preemptor", link.ns)["spec"]["nodeName"] == "h1"


def test_a_bind_asks_the_server_when_no_deletion_was_seen(link: Link) -> None:
    create(link.cluster, link.pod("victim", node="n1"), link.pod("preemptor"))
    link.applier.victim_wait = 0.2  # nobody tells it the victim went
    assert link.apply("evict", "Pod", "victim") == "applied"
    eventually(lambda: get(link.cluster, "pods", "victim", link.ns) is None, "KWOK to delete the evicted pod")
    assert link.apply("bind", "Pod", "preemptor", node="n1") == "applied"
    assert link.applier.leaving == {}


def test_an_evicted_pod_a_list_lacks_is_forgotten_when_the_server_says_it_is_gone(link: Link) -> None:
    """A deletion no watch saw (the link's watcher started again, which lists only what exists): after
    the next list of pods the link asks the server about each evicted pod, so ``leaving`` holds pods
    that exist, not every deletion ever missed. One evicted after the list was taken is still there,
    terminating, and stays."""
    create(link.cluster, link.pod("victim", node="h1"), link.pod("late", node="h2"), link.pod("bystander", node="n3"))
    bridge = ClusterBridge(Topics())  # the applying process's, and the watching process's below
    bridge.applier = link.applier
    parent = WatchProcess(BusConfig(bootstrap="unused:9092"), KubeTarget(kubeconfig=str(link.cluster.kubeconfig)),
                          bridge)

    async def line() -> None:  # what the watching process's hook says, taken as the parent takes it
        await parent.take(json.loads(json.dumps({"pods_listed": True})))

    bridge.on_pods_listed = line
    for name in ("victim", "late"):
        assert link.apply("evict", "Pod", name) == "applied"
    assert set(link.applier.leaving) == {"h1", "h2"}
    link.release("victim")  # nobody tells the applier
    eventually(lambda: get(link.cluster, "pods", "victim", link.ns) is None, "the released pod to go")
    link.run(bridge.inventory(POD, "9", [link.pod("bystander", node="n3")]))  # the list lacks both
    assert link.applier.leaving == {"h2": {(link.ns, "late")}}


# --------------------------------------------------------------------------- status
def test_status_goes_through_the_subresource_and_touches_only_musters_fields(link: Link) -> None:
    queue = f"{link.ns}-research"
    create(link.cluster, volcano_queue(queue))
    link.cluster.kubectl("patch", "queues.scheduling.volcano.sh", queue, "--subresource=status", "--type=merge",
                         "-p", '{"status": {"state": "Open", "allocated": {}, "reservation": {"nodes": ["n9"]}}}')
    status = {"state": "Open", "pending": 2, "inqueue": 1, "running": 0, "allocated": {"cpu": "3"}}
    assert link.apply("status", "Queue", queue, "", api_version=VOLCANO, status=status) == "applied"
    live = get(link.cluster, "queues.scheduling.volcano.sh", queue)
    assert live["status"] == {**status, "reservation": {"nodes": ["n9"]}}  # another controller's field stays
    assert live["spec"]["weight"] == 1
    assert link.applier._status_served[VOLCANO_QUEUE] is True
    version = live["metadata"]["resourceVersion"]
    assert link.apply("status", "Queue", queue, "", api_version=VOLCANO, status=status) == "applied"
    assert get(link.cluster, "queues.scheduling.volcano.sh", queue)["metadata"]["resourceVersion"] == version
    # an annotation is a patch of the object itself, and the server keeps its status out of it
    assert link.apply("annotate", "Queue", queue, "", annotations={"a": "b"}) == "applied"
    assert get(link.cluster, "queues.scheduling.volcano.sh", queue)["status"] == live["status"]


def test_status_of_a_kai_queue_is_not_written_to_a_volcano_queue_of_the_same_name(link: Link) -> None:
    queue = f"{link.ns}-team"
    create(link.cluster, volcano_queue(queue))
    assert link.apply("status", "Queue", queue, "", api_version=KAI, status={"allocated": {"cpu": "1"}}) == "absent"
    assert "allocated" not in (get(link.cluster, "queues.scheduling.volcano.sh", queue).get("status") or {})


def test_a_volcano_podgroups_status_is_written_on_the_object_in_one_request(link: Link) -> None:
    create(link.cluster, {"apiVersion": VOLCANO, "kind": "PodGroup",
                          "metadata": {"name": "ray-rc-pg", "namespace": link.ns}, "spec": {"minMember": 1}})
    status = {"phase": "Inqueue", "conditions": [{"type": "Scheduled", "status": "True", "reason": "r",
                                                  "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    assert link.apply("status", "PodGroup", "ray-rc-pg", api_version=VOLCANO_POD_GROUP.api_version,
                      status=status) == "applied"
    assert get(link.cluster, "podgroups.scheduling.volcano.sh", "ray-rc-pg", link.ns)["status"]["phase"] == "Inqueue"
    assert link.applier._status_served[VOLCANO_POD_GROUP] is False  # Volcano's CRD: no status subresource
    assert link.apply("status", "PodGroup", "nope", api_version=VOLCANO_POD_GROUP.api_version,
                      status=status) == "absent"


def test_events_are_named_after_their_effect_so_a_redelivery_adds_none(link: Link) -> None:
    create(link.cluster, link.pod("p"))
    effect = {"reason": "Waiting", "message": "queue research is full", "event_type": "Normal"}
    assert link.apply("event", "Pod", "p", **effect) == "applied"
    assert link.apply("event", "Pod", "p", **effect) == "unchanged"
    events = [e for e in get(link.cluster, "events", namespace=link.ns)["items"] if e["reason"] == "Waiting"]
    assert len(events) == 1 and events[0]["involvedObject"]["name"] == "p" and events[0]["source"]["component"] == "muster"


# --------------------------------------------------------------------------- lists and watches
def test_list_then_watch_reports_adds_changes_and_deletes_and_list_items_get_their_kind(link: Link) -> None:
    """The server sends a list's items without kind and apiVersion; the watcher gives them the resource's."""
    mine = {f"{link.ns}-a", f"{link.ns}-b"}
    create(link.cluster, node(f"{link.ns}-a"))
    seen: list[tuple[str, str, str, str]] = []

    async def sink(change: str, obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"] in mine:
            seen.append((change, obj["kind"], obj["apiVersion"], obj["metadata"]["name"]))

    async def work() -> None:
        task = asyncio.create_task(link.watcher.run(NODE, sink))
        try:
            while len(seen) < 1:
                await asyncio.sleep(0.05)
            await asyncio.to_thread(create, link.cluster, node(f"{link.ns}-b"))
            await asyncio.to_thread(link.cluster.kubectl, "label", "node", f"{link.ns}-a", "seen=yes")
            await asyncio.to_thread(link.cluster.kubectl, "delete", "node", f"{link.ns}-b")
            while not any(change == "Deleted" for change, *_ in seen):
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    link.run(asyncio.wait_for(work(), 60))
    assert seen[0] == ("Added", "Node", "v1", f"{link.ns}-a")  # from the list
    changes = [(change, name) for change, _, _, name in seen[1:]]
    assert ("Added", f"{link.ns}-b") in changes and ("Modified", f"{link.ns}-a") in changes
    assert changes[-1] == ("Deleted", f"{link.ns}-b")
    assert {(kind, version) for _, kind, version, _ in seen} == {("Node", "v1")}


def test_a_resource_the_cluster_does_not_serve_is_retried_quietly_and_never_listed(link: Link) -> None:
    """A 404 is no list: a CRD briefly not served must not make every object of it look deleted."""
    widgets = Resource("Widget", "example.muster.dev", "v1", "widgets", namespaced=True)
    reported: list[str] = []

    async def sink(change: str, obj: dict[str, Any]) -> None:
        reported.append(change)

    async def inventory(resource: Resource, version: str, objects: list[dict[str, Any]]) -> None:
        reported.append("listed")

    async def work() -> None:
        watcher = Watcher(link.api, absent_retry=0.1)
        task = asyncio.create_task(watcher.run(widgets, sink, inventory=inventory))
        while watcher.lists < 4:
            await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    link.run(asyncio.wait_for(work(), 30))
    assert reported == []


def test_a_watch_from_a_version_the_watch_cache_still_holds_replays_instead_of_expiring(link: Link) -> None:
    """The emulator answered 410 for any version older than its ``compact()``; the real API server serves
    a watch from its watch cache, which holds every event since it started (at least 75 s of them,
    k8s.io/apiserver pkg/storage/cacher/watch_cache.go): an old version is replayed, not expired, even
    after etcd compacted it. A 410 comes only for versions the cache dropped (or with no cache: the
    watcher's relist on a real 410 is test_watch_expiry.py's). What muster relies on here: the replay brings the
    objects made since, and the watcher, started afresh, lists them."""
    create(link.cluster, link.pod("before"))
    seen: list[tuple[str, str]] = []

    async def sink(change: str, obj: dict[str, Any]) -> None:
        if obj["metadata"]["namespace"] == link.ns:
            seen.append((change, obj["metadata"]["name"]))

    link.run(link.watcher._watch(POD, "2", {}, sink))  # ends at the watch's timeout (2 s), no 410
    assert ("Added", "before") in seen
    seen.clear()
    create(link.cluster, link.pod("after"))

    async def run_until_listed() -> None:
        task = asyncio.ensure_future(link.watcher.run(POD, sink))
        try:
            while not {("Added", "before"), ("Added", "after")} <= set(seen):
                await asyncio.sleep(0.05)
        finally:
            task.cancel()

    link.run(asyncio.wait_for(run_until_listed(), 30))
    assert link.watcher.lists == 1
