"""The deployed stack in wall-clock time, traced to a real Jaeger and scraped by a real Prometheus.

``tests/deploy/test_backends.py`` checks the backends on a simulated run, where spans are drawn in
event time. Here the stack runs as deployed: the four services, the projector (PostgreSQL) and the
cluster link (``muster run cluster`` with the ServiceAccount's token) as ``muster run`` processes,
against the session's real cluster (real KubeRay makes the pods, KWOK runs them), each sending its
spans to Jaeger (``shared.parts.jaeger``) and serving ``/metrics`` to Prometheus
(``shared.parts.prometheus``), which scrapes all six with ``deploy/prometheus/prometheus.yml``
rendered with their ports, the cluster link's job included.

Two RayClusters of 2 CPUs in a Volcano queue capped at 2: the second waits for the first to be
deleted. Then: one trace per workload in Jaeger under its derived id, with one root; the second's
queued span lasts the wait ``muster explain`` reports; no child span starts before its parent
(hops take the wall clock around their handling, the projector's roots and phases the events'
times); every target is up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from shared.audit.logfile import envelopes, open_log
from shared.history import schema
from shared.kernel.topology import SERVICES
from shared.observability.tracing.context import root_span, trace_id
from shared.parts.devcluster import DevCluster
from shared.parts.process import free_port
from shared.runtime.bus.app import ensure_topics
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.driver import EventLoopThread
from tests.builders.cli import invoke
from tests.conftest import _missing, delete_topics, empty
from tests.deploy.test_backends import render_scrape_config
from tests.realcluster.conftest import ROOT, create, eventually, get, install, node, token_kubeconfig
from tests.realcluster.test_leader import ray_cluster

QUEUE = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "research"},
         "spec": {"weight": 1, "capability": {"cpu": "2", "memory": "4Gi"}}}


def running(cluster: DevCluster, name: str) -> bool:
    pods = [p for p in get(cluster, "pods", namespace="team-a")["items"]
            if p["metadata"].get("labels", {}).get("ray.io/cluster") == name]
    return len(pods) == 2 and all(p["spec"].get("nodeName") == "n1" and p["status"].get("phase") == "Running"
                                  for p in pods)


def suspended(cluster: DevCluster, name: str) -> bool:
    return bool((get(cluster, "rayclusters.ray.io", name, "team-a") or {}).get("spec", {}).get("suspend"))


class Stack:
    """The six ``muster run`` processes, their logs in ``logs``."""

    def __init__(self, config: BusConfig, store: str, kubeconfig: Path, logs: Path, env: dict[str, str]) -> None:
        self.ports = {name: free_port() for name in (*SERVICES, "projector", "cluster")}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.config, self.store, self.kubeconfig, self.logs = config, store, kubeconfig, logs
        self.env = {**os.environ, **config.env(), **env, "PYTHONUNBUFFERED": "1"}

    def start(self) -> None:
        for name in self.ports:
            args = [sys.executable, "-m", "shared.cli.main", "run", name, "--metrics-port", str(self.ports[name]),
                    "--scheduler-names", "muster,volcano"]
            if name == "projector":
                args = args[:-2] + ["--store", self.store]
            if name == "cluster":
                args += ["--kubeconfig", str(self.kubeconfig)]
            self.processes[name] = subprocess.Popen(args, env=self.env, stdout=(self.logs / f"{name}.log").open("ab"),
                                                    stderr=subprocess.STDOUT, cwd=ROOT)

    def alive(self) -> None:
        dead = {n: p.returncode for n, p in self.processes.items() if p.poll() is not None}
        assert not dead, f"exited: {dead}; logs in {self.logs}"

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _parent(span: dict[str, Any]) -> str | None:
    refs = [r for r in span.get("references", []) if r["refType"] == "CHILD_OF"]
    return refs[0]["spanID"] if refs else None


@dataclass
class Deployed:
    """What the traced deployment left for the checks."""

    store: str
    ports: dict[str, int]
    scraped: set[str]
    targets: list[dict[str, Any]]
    cluster_up: list[dict[str, Any]]
    starts: dict[str, str]
    """Workload -> the trace id derived from its WorkloadSubmitted in the log."""
    traces: dict[str, dict[str, Any]]
    """Workload -> its trace as Jaeger's query API gives it."""
    where: Path


@pytest.fixture(scope="module")
def deployed(devcluster: DevCluster, kafka_bootstrap: str, postgres_url: str,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    """rc-1 admitted and run; rc-2 created, waiting for the queue's capability; rc-1 deleted, rc-2 run.
    Then what Prometheus and Jaeger hold once the projector has stored both GangRunning."""
    from shared.parts.catalog import MissingPart
    from shared.parts.jaeger import JaegerServer
    from shared.parts.process import PartFailed
    from shared.parts.prometheus import PrometheusServer

    cluster = devcluster  # emptied as clean_cluster does (a module's run, not a test's)
    cluster.reset()
    if cluster.batch_scheduler != "none":
        cluster.start_kuberay("none")
    cluster.kube_scheduler(True)
    tmp_path = tmp_path_factory.mktemp("traced-stack")
    if schema.current(postgres_url) != schema.head():
        schema.upgrade(postgres_url)
    empty(postgres_url)
    install(cluster)
    cluster.kubectl("create", "namespace", "team-a")
    create(cluster, node("n1"), QUEUE)
    config = BusConfig(kafka_bootstrap, prefix=f"t{uuid.uuid4().hex[:8]}.")
    with ExitStack() as cleanup:  # whatever fails, each part started is stopped (last started first)
        try:
            jaeger = JaegerServer(tmp_path / "jaeger").start()
        except (MissingPart, PartFailed) as exc:
            _missing(exc)
        cleanup.callback(jaeger.stop)
        stack = Stack(config, postgres_url, token_kubeconfig(cluster, tmp_path / "muster.kubeconfig"), tmp_path,
                      {"OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"})
        scraped = render_scrape_config(stack.ports, tmp_path / "prometheus.yml")
        try:
            prometheus = PrometheusServer(tmp_path / "prometheus.yml", tmp_path / "prometheus").start()
        except (MissingPart, PartFailed) as exc:
            _missing(exc)
        cleanup.callback(prometheus.stop)
        cleanup.callback(delete_topics, kafka_bootstrap, config.prefix)
        bus = EventLoopThread()
        try:
            bus.run(ensure_topics(config))
        finally:
            bus.close()
        cleanup.callback(stack.stop)
        stack.start()
        create(cluster, ray_cluster("rc-1"))
        eventually(lambda: stack.alive() or running(cluster, "rc-1"), "rc-1 to be admitted and run", timeout=120)
        create(cluster, ray_cluster("rc-2"))
        time.sleep(3)
        assert suspended(cluster, "rc-2"), "rc-2 waits: the queue's capability is rc-1's"
        cluster.kubectl("delete", "raycluster", "rc-1", "-n", "team-a")
        eventually(lambda: stack.alive() or running(cluster, "rc-2"), "rc-2 to be admitted after rc-1 left",
                   timeout=120)

        def all_up() -> list[dict[str, Any]]:
            targets = prometheus.targets()
            return targets if len(targets) == len(scraped) and all(t["health"] == "up" for t in targets) else []

        targets = eventually(all_up, "Prometheus to scrape every target up", timeout=60)

        def projected() -> list[Any]:
            envs = list(envelopes(open_log(postgres_url)))
            return envs if sum(e.type == "GangRunning" for e in envs) >= 2 else []

        envs = eventually(projected, "the projector to store both workloads' GangRunning", timeout=60)
        assert not [e for e in envs if e.type in ("PreemptionRequested", "GangDisrupted")]
        starts = {e.subject: trace_id(e.subject, e.id) for e in envs if e.type == "WorkloadSubmitted"}

        def with_roots() -> dict[str, dict[str, Any]]:
            found = {key: jaeger.trace(tid) for key, tid in starts.items()}
            return found if all(t is not None and sum(_parent(s) is None for s in t["spans"]) == 1
                                for t in found.values()) else {}

        traces = eventually(with_roots, "Jaeger to hold every workload's trace with its root", timeout=60)
        (tmp_path / "traces.json").write_text(json.dumps(traces, indent=1))
        yield Deployed(postgres_url, stack.ports, scraped, targets,
                       prometheus.query('up{job="muster-cluster"} == 1'), starts, traces, tmp_path)


def test_prometheus_scrapes_all_six_with_the_repo_config(deployed: Deployed) -> None:
    assert deployed.scraped == set(deployed.ports) == {*SERVICES, "projector", "cluster"}
    assert {t["labels"]["instance"] for t in deployed.targets} == {f"127.0.0.1:{p}" for p in deployed.ports.values()}
    assert len(deployed.cluster_up) == 1, "the cluster link's job (muster-cluster) is scraped"


def test_one_trace_per_workload_with_its_root(deployed: Deployed) -> None:
    assert set(deployed.starts) == {"team-a/rc-1", "team-a/rc-2"}
    for key, trace in deployed.traces.items():
        [root] = [s for s in trace["spans"] if _parent(s) is None]
        assert root["spanID"] == root_span(deployed.starts[key])
        assert trace["processes"][root["processID"]]["serviceName"] == "muster"
        assert {s["traceID"] for s in trace["spans"]} == {deployed.starts[key]}
    services = {p["serviceName"] for t in deployed.traces.values() for p in t["processes"].values()}
    assert {f"muster-{s}" for s in (*SERVICES, "cluster")} <= services


def test_the_queued_and_placing_spans_last_the_wait_muster_explain_reports(deployed: Deployed) -> None:
    """rc-2 waited for rc-1 to leave; event time is wall-clock time here (no epoch). The queued span ends
    when the queue reserved its quota (Dequeued), placing when placement placed its gang (GangPlaced),
    which is when explain's Admitted begins: in the deployment each service decides at its own time, so
    placement, having handled a later input first, may place a few milliseconds after the quota was
    reserved, and explain's wait is the two spans together."""
    spans = deployed.traces["team-a/rc-2"]["spans"]
    [queued] = [s for s in spans if s["operationName"] == "queued"]
    [placing] = [s for s in spans if s["operationName"] == "placing"]
    start = queued["startTime"] / 1e6
    assert abs(placing["startTime"] - (queued["startTime"] + queued["duration"])) <= 2, \
        "placing starts where queued ends (to Jaeger's microsecond, each rounded)"
    duration = (placing["startTime"] + placing["duration"]) / 1e6 - start
    assert queued["duration"] / 1e6 > 1, "rc-2 waited for rc-1 to leave"

    def explain(at: float) -> dict[str, Any]:
        said = invoke("explain", "team-a/rc-2", "--store", deployed.store, "--at", f"{at:.6f}", "--json")
        assert said.exit_code == 0, said.output
        return json.loads(said.output)

    after, waiting = explain(start + duration + 0.0005), explain(start + duration / 2)
    assert waiting["phase"] == "Queued" and after["phase"] not in ("Queued", "Preempted", None), (waiting, after)
    assert after["since"] - waiting["since"] == pytest.approx(duration, abs=1e-3)


def test_no_child_span_starts_before_its_parent(deployed: Deployed) -> None:
    early = []
    for trace in deployed.traces.values():
        spans = {s["spanID"]: s for s in trace["spans"]}
        names = {pid: p["serviceName"] for pid, p in trace["processes"].items()}
        for span in trace["spans"]:
            parent = spans.get(_parent(span) or "")
            if parent is not None and span["startTime"] < parent["startTime"]:
                early.append(f"{names[span['processID']]} {span['operationName']!r} starts "
                             f"{(parent['startTime'] - span['startTime']) / 1e3:g} ms before its parent "
                             f"{names[parent['processID']]} {parent['operationName']!r}")
    assert not early, "\n".join(early) + f"\n(the traces: {deployed.where / 'traces.json'})"
