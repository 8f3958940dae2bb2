"""Objects deleted while the cluster link is down are found gone when it lists again (``shared.listing``).

The deployment's pieces in this process on a real broker — the four services, the projector into a
SQLite store, ``muster run cluster``'s app — against the API emulator over real HTTP (tests/kubeapi.py).
A RayCluster is admitted and its pods bound; the link stops; the user deletes the RayCluster and
its pods, and a node goes, while nothing watches; the link starts again, with no memory of what it
had seen. The workload must end Deleted in the store with its queue's usage freed, and placement
must have let go of its pods and of the node (another RayCluster takes the freed room).
"""

from __future__ import annotations

from typing import Any

from shared.audit.kafka import KafkaLog
from shared.audit.logfile import envelopes
from shared.audit.replay import verify
from shared.bus.app import ensure_topics, service_app
from shared.bus.cluster import KubeTarget, cluster_app
from shared.bus.config import BusConfig
from shared.bus.driver import EventLoopThread, gather_all
from shared.bus.projector import projector_app
from shared.policy import Policy
from shared.store.query import queue_report, workload_history
from shared.topology import SERVICES
from tests.builders import node, ray_cluster, worker_group
from tests.integration.test_cluster_bridge import QUEUE, eventually, ray_pod, stop_apps
from tests.kubeapi import KubeApiEmulator

LABELS = {"ray.io/scheduler-name": "volcano", "volcano.sh/queue-name": "research"}


def _cluster(name: str) -> dict[str, Any]:
    """A suspended RayCluster of 1 + 2 pods, 5 cpu in all (the queue holds 8: one at a time)."""
    return ray_cluster(name, "team-a", suspend=True, head={"cpu": "1", "memory": "1Gi"},
                       workers=[worker_group("worker", 2, {"cpu": "2", "memory": "1Gi"})], labels=LABELS)


def _pods(name: str) -> list[dict[str, Any]]:
    return [ray_pod(name, f"{name}-head-x1", "head", "headgroup", "1"),
            ray_pod(name, f"{name}-worker-worker-y1", "worker", "worker", "2"),
            ray_pod(name, f"{name}-worker-worker-y2", "worker", "worker", "2")]


def _unsuspended(kube: KubeApiEmulator, name: str) -> bool:
    live = kube.get("RayCluster", "ray.io/v1", "team-a", name)
    return bool(live) and live["spec"].get("suspend") is False


def _bound_to(kube: KubeApiEmulator, pods: list[dict[str, Any]]) -> list[str] | None:
    nodes = [(kube.get("Pod", "v1", "team-a", p["metadata"]["name"]) or {}).get("spec", {}).get("nodeName")
             for p in pods]
    return nodes if all(nodes) else None


def test_a_ray_cluster_its_pods_and_a_node_deleted_while_the_link_was_down_are_deleted_after_it_lists_again(
        kafka_bootstrap: str, topic_prefix: str, sqlite_store: str) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    with KubeApiEmulator() as kube:
        kube.create(node("n1", cpu="6", memory="64Gi"))
        kube.create(node("n2", cpu="6", memory="64Gi"))
        kube.create(QUEUE)
        bus = EventLoopThread()
        try:
            bus.run(ensure_topics(config))
            apps = {name: service_app(name, config, Policy()) for name in SERVICES}
            apps["projector"] = projector_app(config, sqlite_store)
            link = cluster_app(config, KubeTarget(url=kube.url))
            bus.run(gather_all(app.start() for app in [*apps.values(), link]), timeout=90)
            try:
                kube.create(_cluster("rc"))
                eventually(lambda: _unsuspended(kube, "rc"), "rc to be unsuspended")
                pods = _pods("rc")
                for p in pods:
                    kube.create(p)
                eventually(lambda: _bound_to(kube, pods), "rc's pods to be bound")
                eventually(lambda: (workload_history(sqlite_store, "team-a/rc") or {}).get("phase") == "Running"
                           or queue_report(sqlite_store).get("research", {}).get("active") == ["team-a/rc"],
                           "rc to hold the queue's quota in the store")
                on = {p["metadata"]["name"]: _bound_to(kube, [p])[0] for p in pods}  # type: ignore[index]

                bus.run(link.stop(), timeout=60)  # the link is down: nothing watches
                kube.delete("RayCluster", "ray.io/v1", "team-a", "rc")
                for p in pods:
                    kube.delete("Pod", "v1", "team-a", p["metadata"]["name"])
                spare = "n2" if "n2" not in on.values() else "n1"
                kube.delete("Node", "v1", "", spare)

                link = cluster_app(config, KubeTarget(url=kube.url))  # no memory of what it saw
                bus.run(link.start(), timeout=90)

                def deleted() -> bool:
                    history = workload_history(sqlite_store, "team-a/rc") or {}
                    research = queue_report(sqlite_store).get("research", {})
                    return history.get("phase") == "Deleted" and not research.get("usage") and not research.get("active")

                eventually(deleted, "rc to be Deleted in the store with the queue's usage freed", timeout=90)
                phases = [t["phase"] for t in workload_history(sqlite_store, "team-a/rc")["transitions"]]  # type: ignore[index]
                assert phases.count("Deleted") == 1

                # placement let go of rc's pods and of the node that went: a second cluster of the same
                # size is admitted and bound to the one node left, which has room only if rc's pods left it
                kube.create(_cluster("next"))
                eventually(lambda: _unsuspended(kube, "next"), "the next cluster to be unsuspended", timeout=90)
                following = _pods("next")
                for p in following:
                    kube.create(p)
                left = "n1" if spare == "n2" else "n2"
                assert eventually(lambda: _bound_to(kube, following), "the next cluster's pods to be bound",
                                  timeout=90) == [left] * 3
            finally:
                stop_apps(bus, {**apps, "cluster": link})
        finally:
            bus.close()
    # the deletions are a fold over the inboxes: the log replays to the same decisions
    tally = verify(KafkaLog(f"kafka://{kafka_bootstrap}", policy=Policy(), prefix=topic_prefix), Policy())
    assert tally.different == 0 and tally.identical > 0
    log = list(envelopes(KafkaLog(f"kafka://{kafka_bootstrap}", policy=Policy(), prefix=topic_prefix)))
    listings = {e.id for e in log if e.type == "ObjectsListed"}
    assert [e.subject for e in log if e.type == "WorkloadDeleted" and e.causation_id in listings] == ["team-a/rc"]
