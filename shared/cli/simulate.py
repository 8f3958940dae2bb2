"""``muster simulate``: a scenario on the embedded stack, on Kafka (``--bus``) or on a real cluster (``--cluster``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from shared.cli.errors import failed
from shared.cli.options import SCHEDULER_NAMES_HELP, tracing_ready, writable, write
from shared.kernel.policy import Policy, PolicyError
from shared.sim.scenario import ScenarioError, load_scenario
from shared.kernel.display import plain


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
        raise failed(f"--services {services}: 'tasks' or 'processes'")
    if json_out is not None:
        writable(json_out, "the result document")
    if trace:
        tracing_ready(err)
    if store is not None:
        from shared.history import StoreError, schema

        try:
            schema.ensure(store)  # a bad URL or an unreachable store fails before the run, not after
        except StoreError as exc:
            raise failed(exc) from None
    stream = None  # the embedded run's log, written to --store as it is made (not kept whole in memory)
    try:
        policy = Policy.from_yaml(policy_file) if policy_file else None
        if scheduler_names is not None:
            policy = (policy or Policy()).with_scheduler_names(scheduler_names)
        loaded = load_scenario(scenario)
        for note in loaded.notes():
            err.print(f"[yellow]note:[/] {plain(note)}")
        if cluster is not None and bus is not None:
            raise failed("--cluster and --bus: choose one")
        if cluster is not None:
            run = _simulate_live(loaded, policy, cluster, trace=trace, keep_log=trace or store is not None)
        elif bus is not None:
            run = _simulate_on_bus(loaded, policy, bus, services, store, keep_topics, err, trace)
        else:
            if store is not None:
                stream = _stream(store, loaded, policy)
            run = simulate(loaded, policy, traced=trace, keep_log=trace, listener=stream)  # the log's only readers
    except (ScenarioError, PolicyError) as exc:
        if stream is not None:
            stream.close()
        raise failed(exc) from None
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
            if stream is not None:
                written = stream.finish()
            elif bus is None:
                written = record(store, run.runtime.log, header=header.for_store())
            else:
                write_header(store, header.for_store())
        except StoreError as exc:
            raise failed(exc) from None
    if json_out:
        write(json_out, json.dumps(result, indent=2) + "\n", "the result document")
    failures = run.check() if check else []
    if quiet:
        for f in failures:
            err.print(f"[red]✗[/] {plain(str(f))}")
    else:
        from shared.sim.timeline import render

        render(result, console, failures, checked=check, elastic=run.history.elastic_waits(),
               warnings=run.history.warnings())
        if written is not None:
            from shared.history.engine import display

            console.print(f"[dim]history: {written.events} events written to {plain(display(store))}"
                          + (f" ({written.skipped} were there already)" if written.skipped else "") + "[/]")
        elif store is not None:
            from shared.history.engine import display

            console.print(f"[dim]history: the projector wrote the event log to {plain(display(store))}[/]")
    if not_sent is not None:
        raise failed(f"--trace: {not_sent}")
    if failures:
        raise typer.Exit(1)


def _stream(store: str, scenario: Any, policy: Optional[Policy]) -> Any:
    """The writer of the embedded run's log to ``store`` as it is made, with the header the run is
    made under (its policy, the scenario), known before the run."""
    from shared.audit.header import LogHeader
    from shared.history import StoreError
    from shared.history.stream import LogStream

    header = LogHeader.made_now(scenario.effective_policy(policy), origin="simulate", scenario=scenario.name,
                                until=scenario.until)
    try:
        return LogStream(store, header=header.for_store())
    except StoreError as exc:
        raise failed(exc) from None


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
        raise failed(exc) from None
    problem = kafka_answers(",".join(config.servers))
    if problem:
        raise failed(f"Kafka at {bus} does not answer: {problem}")
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
        raise failed(exc) from None
    finally:
        if sink is not None:
            sink.close()
        if not keep_topics:  # the run's own (prefix of its own); the history, if asked for, is in --store
            delete_topics(config)
        else:  # the prefix has a random part: without it nobody finds them again
            err.print(f"topics kept: {plain(config.prefix)}* (e.g. muster log export --from {plain(bus)} "
                      f"--topic-prefix {plain(config.prefix)} --out log.jsonl)", soft_wrap=True)
