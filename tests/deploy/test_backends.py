"""The observability stack against real backends: a live run sends its traces to a real Jaeger and
is scraped by a real Prometheus with the repository's scrape config, and what a person would look at
is there.

One run (``backends-run.yaml``: reclaims, failed placements, waits, limits) goes through the five
services as ``muster run`` processes on a real Kafka broker, the projector writing to a real
PostgreSQL, with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointed at Jaeger (``shared.parts.jaeger``, built
by ``make tools``) and every service's ``/metrics`` scraped by Prometheus (``shared.parts.prometheus``,
Debian's) from ``deploy/prometheus/prometheus.yml`` rendered with this run's ports. Then:

- Jaeger: every workload incarnation's trace is found by the id derived from the log
  (``shared.observability.tracing.context.trace_id``), and no other trace; each has one root; its queued span
  lasts the wait ``muster explain`` reports; no child span starts before its parent.
- Prometheus: every service is a healthy target; every query of every panel of every dashboard in
  ``deploy/grafana/dashboards`` (template variables filled as Grafana would for "All") returns at
  least one series, and every query variable at least one value.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from shared.history import schema
from shared.kernel.topology import SERVICES
from shared.observability.tracing.context import root_span, trace_id
from shared.parts.process import free_port
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.driver import ServiceHost, simulate_on_bus
from shared.runtime.simulate import Run
from shared.sim.scenario import load_scenario
from tests.builders.cli import invoke
from tests.conftest import _missing, delete_topics, empty

ROOT = Path(__file__).parents[2]
SCENARIO = Path(__file__).with_name("backends-run.yaml")
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DASHBOARDS = sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"))
SCRAPE_SECONDS = 1
RATE_INTERVAL = f"{4 * SCRAPE_SECONDS}s"
"""What Grafana puts for ``$__rate_interval``: four scrape intervals (at least), so a rate has two samples."""
WAITING = ("Queued", "Preempted")


# --------------------------------------------------------------------------- the run
def render_scrape_config(ports: dict[str, int], path: Path) -> set[str]:
    """The repository's scrape config with its targets (compose's ``SERVICE:9464``) pointed at this run's
    ports, scraping every second; the targets it names. A job whose services this run has none of (the
    cluster link: the run's cluster is simulated) keeps no target."""
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    named: set[str] = set()
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            hosts = [t.rsplit(":", 1)[0] for t in static["targets"]]
            static["targets"] = [f"127.0.0.1:{ports[h]}" for h in hosts if h in ports]
            named.update(h for h in hosts if h in ports)
    config["global"]["scrape_interval"] = f"{SCRAPE_SECONDS}s"
    path.write_text(yaml.safe_dump(config))
    return named


def panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, PromQL) of every Prometheus target of every panel."""
    out = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                kind = (target.get("datasource") or panel.get("datasource") or {}).get("type", "")
                if kind == "prometheus" and target.get("expr"):
                    out.append((path.name, panel["title"], target["expr"]))
    return out


def variable_queries() -> list[tuple[str, str, str, str]]:
    """(dashboard file, variable, metric, label) of every ``label_values(metric, label)`` variable."""
    out = []
    for path in DASHBOARDS:
        for variable in json.loads(path.read_text())["templating"]["list"]:
            if variable["type"] == "query":
                found = re.fullmatch(r"\s*label_values\(\s*([^,\s]+)\s*,\s*(\w+)\s*\)\s*", variable["definition"])
                assert found, f"{path.name}: ${variable['name']} is not label_values(metric, label)"
                out.append((path.name, variable["name"], found.group(1), found.group(2)))
    return out


def fill(expr: str) -> str:
    """A panel's query as Grafana sends it with every picker on "All" (``.*``) and a short run's rate window."""
    text = expr.replace("$__rate_interval", RATE_INTERVAL).replace("${__rate_interval}", RATE_INTERVAL)
    text = re.sub(r"\$\{?(queue|resource|workload)\}?", ".*", text)
    assert "$" not in text, f"a template variable this test does not fill: {expr}"
    return text


@dataclass
class Live:
    """What the live run left behind for the checks."""

    run: Run | None = None
    epoch: float = 0.0
    store: str = ""
    missing: dict[str, Exception] = field(default_factory=dict)
    jaeger: Any = None
    targets: list[dict[str, Any]] = field(default_factory=list)
    scraped: set[str] = field(default_factory=set)
    series: dict[str, int] = field(default_factory=dict)
    """Filled panel query -> the number of series it returned (0: none within the time)."""
    values: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def need(self, part: str) -> None:
        if part in self.missing:
            _missing(self.missing[part])


def _collect(prometheus: Any, live: Live, queries: list[str], timeout: float = 60.0) -> None:
    """Poll the panels' queries (and the variables) until each returns a series, or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    pending = set(queries)
    variables = {(metric, label) for _, _, metric, label in variable_queries()}
    while True:
        live.targets = prometheus.targets()
        for query in sorted(pending):
            try:
                found = len(prometheus.query(query))
            except Exception as exc:  # the server's refusal is the finding
                live.errors[query] = str(exc)
                pending.discard(query)
                continue
            live.series[query] = found
            if found:
                pending.discard(query)
        for metric, label in sorted(variables):
            live.values[(metric, label)] = prometheus.api(f"label/{label}/values", **{"match[]": metric})
        healthy = {t["scrapePool"] + t["labels"]["instance"] for t in live.targets if t["health"] == "up"}
        if (not pending and len(healthy) == len(live.targets) and all(live.values.values())) \
                or time.monotonic() > deadline:
            return
        time.sleep(SCRAPE_SECONDS)


@pytest.fixture(scope="module")
def live(kafka_bootstrap: str, postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    from shared.observability.tracing.otel import SpanSink
    from shared.parts.catalog import MissingPart
    from shared.parts.jaeger import JaegerServer
    from shared.parts.process import PartFailed
    from shared.parts.prometheus import PrometheusServer

    if schema.current(postgres_url) != schema.head():
        schema.upgrade(postgres_url)
    empty(postgres_url)
    seen = Live(store=postgres_url)
    workdir = tmp_path_factory.mktemp("backends")
    ports = {name: free_port() for name in (*SERVICES, "projector")}
    with ExitStack() as stack:
        try:
            seen.jaeger = stack.enter_context(JaegerServer(workdir / "jaeger"))
        except (MissingPart, PartFailed) as exc:
            seen.missing["jaeger"] = exc
        prometheus = None
        try:
            seen.scraped = render_scrape_config(ports, workdir / "prometheus.yml")
            prometheus = stack.enter_context(PrometheusServer(workdir / "prometheus.yml", workdir / "prometheus"))
        except (MissingPart, PartFailed) as exc:
            seen.missing["prometheus"] = exc
        if len(seen.missing) == 2:
            _missing(seen.missing["jaeger"])
        env = stack.enter_context(pytest.MonkeyPatch.context())
        if seen.jaeger is not None:
            env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", seen.jaeger.otlp_endpoint)
        else:
            env.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
        env.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
        env.delenv("OTEL_SERVICE_NAME", raising=False)
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")  # the SDK's batch wait: send within the run

        def after_run(run: Run, host: ServiceHost) -> None:
            if prometheus is not None:
                _collect(prometheus, seen, sorted({fill(q) for _, _, q in panel_queries()}))

        seen.epoch = time.time()
        sink = SpanSink(epoch=seen.epoch) if seen.jaeger is not None else None
        prefix = f"t{uuid.uuid4().hex[:8]}."
        try:
            seen.run = simulate_on_bus(load_scenario(SCENARIO), BusConfig(kafka_bootstrap, prefix=prefix),
                                       services="processes", store=postgres_url, sink=sink, metrics_ports=ports,
                                       after_run=after_run)
        finally:
            if sink is not None:
                sink.close()
            delete_topics(kafka_bootstrap, prefix)
        yield seen


# --------------------------------------------------------------------------- Jaeger
def incarnations(run: Run) -> dict[str, tuple[str, bool]]:
    """Trace id -> (workload, still open), derived from the log as every service derives it
    (``trace_id(workload, id of the envelope that began the incarnation)``): a workload's first
    submission, each preemption or disruption; each checked against the ``traceparent`` that envelope
    carries. An incarnation is open when the run ends with its workload waiting (a reclaimed workload
    not admitted again): the projector sends a root and its phases when an incarnation ends, so such
    a trace has the services' hops only, their parent the root to come."""
    out: dict[str, tuple[str, bool]] = {}
    latest: dict[str, str] = {}
    for env in run.runtime.log:
        if env.type in ("PreemptionRequested", "GangDisrupted") or \
                (env.type == "WorkloadSubmitted" and env.subject not in latest):
            derived = trace_id(env.subject, env.id)
            assert env.trace.get("traceparent", "").split("-")[1] == derived, (env.type, env.subject)
            out[derived] = (env.subject, False)
            latest[env.subject] = derived
        if env.type in ("WorkloadFinished", "WorkloadDeleted", "WorkloadWithdrawn", "WorkloadRejected"):
            latest.pop(env.subject, None)
    for key, doc in run.result()["workloads"].items():
        if key in latest and doc["transitions"][-1]["phase"] in WAITING:
            out[latest[key]] = (key, True)
    return out


def _tags(span: dict[str, Any]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span.get("tags", [])}


def _parent(span: dict[str, Any]) -> str | None:
    refs = [r for r in span.get("references", []) if r["refType"] == "CHILD_OF"]
    return refs[0]["spanID"] if refs else None


def _roots(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in trace["spans"] if _parent(s) is None]


@pytest.fixture(scope="module")
def traces(live: Live) -> dict[str, dict[str, Any]]:
    """Trace id -> the trace Jaeger's query API gives for it, once every expected one is there with its
    root (none for an open incarnation) and the four deciding services have sent hops."""
    live.need("jaeger")
    assert live.run is not None
    expected = incarnations(live.run)
    found: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 60
    while True:
        for tid in expected:
            trace = live.jaeger.trace(tid)
            if trace is not None:
                found[tid] = trace
        services = {p["serviceName"] for t in found.values() for p in t["processes"].values()}
        roots = {t: len(_roots(found[t])) if t in found else None for t in expected}
        if all(roots[t] == (0 if is_open else 1) for t, (_, is_open) in expected.items()) \
                and {f"muster-{s}" for s in SERVICES} <= services:
            return found
        if time.monotonic() > deadline:
            (live.jaeger.root / "traces.json").write_text(json.dumps(found, indent=1))
            pytest.fail(f"Jaeger has {len(found)} of the {len(expected)} traces, roots {roots} (expected: one, "
                        f"none for open ones: {expected}; services {sorted(services)}); they are in "
                        f"{live.jaeger.root / 'traces.json'}")
        time.sleep(0.5)


def test_jaeger_holds_one_trace_per_workload_incarnation_and_no_other(live: Live,
                                                                      traces: dict[str, dict[str, Any]]) -> None:
    assert live.run is not None
    expected = incarnations(live.run)
    assert len(expected) == len(live.run.result()["workloads"]) + 2, "the scenario reclaims two workloads"
    assert [w for w, is_open in expected.values() if is_open] == ["team-a/a-4"], "the one not admitted again"
    for tid, trace in traces.items():
        workload, is_open = expected[tid]
        assert {s["traceID"] for s in trace["spans"]} == {tid}
        if is_open:  # the hops wait for their root: every one without a parent in the trace names it
            spans = {s["spanID"] for s in trace["spans"]}
            assert {_parent(s) for s in trace["spans"]} - spans == {root_span(tid)}
            continue
        [root] = _roots(trace)
        assert trace["processes"][root["processID"]]["serviceName"] == "muster"
        assert root["spanID"] == root_span(tid)
        assert _tags(root)["muster.workload"] == workload
    start_us = int((live.epoch - 3600) * 1e6)
    end_us = int((live.epoch + 3600) * 1e6)  # spans are drawn in event time from the epoch: up to 180 s on
    listed = {t["traceID"] for service in ("muster", *(f"muster-{s}" for s in SERVICES))
              for t in live.jaeger.traces(service, start_us, end_us)}
    assert listed == set(expected)


def _explain(store: str, workload: str, at: float) -> dict[str, Any]:
    said = invoke("explain", workload, "--store", store, "--at", f"{at:.6f}", "--json")
    assert said.exit_code == 0, said.output
    return json.loads(said.output)


def test_the_queued_span_lasts_the_wait_muster_explain_reports(live: Live,
                                                               traces: dict[str, dict[str, Any]]) -> None:
    """``muster explain`` at the queued span's end says the workload is admitted since then (E); in the
    middle of the span, that it waits since the span's start (S): E - S, the wait explain reports, is
    the span's duration (to the microsecond Jaeger keeps). A span of no length is a workload admitted
    the moment it was queued: explain says it is admitted since the span's start."""
    compared = 0
    for trace in traces.values():
        if not _roots(trace):
            continue  # an open incarnation: its phases come with its root
        [root] = _roots(trace)
        workload = _tags(root)["muster.workload"]
        [queued] = [s for s in trace["spans"] if s["operationName"] == "queued"]
        start = queued["startTime"] / 1e6 - live.epoch
        duration = queued["duration"] / 1e6
        after = _explain(live.store, workload, start + duration + 0.0005)  # Jaeger's microseconds less the
        # epoch can fall a hair before the instant
        assert after["phase"] not in WAITING, (workload, after["lines"])
        assert after["since"] == pytest.approx(start + duration, abs=1e-3), (workload, after["lines"])
        if duration >= 0.002:
            waiting = _explain(live.store, workload, start + duration / 2)
            assert waiting["phase"] in WAITING, (workload, waiting["lines"])
            assert after["since"] - waiting["since"] == pytest.approx(duration, abs=1e-3), (workload, waiting["lines"])
        compared += 1
    assert live.run is not None and compared == len(live.run.result()["workloads"]) + 2 - 1, \
        "every incarnation but the open one"
    assert any(s["duration"] > 0 for t in traces.values() for s in t["spans"] if s["operationName"] == "queued")


def test_no_child_span_starts_before_its_parent(traces: dict[str, dict[str, Any]]) -> None:
    """Across processes too: a hop starts no earlier than the hop that sent its input, and a decision a
    timer made (``queue TimerFired``, child of the root) no earlier than the root, nor what it caused."""
    early: list[str] = []
    pairs: set[tuple[str, str]] = set()
    for trace in traces.values():
        spans = {s["spanID"]: s for s in trace["spans"]}
        names = {pid: p["serviceName"] for pid, p in trace["processes"].items()}
        for span in trace["spans"]:
            parent = spans.get(_parent(span) or "")
            if parent is None:
                continue
            pairs.add((parent["operationName"], span["operationName"]))
            if span["startTime"] < parent["startTime"]:
                early.append(f"{names[span['processID']]} {span['operationName']!r} starts "
                             f"{(parent['startTime'] - span['startTime']) / 1e3:g} ms before its parent "
                             f"{names[parent['processID']]} {parent['operationName']!r} (trace {span['traceID']})")
    assert not early, "\n".join(early)
    assert ("admission ObjectChanged", "queue WorkloadSubmitted") in pairs  # across processes
    assert any(parent == "queue TimerFired" and child.startswith("placement ") for parent, child in pairs), \
        "a timer-driven Dequeued's hop was compared with its cause"


# --------------------------------------------------------------------------- Prometheus
def test_prometheus_scrapes_every_service_with_the_repo_config(live: Live) -> None:
    live.need("prometheus")
    assert live.scraped == {*SERVICES, "projector"}, "the repo's config names every service of the run"
    assert len(live.targets) == len(live.scraped)
    down = [(t["labels"]["instance"], t["lastError"]) for t in live.targets if t["health"] != "up"]
    assert not down


@pytest.mark.parametrize("dashboard,title,expr", panel_queries(),
                         ids=[f"{d.removesuffix('.json')}:{t}:{i}" for i, (d, t, _) in enumerate(panel_queries())])
def test_every_panel_query_returns_a_series(live: Live, dashboard: str, title: str, expr: str) -> None:
    live.need("prometheus")
    query = fill(expr)
    assert query not in live.errors, f"{dashboard}, {title!r}: Prometheus refuses {query}: {live.errors[query]}"
    assert live.series.get(query), f"{dashboard}, {title!r}: no series for {query}"


def test_every_query_variable_has_values(live: Live) -> None:
    live.need("prometheus")
    for dashboard, name, metric, label in variable_queries():
        assert live.values.get((metric, label)), f"{dashboard}: ${name} (label_values({metric}, {label})) is empty"
