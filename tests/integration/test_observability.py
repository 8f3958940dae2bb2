"""Traces and metrics of the services on Kafka, against real parts: one scenario with a preemption
runs through the five services as ``muster run`` processes (a real Kafka-protocol broker, a real
PostgreSQL for the projector), tracing to an OTLP/HTTP receiver in this test (``tests/otlp.py``,
protobuf decoded with ``opentelemetry-proto``), the queue service serving ``/metrics`` on a port.

While the services still run (``after_run``) the test scrapes ``/metrics``, ``/healthz`` and
``/readyz`` and runs a real Prometheus (Debian's, a part ``make tools`` installs) with the repo's
scrape config (``deploy/prometheus/prometheus.yml``, its targets pointed at this run's ports) and
queries one series. Every check compares with the run's result document.
"""

from __future__ import annotations

import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from shared.history import schema
from shared.kernel import quantity as q
from shared.parts.catalog import MissingPart
from shared.parts.localbroker import free_port
from shared.parts.process import PartFailed
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.driver import ServiceHost, simulate_on_bus
from shared.runtime.simulate import Run
from tests.conftest import _missing, delete_topics
from tests.conftest import empty
from tests.integration.conftest import scenario_run
from tests.integration.test_bus_parity import without_stats
from tests.otlp import OtlpReceiver, ReceivedSpan
from tests.unit.tracing.test_spans import waits

SCENARIO = Path(__file__).parents[1] / "scenarios" / "kai-priority-preemption.yaml"
SCRAPE_CONFIG = Path(__file__).parents[2] / "deploy" / "prometheus" / "prometheus.yml"
HOPS = ("admission", "queue", "placement", "reconciler")


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def prometheus_query(ports: dict[str, int], workdir: Path, query: str) -> Any:
    """Run Prometheus (the part ``make tools`` installs) with the repo's scrape config, its targets
    pointed at ``ports``; the value of ``query`` once a scrape has brought it (None if none came within
    the time)."""
    from shared.parts.prometheus import PrometheusServer

    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            static["targets"] = [f"127.0.0.1:{ports[t.split(':')[0]]}" for t in static["targets"]
                                 if t.split(":")[0] in ports]
    config["global"]["scrape_interval"] = "1s"
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    with PrometheusServer(workdir / "prometheus.yml", workdir / "prometheus") as prometheus:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            result = prometheus.query(query)
            if result:
                return result
            time.sleep(0.5)
        return None


class Observed:
    """What the run left behind for the checks."""

    run: Run
    spans: list[ReceivedSpan]
    metrics: dict[str, list[Any]]
    health: dict[str, tuple[int, str]]
    prometheus: Any = None
    prometheus_missing: Exception | None = None


@pytest.fixture(scope="module")
def observed(kafka_bootstrap: str, postgres_url: str) -> Iterator[Observed]:
    if schema.current(postgres_url) != schema.head():
        schema.upgrade(postgres_url)
    empty(postgres_url)
    prefix = f"t{uuid.uuid4().hex[:8]}."
    ports = {"queue": free_port(), "projector": free_port()}
    seen = Observed()
    with OtlpReceiver() as receiver, pytest.MonkeyPatch.context() as env, \
            tempfile.TemporaryDirectory() as workdir:
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        env.delenv("OTEL_SERVICE_NAME", raising=False)
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")  # the SDK's batch wait: send within the run
        from shared.observability.tracing.otel import SpanSink

        def after_run(run: Run, host: ServiceHost) -> None:
            seen.metrics = {f.name: f.samples for f in text_string_to_metric_families(
                get(f"http://127.0.0.1:{ports['queue']}/metrics")[1])}
            seen.health = {f"{name}{path}": get(f"http://127.0.0.1:{ports[name]}{path}") for name, path in
                           (("queue", "/healthz"), ("queue", "/readyz"), ("projector", "/readyz"))}
            try:
                seen.prometheus = prometheus_query(ports, Path(workdir), "muster_admitted_workloads_total")
            except (MissingPart, PartFailed) as exc:
                seen.prometheus_missing = exc

        sink = SpanSink(epoch=time.time())
        try:
            seen.run = simulate_on_bus(scenario_run(SCENARIO).scenario, BusConfig(kafka_bootstrap, prefix=prefix),
                                       services="processes", store=postgres_url, sink=sink, metrics_ports=ports,
                                       after_run=after_run)
        finally:
            sink.close()
            delete_topics(kafka_bootstrap, prefix)
        roots = len(seen.run.result()["workloads"]) + 1  # one workload is preempted: a second incarnation
        seen.spans = receiver.wait_for(lambda spans: sum(s.parent_id is None for s in spans) >= roots
                                       and {s.service for s in spans} >= {f"muster-{h}" for h in HOPS})
    yield seen


def test_the_run_decides_as_the_embedded_one(observed: Observed) -> None:
    assert without_stats(observed.run.result()) == without_stats(scenario_run(SCENARIO).result())


def test_one_trace_per_workload_incarnation_with_its_phases(observed: Observed) -> None:
    result = observed.run.result()
    by_trace: dict[str, list[ReceivedSpan]] = defaultdict(list)
    for span in observed.spans:
        by_trace[span.trace_id].append(span)
    roots = {t: [s for s in spans if s.parent_id is None] for t, spans in by_trace.items()}
    assert all(len(r) == 1 for r in roots.values()), "every trace has exactly one root"
    per_workload = Counter(r[0].attributes["muster.workload"] for r in roots.values())
    expected = {key: 1 + sum(tr["phase"] == "Preempted" for tr in w["transitions"])
                for key, w in result["workloads"].items()}
    assert dict(per_workload) == expected
    for trace, spans in by_trace.items():
        root = roots[trace][0]
        assert root.service == "muster"
        assert root.name == f"{root.attributes['muster.kind']} {root.attributes['muster.workload']}"
        assert {"muster.queue", "muster.priority", "muster.gang.size", "muster.gpu"} <= set(root.attributes)
        phases = {s.name: s for s in spans if s.name in ("queued", "placing", "binding", "starting")}
        assert set(phases) == {"queued", "placing", "binding", "starting"}, root.attributes
        assert all(p.parent_id == root.span_id for p in phases.values())
        assert phases["queued"].start == pytest.approx(root.start, abs=1e-3)
        assert phases["starting"].end == pytest.approx(root.end, abs=1e-3)


def test_the_queued_span_lasts_the_wait_of_the_result_document(observed: Observed) -> None:
    result = observed.run.result()
    queued = Counter((s.attributes["muster.workload"], round(s.duration, 3))
                     for s in observed.spans if s.name == "queued")
    expected = Counter((key, round(w, 3)) for key, doc in result["workloads"].items() for w in waits(doc))
    assert queued == expected
    assert any(duration > 0 for _, duration in queued), "the scenario has a real wait"


def test_hops_are_children_across_processes_with_messaging_attributes(observed: Observed) -> None:
    by_id = {(s.trace_id, s.span_id): s for s in observed.spans}
    hops = [s for s in observed.spans if s.attributes.get("messaging.system") == "kafka"]
    assert {s.service for s in hops} == {f"muster-{h}" for h in HOPS}
    for hop in hops:
        service = hop.service.removeprefix("muster-")
        assert hop.name.startswith(f"{service} ")
        assert hop.attributes["messaging.destination.name"].endswith(f".{service}")
        assert hop.attributes["messaging.consumer.group.name"].endswith(f".{service}")
        assert hop.attributes["messaging.operation.type"] == "process"
        assert "messaging.kafka.offset" in hop.attributes
    # the queue's span of a WorkloadSubmitted is the child of admission's span, sent by another process
    submitted = [s for s in hops if s.name == "queue WorkloadSubmitted"]
    assert submitted
    for span in submitted:
        parent = by_id[(span.trace_id, span.parent_id)]
        assert parent.service == "muster-admission" and parent.name == "admission ObjectChanged"
    # a decision made in a cycle another event caused links to that cause
    decided = [s for s in hops if s.name == "queue TimerFired" and "Dequeued" in s.attributes.get("muster.outputs", [])]
    assert decided and all(s.parent_id == next(r.span_id for r in observed.spans if r.trace_id == s.trace_id
                                                and r.parent_id is None) for s in decided)


def _sample(metrics: dict[str, list[Any]], name: str, **labels: str) -> float:
    family = name.removesuffix("_total").removesuffix("_sum").removesuffix("_count")
    for sample in metrics.get(family, []):
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
            return sample.value
    raise AssertionError(f"no sample {name} {labels} in /metrics")


def test_metrics_agree_with_the_result_document(observed: Observed) -> None:
    result, metrics = observed.run.result(), observed.metrics
    by_queue: dict[str, list[float]] = defaultdict(list)
    for doc in result["workloads"].values():
        by_queue[doc["queue"]].extend(waits(doc))
    for queue, seen in by_queue.items():
        assert _sample(metrics, "muster_admission_wait_time_seconds_count", cluster_queue=queue) == len(seen)
        assert _sample(metrics, "muster_admission_wait_time_seconds_sum", cluster_queue=queue) == pytest.approx(sum(seen))
        assert _sample(metrics, "muster_admitted_workloads_total", cluster_queue=queue) == len(seen)
    for queue, doc in result["queues"].items():
        assert _sample(metrics, "muster_pending_workloads", cluster_queue=queue, status="active") == len(doc["pending"])
        assert _sample(metrics, "muster_pending_workloads", cluster_queue=queue, status="backoff") == len(doc["backoff"])
        assert _sample(metrics, "muster_reserving_active_workloads", cluster_queue=queue) == len(doc["active"])
        for resource, amount in q.parse_resources(doc["usage"]).items():
            got = _sample(metrics, "muster_cluster_queue_resource_usage", cluster_queue=queue, resource=resource)
            assert got == pytest.approx(amount / 1000)
    preemptions = sum(tr["phase"] == "Preempted" for doc in result["workloads"].values() for tr in doc["transitions"])
    assert sum(s.value for s in metrics["muster_preempted_workloads"] if s.name.endswith("_total")) == preemptions
    assert _sample(metrics, "muster_events_handled_total", service="queue") > 0
    assert _sample(metrics, "muster_dead_letters_total", service="queue") == 0


def test_health_and_readiness_answer(observed: Observed) -> None:
    assert observed.health["queue/healthz"] == (200, "ok\n")
    assert observed.health["queue/readyz"] == (200, "ready\n")
    assert observed.health["projector/readyz"] == (200, "ready\n")


def test_a_real_prometheus_scrapes_the_services_with_the_repo_config(observed: Observed) -> None:
    if observed.prometheus_missing is not None:
        _missing(observed.prometheus_missing)
    assert observed.prometheus is not None, "Prometheus scraped nothing within a minute"
    admitted = {s["metric"]["cluster_queue"]: float(s["value"][1]) for s in observed.prometheus}
    result = observed.run.result()
    expected: Counter[str] = Counter()
    for doc in result["workloads"].values():
        expected[doc["queue"]] += len(waits(doc))
    assert admitted == {k: float(v) for k, v in expected.items()}
