"""One scenario, two runtimes, same decisions: every scenario in tests/scenarios through the
services on a real Kafka-protocol broker, with the projector writing a real PostgreSQL.

For each: the result document equals the embedded run's (apart from ``stats``), the event log is
the same envelopes in the same order (the driver publishes each round in delivery order), every
service's inbox topic holds each envelope of its inbox, and the store the projector wrote from
the log topic shows every workload exactly as the result does (``muster history --json``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.bus.config import BusConfig
from shared.bus.driver import simulate_on_bus
from shared.simulate import Run
from shared.events import to_json
from shared.store import query
from tests.integration.conftest import SCENARIOS, scenario_run
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
                                                 pg_store: str) -> None:
    embedded = scenario_run(path)
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    distributed = simulate_on_bus(embedded.scenario, config, store=pg_store)
    assert_same_run(distributed, embedded, pg_store)
