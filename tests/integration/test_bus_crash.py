"""Crash test: SIGKILL the queue and the placement service in the middle of a scenario on Kafka.

The services run as ``muster run`` processes. The queue is killed between two rounds (idle, but
with offsets not yet committed) and placement a moment after a round was released to it (most
likely mid-round); each is started again at once. On restart a service rebuilds itself from its
inbox and handles again whatever came after its last commit, sending the same ids again: the
final result equals the uncrashed run, no decision is lost or applied twice, and the projection
holds no duplicate rows.
"""

from __future__ import annotations

import shutil
import threading
from collections import Counter
from pathlib import Path

from sqlalchemy import func, select

from shared.history.engine import connect
from shared.history.models import Decision, EventLog, WorkloadTransition
from shared.kernel.topology import SERVICES
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.driver import ServiceHost, simulate_on_bus
from tests.integration.conftest import scenario_run
from tests.integration.test_bus_parity import assert_same_run

SCENARIO = Path(__file__).parents[1] / "scenarios" / "volcano-gang-queue.yaml"
KILL_QUEUE_BEFORE, KILL_PLACEMENT_AFTER = 12, 30


def _crash(host: ServiceHost, name: str) -> None:
    host.kill(name)
    host.spawn(name)


def test_services_killed_mid_scenario_decide_as_if_nothing_happened(kafka_bootstrap: str, topic_prefix: str,
                                                                    pg_store: str) -> None:
    embedded = scenario_run(SCENARIO)
    crashed: list[str] = []

    def before_round(n: int, host: ServiceHost) -> None:
        if n == KILL_QUEUE_BEFORE:
            _crash(host, "queue")
            crashed.append("queue")
        if n == KILL_PLACEMENT_AFTER:  # released a few milliseconds from now: kill it while it works
            timer = threading.Timer(0.003, lambda: (_crash(host, "placement"), crashed.append("placement")))
            timer.start()

    host_logs: list[Path] = []

    def remember_logs(n: int, host: ServiceHost) -> None:
        if not host_logs:
            host_logs.append(host.logs)
        before_round(n, host)

    distributed = simulate_on_bus(embedded.scenario, BusConfig(kafka_bootstrap, prefix=topic_prefix),
                                  services="processes", store=pg_store, before_round=remember_logs, keep_logs=True)
    assert sorted(crashed) == ["placement", "queue"]
    assert_same_run(distributed, embedded, pg_store)

    # each restarted service came back from its inbox, not from nothing
    texts = {name: (host_logs[0] / f"{name}.log").read_text() for name in ("queue", "placement")}
    shutil.rmtree(host_logs[0])
    for text in texts.values():
        assert text.count("rebuilt from") == 2, text[-2000:]

    # the store: every envelope once, every decision once, no transition twice
    outputs = [e for e in embedded.runtime.log if e.source in SERVICES]
    engine = connect(pg_store)
    try:
        with engine.connect() as conn:
            events = conn.execute(select(func.count()).select_from(EventLog.__table__)).scalar_one()
            decisions = conn.execute(select(Decision.__table__.c.event_id)).scalars().all()
            transitions = conn.execute(select(func.count()).select_from(WorkloadTransition.__table__)).scalar_one()
    finally:
        engine.dispose()
    assert events == len({e.id for e in embedded.runtime.log})
    assert Counter(decisions) == Counter(e.id for e in outputs)
    assert transitions == sum(len(w["transitions"]) for w in embedded.result()["workloads"].values())
