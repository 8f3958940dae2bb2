"""Determinism, the property event sourcing rests on.

1. The same scenario gives a byte-identical event log and result (apart from wall time).
2. Each service's state and outputs are a fold over its inbox: replaying the recorded inbox into a
   fresh core reproduces every output envelope, byte for byte.
3. Golden decision sequences: the decisions each scenario produces are pinned in golden/; an
   intended change of behaviour regenerates them with ``MUSTER_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shared.audit.replay import inbox
from shared.kernel.events import Envelope, to_json, wrap
from shared.kernel.topology import SERVICES
from shared.runtime.cores import build_cores
from shared.runtime.simulate import Run, simulate
from shared.sim.scenario import load_scenario

SCENARIOS = sorted((Path(__file__).parent.parent / "scenarios").glob("*.yaml"))
GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(scope="module", params=SCENARIOS, ids=[p.stem for p in SCENARIOS])
def run(request: pytest.FixtureRequest) -> Run:
    return simulate(load_scenario(request.param))


def _strip_wall(result: dict) -> dict:
    result = json.loads(json.dumps(result))
    result["stats"].pop("wall_seconds")
    return result


def test_same_scenario_same_log_and_result(run: Run) -> None:
    again = simulate(run.scenario)
    assert [to_json(e) for e in again.runtime.log] == [to_json(e) for e in run.runtime.log]
    assert _strip_wall(again.result()) == _strip_wall(run.result())


@pytest.mark.parametrize("service", SERVICES)
def test_replaying_an_inbox_reproduces_every_output(run: Run, service: str) -> None:
    log = run.runtime.log
    recorded: dict[str, list[bytes]] = {}
    for env in log:
        if env.source == service:
            recorded.setdefault(env.causation_id or "", []).append(to_json(env))
    core = build_cores(run.policy)[service]
    seen: set[str] = set()
    replayed_count = 0
    for env in inbox(log, service):  # the rule muster replay uses
        if env.id in seen:
            continue
        seen.add(env.id)
        outputs = [to_json(wrap(p, source=service, cause=env, index=i)) for i, p in enumerate(core.handle(env))]
        assert outputs == recorded.get(env.id, []), f"{service} diverged on {env.type} {env.subject} at {env.occurred_at}"
        replayed_count += len(outputs)
    assert replayed_count == sum(len(v) for v in recorded.values())


def _decisions(run: Run) -> list[str]:
    lines = []
    for env in run.runtime.log:
        if env.source in SERVICES and env.type not in ("TimerSet", "KubeEffect"):
            p = env.payload
            reason = getattr(p, "reason", "")
            lines.append(f"{env.occurred_at:g} {env.source} {env.type} {env.subject} {reason}".rstrip())
    return lines


def test_decisions_match_the_golden_sequence(run: Run) -> None:
    path = GOLDEN / f"{run.scenario.name}.txt"
    lines = _decisions(run)
    if os.environ.get("MUSTER_UPDATE_GOLDEN") or not path.exists():
        GOLDEN.mkdir(exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        if not os.environ.get("MUSTER_UPDATE_GOLDEN"):
            pytest.fail(f"wrote missing golden file {path.name}; review it and commit it")
    expected = path.read_text().splitlines()
    assert lines == expected


@pytest.mark.parametrize("name", ["fair-share-two-teams", "gpu-fractions-and-whole-devices", "kai-priority-preemption"])
def test_another_process_with_another_hash_seed_gives_the_same_result(name: str, tmp_path: Path) -> None:
    """String hashing is salted per process; nothing a core decides may depend on it."""
    import subprocess
    import sys

    scenario = Path(__file__).parent.parent / "scenarios" / f"{name}.yaml"
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-m", "shared.cli.main", "simulate", str(scenario), "--json", str(out), "-q"],
                   check=True, env=env, capture_output=True)
    here = simulate(load_scenario(scenario)).result()
    assert _strip_wall(json.loads(out.read_text())) == _strip_wall(here)
