"""bench/bus_bench.py's baseline for "tracing off": the worker and service without their tracing checks
must decide exactly as the real ones do, or the overhead it measures would be of something else."""

from __future__ import annotations

from pathlib import Path

from bench.bus_bench import _no_tracing_hooks
from shared.audit.replay import inbox
from shared.kernel.events import to_json
from shared.kernel.topology import SERVICES
from shared.runtime.bus.sequencing import Arrival
from shared.runtime.bus.topics import Topics
from shared.runtime.bus.worker import InboxWorker
from shared.runtime.cores import build_cores
from shared.runtime.service import Service
from shared.runtime.simulate import simulate
from shared.sim.scenario import load_scenario

SCENARIO = Path(__file__).parents[2] / "scenarios" / "volcano-autoscaling-elastic-workers.yaml"


def _outputs(run, service: str) -> list[bytes]:
    worker = InboxWorker(Service(build_cores(run.policy)[service]), Topics(), Arrival())
    return [to_json(out) for env in inbox(run.runtime.log, service) for out in worker._handle(env)]


def test_the_hook_free_baseline_decides_as_the_real_worker():
    run = simulate(load_scenario(SCENARIO))
    for service in SERVICES:
        real = _outputs(run, service)
        with _no_tracing_hooks():
            plain = _outputs(run, service)
        assert real and plain == real, service
    assert InboxWorker._handle.__module__ == "shared.runtime.bus.worker"  # restored
