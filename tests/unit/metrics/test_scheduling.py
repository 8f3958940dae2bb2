"""shared/observability/metrics/scheduling.py: the queue service's metrics agree with the result document, for
every scenario (the fold watches the queue's inbox and outputs as the worker would hand them)."""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from shared.kernel import quantity as q
from shared.kernel.model import UNLIMITED
from shared.kernel.topology import destinations
from shared.observability.metrics.scheduling import QueueStatusCollector, WaitFold, queue_metrics
from shared.runtime.simulate import Run, simulate
from shared.sim.scenario import load_scenario
from tests.unit.tracing.test_spans import waits

SCENARIOS = sorted((Path(__file__).parents[2] / "scenarios").glob("*.yaml"))
IDS = [p.stem for p in SCENARIOS]


@lru_cache(maxsize=None)
def folded(path: Path) -> tuple[Run, CollectorRegistry, WaitFold]:
    """The scenario's run, and the queue's metrics as they stand at its end."""
    run = simulate(load_scenario(path))
    registry = CollectorRegistry()
    fold = queue_metrics(run.runtime.core("queue"), registry)
    outputs: dict[str, list] = defaultdict(list)
    for env in run.runtime.log:
        if env.source == "queue":
            outputs[env.causation_id or ""].append(env)
    for env in run.runtime.log:  # the queue's inbox in order, each with what it made of it
        if "queue" in destinations(env) or (env.type == "TimerFired" and outputs.get(env.id)):
            fold(env, outputs.get(env.id, []))
    return run, registry, fold


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    got = registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


@pytest.mark.parametrize("path", SCENARIOS, ids=IDS)
def test_admission_waits_are_the_result_documents(path: Path) -> None:
    run, registry, _ = folded(path)
    by_queue: dict[str, list[float]] = defaultdict(list)
    for doc in run.result()["workloads"].values():
        by_queue[doc["queue"]].extend(waits(doc))
    for queue, seen in by_queue.items():
        assert value(registry, "muster_admission_wait_time_seconds_count", cluster_queue=queue) == len(seen)
        assert value(registry, "muster_admission_wait_time_seconds_sum", cluster_queue=queue) == pytest.approx(sum(seen))
        assert value(registry, "muster_admitted_workloads_total", cluster_queue=queue) == len(seen)


@pytest.mark.parametrize("path", SCENARIOS, ids=IDS)
def test_pending_usage_and_running_are_the_result_documents(path: Path) -> None:
    run, registry, _ = folded(path)
    result = run.result()
    for queue, doc in result["queues"].items():
        waiting = value(registry, "muster_pending_workloads", cluster_queue=queue, status="active") + \
            value(registry, "muster_pending_workloads", cluster_queue=queue, status="inadmissible")
        assert waiting == len(doc["pending"]), queue
        assert value(registry, "muster_pending_workloads", cluster_queue=queue, status="backoff") == len(doc["backoff"])
        assert value(registry, "muster_reserving_active_workloads", cluster_queue=queue) == len(doc["active"])
        for resource, amount in q.parse_resources(doc["usage"]).items():
            assert value(registry, "muster_cluster_queue_resource_usage", cluster_queue=queue,
                         resource=resource) == pytest.approx(amount / 1000)
    running = defaultdict(int)
    for doc in result["workloads"].values():
        if doc["phase"] == "Running":
            running[doc["queue"]] += 1
    for queue in result["queues"]:
        assert value(registry, "muster_running_workloads", cluster_queue=queue) == running.get(queue, 0), queue


@pytest.mark.parametrize("path", SCENARIOS, ids=IDS)
def test_preemptions_are_counted_by_reason(path: Path) -> None:
    """Preemptions by why; a stale gang's eviction is an eviction (``PodsReadyTimeout``), no preemption."""
    run, registry, _ = folded(path)
    evictions = [tr["reason"] for doc in run.result()["workloads"].values() for tr in doc["transitions"]
                 if tr["phase"] == "Preempted"]
    stale = [r for r in evictions if r.startswith("stale gang evicted")]   # evicted, preempted by no one
    preempted = [r for r in evictions if r not in stale]
    reclaimed = sum(r.startswith("reclaimed by") for r in preempted)
    total = sum(s.value for metric in registry.collect() if metric.name == "muster_preempted_workloads"
                for s in metric.samples if s.name.endswith("_total"))
    in_cohort = sum(s.value for metric in registry.collect() if metric.name == "muster_preempted_workloads"
                    for s in metric.samples if s.name.endswith("_total") and s.labels["reason"] == "InCohortReclamation")
    assert (total, in_cohort) == (len(preempted), reclaimed)
    timed_out = sum(s.value for metric in registry.collect() if metric.name == "muster_evicted_workloads"
                    for s in metric.samples if s.name.endswith("_total") and s.labels["reason"] == "PodsReadyTimeout")
    assert timed_out == len(stale)


def test_a_closed_queues_waiting_workloads_are_inadmissible() -> None:
    run, registry, _ = folded(next(p for p in SCENARIOS if p.stem == "volcano-closed-queue"))
    held = {queue for queue, doc in run.result()["queues"].items() if doc["pending"]}
    assert any(value(registry, "muster_pending_workloads", cluster_queue=queue, status="inadmissible")
               for queue in held)


def test_unlimited_quota_is_minus_one() -> None:
    run, registry, _ = folded(next(p for p in SCENARIOS if p.stem == "kai-parent-limit-binds-children"))
    limits = [s.value for metric in registry.collect() if metric.name == "muster_cluster_queue_resource_limit"
              for s in metric.samples]
    assert -1 in limits and 6 in limits and all(v == -1 or v > 0 for v in limits)


def test_the_borrowing_limit_is_kueues_the_headroom_above_the_guarantee() -> None:
    """Kueue's ``borrowingLimit`` is how far above ``nominalQuota`` a queue may go, not its total; muster's
    total is ``muster_cluster_queue_resource_limit``."""
    registry = CollectorRegistry()
    view = {"q": {"exists": True, "state": "Open", "pending": [], "backoff": [], "active": [], "usage": {},
                  "guarantee": {"cpu": 2000, "nvidia.com/gpu": 4000, "pods": UNLIMITED},
                  "limit": {"cpu": 6000, "memory": UNLIMITED, "nvidia.com/gpu": 4000, "pods": 8000}}}
    registry.register(QueueStatusCollector(lambda: view, WaitFold(registry)))
    assert {r: value(registry, "muster_cluster_queue_resource_limit", cluster_queue="q", resource=r)
            for r in ("cpu", "memory", "nvidia.com/gpu", "pods")} == {"cpu": 6, "memory": -1, "nvidia.com/gpu": 4,
                                                                     "pods": 8}
    assert {r: value(registry, "muster_cluster_queue_borrowing_limit", cluster_queue="q", resource=r)
            for r in ("cpu", "memory", "nvidia.com/gpu", "pods")} == {"cpu": 4, "memory": -1, "nvidia.com/gpu": 0,
                                                                     "pods": 0}
