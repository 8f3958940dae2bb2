"""A watch from a version etcd compacted away: 410 Gone from the real API server, and the relist after it.

The session's cluster serves watches from its watch cache, which replays an old version instead of
expiring it (``test_api.py``). With ``--watch-cache=false`` the API server serves each watch from etcd
itself, and a version below etcd's compaction is 410 Gone ("too old resource version"), as a watcher
that was away longer than the cache keeps finds it on a busy cluster. A cluster of this module's own,
then, whose etcd is compacted through its v3 HTTP gateway (``/v3/kv/compaction``).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any, Iterator

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from services.reconciler.kubeapi import Watcher, connect
from services.reconciler.resources import PRIORITY_CLASS
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
