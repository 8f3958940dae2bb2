"""The cluster link's requests against the real API server, where tests/kubeapi.py once answered:
bindings, evictions with a PodDisruptionBudget in the way, status written where the CRD keeps it,
Events, and a watch from an old version. docs/design.md "What the real API server
taught us" lists what differed."""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import pytest

from services.reconciler.kubeapi import KubeApplier, Refused, Watcher, connect
from services.reconciler.resources import POD, VOLCANO_POD_GROUP
from shared.events import kube_effect
from shared.parts.devcluster import DevCluster
from tests.realcluster.conftest import create, eventually, get, node


class Link:
    """The applier and watcher on a loop of this test's own, as the admin (RBAC is test_rbac.py's)."""

    def __init__(self, cluster: DevCluster) -> None:
        self.loop = asyncio.new_event_loop()
        self.api = self.run(connect(kubeconfig=str(cluster.kubeconfig)))
        self.applier = KubeApplier(self.api, victim_wait=1.0, status_interval=0.0)
        self.watcher = Watcher(self.api, watch_timeout=2)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def apply(self, op: str, kind: str, name: str, namespace: str = "team-a", **fields: Any) -> str:
        return str(self.run(self.applier.apply(kube_effect(op=op, kind=kind, namespace=namespace, name=name, **fields),
                                               f"{op}-{name}-{fields.get('node', '')}")))


@pytest.fixture
def link(clean_cluster: DevCluster) -> Iterator[Link]:
    clean_cluster.kubectl("create", "namespace", "team-a")
    create(clean_cluster, node("n1"), node("n2"))
    one = Link(clean_cluster)
    try:
        yield one
    finally:
        one.run(one.api.close())
        one.loop.close()


def pod(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team-a", "labels": labels or {}},
            "spec": {"schedulerName": "muster", "containers": [{"name": "c", "image": "busybox"}]}}


def test_a_binding_sets_the_node_and_annotations_once_and_a_second_is_unchanged_or_a_conflict(
        clean_cluster: DevCluster, link: Link) -> None:
    create(clean_cluster, pod("p"))
    assert link.apply("bind", "Pod", "p", node="n1", annotations={"gpu-fraction": "0.5"}) == "applied"
    bound = get(clean_cluster, "pods", "p", "team-a")
    assert bound["spec"]["nodeName"] == "n1" and bound["metadata"]["annotations"]["gpu-fraction"] == "0.5"
    assert link.apply("bind", "Pod", "p", node="n1") == "unchanged"   # the server's 409, then a read
    assert link.apply("bind", "Pod", "p", node="n2") == "conflict"
    assert link.apply("bind", "Pod", "gone", node="n1") == "absent"


def test_an_eviction_a_disruption_budget_forbids_is_refused_with_its_reason_not_retried(
        clean_cluster: DevCluster, link: Link) -> None:
    create(clean_cluster, pod("guarded", {"app": "db"}), {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "db", "namespace": "team-a"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}})
    assert link.apply("bind", "Pod", "guarded", node="n1") == "applied"
    eventually(lambda: get(clean_cluster, "pods", "guarded", "team-a")["status"].get("conditions") and all(
        c["status"] == "True" for c in get(clean_cluster, "pods", "guarded", "team-a")["status"]["conditions"]
        if c["type"] == "Ready"), "KWOK to make the pod Ready")
    eventually(lambda: (get(clean_cluster, "pdb", "db", "team-a").get("status") or {}).get("currentHealthy") == 1,
               "the disruption controller to count the pod")
    with pytest.raises(Refused, match="disruption budget"):
        link.apply("evict", "Pod", "guarded")
    assert get(clean_cluster, "pods", "guarded", "team-a") is not None
    assert not link.applier.leaving  # a bind to n1 does not wait for a pod that stays
    # without a budget in the way the same effect evicts it
    clean_cluster.kubectl("delete", "pdb", "db", "-n", "team-a")
    assert link.apply("evict", "Pod", "guarded") == "applied"


def test_a_volcano_podgroups_status_is_written_on_the_object_in_one_request(
        clean_cluster: DevCluster, link: Link) -> None:
    create(clean_cluster, {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                           "metadata": {"name": "ray-rc-pg", "namespace": "team-a"}, "spec": {"minMember": 1}})
    status = {"phase": "Inqueue", "conditions": [{"type": "Scheduled", "status": "True", "reason": "r",
                                                  "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    assert link.apply("status", "PodGroup", "ray-rc-pg", api_version=VOLCANO_POD_GROUP.api_version,
                      status=status) == "applied"
    assert get(clean_cluster, "podgroups.scheduling.volcano.sh", "ray-rc-pg", "team-a")["status"]["phase"] == "Inqueue"
    assert link.applier._status_served[VOLCANO_POD_GROUP] is False  # Volcano's CRD: no status subresource
    assert link.apply("status", "PodGroup", "nope", api_version=VOLCANO_POD_GROUP.api_version,
                      status=status) == "absent"


def test_events_are_named_after_their_effect_so_a_redelivery_adds_none(clean_cluster: DevCluster, link: Link) -> None:
    create(clean_cluster, pod("p"))
    effect = {"reason": "Waiting", "message": "queue research is full", "event_type": "Normal"}
    assert link.apply("event", "Pod", "p", **effect) == "applied"
    assert link.apply("event", "Pod", "p", **effect) == "unchanged"
    events = [e for e in get(clean_cluster, "events", namespace="team-a")["items"] if e["reason"] == "Waiting"]
    assert len(events) == 1 and events[0]["involvedObject"]["name"] == "p" and events[0]["source"]["component"] == "muster"


def test_a_watch_from_a_version_the_watch_cache_still_holds_replays_instead_of_expiring(
        clean_cluster: DevCluster, link: Link) -> None:
    """The emulator answered 410 for any version older than its ``compact()``; the real API server serves
    a watch from its watch cache, which holds every event since it started (at least 75 s of them,
    k8s.io/apiserver pkg/storage/cacher/watch_cache.go): an old version is replayed, not expired, even
    after etcd compacted it. A 410 comes only for versions the cache dropped (or with no cache: the
    watcher's relist on a real 410 is test_watch_expiry.py's). What muster relies on here: the replay brings the
    objects made since, and the watcher, started afresh, lists them."""
    create(clean_cluster, pod("before"))
    seen: list[tuple[str, str]] = []

    async def sink(change: str, obj: dict[str, Any]) -> None:
        seen.append((change, obj["metadata"]["name"]))

    link.run(link.watcher._watch(POD, "2", {}, sink))  # ends at the watch's timeout (2 s), no 410
    assert ("Added", "before") in seen
    seen.clear()
    create(clean_cluster, pod("after"))

    async def run_until_listed() -> None:
        task = asyncio.ensure_future(link.watcher.run(POD, sink))
        try:
            while not {("Added", "before"), ("Added", "after")} <= set(seen):
                await asyncio.sleep(0.05)
        finally:
            task.cancel()

    link.run(asyncio.wait_for(run_until_listed(), 30))
    assert link.watcher.lists == 1
