"""``muster devcluster up|down``: the dev cluster (``shared.parts.devcluster``) from the command line."""

from __future__ import annotations

from pathlib import Path

import typer

from shared.cli.errors import failed

devcluster_app = typer.Typer(no_args_is_help=True, help="A real Kubernetes cluster on this machine (etcd, "
                             "kube-apiserver, controller manager, scheduler, KWOK nodes, KubeRay), from `make tools`.")

DIR_HELP = "Folder of the cluster's files, logs and kubeconfig."


@devcluster_app.command("up")
def up(directory: Path = typer.Option(Path("build/devcluster"), "--dir", help=DIR_HELP),
       batch_scheduler: str = typer.Option("none", "--batch-scheduler", envvar="BATCH_SCHEDULER",
                                           help="KubeRay's --batch-scheduler: none, volcano, kai-scheduler or "
                                                "scheduler-plugins."),
       nodes: Path = typer.Option(Path("deploy/devcluster/nodes.yaml"), "--nodes", envvar="NODES",
                                  help="Node manifests for KWOK (annotated kwok.x-k8s.io/node: fake)."),
       peer: str = typer.Option("", "--peer", envvar="PEER",
                                help="Run a peer scheduler too (volcano), KubeRay's --batch-scheduler set for it."),
       configuration: str = typer.Option("", "--peer-config",
                                         help="The peer's configuration (volcano: e2e, the default, or installer).")
       ) -> None:
    """Start the cluster and leave it running; prints where its kubeconfig is."""
    from shared.parts.catalog import MissingPart
    from shared.parts.devcluster import BATCH_SCHEDULERS, DevCluster, down as stop
    from shared.parts.peers import peer as find_peer
    from shared.parts.process import PartFailed

    try:
        chosen = find_peer(peer) if peer else None
    except ValueError as exc:
        raise failed(f"--peer: {exc}") from None
    if chosen is not None:
        batch_scheduler = chosen.batch_scheduler
        configuration = configuration or chosen.configurations[0]
        if configuration not in chosen.configurations:
            raise failed(f"--peer-config {configuration}: one of {', '.join(chosen.configurations)}")
    if batch_scheduler not in BATCH_SCHEDULERS:
        raise failed(f"--batch-scheduler {batch_scheduler}: one of {', '.join(BATCH_SCHEDULERS)}")
    if not nodes.is_file():
        raise failed(f"--nodes {nodes}: no such file")
    if (directory / "state.json").exists():
        raise failed(f"a dev cluster already runs from {directory}: `make devcluster-down` first")
    cluster = DevCluster(directory, batch_scheduler=batch_scheduler, nodes=nodes)
    try:
        cluster.up()
        started = chosen.start(cluster, configuration) if chosen is not None else []
    except (MissingPart, PartFailed, OSError) as exc:
        cluster.stop()
        stop(directory)
        raise failed(exc) from None
    typer.echo(f"dev cluster up in {cluster.ready_seconds:.0f} s: {cluster.server}, KubeRay "
               f"--batch-scheduler={batch_scheduler}; logs in {directory / 'logs'}")
    if chosen is not None:
        typer.echo(f"peer {chosen.name} ({configuration}): {', '.join(started)}")
    typer.echo(f"export KUBECONFIG={cluster.kubeconfig}")


@devcluster_app.command("down")
def down(directory: Path = typer.Option(Path("build/devcluster"), "--dir", help=DIR_HELP)) -> None:
    """Stop the cluster and delete its folder."""
    from shared.parts.devcluster import down as stop

    stopped = stop(directory)
    typer.echo(f"stopped {', '.join(stopped)}; removed {directory}" if stopped else f"no dev cluster in {directory}")
