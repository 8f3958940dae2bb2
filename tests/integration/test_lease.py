"""Leader election over real HTTP against the API emulator: one holder, conflicts, takeover, release.

The candidates' clocks are fake (advanced by the test), so expiry needs no waiting; the Lease, its
resourceVersion and the 409s are the emulator's, as a real API server answers them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.reconciler.kubeapi import connect
from services.reconciler.lease import LeaseElector, LeaseLost
from tests.kubeapi import KubeApiEmulator


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def kube() -> Any:
    with KubeApiEmulator() as emulator:
        yield emulator


def candidate(name: str, clock: Clock) -> LeaseElector:
    return LeaseElector("muster-system", "muster-cluster", name, lease_duration=15, renew_deadline=10,
                        retry_period=2, clock=clock, wall=lambda: 1_700_000_000.0 + clock.now)


def lease(kube: KubeApiEmulator) -> dict:
    return kube.get("Lease", "coordination.k8s.io/v1", "muster-system", "muster-cluster")["spec"]


def run(kube: KubeApiEmulator, work: Any) -> Any:
    async def go() -> Any:
        api = await connect(kube.url)
        async with api:
            return await work(api)
    return asyncio.run(go())


def test_one_candidate_holds_and_the_other_waits_until_the_holder_falls_silent(kube: KubeApiEmulator) -> None:
    a_clock, b_clock = Clock(), Clock()
    a, b = candidate("a", a_clock), candidate("b", b_clock)

    async def work(api: Any) -> None:
        assert await a.try_once(api) is True        # created
        assert await b.try_once(api) is False       # held by a, just seen
        a_clock.now = b_clock.now = 10.0
        assert await a.try_once(api) is True        # a renews: the record changed
        b_clock.now = 20.0
        assert await b.try_once(api) is False       # b saw the change at 20: it waits until 35
        b_clock.now = 34.9
        assert await b.try_once(api) is False
        b_clock.now = 35.0
        assert await b.try_once(api) is True        # a fell silent for a lease duration: b takes over
        a_clock.now = 36.0
        assert await a.try_once(api) is False       # a sees b hold it

    run(kube, work)
    spec = lease(kube)
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1 and spec["leaseDurationSeconds"] == 15
    assert spec["renewTime"].endswith("Z") and "." in spec["renewTime"]


def test_of_two_writes_naming_the_same_version_one_gets_a_conflict(kube: KubeApiEmulator) -> None:
    from kubernetes_asyncio.client.exceptions import ApiException

    clock = Clock()
    a, b = candidate("a", clock), candidate("b", clock)

    async def work(api: Any) -> None:
        assert await a.try_once(api) is True
        await a.release(api)                     # holder empty: anyone may take it
        a._observe(await a._read(api))           # both read the same resourceVersion ...
        b._observe(await b._read(api))
        assert await b.try_once(api) is True     # ... b writes first
        with pytest.raises(ApiException) as lost:
            await a._replace(api, {"holderIdentity": "a", "leaseDurationSeconds": 15})
        assert lost.value.status == 409          # a's write names the version b replaced

    run(kube, work)
    assert lease(kube)["holderIdentity"] == "b"


def test_a_released_lease_is_taken_at_the_next_try(kube: KubeApiEmulator) -> None:
    clock = Clock()
    a, b = candidate("a", clock), candidate("b", clock)

    async def work(api: Any) -> None:
        assert await a.try_once(api) is True
        assert await b.try_once(api) is False
        await a.release(api)
        assert await b.try_once(api) is True

    run(kube, work)
    assert lease(kube)["holderIdentity"] == "b"


def test_a_holder_that_sees_another_holder_has_lost_the_lease(kube: KubeApiEmulator) -> None:
    clock = Clock()
    a = LeaseElector("muster-system", "muster-cluster", "a", lease_duration=3, renew_deadline=2,
                     retry_period=0.05)
    b = candidate("b", clock)

    async def work(api: Any) -> str:
        assert await a.try_once(api) is True
        clock.now = 100.0
        await b.try_once(api)
        clock.now = 200.0
        assert await b.try_once(api) is True  # b's clock says a is long silent
        with pytest.raises(LeaseLost) as lost:
            await asyncio.wait_for(a.keep(api), 5)
        return str(lost.value)

    assert "held by b now" in run(kube, work)


def test_a_holder_that_cannot_renew_stops_within_the_renew_deadline(kube: KubeApiEmulator) -> None:
    a = LeaseElector("muster-system", "muster-cluster", "a", lease_duration=3, renew_deadline=0.5,
                     retry_period=0.1)

    async def work(api: Any) -> str:
        assert await a.try_once(api) is True
        kube.fail(503, "ServiceUnavailable", times=1000)
        with pytest.raises(LeaseLost) as lost:
            await asyncio.wait_for(a.keep(api), 5)
        return str(lost.value)

    assert "was not renewed for 0.5s" in run(kube, work)
