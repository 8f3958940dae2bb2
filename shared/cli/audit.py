"""The audit commands (``shared/audit``): ``muster log export|import``, ``replay``, ``explain``, ``report``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.console import Console

from shared.cli.errors import failed
from shared.cli.options import LOCAL_HELP, STORE_HELP, TIME_HELP, resolved, time_arg, tracing_ready, writable
from shared.kernel.eventtime import TimeArg, TimeFormat
from shared.kernel.policy import Policy, PolicyError
from shared.sim.scenario import ScenarioError
from shared.kernel.display import plain

if TYPE_CHECKING:
    from collections.abc import Iterator

    from shared.kernel.events import Envelope

LOG_HELP = ("The log: an exported file (.jsonl or .jsonl.gz), a history store URL (sqlite:///h.db, "
            "postgresql+psycopg://...) or a Kafka address (kafka://HOST:PORT).")
PREFIX_HELP = "With a Kafka log: the stack's topic prefix (default: $MUSTER_TOPIC_PREFIX, else muster.)."


def _audit_failed(exc: Exception) -> typer.Exit:
    """An unusable log or store: one line, and the exit code of its kind (shared/audit/errors.py)."""
    from shared.audit.errors import AuditError

    text = " ".join(line.strip() for line in str(exc).splitlines()
                    if line.strip() and not line.strip().startswith("For further information"))
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[red]error:[/] {plain(text)}")
    return typer.Exit(exc.exit_code if isinstance(exc, AuditError) else 2)


def _audit_errors() -> tuple[type[Exception], ...]:
    from shared.audit.errors import AuditError

    return (AuditError, PolicyError, ScenarioError)


def _policy(path: Optional[Path]) -> Optional[Policy]:
    return Policy.from_yaml(path) if path else None


def log_export(
    out: Path = typer.Option(..., "--out", help="The file to write (JSON Lines; gzip when it ends .gz)."),
    source: Optional[str] = typer.Option(None, "--from", help="Where the log is: kafka://HOST:PORT, a store URL "
                                         "or an exported file."),
    store: Optional[str] = typer.Option(None, "--store", help="Export this history store's log (same as --from URL)."),
    since_arg: Optional[TimeArg] = typer.Option(None, "--since", parser=time_arg, metavar="TIME",
                                                help="Only envelopes at or after this time: " + TIME_HELP + "."),
    until_arg: Optional[TimeArg] = typer.Option(None, "--until", parser=time_arg, metavar="TIME",
                                                help="Only envelopes at or before this time (as --since)."),
    local: bool = typer.Option(False, "--local", help=LOCAL_HELP),
    policy_file: Optional[Path] = typer.Option(None, "--policy", help="The policy the services ran with, for the "
                                               "header (a Kafka log does not record it)."),
    prefix: Optional[str] = typer.Option(None, "--topic-prefix", envvar="MUSTER_TOPIC_PREFIX", help=PREFIX_HELP),
) -> None:
    """Write the event log to a file: a header line (muster and schema version, the policy), one envelope a line;
    chained and signed when the log is (a store, or Kafka whose projector has a signing key)."""
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
        since, until = resolved(clock, since_arg, "--since"), resolved(clock, until_arg, "--until")
        if since is not None and until is not None and since > until:
            assert since_arg is not None and until_arg is not None
            raise _audit_failed(ValueError(f"--since {since_arg.text} is after --until {until_arg.text}: the window "
                                           "holds no time"))
        with progress_of(log, "exporting") as tick:
            count = export(log, out, since=since, until=until, tick=tick)
    except _audit_errors() as exc:
        raise _audit_failed(exc) from None
    typer.echo(f"wrote {count} events to {out}")


def log_archive(
    until_arg: TimeArg = typer.Option(..., "--until", parser=time_arg, metavar="TIME",
                                      help="Archive what came before this time: " + TIME_HELP + "."),
    out: Path = typer.Option(..., "--out", help="The archive to write (a chained log file; gzip when it ends .gz)."),
    store: Optional[str] = typer.Option(None, "--store", envvar="MUSTER_STORE", help=STORE_HELP),
    prune: bool = typer.Option(False, "--prune", help="Then delete the archived envelopes from the store."),
    local: bool = typer.Option(False, "--local", help=LOCAL_HELP),
) -> None:
    """Write the log before --until as a verified, chained, signed archive (cut at the last checkpoint before it);
    with --prune, remove those records from the store. `muster replay LOG --verify --archive FILE` checks both as
    one chain."""
    from shared.audit.archive import archive
    from shared.audit.export import first_time
    from shared.audit.logfile import StoreLog
    from shared.history import StoreError
    from shared.history.engine import resolve_url

    try:
        source = StoreLog(resolve_url(store))
        clock = TimeFormat.of(source.header.origin, first_time(source), local=local)
        until = resolved(clock, until_arg, "--until")
        assert until is not None
        done = archive(source, until, out, prune=prune)
    except StoreError as exc:
        raise failed(exc) from None
    except _audit_errors() as exc:
        raise _audit_failed(exc) from None
    through = ", ".join(f"partition {p} through offset {o}" for p, o in sorted(done.through.items()))
    typer.echo(f"archived {done.envelopes} events ({through}) to {out}, verified"
               + (f"; {done.pruned} pruned from the store" if prune else ""))


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
    public_keys: list[Path] = typer.Option([], "--public-key", help="With --verify: the signer's public key (PEM, as "
                                           "`muster log key` prints it); every checkpoint must be signed by it or by a "
                                           "key it endorsed. Repeat for several."),
    witness: Optional[Path] = typer.Option(None, "--witness", help="With --verify: checkpoints stored elsewhere "
                                           "(`muster log checkpoints` output); the log must agree with each."),
    archive_file: Optional[Path] = typer.Option(None, "--archive", help="With --verify: the archive of what came "
                                                "before this log (`muster log archive --prune`): both are checked as "
                                                "one chain and their decisions re-derived as one log."),
) -> None:
    """Replay an event log through the cores: --verify checks the log's hash chain and signed checkpoints, then
    re-derives every decision; --what-if tries another policy; --trace sends the history's traces to Tempo."""
    from shared.audit.logfile import open_log

    console = Console(highlight=False, width=max(Console().width, 120), soft_wrap=True)
    if not verify and what_if is None and not trace:
        raise _audit_failed(ValueError("say what to do with the log: --verify, --what-if POLICY.yaml, --trace, "
                                       "or several"))
    if what_if is None and (apply or html_out or json_out or approximate):
        raise _audit_failed(ValueError("--apply, --html, --json and --approximate go with --what-if"))
    for path, what in ((html_out, "the what-if page"), (json_out, "the what-if comparison")):
        if path is not None:
            writable(path, what)  # before the long part, not a traceback after it
    if trace:
        tracing_ready(Console(stderr=True, highlight=False))
    try:
        override = _policy(policy_file)
        source = open_log(log, topic_prefix=prefix)
        code = 0
        if verify or what_if is not None:
            source.header.whole("--verify" if verify else "--what-if")  # a Kafka log is read here
        if override is not None:  # once the log reads: a log that does not is one error line, nothing else
            Console(stderr=True, highlight=False, soft_wrap=True).print(
                f"[yellow]note:[/] --policy {plain(str(policy_file))} overrides the policy the log records: every "
                "decision is re-derived under it, and a divergence may be that policy's, not an altered log")
        if verify:
            from shared.audit import verify as verifying

            code = _integrity(source, public_keys, witness, console, archive_file)
            if code == 0 and archive_file is not None:
                from shared.audit.logfile import Joined, LogFile

                source = Joined(LogFile(archive_file), source)
            if code == 0:
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


def _integrity(source: Any, public_keys: list[Path], witness: Optional[Path], console: Console,
               archive_file: Optional[Path] = None) -> int:
    """``--verify``'s first step: the log's chain and signed records (``shared.audit.integrity``); 0 when
    they hold (or the log has none, said so), else ``TAMPERED`` with the first line that shows it."""
    import tempfile

    from shared.audit.export import export
    from shared.audit.integrity import TAMPERED, Tampered, check, read_witness, summary, trusted_keys
    from shared.audit.logfile import LogFile, StoreLog
    from shared.history.integrity import BadKey

    try:
        keys = trusted_keys(public_keys)
    except BadKey as exc:
        raise _audit_failed(ValueError(str(exc))) from None
    witnessed = read_witness(witness) if witness is not None else []
    after = None
    try:
        if archive_file is not None:
            archived = check(LogFile(archive_file), keys, sealed=False)
            after = archived.ends
            reach = [w for w in witnessed if w.get("offset", -1) <= after.get(w.get("partition"), (-1,))[0]]
            if reach:
                check(LogFile(archive_file), keys, reach, sealed=False)
            witnessed = [w for w in witnessed if w not in reach]
            console.print(f"[green]archive OK[/]: {plain(archive_file.name)}: {plain(summary(archived))}")
        from shared.audit.kafka import KafkaLog

        if isinstance(source, KafkaLog) and source.signed:  # checked as its export would hold it
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "kafka.jsonl"
                export(source, path)
                verdict = check(LogFile(path), keys, witnessed, after=after)
        elif isinstance(source, StoreLog) and source.chained() and source.signed():
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "store.jsonl"
                export(source, path)
                verdict = check(LogFile(path), keys, witnessed, after=after)
        elif isinstance(source, LogFile) and source.header.chained:
            verdict = check(source, keys, witnessed, after=after)
        else:
            if keys or witnessed:
                console.print(f"[bold red]NOT CHAINED[/]: {plain(source.name)} carries no hash chain (a Kafka log "
                              "whose projector had no signing key, or a store or file made before the chain "
                              "existed): its authenticity cannot be checked; "
                              "export the projector's store instead")
                return TAMPERED
            console.print("[yellow]note:[/] the log carries no hash chain (a Kafka log whose projector had no "
                          "signing key, or made before the chain existed): its decisions are checked below, not "
                          "that it is the log that was written")
            return 0
    except Tampered as exc:
        console.print(f"[bold red]TAMPERED[/]: {plain(str(exc))}")
        return TAMPERED
    console.print(f"[green]chain OK[/]: {plain(summary(verdict))}")
    for note in verdict.notes:
        console.print(f"[yellow]note:[/] {plain(note)}")
    return 0


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
    console.print(f"[bold]{plain(title)}[/]")
    for line in whatif.verdict(doc):
        console.print(plain(line), style=None if outcome.faithful else "yellow")
    table = Table(title=f"per queue, recorded -> new (to {clock.at(outcome.end)})", title_justify="left")
    table.add_column("queue")
    for _, label in whatif.COLUMNS:
        table.add_column(label)
    for name, cells in whatif.table_rows(doc):
        table.add_row(plain(name), *cells)
    console.print(table)
    if whatif.has_lower_bounds(doc):
        console.print(plain(whatif.AT_LEAST))
    console.print(f"{len(doc['changed'])} of {len(doc['workloads'])} workloads changed")
    for key in doc["changed"]:
        console.print(plain(f"  {key}: {'; '.join(doc['workloads'][key]['change'])}"))
    if outcome.unmodeled:
        console.print("not modeled (the cluster's answer to a changed admission is not in the recording):")
        for gap in outcome.unmodeled:
            console.print(plain(f"  {gap.words(clock.at)}"))
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


def explain_cmd(
    workload: Optional[str] = typer.Argument(None, metavar="NAMESPACE/NAME", help="The workload to explain."),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    log: Optional[str] = typer.Option(None, "--log", help="An exported log file (or kafka://HOST:PORT)."),
    at_arg: Optional[TimeArg] = typer.Option(None, "--at", parser=time_arg, metavar="TIME",
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
        at = resolved(clock, at_arg, "--at")
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
            f"[red]error:[/] no {'queue' if isinstance(exc, UnknownQueue) else 'workload'} {plain(exc.key)} in the log"
            + (f" up to {clock.at(exc.at)}" if at is not None and exc.at is not None else "")
            + (f" (the log is a window from {clock.at(source.header.since)})" if source.header.since is not None else "")
            + (f"; did you mean {plain(', '.join(exc.similar))}?" if exc.similar else ""))
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
            console.print(plain(note))
        console.print(f"queue {plain(queue)} at {plain(clock.at(moment.at))}: {len(doc)} waiting")
        for line in doc:
            waited = f", waiting {clock.duration(line['waiting_seconds'])}" if line["waiting_seconds"] is not None else ""
            backoff = f", backing off until {clock.at(line['backoff_until'])}" if line["backoff_until"] else ""
            console.print(plain(f"  {line['position']}. {line['workload']} priority {line['priority']}{waited}"
                                 f"{backoff}: {line['reason']}"))
        return
    for text in doc["lines"]:
        console.print(plain(text))


def _first_of(items: Iterator[Envelope]) -> tuple[Optional[float], Iterator[Envelope]]:
    """The first envelope's event time and every envelope, the first included: the log read once."""
    import itertools

    head = next(items, None)
    if head is None:
        return None, iter(())
    return head.occurred_at, itertools.chain((head,), items)


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
