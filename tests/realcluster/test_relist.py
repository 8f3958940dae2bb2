"""Objects deleted while the cluster link is down are found gone when it lists again (``shared.kernel.listing``).

The deployment's pieces in this process on the session's Kafka broker — the four services, the
projector into a SQLite store, ``muster run cluster``'s app — against the session's real cluster:
real KubeRay makes a RayCluster's pods, muster admits it and binds them, KWOK runs them. The link
stops; the user deletes the RayCluster (the garbage collector deletes its pods) and a node goes,
while nothing watches; the link starts again, with no memory of what it had seen. The workload must
end Deleted in the store with its queue's usage freed, and placement must have let go of its pods
and of the node (another RayCluster takes the freed room).
"""

from __future__ import annotations

from typing import Any

from shared.audit.kafka import KafkaLog
from shared.audit.logfile import envelopes
from shared.audit.replay import verify
from shared.audit.timeorder import backwards
from shared.history.query import queue_report, workload_history
from shared.kernel.policy import Policy
from shared.kernel.topology import SERVICES
from shared.kubernetes.app import cluster_app
from shared.kubernetes.cluster import KubeTarget
from shared.parts.devcluster import DevCluster
from shared.runtime.bus.app import ensure_topics, service_app
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.driver import EventLoopThread, gather_all
from shared.runtime.bus.projector import projector_app
from tests.conftest import log_complete
from tests.integration.test_cluster_bridge import stop_apps
from tests.realcluster.conftest import create, eventually, get, node
from tests.realcluster.test_leader import QUEUE, ray_cluster


def _bound(cluster: DevCluster, name: str) -> dict[str, str]:
    """The RayCluster's pods (real KubeRay labels them with the cluster) -> their nodes, once both are
    bound; empty before."""
    pods = {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in get(cluster, "pods", namespace="team-a")["items"]
            if p["metadata"].get("labels", {}).get("ray.io/cluster") == name}
    return pods if len(pods) == 2 and all(pods.values()) else {}


def _unsuspended(cluster: DevCluster, name: str) -> bool:
    return (get(cluster, "rayclusters.ray.io", name, "team-a") or {}).get("spec", {}).get("suspend") is False


def test_a_ray_cluster_its_pods_and_a_node_deleted_while_the_link_was_down_are_deleted_after_it_lists_again(
        clean_cluster: DevCluster, kafka_bootstrap: str, topic_prefix: str, sqlite_store: str) -> None:
    cluster = clean_cluster
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    target = KubeTarget(kubeconfig=str(cluster.kubeconfig))
    cluster.kubectl("create", "namespace", "team-a")
    create(cluster, node("n1", cpu="2"), node("n2", cpu="2"), QUEUE)  # a RayCluster (2 cpu) fills a node
    bus = EventLoopThread()
    try:
        bus.run(ensure_topics(config))
        apps: dict[str, Any] = {name: service_app(name, config, Policy()) for name in SERVICES}
        apps["projector"] = projector_app(config, sqlite_store)
        link = cluster_app(config, target)
        bus.run(gather_all(app.start() for app in [*apps.values(), link]), timeout=90)
        try:
            create(cluster, ray_cluster("rc"))
            eventually(lambda: _unsuspended(cluster, "rc"), "rc to be unsuspended")
            on = eventually(lambda: _bound(cluster, "rc"), "rc's pods to be bound")
            eventually(lambda: (workload_history(sqlite_store, "team-a/rc") or {}).get("phase") == "Running",
                       "rc to be Running in the store")

            bus.run(link.stop(), timeout=60)  # the link is down: nothing watches
            cluster.kubectl("delete", "raycluster", "rc", "-n", "team-a", "--wait=true")
            eventually(lambda: not [p for p in get(cluster, "pods", namespace="team-a")["items"]
                                    if p["metadata"].get("labels", {}).get("ray.io/cluster") == "rc"],
                       "the garbage collector to delete rc's pods")
            (used,) = set(on.values())
            spare = "n2" if used == "n1" else "n1"
            cluster.kubectl("delete", "node", spare)

            link = cluster_app(config, target)  # no memory of what it saw
            bus.run(link.start(), timeout=90)

            def deleted() -> bool:
                history = workload_history(sqlite_store, "team-a/rc") or {}
                research = queue_report(sqlite_store).get("research", {})
                return history.get("phase") == "Deleted" and not research.get("usage") and not research.get("active")

            eventually(deleted, "rc to be Deleted in the store with the queue's usage freed", timeout=90)
            phases = [t["phase"] for t in workload_history(sqlite_store, "team-a/rc")["transitions"]]  # type: ignore[index]
            assert phases.count("Deleted") == 1

            # placement let go of rc's pods and of the node that went: a second cluster of the same size
            # is admitted and bound to the one node left, which has room only if rc's pods left it
            create(cluster, ray_cluster("next"))
            eventually(lambda: _unsuspended(cluster, "next"), "the next cluster to be unsuspended", timeout=90)
            following = eventually(lambda: _bound(cluster, "next"), "the next cluster's pods to be bound", timeout=90)
            assert set(following.values()) == {used}
            eventually(lambda: log_complete(kafka_bootstrap, topic_prefix), "the stack to finish what it was doing")
        finally:
            stop_apps(bus, {**apps, "cluster": link})
    finally:
        bus.close()
    # the deletions are a fold over the inboxes: the log replays to the same decisions
    log = KafkaLog(f"kafka://{kafka_bootstrap}", policy=Policy(), prefix=topic_prefix)
    tally = verify(log, Policy())
    assert tally.different == 0 and tally.identical > 0
    listed = list(envelopes(KafkaLog(f"kafka://{kafka_bootstrap}", policy=Policy(), prefix=topic_prefix)))
    assert backwards(listed) == [], "event time runs forwards along every cause and within every service"
    listings = {e.id for e in listed if e.type == "ObjectsListed"}
    assert [e.subject for e in listed if e.type == "WorkloadDeleted" and e.causation_id in listings] == ["team-a/rc"]
