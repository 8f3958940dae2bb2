"""A watch from a version etcd compacted away: 410 Gone from the real API server, and the relist after it.

The session's cluster serves watches from its watch cache, which replays an old version instead of
expiring it (``test_api.py``). With ``--watch-cache=false`` the API server serves each watch from etcd
itself, and a version below etcd's compaction is 410 Gone ("too old resource version"), as a watcher
that was away longer than the cache keeps finds it on a busy cluster. A cluster of this module's own,
then, whose etcd is compacted through its v3 HTTP gateway (``/v3/kv/compaction``).
"""

from __future__ import annotations

import asyncio
import gc
import json
import urllib.request
from typing import Any, Iterator

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from shared.kubernetes.kubeapi import Watcher, connect
from shared.kubernetes.resources import PRIORITY_CLASS
from shared.parts.devcluster import DevCluster
from tests.realcluster.conftest import create


@pytest.fixture(scope="module")
def etcd_watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    from shared.parts.catalog import MissingPart
    from shared.parts.process import PartFailed

    cluster = DevCluster(tmp_path_factory.mktemp("nocache"), apiserver_flags=("--watch-cache=false",))
    try:
        cluster.up()
    except (MissingPart, PartFailed) as exc:
        cluster.stop()
        pytest.fail(f"the dev cluster did not start: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


def priority_class(name: str) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": 10}


def compact(cluster: DevCluster) -> int:
    """Compact etcd up to its current revision; the revision."""
    def call(path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(f"http://127.0.0.1:{cluster.ports['etcd']}{path}",
                                         data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    revision = int(call("/v3/kv/range", {"key": "AA=="})["header"]["revision"])  # any key: the header says it
    call("/v3/kv/compaction", {"revision": str(revision), "physical": True})
    return revision


def test_a_watch_from_a_compacted_version_is_gone_and_the_relist_reports_only_what_changed(
        etcd_watched: DevCluster) -> None:
    create(etcd_watched, priority_class("stays"), priority_class("goes"))
    seen: dict[tuple[str, str], Any] = {}
    changes: list[tuple[str, str]] = []

    async def sink(change: str, obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"] in ("stays", "goes", "new"):
            changes.append((change, obj["metadata"]["name"]))

    async def work() -> tuple[int | None, list[str]]:
        api = await connect(kubeconfig=str(etcd_watched.kubeconfig))
        watcher = Watcher(api, watch_timeout=5)
        try:
            version, _ = await watcher._relist(PRIORITY_CLASS, seen, sink)
            etcd_watched.kubectl("delete", "priorityclass", "goes")
            create(etcd_watched, priority_class("new"))
            assert compact(etcd_watched) > int(version)
            status = None
            try:
                await watcher._watch(PRIORITY_CLASS, version, seen, sink)
            except ApiException as exc:
                status = exc.status
            changes.append(("-", "relist"))
            await watcher._relist(PRIORITY_CLASS, seen, sink)
            return status, [c for c, _ in changes]
        finally:
            await api.close()

    status, _ = asyncio.run(work())
    assert status == 410  # the emulator's compact() was right about this server, without its cache
    listed = changes[:changes.index(("-", "relist"))]
    assert sorted(listed) == [("Added", "goes"), ("Added", "stays")]
    assert sorted(changes[changes.index(("-", "relist")) + 1:]) == [("Added", "new"), ("Deleted", "goes")]


def test_every_list_is_reported_whole_after_its_changes_and_a_deletion_in_a_watch_gap_with_the_next(
        etcd_watched: DevCluster) -> None:
    """``inventory``: what the link turns into ``ObjectsListed`` (shared.kernel.listing). The watcher is held
    between two watches (its process was away); meanwhile an object goes and etcd is compacted, so the
    watch it resumes is 410 Gone and the list after it reports the deletion, then the whole list."""
    create(etcd_watched, priority_class("inv-a"), priority_class("inv-b"))
    order: list[tuple[Any, ...]] = []

    async def sink(change: str, obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"].startswith("inv-"):
            order.append((change, obj["metadata"]["name"]))

    async def inventory(resource: Any, version: str, objects: list[dict[str, Any]]) -> None:
        order.append(("listed", bool(version), sorted(o["metadata"]["name"] for o in objects
                                                      if o["metadata"]["name"].startswith("inv-"))))

    async def work() -> None:
        api = await connect(kubeconfig=str(etcd_watched.kubeconfig))
        watcher = Watcher(api, watch_timeout=1)
        real, gap, watches = watcher._watch, asyncio.Event(), []

        async def watching(*args: Any) -> str:
            watches.append(args[1])
            if len(watches) > 1:
                await gap.wait()
            return await real(*args)

        watcher._watch = watching  # type: ignore[method-assign]
        task = asyncio.create_task(watcher.run(PRIORITY_CLASS, sink, inventory=inventory))
        try:
            while len(watches) < 2:  # listed, watched once, now held
                await asyncio.sleep(0.05)
            await asyncio.to_thread(etcd_watched.kubectl, "delete", "priorityclass", "inv-a")
            await asyncio.to_thread(compact, etcd_watched)
            gap.set()
            while sum(1 for o in order if o[0] == "listed") < 2:
                await asyncio.sleep(0.05)
            assert watcher.lists == 2
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await api.close()

    asyncio.run(asyncio.wait_for(work(), 60))
    assert sorted(order[:2]) == [("Added", "inv-a"), ("Added", "inv-b")]
    assert order[2:] == [("listed", True, ["inv-a", "inv-b"]), ("Deleted", "inv-a"), ("listed", True, ["inv-b"])]


@pytest.mark.parametrize("written_after, status", [(True, 410), (False, 500)], ids=["gone", "prevkv-lost"])
def test_an_object_gone_while_unwatched_is_reported_as_last_watched_and_the_cache_is_not_walked_by_gc(
        etcd_watched: DevCluster, written_after: bool, status: int) -> None:
    """The watcher keeps what it saw as text (``kubeapi.Cached``): a relist that misses an object
    reports its last watched version, as the parsed object would have been, and nothing of the
    cache is tracked by the cyclic collector.

    The watch that resumes after the gap fails one of two ways. Compacted past a later write, the
    version is gone: 410. Compacted at the deletion itself, the version is still served but etcd no
    longer holds the object's previous value, which the API server needs for a DELETED event: 500
    "etcd event received with PrevKv=nil" (k8s.io/apiserver pkg/storage/etcd3/event.go, ``parseEvent``). The
    watcher lists again after either (after ``error_retry`` for the 500)."""
    prefix = f"lw-{status}-"
    goes = priority_class(f"{prefix}goes")
    goes["metadata"]["labels"] = {"v": "1"}
    create(etcd_watched, goes, priority_class(f"{prefix}stays"))
    objects: list[tuple[str, dict[str, Any]]] = []

    async def sink(change: str, obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"].startswith(prefix):
            objects.append((change, obj))

    async def work() -> int | None:
        api = await connect(kubeconfig=str(etcd_watched.kubeconfig))
        watcher = Watcher(api, watch_timeout=2)
        seen: dict[tuple[str, str], Any] = {}
        try:
            version, _ = await watcher._relist(PRIORITY_CLASS, seen, sink)
            await asyncio.to_thread(etcd_watched.kubectl, "label", "priorityclass", f"{prefix}goes", "v=2",
                                    "--overwrite")
            version = await watcher._watch(PRIORITY_CLASS, version, seen, sink)  # the change, then the timeout
            gc.collect()
            assert seen and not any(gc.is_tracked(kept) for kept in seen.values())
            await asyncio.to_thread(etcd_watched.kubectl, "delete", "priorityclass", f"{prefix}goes")
            if written_after:
                await asyncio.to_thread(create, etcd_watched, priority_class(f"{prefix}new"))
            await asyncio.to_thread(compact, etcd_watched)
            failed = None
            try:
                await watcher._watch(PRIORITY_CLASS, version, seen, sink)
            except ApiException as exc:
                failed = exc.status
            await watcher._relist(PRIORITY_CLASS, seen, sink)
            return failed
        finally:
            await api.close()

    assert asyncio.run(work()) == status
    modified = next(obj for change, obj in objects if change == "Modified")
    deleted = next(obj for change, obj in objects if change == "Deleted")
    assert deleted == modified and deleted["metadata"]["labels"] == {"v": "2"} and deleted["kind"] == "PriorityClass"
