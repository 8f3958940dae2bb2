"""The cluster adapter over real HTTP against the API emulator (tests/kubeapi.py), for what the real API
server cannot be made to answer on demand: throttling, outages and every refusal code for each write,
a token rotated between requests, the spacing of status writes in time, a proxy taken from the
environment. What a real server answers to muster's requests is tests/realcluster/test_api.py's (and
test_watch_expiry.py's for watches)."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, TypeVar

import pytest

from shared.kubernetes.kubeapi import KubeApplier, Refused, Transient, connect
from tests.builders.sim import effect
from tests.kubeapi import MALFORMED_BINDINGS, KubeApiEmulator, post_binding

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
@pytest.mark.parametrize("code", [429, 503])
def test_throttling_and_outages_are_transient(kube: KubeApiEmulator, code: int) -> None:
    kube.create(pod("p"))
    kube.fail(code, "TooManyRequests" if code == 429 else "ServiceUnavailable")
    with pytest.raises(Transient, match=str(code)):
        apply(kube, (effect("bind", "Pod", "p", "team-a", node="n1"), "e1"))
    assert apply(kube, (effect("bind", "Pod", "p", "team-a", node="n1"), "e1")) == ["applied"]


# --------------------------------------------------------------------------- the effects' own requests
# (the client's own calls, their answers read unparsed: ``checked``)
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


def test_a_bind_without_a_node_is_refused_before_any_request(kube: KubeApiEmulator) -> None:
    """The server would answer 500 (tests/realcluster/test_api.py), which is retried as an outage."""
    kube.create(pod("p"))
    before = len(kube.state.requests)
    with pytest.raises(Refused, match="bind Pod team-a/p: no node to bind it to"):
        apply(kube, (effect("bind", "Pod", "p", "team-a", node=""), "e1"))
    assert len(kube.state.requests) == before


def test_the_emulator_refuses_a_binding_for_another_pod_or_to_no_node(kube: KubeApiEmulator) -> None:
    """The emulator validates a Binding as the API server does, so a malformed one cannot pass in tests:
    the real server's codes for the same bodies are tests/realcluster/test_api.py's."""
    kube.create(pod("p"))
    bodies = [body for body, _ in MALFORMED_BINDINGS]
    codes = run(kube, lambda api: asyncio.gather(*[post_binding(api, "team-a", b) for b in bodies]))
    assert codes == [code for _, code in MALFORMED_BINDINGS]
    assert "nodeName" not in kube.get("Pod", "v1", "team-a", "p")["spec"]
    well_formed = {"kind": "Binding", "metadata": {"name": "p"},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
    assert run(kube, lambda api: post_binding(api, "team-a", well_formed)) == 201
    assert kube.get("Pod", "v1", "team-a", "p")["spec"]["nodeName"] == "n1"


# --------------------------------------------------------------------------- status
def volcano_queue(name: str = "research") -> dict:
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": name},
            "spec": {"weight": 1}, "status": {"state": "Open", "reservation": {"nodes": ["n9"]}}}


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
