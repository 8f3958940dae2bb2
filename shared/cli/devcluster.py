"""``muster devcluster up|down``: the dev cluster (``shared.parts.devcluster``) from the command line."""

from __future__ import annotations

from pathlib import Path

import typer

from shared.cli.errors import failed

devcluster_app = typer.Typer(no_args_is_help=True, help="A real Kubernetes cluster on this machine (etcd, "
                             "kube-apiserver, controller manager, scheduler, KWOK nodes, KubeRay), from `make tools`.")

DIR_HELP = "Folder of the cluster's files, logs and kubeconfig."
PEERS = ("none", "kai")


@devcluster_app.command("up")
def up(directory: Path = typer.Option(Path("build/devcluster"), "--dir", help=DIR_HELP),
       batch_scheduler: str = typer.Option("none", "--batch-scheduler", envvar="BATCH_SCHEDULER",
                                           help="KubeRay's --batch-scheduler: none, volcano, kai-scheduler or "
                                                "scheduler-plugins."),
       nodes: Path = typer.Option(Path("deploy/devcluster/nodes.yaml"), "--nodes", envvar="NODES",
                                  help="Node manifests for KWOK (annotated kwok.x-k8s.io/node: fake)."),
       peer: str = typer.Option("none", "--peer", envvar="PEER",
                                help="A peer scheduler to run beside it: none, or kai (KAI Scheduler's programs "
                                     "from `make tools`; KubeRay then defaults to --batch-scheduler=kai-scheduler)."
                                )) -> None:
    """Start the cluster and leave it running; prints where its kubeconfig is."""
    from shared.parts.catalog import MissingPart
    from shared.parts.devcluster import BATCH_SCHEDULERS, DevCluster, down as stop
    from shared.parts.process import PartFailed

    if peer not in PEERS:
        raise failed(f"--peer {peer}: one of {', '.join(PEERS)}")
    if peer == "kai" and batch_scheduler == "none":
        batch_scheduler = "kai-scheduler"
    if batch_scheduler not in BATCH_SCHEDULERS:
        raise failed(f"--batch-scheduler {batch_scheduler}: one of {', '.join(BATCH_SCHEDULERS)}")
    if not nodes.is_file():
        raise failed(f"--nodes {nodes}: no such file")
    if (directory / "state.json").exists():
        raise failed(f"a dev cluster already runs from {directory}: `make devcluster-down` first")
    cluster = DevCluster(directory, batch_scheduler=batch_scheduler, nodes=nodes)
    try:
        cluster.up()
        if peer == "kai":
            from shared.parts import kai

            cluster.adopt(kai.start(cluster).parts)
    except (MissingPart, PartFailed, OSError) as exc:
        cluster.stop()
        stop(directory)
        raise failed(exc) from None
    typer.echo(f"dev cluster up in {cluster.ready_seconds:.0f} s: {cluster.server}, KubeRay "
               f"--batch-scheduler={batch_scheduler}{'' if peer == 'none' else f', peer {peer} running'}; "
               f"logs in {directory / 'logs'}")
    typer.echo(f"export KUBECONFIG={cluster.kubeconfig}")


@devcluster_app.command("down")
def down(directory: Path = typer.Option(Path("build/devcluster"), "--dir", help=DIR_HELP)) -> None:
    """Stop the cluster and delete its folder."""
    from shared.parts.devcluster import down as stop

    stopped = stop(directory)
    typer.echo(f"stopped {', '.join(stopped)}; removed {directory}" if stopped else f"no dev cluster in {directory}")
