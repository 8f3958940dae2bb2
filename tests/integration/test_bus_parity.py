"""One scenario, two runtimes, same decisions: every scenario in tests/scenarios through the
services on a real Kafka-protocol broker, with the projector writing a real PostgreSQL.

For each: the result document equals the embedded run's (apart from ``stats``), the event log is
the same envelopes in the same order (the driver publishes each round in delivery order), every
service's inbox topic holds each envelope of its inbox, and the store the projector wrote from
the log topic shows every workload exactly as the result does (``muster history --json``).
A core that raises on one envelope is contained alike on both: the same rejection, the rest as before.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from services.queue.core import QueueCore
from shared.history import query
from shared.kernel.events import Envelope, WorkloadSubmitted, to_json
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.driver import simulate_on_bus
from shared.runtime.cores import CORE_CLASSES
from shared.runtime.simulate import Run, simulate
from shared.sim.scenario import parse_scenario
from tests.integration.conftest import SCENARIOS, scenario_run
from tests.integration.test_bus_service import read_until
from tests.integration.test_scenario_history import _as_json_stores_it


def without_stats(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "stats"}


def assert_same_run(distributed: Run, embedded: Run, store: str | None = None) -> None:
    """The checks every distributed run must pass against its embedded twin."""
    result = distributed.result()
    assert without_stats(result) == without_stats(embedded.result())
    assert [e.id for e in distributed.runtime.log] == [e.id for e in embedded.runtime.log]
    assert distributed.check() == embedded.check()
    if store is None:
        return
    for key, expected in result["workloads"].items():
        stored = query.workload_history(store, key)
        assert stored is not None, key
        assert stored.pop("workload") == key
        assert stored["transitions"] == expected["transitions"], key
        assert stored == expected, key
    # each envelope as the bus carried it (the log's order is the services' interleaving, not the embedded run's)
    stored_log = {e.id: to_json(e) for e in query.read_log(store)}
    assert stored_log == {e.id: _as_json_stores_it(to_json(e)) for e in embedded.runtime.log}


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_kafka_stack_decides_as_the_embedded_one(path: Path, kafka_bootstrap: str, topic_prefix: str,
                                                 pg_store: str, caplog: pytest.LogCaptureFixture) -> None:
    embedded = scenario_run(path)
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    with caplog.at_level(logging.INFO, logger="muster.bus"):
        distributed = simulate_on_bus(embedded.scenario, config, store=pg_store)
    # Apache Kafka hands no reader a later batch before an earlier one (InOrder never rewinds; Tansu did)
    assert "fetching again" not in caplog.text
    assert_same_run(distributed, embedded, pg_store)


class PoisonedQueue(QueueCore):
    """The queue with a bug: it raises on the submission of the workload named ``poison``."""

    def handle(self, env: Envelope) -> list[Any]:
        if isinstance(env.payload, WorkloadSubmitted) and env.payload.workload.name == "poison":
            raise RuntimeError("a bug on poison")
        return super().handle(env)


POISON_SCENARIO = """\
name: poisoned-queue
cluster:
  nodes:
    - {name: node-1, capacity: {cpu: "8", memory: 32Gi, pods: "110"}}
steps:
  - at: 0s
    apply: |
      apiVersion: ray.io/v1
      kind: RayCluster
      metadata: {name: poison, namespace: default}
      spec:
        headGroupSpec:
          template: {spec: {containers: [{name: ray, resources: {requests: {cpu: "1", memory: 1Gi}}}]}}
      ---
      apiVersion: ray.io/v1
      kind: RayCluster
      metadata: {name: fine, namespace: default}
      spec:
        headGroupSpec:
          template: {spec: {containers: [{name: ray, resources: {requests: {cpu: "1", memory: 1Gi}}}]}}
until: 30s
"""


def test_a_core_that_raises_is_contained_alike_on_both_runtimes(kafka_bootstrap: str, topic_prefix: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue raises on one workload: both runtimes reject it with the same reason and run the
    other one; on Kafka the record is dead-lettered, embedded the failure is kept in ``faults``."""
    monkeypatch.setitem(CORE_CLASSES, "queue", PoisonedQueue)
    scenario = parse_scenario(POISON_SCENARIO)
    embedded = simulate(scenario)
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    distributed = simulate_on_bus(scenario, config)
    assert_same_run(distributed, embedded)
    workloads = embedded.result()["workloads"]
    assert workloads["default/poison"]["phase"] == "Rejected"
    assert "queue failed on WorkloadSubmitted default/poison" in workloads["default/poison"]["transitions"][-1]["reason"]
    assert workloads["default/fine"]["phase"] == "Running"
    assert [fault.service for fault in embedded.runtime.faults] == ["queue"]
    [letter] = [json.loads(r.value) for r in read_until(config, config.topics.deadletter, lambda rs: len(rs) >= 1)]
    assert letter["consumer"] == "queue" and letter["error"] == embedded.runtime.faults[0].error
