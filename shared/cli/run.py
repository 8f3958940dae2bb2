"""``muster run SERVICE``: one service as a Faust worker on Kafka, one function per kind of service:
a decision service (``_service``), the projector (``_projector``), the cluster link (``_cluster``)."""

from __future__ import annotations

import logging

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import typer
from rich.console import Console

from shared.cli.errors import failed
from shared.cli.options import SCHEDULER_NAMES_HELP, STORE_HELP
from shared.kernel.policy import Policy, PolicyError
from shared.kernel.display import plain

if TYPE_CHECKING:
    from shared.runtime.bus.config import BusConfig

SERVICE_NAMES = ("admission", "queue", "placement", "reconciler", "projector", "cluster")


@dataclass
class _Worker:
    """A service's app, ready to run: its metrics exposition, the metrics socket (None with
    ``--metrics-port 0``) and, for the cluster link holding the Lease, what keeps it."""

    app: Any
    exposition: Any
    sock: Any
    keep: Optional[Callable[[], Any]] = None


@dataclass(frozen=True)
class _Signing:
    """The projector's signing options, as ``run_cmd`` hands them on: the key file, the key it replaces,
    and how often a checkpoint is signed (envelopes, seconds)."""

    key: Optional[Path]
    rotated_from: Optional[Path]
    every: int
    seconds: float


def _only(service: str, default: Any, flag: str, envvar: str, text: str, **bounds: Any) -> Any:
    """An option that one kind of service reads (the others ignore it), set by ``flag`` or ``envvar``:
    its help starts with the service it is for."""
    return typer.Option(default, flag, envvar=envvar, help=f"{service} only: {text}", **bounds)


def run_cmd(
    service: str = typer.Argument(..., help="admission, queue, placement, reconciler, projector, or cluster "
                                  "(the link to a Kubernetes API server: watch -> inboxes, effects -> API)."),
    kafka: Optional[str] = typer.Option(None, "--kafka", envvar="MUSTER_KAFKA",
                                        help="Kafka bootstrap servers, HOST:PORT[,HOST:PORT] (default: $MUSTER_KAFKA)."),
    prefix: Optional[str] = typer.Option(None, "--topic-prefix", envvar="MUSTER_TOPIC_PREFIX",
                                         help="Prefix of every topic name (default: muster.)."),
    policy_file: Optional[Path] = typer.Option(None, "--policy", envvar="MUSTER_POLICY", help="Policy YAML."),
    store: Optional[str] = typer.Option(None, "--store", envvar="MUSTER_STORE", help=STORE_HELP + " Projector only."),
    ordering: str = typer.Option("arrival", "--ordering", help="'arrival' (the deployment) or 'rounds' (as "
                                 "`simulate --bus` starts services: each round waits for the driver's release)."),
    loglevel: str = typer.Option("info", "--log-level", help="Faust worker log level."),
    kube_url: Optional[str] = _only("Cluster", None, "--kube-url", "MUSTER_KUBE_URL",
                                    "API server URL without auth (kubectl proxy)."),
    kubeconfig: Optional[str] = _only("Cluster", None, "--kubeconfig", "MUSTER_KUBECONFIG",
                                      "kubeconfig file (default: in-cluster service account, else $KUBECONFIG "
                                      "or ~/.kube/config)."),
    context: Optional[str] = _only("Cluster", None, "--context", "MUSTER_KUBE_CONTEXT", "kubeconfig context."),
    scheduler_names: Optional[str] = typer.Option(None, "--scheduler-names", envvar="MUSTER_SCHEDULER_NAMES",
                                                  help=SCHEDULER_NAMES_HELP + " Default: the policy's "
                                                  "scheduler_names (muster)."),
    lease: Optional[str] = _only("Cluster", None, "--lease", "MUSTER_LEASE",
                                 "the coordination.k8s.io Lease NAMESPACE/NAME that makes one bridge the applier "
                                 "(default: $POD_NAMESPACE/muster-cluster, else muster-system/muster-cluster); "
                                 "'none' runs without one."),
    identity: Optional[str] = _only("Cluster", None, "--identity", "MUSTER_IDENTITY",
                                    "this bridge's name in the Lease (default: $POD_NAME, else host-pid)."),
    lease_duration: float = _only("Cluster", 15.0, "--lease-duration", "MUSTER_LEASE_DURATION",
                                  "seconds a standby waits for a silent holder."),
    renew_deadline: float = _only("Cluster", 10.0, "--renew-deadline", "MUSTER_RENEW_DEADLINE",
                                  "seconds the holder may fail to renew before it stops."),
    retry_period: float = _only("Cluster", 2.0, "--retry-period", "MUSTER_RETRY_PERIOD",
                                "seconds between lease renewals and tries."),
    metrics_port: int = typer.Option(9464, "--metrics-port", envvar="MUSTER_METRICS_PORT",
                                     help="Serve /metrics, /healthz and /readyz on this port (0: none)."),
    metrics_address: Optional[str] = typer.Option(None, "--metrics-address", envvar="MUSTER_METRICS_ADDRESS",
                                                  help="The address they listen on (default: 0.0.0.0 in a pod, "
                                                  "i.e. with KUBERNETES_SERVICE_HOST set, else 127.0.0.1)."),
    replication: Optional[int] = typer.Option(None, "--topic-replication", help="Replication factor of the "
                                              "topics created when missing (default: $MUSTER_TOPIC_REPLICATION, "
                                              "else 1)."),
    min_insync: Optional[int] = typer.Option(None, "--topic-min-insync", help="Their min.insync.replicas "
                                             "(default: $MUSTER_TOPIC_MIN_INSYNC, else 1)."),
    signing_key: Optional[Path] = _only("Projector", None, "--signing-key", "MUSTER_SIGNING_KEY",
                                        "the Ed25519 key (PEM file; a mounted Kubernetes Secret) that signs "
                                        "checkpoints of the log's hash chain. Without one the log is chained but "
                                        "not signed."),
    rotated_from: Optional[Path] = _only("Projector", None, "--rotated-from", "MUSTER_SIGNING_KEY_PREVIOUS",
                                         "the key --signing-key replaces; it signs the new key's record (a "
                                         "rotation the verifier can follow)."),
    checkpoint_every: int = _only("Projector", 10_000, "--checkpoint-every", "MUSTER_CHECKPOINT_EVERY",
                                  "sign a checkpoint every this many envelopes.", min=1),
    checkpoint_seconds: float = _only("Projector", 60.0, "--checkpoint-seconds", "MUSTER_CHECKPOINT_SECONDS",
                                      "and at least this often while envelopes come.", min=0.0),
) -> None:
    """Run one service as a Faust worker on Kafka: it consumes its inbox and writes to the next ones.

    Tracing: set OTEL_EXPORTER_OTLP_ENDPOINT (and the other standard OTEL_* variables) to send spans."""
    config, policy, epoch = _checked(service, ordering, metrics_port, kafka, prefix, replication, min_insync,
                                     policy_file, scheduler_names)
    sink = _span_sink(epoch)

    def claim_port() -> Any:
        """The metrics socket, once the service's own inputs checked out and before Kafka is asked."""
        return _metrics_socket(metrics_port, metrics_address) if metrics_port else None

    if service == "projector":
        worker = _projector(config, policy, policy_file, store, sink, claim_port,
                            _Signing(signing_key, rotated_from, checkpoint_every, checkpoint_seconds))
    elif service == "cluster":
        worker = _cluster(config, sink, claim_port, loglevel=loglevel, kube_url=kube_url, kubeconfig=kubeconfig,
                          context=context, identity=identity, lease=lease, lease_duration=lease_duration,
                          renew_deadline=renew_deadline, retry_period=retry_period)
    else:
        worker = _service(service, config, policy, ordering, sink, claim_port)
    _run(worker, loglevel, sink)


def _checked(service: str, ordering: str, metrics_port: int, kafka: Optional[str], prefix: Optional[str],
             replication: Optional[int], min_insync: Optional[int], policy_file: Optional[Path],
             scheduler_names: Optional[str]) -> tuple[BusConfig, Policy, Any]:
    """The flags, the broker's settings, the policy and the tracing settings, checked before anything
    starts: a bad one is one line and exit code 2."""
    from shared.observability.tracing.config import TracingConfigError, check, epoch_from_env
    from shared.runtime.bus.config import BusConfig, BusConfigError

    if service not in SERVICE_NAMES:
        raise failed(f"unknown service {service!r}: one of {', '.join(SERVICE_NAMES)}")
    if ordering not in ("arrival", "rounds"):
        raise failed(f"--ordering {ordering}: 'arrival' or 'rounds'")
    if not 0 <= metrics_port <= 65535:
        raise failed(f"--metrics-port {metrics_port}: a port from 1 to 65535, or 0 for none")
    try:
        config = BusConfig.from_env(kafka, prefix=prefix, replication=replication, min_insync=min_insync)
        policy = (Policy.from_yaml(policy_file) if policy_file else Policy()).with_scheduler_names(scheduler_names)
        check()
        epoch = epoch_from_env()
    except (BusConfigError, PolicyError, TracingConfigError) as exc:
        raise failed(exc) from None
    return config, policy, epoch


def _span_sink(epoch: Any) -> Any:
    """Where the worker's spans go when tracing is on (``OTEL_EXPORTER_OTLP_ENDPOINT``); None when off."""
    from shared.observability.tracing.config import enabled

    if not enabled():
        return None
    from shared.observability.tracing.otel import SpanSink

    return SpanSink(epoch=epoch)


def _service(service: str, config: BusConfig, policy: Policy, ordering: str, sink: Any,
             claim_port: Callable[[], Any]) -> _Worker:
    """A decision service (admission, queue, placement, reconciler): its inbox checked, its app."""
    from shared.observability.metrics import server as metrics
    from shared.runtime.bus.app import service_app

    from shared.runtime.bus.snapshot import SnapshotKeeper

    sock = claim_port()
    signed = config.snapshot_key_file is not None  # else no snapshots: none could be trusted after a restart
    _topics_or_exit(config, f"the {service} service", config.topics.inbox(service), group=f"{config.prefix}{service}",
                    replays=True, snapshots=SnapshotKeeper(config, service, policy) if signed else None)
    if not signed:
        Console(stderr=True, highlight=False, soft_wrap=True).print(
            f"{service}: snapshots off (no MUSTER_SNAPSHOT_KEY_FILE): every start replays the whole inbox")
    app_ = service_app(service, config, policy, ordering=ordering, sink=sink,  # type: ignore[arg-type]
                       snapshots=None if signed else False)
    return _Worker(app_, metrics.service_exposition(app_, service), sock)


def _projector(config: BusConfig, policy: Policy, policy_file: Optional[Path], store: Optional[str], sink: Any,
               claim_port: Callable[[], Any], signing: _Signing) -> _Worker:
    """The projector: its store's tables made (and the services' policy recorded there, signed when it
    has a signing key), the log topic checked from where the store says it read to, its app."""
    from shared.history import StoreError, schema
    from shared.history.engine import resolve_url
    from shared.history.integrity import BadKey, Signer
    from shared.observability.metrics import server as metrics
    from shared.runtime.bus.projector import projector_app

    try:
        signer = Signer.from_file(signing.key) if signing.key else None
        previous = Signer.from_file(signing.rotated_from) if signing.rotated_from else None
    except BadKey as exc:
        raise failed(str(exc)) from None
    if signer is None:
        logging.getLogger("muster.projector").warning(
            "projector: no --signing-key ($MUSTER_SIGNING_KEY): the log is hash-chained but its checkpoints are "
            "not signed, so an auditor cannot tell it from a rewritten one (docs/operations.md, signing key)")
    header = None
    try:
        url = resolve_url(store)
        schema.ensure(url)
        if policy_file:  # the services' policy: what `muster replay --verify` needs to rebuild them
            from shared.audit.header import LogHeader
            from shared.history.header import write_header

            header = LogHeader.made_now(policy, origin="kafka").for_store()
            write_header(url, header)
    except StoreError as exc:
        raise failed(exc) from None
    sock = claim_port()
    _topics_or_exit(config, "the projector", config.topics.log, resume=_stored_offset(url, config.topics.log))
    app_ = projector_app(config, url, sink=sink, signer=signer, rotated_from=previous,
                         checkpoint_every=signing.every, checkpoint_seconds=signing.seconds)
    if header is not None and signer is not None:  # by the app's writer: its key and header records go to the
        try:                                        # checkpoints topic too, which a Kafka export reads them from
            app_.muster_writer.sign_header(header)  # type: ignore[attr-defined]
        except StoreError as exc:
            raise failed(exc) from None
    return _Worker(app_, metrics.projector_exposition(app_), sock)


def _cluster(config: BusConfig, sink: Any, claim_port: Callable[[], Any], *, loglevel: str,
             kube_url: Optional[str], kubeconfig: Optional[str], context: Optional[str], identity: Optional[str],
             lease: Optional[str], lease_duration: float, renew_deadline: float, retry_period: float) -> _Worker:
    """The cluster link: the API server answering, the effects topic checked, its app, and (unless
    ``--lease none``) the Lease taken before it runs."""
    import asyncio
    import socket

    from shared.kubernetes.app import cluster_app
    from shared.kubernetes.cluster import KubeTarget, keep_lease, reachable

    who = identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    target = KubeTarget(kube_url, kubeconfig, context, identity=who)
    problem = asyncio.run(reachable(target))
    if problem:
        raise failed(f"Kubernetes API: {problem}")
    sock = claim_port()
    _topics_or_exit(config, "the cluster link", config.topics.effects, group=f"{config.prefix}cluster")
    app_ = cluster_app(config, target, sink=sink, loglevel=loglevel)
    from shared.observability.metrics import server as metrics

    worker = _Worker(app_, metrics.cluster_exposition(app_), sock)
    if (lease or "").lower() != "none":
        elector = _take_lease(target, who, lease, worker, lease_duration=lease_duration,
                              renew_deadline=renew_deadline, retry_period=retry_period)
        worker.keep = lambda: keep_lease(target, elector)
    return worker


def _take_lease(target: Any, who: str, lease: Optional[str], worker: _Worker, *, lease_duration: float,
                renew_deadline: float, retry_period: float) -> Any:
    """Wait until this bridge holds the Lease ``--lease`` names, alive and not ready meanwhile; the
    elector that holds it."""
    import asyncio

    from shared.kubernetes.cluster import take_lease
    from shared.kubernetes.lease import LeaseElector
    from shared.observability.metrics import server as metrics

    where = lease or f"{os.environ.get('POD_NAMESPACE') or 'muster-system'}/muster-cluster"
    namespace, _, name = where.partition("/")
    if not namespace or not name or "/" in name:
        raise failed(f"--lease {where!r}: give it as NAMESPACE/NAME, or none")
    try:
        elector = LeaseElector(namespace, name, who, lease_duration=lease_duration,
                               renew_deadline=renew_deadline, retry_period=retry_period)
    except ValueError as exc:
        raise failed(f"--lease-duration/--renew-deadline/--retry-period: {exc}") from None
    standby = None
    if worker.sock is not None:  # a standby is alive and not ready (on a copy: the server closes its socket)
        waiting = metrics.Health(ready=[lambda: f"standing by for the lease {where}"])
        standby = lambda: metrics.serve(worker.sock.dup(), worker.exposition.registry, waiting)  # noqa: E731
    try:
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        asyncio.run(take_lease(target, elector, say=lambda line: err.print(plain(line)), meanwhile=standby))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except Exception as exc:  # noqa: BLE001 - forbidden, unreachable: one line, exit 2
        raise failed(f"Kubernetes API: cannot take the lease {where}: "
                      f"{' '.join(str(exc).split()) or type(exc).__name__}") from None
    return elector


def _run(worker: _Worker, loglevel: str, sink: Any) -> None:
    """Serve its metrics, keep its Lease (the cluster link), run the worker until it stops; then
    stop keeping the Lease and send the spans left."""
    from shared.runtime.bus.app import run_app

    if worker.sock is not None:
        worker.exposition.attach(worker.app, worker.sock)
    keeper = worker.keep() if worker.keep is not None else None
    try:
        run_app(worker.app, loglevel=loglevel)
    finally:
        if keeper is not None:
            keeper.stop()
        if sink is not None:
            sink.close()  # sends what is left


def _metrics_socket(port: int, address: Optional[str]) -> Any:
    """The metrics port, bound on ``address`` (``default_address`` when not given); a busy one is one line
    and exit code 2."""
    from shared.observability.metrics.server import MetricsPortError, bind, default_address

    try:
        return bind(port, address or default_address(os.environ))
    except MetricsPortError as exc:
        raise failed(exc) from None


def _topics_or_exit(config: BusConfig, reader: str, topic: str, *, group: str | None = None,
                    resume: int | None = None, replays: bool = False, snapshots: Any = None) -> None:
    """Create the topics when missing and check that ``topic`` holds what ``reader`` needs
    (``shared.runtime.bus.app.ready_to_read``); an unusable Kafka, a topic that would lose records or has
    lost some is one line and exit code 2."""
    import asyncio
    import logging

    from shared.runtime.bus.app import TopicUnfit, ready_to_read

    quiet = logging.getLogger("aiokafka")
    level, quiet.level = quiet.level, logging.CRITICAL  # its retries would print lines of their own
    try:
        asyncio.run(asyncio.wait_for(ready_to_read(config, topic, reader, group=group, resume=resume,
                                                   replays=replays, snapshots=snapshots), 60))
    except TopicUnfit as exc:
        raise failed(f"not starting: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - unreachable, refused, misconfigured: one line, exit 2
        raise failed(f"Kafka at {','.join(config.servers)} cannot be used: "
                      f"{' '.join(str(exc).split()) or type(exc).__name__}") from None
    finally:
        quiet.setLevel(level)


def _stored_offset(url: str, topic: str) -> int | None:
    """Where the projector's store says it reads ``topic`` (partition 0) on; None when it never did."""
    from shared.history import StoreError
    from shared.history.writer import ProjectionWriter
    from shared.runtime.bus.projector import CONSUMER

    try:
        with ProjectionWriter(url, consumer=CONSUMER) as writer:
            return writer.consumed_offsets(topic).get(0)
    except StoreError as exc:
        raise failed(exc) from None
