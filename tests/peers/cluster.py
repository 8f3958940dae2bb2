"""The dev cluster a peer's comparison runs on: the session's, with the peer's programs built (a peer that
cannot be built where the registries are unreachable is skipped, else it fails), put back as the other
real-cluster tests expect it afterwards (KubeRay without a batch scheduler, kube-scheduler running)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import pytest

if TYPE_CHECKING:
    from shared.parts.devcluster import DevCluster
    from shared.parts.peers import Peer


def peer_cluster(devcluster: "DevCluster", peer: "Peer") -> Iterator["DevCluster"]:
    """The body of each peer's module fixture."""
    from shared.parts.catalog import MissingPart, built

    try:
        built(peer.part)
    except MissingPart as exc:
        pytest.skip(str(exc)) if exc.unreachable else pytest.fail(str(exc))
    yield devcluster
    devcluster.reset()
    devcluster.start_kuberay("none")
    devcluster.kube_scheduler(True)
