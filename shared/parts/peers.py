"""The peer schedulers muster is compared with, run for real on the dev cluster (issue 32).

A ``Peer`` is what the comparison (``shared.peers``) needs to know of one: its name, the part
``make tools`` builds it as, KubeRay's ``--batch-scheduler`` for it (KubeRay then makes its PodGroups
exactly as in production; the scenario files whose manifests imply that setting are its dialect's), where it reads a workload's queue,
and how to start and stop its processes beside a ``DevCluster``. Every peer's processes are started
the one way, as the cluster's parts (``DevCluster.start_part``, KAI's through ``shared.parts.kai``), so
``Peer.stop`` and ``muster devcluster down`` stop them with the rest.

Volcano: ``vc-scheduler`` with a configuration of the module's own files, and ``vc-controller-manager``
with only the controllers a scheduler-only install needs (``pg-controller``: a PodGroup for a plain pod
that names the scheduler; ``queue-controller``: a queue's ``status.state`` Open and its counts). No
webhook manager (it needs a serving certificate the API server trusts): docs/parts.md says what that
changes.
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from shared.parts import catalog, kai
from shared.parts.process import free_port

if TYPE_CHECKING:
    from shared.parts.devcluster import DevCluster
    from shared.sim.batchscheduler import Setting


@dataclass(frozen=True)
class Peer:
    """One peer scheduler (see the module docstring)."""

    name: str
    part: str
    """The part ``make tools`` builds (``catalog.built(part)``)."""
    batch_scheduler: "Setting"
    """KubeRay's ``--batch-scheduler`` while the peer schedules."""
    queue_label: str
    """The label that names a workload's queue."""
    group_annotation: str
    """The pod annotation that names its PodGroup."""
    podgroups: str
    """kubectl's resource for its PodGroups (``podgroups.scheduling.volcano.sh``)."""
    default_queue: str
    start: Callable[["DevCluster", str], list[str]]
    """Start its processes on the cluster with the named configuration; the names of the parts started."""
    configurations: tuple[str, ...] = field(default=("default",))
    """The configurations ``start`` knows, the first the one compared."""

    before_stop: Callable[["DevCluster"], None] | None = None
    """What must go before its processes stop (KAI's admission webhooks, which fail closed)."""

    def stop(self, cluster: "DevCluster", parts: list[str]) -> None:
        if self.before_stop is not None:
            self.before_stop(cluster)
        for name in reversed(parts):
            cluster.stop_part(name)


VOLCANO_ACTIONS = {
    "installer": None,
    "e2e": "enqueue, allocate, backfill, reclaim, preempt",
}
"""Volcano's configurations: ``installer`` is the installer's ``volcano-scheduler.conf`` as it is (actions
enqueue, allocate, backfill: nothing is ever reclaimed or preempted); ``e2e`` the same plugins with the
actions of the configuration Volcano's own e2e suite runs (``volcano-scheduler-ci.conf``), reclaim and
preempt among them, which muster always does. The plugins stay the installer's (capacity, whose
``deserved`` muster reads), not the CI file's (proportion)."""


def volcano_conf(installer: str, configuration: str) -> str:
    """The scheduler configuration file's text for ``configuration`` (``VOLCANO_ACTIONS``)."""
    actions = VOLCANO_ACTIONS[configuration]
    if actions is None:
        return installer
    lines = installer.splitlines()
    found = [i for i, line in enumerate(lines) if line.startswith("actions:")]
    if len(found) != 1:
        raise ValueError("the installer's volcano-scheduler.conf has no single 'actions:' line")
    lines[found[0]] = f'actions: "{actions}"'
    return "\n".join(lines) + "\n"


def start_volcano(cluster: "DevCluster", configuration: str = "e2e", verbosity: int = 2) -> list[str]:
    """vc-controller-manager and vc-scheduler against ``cluster``, each as a user of its own (an admin:
    Volcano's ClusterRoles are the installer's, not applied here); returns once the scheduler is healthy.
    ``verbosity``: vc-scheduler's ``-v`` (4 logs each plugin's verdict on each job, to read why it acted)."""
    built = catalog.built("volcano")
    # the CRDs its informers list beside the Queue and PodGroup ones (``crds``): without them a cache never syncs
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(built.file("bus.volcano.sh_commands.yaml")),
                    "-f", str(built.file("nodeinfo.volcano.sh_numatopologies.yaml")))
    cluster.kubectl("wait", "--for", "condition=Established", "--timeout", "60s",
                    "crd/commands.bus.volcano.sh", "crd/numatopologies.nodeinfo.volcano.sh")
    cluster.kubectl("create", "namespace", "volcano-system", check=False)  # its leader-election lock's
    conf = cluster.root / f"volcano-scheduler-{configuration}.conf"
    conf.write_text(volcano_conf(built.file("volcano-scheduler.conf").read_text(), configuration))
    healthz = free_port()
    manager, scheduler = cluster.client("vc-controller-manager"), cluster.client("vc-scheduler")
    cluster.start_part("vc-controller-manager", [
        str(built.file("bin/vc-controller-manager")), "--kubeconfig", str(manager),
        "--controllers", "pg-controller,queue-controller", "--leader-elect=false",
        "--healthz-address", f"127.0.0.1:{free_port()}", "-v", "2",
    ], env={"KUBECONFIG": str(manager)})
    part = cluster.start_part("vc-scheduler", [
        str(built.file("bin/vc-scheduler")), "--kubeconfig", str(cluster.client("vc-scheduler")),
        "--scheduler-conf", str(conf), "--scheduler-name", "volcano", "--leader-elect=false",
        "--listen-address", f"127.0.0.1:{free_port()}", "--enable-healthz=true",
        "--healthz-address", f"127.0.0.1:{healthz}", "--cache-dumper=false", "-v", str(verbosity),
    ], env={"KUBECONFIG": str(scheduler)})  # a device plugin's init reads it (else ~/.kube/config)
    part.wait_until(lambda: urllib.request.urlopen(f"http://127.0.0.1:{healthz}/healthz", timeout=2).status == 200,
                    60, f"healthy at 127.0.0.1:{healthz}")
    return ["vc-controller-manager", "vc-scheduler"]


VOLCANO = Peer(name="volcano", part="volcano", batch_scheduler="volcano", queue_label="volcano.sh/queue-name", group_annotation="scheduling.k8s.io/group-name",
               podgroups="podgroups.scheduling.volcano.sh", default_queue="default", start=start_volcano,
               configurations=tuple(VOLCANO_ACTIONS)[::-1])



def start_kai(cluster: "DevCluster", configuration: str = "default") -> list[str]:
    """KAI's programs as its operator runs them by default (``shared.parts.kai``), the cluster's parts."""
    return list(kai.start(cluster).parts)


KAI = Peer(name="kai", part="kai", batch_scheduler="kai-scheduler", queue_label=kai.QUEUE_LABEL,
           group_annotation="pod-group-name", podgroups="podgroups.scheduling.run.ai", default_queue="default-queue",
           start=start_kai, before_stop=kai.remove_webhooks)

PEERS: dict[str, Peer] = {VOLCANO.name: VOLCANO, KAI.name: KAI}
"""The peers by name (``make compare PEER=NAME``)."""


def peer(name: str) -> Peer:
    try:
        return PEERS[name]
    except KeyError:
        raise ValueError(f"unknown peer {name!r}: one of {', '.join(PEERS)}") from None


def log_of(cluster: "DevCluster", part: str) -> Path:
    """The log file of one of a peer's processes."""
    return cluster.root / "logs" / f"{part}.log"
