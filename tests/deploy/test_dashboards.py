"""The observability stack as files: every Grafana panel queries metrics the services export, every
TraceQL filter names span attributes the spans carry, and the compose stack mounts files that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shared.kernel.policy import Policy
from shared.kernel.topology import SERVICES
from shared.kubernetes.app import cluster_app
from shared.kubernetes.cluster import KubeTarget
from shared.observability.metrics import server
from shared.observability.tracing.spans import SpanBuilder
from shared.runtime.bus.app import service_app
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.projector import projector_app
from shared.runtime.simulate import simulate
from shared.sim.scenario import load_scenario

ROOT = Path(__file__).parents[2]
DASHBOARDS = sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"))
PROMQL_WORDS = {
    "sum", "by", "without", "rate", "increase", "max", "min", "avg", "count", "histogram_quantile", "changes",
    "label_values", "bool", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset",
}
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",), "gauge": ("",)}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every series name the services' registries expose (families without samples yet included)."""
    config = BusConfig("127.0.0.1:9", prefix="dash.")
    expositions = [server.service_exposition(service_app(name, config, Policy()), name) for name in SERVICES]
    store = f"sqlite:///{tmp_path_factory.mktemp('store') / 'h.db'}"
    expositions.append(server.projector_exposition(projector_app(config, store)))
    expositions.append(server.cluster_exposition(cluster_app(config, KubeTarget("http://127.0.0.1:9"))))
    names: set[str] = set()
    for exposition in expositions:
        for family in text_string_to_metric_families(generate_latest(exposition.registry).decode()):
            names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


def queries(dashboard: dict) -> list[tuple[str, str, str]]:
    """(panel title, data source type, query) of every target, and of every templating query."""
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            kind = (target.get("datasource") or panel.get("datasource") or {}).get("type", "")
            out.append((panel["title"], kind, target.get("expr") or target.get("query") or ""))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            out.append((f"${variable['name']}", "prometheus", variable["definition"]))
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are neither functions,
    keywords, label names (inside braces or by/without lists) nor template variables."""
    text = re.sub(r'"[^"]*"', '""', expr)                       # string literals
    text = re.sub(r"label_values\(([^,)]+),[^)]*\)", r"\1", text)  # Grafana's: label_values(metric, label)
    text = re.sub(r"\{[^}]*\}", "{}", text)                     # label matchers
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)                      # ranges
    words = set(re.findall(r"(?<![\w$])[a-zA-Z_:][a-zA-Z0-9_:]*", text))
    return {w for w in words - PROMQL_WORDS if not re.fullmatch(r"\d.*", w)}


def test_there_are_the_two_dashboards() -> None:
    titles = {json.loads(p.read_text())["title"] for p in DASHBOARDS}
    assert titles == {"Scheduling latency", "muster health"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_every_panel_queries_metrics_the_services_export(path: Path, exported: set[str]) -> None:
    dashboard = json.loads(path.read_text())
    checked = 0
    for title, kind, query in queries(dashboard):
        if kind != "prometheus":
            continue
        names = metric_names(query)
        assert names, f"{title}: no metric in {query!r}"
        missing = names - exported
        assert not missing, f"{path.name}, panel {title!r}: {sorted(missing)} not exported"
        checked += 1
    assert checked >= 5


def test_trace_panels_filter_on_attributes_the_spans_carry() -> None:
    run = simulate(load_scenario(ROOT / "tests" / "scenarios" / "volcano-gang-queue.yaml"), traced=True)
    spans = SpanBuilder().build(run.runtime.log)
    carried = {f"span.{k}" for s in spans for k in s.attributes} | {"resource.service.name"}
    services = {s.service for s in spans}
    traceql = [q for p in DASHBOARDS for _, kind, q in queries(json.loads(p.read_text())) if kind == "tempo"]
    assert traceql
    for query in traceql:
        for attribute in re.findall(r"((?:span|resource)\.[\w.]+)", query):
            assert attribute in carried, f"{attribute} in {query!r}"
        for service in re.findall(r'service\.name = "([^"]+)"', query):
            assert service in services


def test_the_compose_stack_mounts_files_of_the_repo_and_sends_traces_to_its_collector() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"otel-collector", "tempo", "prometheus", "grafana"} <= set(services)
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which is not in the repo"
    for name in (*SERVICES, "projector"):
        env = services[name].get("environment") or compose["x-muster"]["environment"]
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in scrape["scrape_configs"] for s in job["static_configs"] for t in s["targets"]}
    assert {f"{name}:9464" for name in (*SERVICES, "projector")} <= targets
    sources = yaml.safe_load((ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "datasources.yaml")
                             .read_text())["datasources"]
    provisioned = {s["type"] for s in sources}
    for path in DASHBOARDS:
        variables = {v["name"]: v["query"] for v in json.loads(path.read_text())["templating"]["list"]
                     if v["type"] == "datasource"}
        assert set(variables.values()) <= provisioned, path.name


def _references(node: object) -> list[dict]:
    """Every ``datasource`` object anywhere in a dashboard (panels, targets, variables)."""
    if isinstance(node, dict):
        found = [node["datasource"]] if isinstance(node.get("datasource"), dict) else []
        return found + [r for value in node.values() for r in _references(value)]
    if isinstance(node, list):
        return [r for item in node for r in _references(item)]
    return []


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_data_sources_are_variables_so_the_dashboards_import_into_any_grafana(path: Path) -> None:
    """No hard-coded uid: each reference names a data source variable of the dashboard's own, of the
    same type, which the importing Grafana fills with a source of that type it has."""
    dashboard = json.loads(path.read_text())
    variables = {v["name"]: v["query"] for v in dashboard["templating"]["list"] if v["type"] == "datasource"}
    references = _references(dashboard)
    assert references
    for reference in references:
        name = re.fullmatch(r"\$\{(\w+)\}", reference["uid"])
        assert name and variables.get(name.group(1)) == reference["type"], (path.name, reference)


def test_grafana_knows_the_scrape_interval_so_rate_windows_hold_four_scrapes() -> None:
    """Grafana's ``$__rate_interval`` is four of the data source's scrape interval (15 s unless told):
    told Prometheus' own, a rate covers four scrapes rather than a minute."""
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())["global"]["scrape_interval"]
    sources = yaml.safe_load((ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "datasources.yaml")
                             .read_text())["datasources"]
    [prometheus] = [s for s in sources if s["type"] == "prometheus"]
    assert prometheus["jsonData"]["timeInterval"] == scrape
