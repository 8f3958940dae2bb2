"""The cluster adapter over real HTTP: kubernetes-asyncio against the API emulator (tests/kubeapi.py)."""

from __future__ import annotations

import asyncio
import gc
import json
from typing import Any, Awaitable, Callable, TypeVar

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from services.reconciler.kubeapi import KubeApplier, Refused, Transient, Watcher, checked, connect
from services.reconciler.resources import NODE, POD, RAY_CLUSTER, VOLCANO_QUEUE, Resource
from shared.bus.cluster import ClusterBridge, KubeTarget
from shared.bus.cluster_watch import WatchProcess
from shared.bus.config import BusConfig
from shared.bus.topics import Topics
from tests.builders.sim import effect
from tests.kubeapi import KubeApiEmulator

T = TypeVar("T")


@pytest.fixture
def kube() -> Any:
    with KubeApiEmulator() as emulator:
        yield emulator


def run(kube: KubeApiEmulator, work: Callable[[Any], Awaitable[T]]) -> T:
    async def go() -> T:
        api = await connect(kube.url)
        async with api:
            return await work(api)
    return asyncio.run(go())


def apply(kube: KubeApiEmulator, *effects: tuple[Any, str]) -> list[str]:
    async def work(api: Any) -> list[str]:
        applier = KubeApplier(api)
        return [await applier.apply(e, effect_id) for e, effect_id in effects]
    return run(kube, work)


def ray_cluster(name: str, *, suspend: bool = True, annotations: dict[str, str] | None = None) -> dict:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": name, "namespace": "team-a", "annotations": annotations or {"keep": "me"}},
            "spec": {"suspend": suspend, "headGroupSpec": {}}}


def pod(name: str, node: str = "") -> dict:
    spec: dict = {"containers": [{"name": "c"}], "schedulerName": "muster"}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team-a"}, "spec": spec}


# --------------------------------------------------------------------------- effects
def test_unsuspend_and_annotate_a_workload_found_by_namespace_and_name(kube: KubeApiEmulator) -> None:
    kube.create(ray_cluster("rc"))
    outcomes = apply(kube, (effect("unsuspend", "", "rc", "team-a"), "e1"),
                     (effect("annotate", "RayCluster", "rc", "team-a", annotations={"muster.dev/queue": "q"}), "e2"))
    assert outcomes == ["applied", "applied"]
    live = kube.get("RayCluster", "ray.io/v1", "team-a", "rc")
    assert live["spec"]["suspend"] is False
    assert live["metadata"]["annotations"] == {"keep": "me", "muster.dev/queue": "q"}


def test_the_same_effect_twice_changes_nothing_more(kube: KubeApiEmulator) -> None:
    kube.create(ray_cluster("rc"))
    unsuspend = (effect("unsuspend", "RayCluster", "rc", "team-a"), "e1")
    apply(kube, unsuspend)
    version = kube.get("RayCluster", "ray.io/v1", "team-a", "rc")["metadata"]["resourceVersion"]
    assert apply(kube, unsuspend) == ["applied"]
    assert kube.get("RayCluster", "ray.io/v1", "team-a", "rc")["metadata"]["resourceVersion"] == version


def test_bind_sets_the_node_and_the_gpu_annotations_once(kube: KubeApiEmulator) -> None:
    kube.create(pod("p"))
    bind = effect("bind", "Pod", "p", "team-a", node="n1", annotations={"gpu-fraction": "0.5"})
    assert apply(kube, (bind, "e1"), (bind, "e1")) == ["applied", "unchanged"]
    live = kube.get("Pod", "v1", "team-a", "p")
    assert live["spec"]["nodeName"] == "n1"
    assert live["metadata"]["annotations"] == {"gpu-fraction": "0.5"}


def test_bind_of_a_pod_bound_elsewhere_is_a_conflict_left_alone(kube: KubeApiEmulator) -> None:
    kube.create(pod("p", node="other"))
    assert apply(kube, (effect("bind", "Pod", "p", "team-a", node="n1"), "e1")) == ["conflict"]
    assert kube.get("Pod", "v1", "team-a", "p")["spec"]["nodeName"] == "other"


def test_evict_deletes_the_pod_and_a_gone_pod_is_absent(kube: KubeApiEmulator) -> None:
    kube.create(pod("p", node="n1"))
    evict = (effect("evict", "Pod", "p", "team-a"), "e1")
    assert apply(kube, evict, evict) == ["applied", "absent"]
    assert kube.get("Pod", "v1", "team-a", "p") is None


def test_events_are_named_after_the_effect_so_a_redelivery_adds_none(kube: KubeApiEmulator) -> None:
    kube.create(ray_cluster("rc"))
    event = effect("event", "RayCluster", "rc", "team-a", reason="Preempted", message="by team-b/big",
                   event_type="Warning")
    assert apply(kube, (event, "abc123"), (event, "abc123")) == ["applied", "unchanged"]
    (recorded,) = kube.items("Event")
    assert recorded["reason"] == "Preempted" and recorded["type"] == "Warning"
    assert recorded["involvedObject"] == {"kind": "RayCluster", "name": "rc", "namespace": "team-a",
                                          "apiVersion": "ray.io/v1"}
    assert recorded["source"]["component"] == "muster"


def test_a_cluster_scoped_queue_is_annotated_in_the_group_that_holds_it(kube: KubeApiEmulator) -> None:
    kube.create({"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "q"}, "spec": {}})
    rejected = effect("annotate", "Queue", "q", "", annotations={"muster.dev/status": "Rejected: bad"})
    assert apply(kube, (rejected, "e1")) == ["applied"]
    assert kube.get("Queue", "scheduling.run.ai/v2", "", "q")["metadata"]["annotations"] == {
        "muster.dev/status": "Rejected: bad"}
    event = effect("event", "Queue", "q", "", reason="Rejected", message="bad", event_type="Warning")
    assert apply(kube, (event, "e2")) == ["applied"]
    assert kube.items("Event")[0]["metadata"]["namespace"] == "default"


def test_effects_on_missing_objects_are_absent_not_errors(kube: KubeApiEmulator) -> None:
    outcomes = apply(kube, (effect("unsuspend", "", "gone", "team-a"), "e1"),
                     (effect("bind", "Pod", "gone", "team-a", node="n1"), "e2"),
                     (effect("annotate", "RayJob", "gone", "team-a", annotations={"a": "b"}), "e3"))
    assert outcomes == ["absent", "absent", "absent"]


def test_a_refusal_names_the_request_and_the_status(kube: KubeApiEmulator) -> None:
    kube.create(ray_cluster("rc"))
    kube.fail(403, "Forbidden")
    with pytest.raises(Refused, match=r"unsuspend RayJob team-a/rc: 403 Forbidden"):
        apply(kube, (effect("unsuspend", "", "rc", "team-a"), "e1"))


@pytest.mark.parametrize("code", [429, 503])
def test_throttling_and_outages_are_transient(kube: KubeApiEmulator, code: int) -> None:
    kube.create(pod("p"))
    kube.fail(code, "TooManyRequests" if code == 429 else "ServiceUnavailable")
    with pytest.raises(Transient, match=str(code)):
        apply(kube, (effect("bind", "Pod", "p", "team-a", node="n1"), "e1"))
    assert apply(kube, (effect("bind", "Pod", "p", "team-a", node="n1"), "e1")) == ["applied"]


# --------------------------------------------------------------------------- the effects' own requests
# (the client's own calls, their answers read unparsed: ``checked``)
def test_a_bind_the_server_finds_invalid_is_refused_with_its_reason(kube: KubeApiEmulator) -> None:
    kube.create(pod("p"))
    with pytest.raises(Refused, match=r"bind Pod team-a/p: 422 Unprocessable Entity"):
        apply(kube, (effect("bind", "Pod", "p", "team-a", node=""), "e1"))
    assert "nodeName" not in kube.get("Pod", "v1", "team-a", "p")["spec"]


@pytest.mark.parametrize("code, reason, outcome", [
    (404, "NotFound", "absent"), (400, "BadRequest", Refused), (403, "Forbidden", Refused),
    (422, "Invalid", Refused), (429, "TooManyRequests", Transient), (500, "InternalError", Transient),
    (503, "ServiceUnavailable", Transient)])
@pytest.mark.parametrize("op", ["bind", "annotate", "status", "event"])
def test_each_write_reads_the_servers_answer_as_before(kube: KubeApiEmulator, op: str, code: int, reason: str,
                                                       outcome: Any) -> None:
    kube.create(pod("p"))
    kube.create(ray_cluster("rc"))
    kube.create(volcano_queue())
    write = {"bind": effect("bind", "Pod", "p", "team-a", node="n1"),
             "annotate": effect("annotate", "RayCluster", "rc", "team-a", annotations={"a": "b"}),
             "status": effect("status", "Queue", "research", "", api_version="scheduling.volcano.sh/v1beta1",
                              status={"pending": 1}),
             "event": effect("event", "RayCluster", "rc", "team-a", reason="Queued", message="waits")}[op]
    kube.fail(code, reason, times=4)  # every place a kind may live answers the same
    if isinstance(outcome, str):
        assert apply(kube, (write, "e1")) == [outcome]
    else:
        with pytest.raises(outcome, match=str(code)):
            apply(kube, (write, "e1"))
    kube.state.failures.clear()
    assert apply(kube, (write, "e2")) == ["applied"]  # the same write goes through once the server takes it


def test_a_pod_bound_meanwhile_by_another_is_a_conflict_and_by_us_unchanged(kube: KubeApiEmulator) -> None:
    kube.create(pod("p"))
    kube.create(pod("q"))
    assert apply(kube, (effect("bind", "Pod", "p", "team-a", node="n1"), "e1"),
                 (effect("bind", "Pod", "p", "team-a", node="n2"), "e2"),
                 (effect("bind", "Pod", "q", "team-a", node="n2"), "e3"),
                 (effect("bind", "Pod", "q", "team-a", node="n2"), "e3")) == ["applied", "conflict", "applied",
                                                                                "unchanged"]
    assert [kube.get("Pod", "v1", "team-a", n)["spec"]["nodeName"] for n in ("p", "q")] == ["n1", "n2"]


def test_the_writes_carry_the_clients_credentials_and_user_agent(kube: KubeApiEmulator) -> None:
    """The token comes from the configuration through its refresh hook (a rotated service-account
    token), as for the client's own calls; without it the server says 401 and nothing is written."""
    kube.create(pod("p"))
    kube.create(ray_cluster("rc"))
    kube.create(volcano_queue())
    kube.require_token("second")
    writes = [(effect("bind", "Pod", "p", "team-a", node="n1"), "e1"),
              (effect("annotate", "RayCluster", "rc", "team-a", annotations={"a": "b"}), "e2"),
              (effect("status", "Queue", "research", "", api_version="scheduling.volcano.sh/v1beta1",
                      status={"pending": 3}), "e3"),
              (effect("event", "RayCluster", "rc", "team-a", reason="Queued", message="waits"), "e4")]

    async def without(api: Any) -> None:
        await KubeApplier(api).apply(*writes[0])

    with pytest.raises(Refused, match="401"):
        run(kube, without)

    async def rotated(config: Any) -> None:
        config.api_key["BearerToken"] = "second"

    async def work(api: Any) -> list[str]:
        api.user_agent = "muster-cluster/test"
        api.configuration.api_key = {"BearerToken": "first"}
        api.configuration.api_key_prefix = {"BearerToken": "Bearer"}
        api.configuration.refresh_api_key_hook = rotated
        applier = KubeApplier(api)
        return [await applier.apply(e, effect_id) for e, effect_id in writes]

    assert run(kube, work) == ["applied"] * 4
    assert [agent for _, _, _, agent in kube.state.writes] == ["muster-cluster/test"] * 4
    assert kube.get("Pod", "v1", "team-a", "p")["spec"]["nodeName"] == "n1"
    assert kube.get("Queue", "scheduling.volcano.sh/v1beta1", "", "research")["status"]["pending"] == 3


def test_the_emulator_refuses_a_binding_for_another_pod_or_to_no_node(kube: KubeApiEmulator) -> None:
    """The emulator validates a Binding as the API server does, so a malformed one cannot pass in tests."""
    kube.create(pod("p"))

    async def post(api: Any, body: dict) -> int:
        try:
            await checked(client.CoreV1Api(api).create_namespaced_pod_binding("p", "team-a", body,
                                                                               _preload_content=False))
            return 201
        except ApiException as exc:
            return int(exc.status)

    node = {"apiVersion": "v1", "kind": "Node", "name": "n1"}
    bodies = [{"kind": "Binding", "metadata": {"name": "q"}, "target": node},
              {"kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Pod", "name": "n1"}},
              {"kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node"}},
              {"kind": "Eviction", "metadata": {"name": "p"}, "target": node},
              {"kind": "Binding", "metadata": {"name": "p", "annotations": {"a": 1}}, "target": node},
              {"kind": "Binding", "metadata": {"name": "p"}, "target": node}]
    assert run(kube, lambda api: asyncio.gather(*[post(api, b) for b in bodies[:-1]])) == [400, 422, 422, 400, 400]
    assert "nodeName" not in kube.get("Pod", "v1", "team-a", "p")["spec"]
    assert run(kube, lambda api: post(api, bodies[-1])) == 201
    assert kube.get("Pod", "v1", "team-a", "p")["spec"]["nodeName"] == "n1"


# --------------------------------------------------------------------------- watch
class Collector:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []
        self.arrived = asyncio.Event()

    async def __call__(self, change: str, obj: dict) -> None:
        self.seen.append((change, obj["kind"], obj["metadata"]["name"]))
        self.arrived.set()

    async def until(self, count: int, timeout: float = 10) -> None:
        async def wait() -> None:
            while len(self.seen) < count:
                self.arrived.clear()
                await self.arrived.wait()
        await asyncio.wait_for(wait(), timeout)


def watch(kube: KubeApiEmulator, resources: tuple[Resource, ...],
          script: Callable[[Collector, Watcher], Awaitable[None]], **options: Any) -> Collector:
    async def work(api: Any) -> Collector:
        collector = Collector()
        watcher = Watcher(api, **options)
        tasks = [asyncio.create_task(watcher.run(r, collector)) for r in resources]
        try:
            await script(collector, watcher)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return collector
    return run(kube, work)


async def later(fn: Callable[..., Any], *args: Any) -> Any:
    """Call the emulator's blocking test API off the event loop."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def test_list_then_watch_reports_adds_changes_and_deletes(kube: KubeApiEmulator) -> None:
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    kube.create(ray_cluster("rc"))

    async def script(c: Collector, w: Watcher) -> None:
        await c.until(2)
        await later(kube.patch, "RayCluster", "ray.io/v1", "team-a", "rc", {"spec": {"suspend": False}})
        await later(kube.delete, "Node", "v1", "", "n1")
        await c.until(4)

    seen = watch(kube, (NODE, RAY_CLUSTER), script).seen
    assert sorted(seen[:2]) == [("Added", "Node", "n1"), ("Added", "RayCluster", "rc")]
    assert sorted(seen[2:]) == [("Deleted", "Node", "n1"), ("Modified", "RayCluster", "rc")]


def test_an_expired_watch_lists_again_and_reports_only_what_changed(kube: KubeApiEmulator) -> None:
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "stays"}})
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "goes"}})

    async def script(c: Collector, w: Watcher) -> None:
        await c.until(2)
        while not kube.watching:
            await asyncio.sleep(0.01)
        kube.cut_watches()  # the watcher is cut off while the cluster changes...
        await later(kube.delete, "Node", "v1", "", "goes")
        await later(kube.create, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "new"}})
        kube.compact()  # ...for longer than the server keeps its history
        await later(kube.end_watches)
        await c.until(4)
        assert w.lists == 2

    seen = watch(kube, (NODE,), script).seen
    assert sorted(seen[:2]) == [("Added", "Node", "goes"), ("Added", "Node", "stays")]
    assert sorted(seen[2:]) == [("Added", "Node", "new"), ("Deleted", "Node", "goes")]


def test_an_object_gone_while_unwatched_is_reported_as_last_watched_and_the_cache_is_not_walked_by_gc(
        kube: KubeApiEmulator) -> None:
    """The watcher keeps what it saw as text (``kubeapi.Cached``): a relist that misses an object
    reports its last watched version, as the parsed object would have been, and nothing of the
    cache is tracked by the cyclic collector."""
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "goes", "labels": {"v": "1"}}})
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "stays"}})
    objects: list[tuple[str, dict]] = []
    caches: list[dict] = []

    class Keeping(Collector):
        async def __call__(self, change: str, obj: dict) -> None:
            objects.append((change, obj))
            await super().__call__(change, obj)

    async def work(api: Any) -> None:
        collector = Keeping()
        watcher = Watcher(api)
        real = watcher._watch

        async def watching(resource: Resource, version: str, seen: dict, sink: Any) -> str:
            caches.append(seen)
            return await real(resource, version, seen, sink)

        watcher._watch = watching  # type: ignore[method-assign]
        task = asyncio.create_task(watcher.run(NODE, collector))
        try:
            await collector.until(2)
            await later(kube.patch, "Node", "v1", "", "goes", {"metadata": {"labels": {"v": "2"}}})
            await collector.until(3)
            gc.collect()
            assert not any(gc.is_tracked(kept) for kept in caches[0].values())
            kube.cut_watches()
            await later(kube.delete, "Node", "v1", "", "goes")
            kube.compact()
            await later(kube.end_watches)
            await collector.until(4)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    run(kube, work)
    modified = next(obj for change, obj in objects if change == "Modified")
    deleted = next(obj for change, obj in objects if change == "Deleted")
    assert deleted == modified and deleted["metadata"]["labels"] == {"v": "2"} and deleted["kind"] == "Node"


def test_a_resource_the_cluster_does_not_serve_is_retried_quietly() -> None:
    with KubeApiEmulator(serves=(NODE,)) as kube:
        kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})

        async def script(c: Collector, w: Watcher) -> None:
            await c.until(1)
            await asyncio.sleep(0.3)

        seen = watch(kube, (NODE, VOLCANO_QUEUE), script, absent_retry=0.1).seen
    assert seen == [("Added", "Node", "n1")]


def test_every_list_is_reported_whole_after_its_changes_and_a_resource_not_served_never() -> None:
    """``inventory``: what the link turns into ``ObjectsListed`` (shared.listing)."""
    with KubeApiEmulator(serves=(NODE,)) as kube:
        kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a"}})
        kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "b"}})
        order: list[tuple[Any, ...]] = []

        async def work(api: Any) -> None:
            async def sink(change: str, obj: dict) -> None:
                order.append((change, obj["metadata"]["name"]))

            async def inventory(resource: Resource, version: str, objects: list[dict]) -> None:
                order.append(("listed", resource.kind, bool(version), sorted(o["metadata"]["name"] for o in objects)))

            watcher = Watcher(api, absent_retry=0.05)
            tasks = [asyncio.create_task(watcher.run(r, sink, inventory=inventory)) for r in (NODE, VOLCANO_QUEUE)]
            try:
                for _ in range(200):
                    if sum(1 for o in order if o[0] == "listed") >= 1 and watcher.lists >= 4:
                        break
                    await asyncio.sleep(0.02)
                while not kube.watching:
                    await asyncio.sleep(0.01)
                kube.cut_watches()  # a watch gap: "a" goes unseen and the history is compacted
                await later(kube.delete, "Node", "v1", "", "a")
                kube.compact()
                await later(kube.end_watches)
                for _ in range(200):
                    if sum(1 for o in order if o[:2] == ("listed", "Node")) >= 2:
                        break
                    await asyncio.sleep(0.02)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

        run(kube, work)
    nodes = [o for o in order if o[:2] != ("listed", "Queue")]
    assert sorted(nodes[:2]) == [("Added", "a"), ("Added", "b")]
    assert nodes[2] == ("listed", "Node", True, ["a", "b"])
    assert nodes[3:] == [("Deleted", "a"), ("listed", "Node", True, ["b"])]
    # a 404 is no list: a CRD briefly not served must not make every object of it look deleted
    assert [o for o in order if o[:2] == ("listed", "Queue")] == []


def test_list_items_without_kind_get_it_from_the_resource(kube: KubeApiEmulator) -> None:
    kube.create(pod("p"))
    kinds: list[tuple[str, str]] = []

    async def work(api: Any) -> None:
        async def sink(change: str, obj: dict) -> None:
            kinds.append((obj["kind"], obj["apiVersion"]))
        task = asyncio.create_task(Watcher(api).run(POD, sink))
        for _ in range(100):
            if kinds:
                break
            await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    run(kube, work)
    assert kinds == [("Pod", "v1")]


def test_a_bind_waits_until_the_pods_evicted_from_its_node_are_gone() -> None:
    with KubeApiEmulator(graceful=True) as kube:
        kube.create(pod("victim", node="n1"))
        kube.create(pod("other-node-victim", node="n2"))
        kube.create(pod("preemptor"))

        async def work(api: Any) -> list[str]:
            applier = KubeApplier(api)
            order: list[str] = []

            async def sink(change: str, obj: dict) -> None:
                if change == "Deleted":
                    order.append(f"gone {obj['metadata']['name']}")
                    await applier.pod_gone(obj["metadata"]["namespace"], obj["metadata"]["name"])

            watching = asyncio.create_task(Watcher(api).run(POD, sink))
            await applier.apply(effect("evict", "Pod", "victim", "team-a"), "e1")
            await applier.apply(effect("evict", "Pod", "other-node-victim", "team-a"), "e2")
            binding = asyncio.create_task(applier.apply(effect("bind", "Pod", "preemptor", "team-a", node="n1"), "e3"))
            await asyncio.sleep(0.5)
            assert not binding.done()  # the victim is still terminating on n1
            assert kube.get("Pod", "v1", "team-a", "victim")["metadata"]["deletionTimestamp"]
            await later(kube.delete, "Pod", "v1", "team-a", "victim")  # the kubelet's part
            order.append(await asyncio.wait_for(binding, 10))
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            return order

        assert run(kube, work) == ["gone victim", "applied"]
        assert kube.get("Pod", "v1", "team-a", "preemptor")["spec"]["nodeName"] == "n1"


def test_a_bind_asks_the_server_when_no_deletion_was_seen() -> None:
    with KubeApiEmulator() as kube:
        kube.create(pod("victim", node="n1"))
        kube.create(pod("preemptor"))

        async def work(api: Any) -> str:
            applier = KubeApplier(api, victim_wait=0.2)  # nobody tells it the victim went
            await applier.apply(effect("evict", "Pod", "victim", "team-a"), "e1")
            outcome = await applier.apply(effect("bind", "Pod", "preemptor", "team-a", node="n1"), "e2")
            assert applier.leaving == {}
            return outcome

        assert run(kube, work) == "applied"


def test_an_evicted_pod_a_list_lacks_is_forgotten_when_the_server_says_it_is_gone() -> None:
    """A deletion no watch saw (the link's watcher started again, which lists only what exists):
    after the next list of pods, which the watching process reports to the applying one as a line
    (``WatchProcess.take``), the link asks the server about each evicted pod, so ``leaving`` holds
    pods that exist, not every deletion ever missed. One made and evicted after the list was taken
    is still there, and stays."""
    with KubeApiEmulator(graceful=True) as kube:  # an evicted pod terminates until it is deleted
        for name, where in (("victim", "n1"), ("late", "n2"), ("bystander", "n3")):
            kube.create(pod(name, node=where))

        async def work(api: Any) -> dict[str, set[tuple[str, str]]]:
            applier = KubeApplier(api)
            bridge = ClusterBridge(Topics())  # the applying process's, and the watching process's below
            bridge.applier = applier
            parent = WatchProcess(BusConfig(bootstrap="unused:9092"), KubeTarget(kube.url), bridge)

            async def line() -> None:  # what the watching process's hook says, taken as the parent takes it
                await parent.take(json.loads(json.dumps({"pods_listed": True})))

            bridge.on_pods_listed = line
            await applier.apply(effect("evict", "Pod", "victim", "team-a"), "e1")
            await applier.apply(effect("evict", "Pod", "late", "team-a"), "e2")
            assert set(applier.leaving) == {"n1", "n2"}
            await later(kube.delete, "Pod", "v1", "team-a", "victim")  # the kubelet's part; nobody tells the applier
            await bridge.inventory(POD, "9", [pod("bystander", node="n3")])  # the list lacks both
            return applier.leaving

        assert run(kube, work) == {"n2": {("team-a", "late")}}


# --------------------------------------------------------------------------- status
def volcano_queue(name: str = "research") -> dict:
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": name},
            "spec": {"weight": 1}, "status": {"state": "Open", "reservation": {"nodes": ["n9"]}}}


def test_status_goes_through_the_subresource_and_touches_only_musters_fields(kube: KubeApiEmulator) -> None:
    kube.create(volcano_queue())
    status = {"state": "Open", "pending": 2, "inqueue": 1, "running": 0, "allocated": {"cpu": "3"}}
    write = effect("status", "Queue", "research", "", api_version="scheduling.volcano.sh/v1beta1", status=status)
    assert apply(kube, (write, "s1")) == ["applied"]
    live = kube.get("Queue", "scheduling.volcano.sh/v1beta1", "", "research")
    assert live["status"] == {**status, "reservation": {"nodes": ["n9"]}}  # another controller's field stays
    assert live["spec"] == {"weight": 1}
    assert ("PATCH", "/apis/scheduling.volcano.sh/v1beta1/queues/research/status") in kube.state.requests
    version = live["metadata"]["resourceVersion"]
    assert apply(kube, (write, "s2")) == ["applied"]  # the same values again change nothing
    assert kube.get("Queue", "scheduling.volcano.sh/v1beta1", "", "research")["metadata"]["resourceVersion"] == version


def test_status_of_a_kai_queue_of_the_same_name_is_not_written_to_volcanos(kube: KubeApiEmulator) -> None:
    kube.create(volcano_queue("team"))
    kai = effect("status", "Queue", "team", "", api_version="scheduling.run.ai/v2", status={"allocated": {"cpu": "1"}})
    assert apply(kube, (kai, "s1")) == ["absent"]
    assert "allocated" not in kube.get("Queue", "scheduling.volcano.sh/v1beta1", "", "team")["status"]


def test_status_of_a_podgroup_that_is_not_there_is_absent(kube: KubeApiEmulator) -> None:
    write = effect("status", "PodGroup", "ray-rc-pg", "team-a", api_version="scheduling.volcano.sh/v1beta1",
                   status={"phase": "Inqueue"})
    assert apply(kube, (write, "s1")) == ["absent"]


def test_writes_of_status_to_one_object_are_spaced(kube: KubeApiEmulator) -> None:
    kube.create(volcano_queue())

    async def work(api: Any) -> None:
        applier = KubeApplier(api, status_interval=0.5)
        for i in range(3):
            await applier.apply(effect("status", "Queue", "research", "", api_version="scheduling.volcano.sh/v1beta1",
                                       status={"pending": i}), f"s{i}")

    run(kube, work)
    times = [at for at, method, path, _ in kube.state.writes if path.endswith("/research/status")]
    assert len(times) == 3
    assert all(b - a >= 0.45 for a, b in zip(times, times[1:]))
    assert kube.get("Queue", "scheduling.volcano.sh/v1beta1", "", "research")["status"]["pending"] == 2


def test_the_spacing_of_status_writes_forgets_objects_last_written_longer_ago(kube: KubeApiEmulator) -> None:
    """The time of an object's last status write matters for one interval: a PodGroup per gang ever
    written (and every queue object) was kept for as long as the link ran."""
    for name in ("a", "b", "c"):
        kube.create(volcano_queue(name))

    async def work(api: Any) -> int:
        applier = KubeApplier(api, status_interval=0.05)
        for i, name in enumerate(("a", "b", "c")):
            await applier.apply(effect("status", "Queue", name, "", api_version="scheduling.volcano.sh/v1beta1",
                                       status={"pending": i}), f"s{i}")
        await asyncio.sleep(0.1)  # every write is older than the interval now (no assertion on time)
        await applier.apply(effect("status", "Queue", "a", "", api_version="scheduling.volcano.sh/v1beta1",
                                   status={"pending": 9}), "s9")
        return len(applier._status_written)

    assert run(kube, work) == 1


def test_a_patch_of_a_custom_object_itself_cannot_change_its_status(kube: KubeApiEmulator) -> None:
    kube.create(volcano_queue())
    write = effect("annotate", "Queue", "research", "", annotations={"a": "b"})
    assert apply(kube, (write, "a1")) == ["applied"]

    async def sneak(api: Any) -> None:
        await client.CustomObjectsApi(api).patch_cluster_custom_object(
            "scheduling.volcano.sh", "v1beta1", "queues", "research", {"status": {"state": "Closed"}},
            _content_type="application/merge-patch+json")

    run(kube, sneak)
    assert kube.get("Queue", "scheduling.volcano.sh/v1beta1", "", "research")["status"]["state"] == "Open"


# --------------------------------------------------------------------------- the client
def test_the_client_reads_no_netrc_per_request_and_takes_the_proxy_from_the_environment_once(
        kube: KubeApiEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp trusting the environment would read ~/.netrc and the proxy variables on a thread for
    every request (a bind cost twice its CPU); the proxy variables are read once, at connect, and
    NO_PROXY is honoured."""

    async def go() -> tuple[bool, Any, Any, int]:
        monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
        monkeypatch.setenv("NO_PROXY", "")
        proxied = await connect("http://api.example:6443")
        proxy = proxied.rest_client.proxy
        await proxied.close()
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        api = await connect(kube.url)
        async with api:
            kube.create(pod("p"))
            assert await KubeApplier(api).apply(effect("bind", kind="Pod", name="p", namespace="team-a", node="n1"),
                                                "e1") == "applied"
            return api.rest_client.pool_manager.trust_env, api.rest_client.proxy, proxy, len(kube.state.requests)

    trusting, direct, proxy, requests = asyncio.run(go())
    assert (trusting, direct, proxy) == (False, None, "http://proxy.example:3128")
    assert requests == 1  # straight to the emulator, no proxy in between
    assert kube.get("Pod", "v1", "team-a", "p")["spec"]["nodeName"] == "n1"
