"""shared/audit/recorded.py: a deployment's what-if replays the log's recorded inputs at their times."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shared.audit.logfile import LogFile, envelopes
from shared.audit.recorded import INGEST, RecordedCluster, inputs
from shared.audit.whatif import comparison, what_if
from shared.kernel.events import KubeEffect
from shared.runtime.simulate import simulate
from shared.sim.scenario import parse_scenario
from tests.builders.audit import deployed
from tests.builders.cli import clean_exit, flat, invoke

RAY_CLUSTER = """
      apiVersion: ray.io/v1
      kind: RayCluster
      metadata: {{name: {name}, namespace: default, labels: {{volcano.sh/queue-name: batch}}}}
      spec:
        headGroupSpec:
          template: {{spec: {{containers: [{{name: ray-head, image: rayproject/ray:2.50.1, resources: {{requests: {{cpu: "4", memory: 2Gi}}}}}}]}}}}
"""
QUEUE = """
      apiVersion: scheduling.volcano.sh/v1beta1
      kind: Queue
      metadata: {{name: batch}}
      spec: {{weight: 1, capability: {{cpu: {cpu}}}}}
"""
SCENARIO = f"""
name: waits-for-quota
cluster:
  nodes:
    - {{name: node-1, capacity: {{cpu: "16", memory: 64Gi, pods: "110"}}}}
steps:
  - at: 0s
    apply: |{QUEUE.format(cpu=4)}
  - at: 1s
    apply: |{RAY_CLUSTER.format(name="first")}
  - at: 2s
    apply: |{RAY_CLUSTER.format(name="second")}
  - at: 60s
    delete: {{kind: RayCluster, namespace: default, name: first}}
until: 90s
"""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scenario's log as a deployment's export holds it (wall-clock times, origin kafka)."""
    run = simulate(parse_scenario(SCENARIO))
    return deployed(run, tmp_path_factory.mktemp("recorded") / "live.jsonl")


def test_the_inputs_of_a_log_are_the_watch_events_the_cluster_sent(live: Path) -> None:
    log = list(envelopes(LogFile(live)))
    feed = inputs(log)
    assert feed and all(env.source == INGEST for env in feed)
    assert {env.type for env in feed} <= {"ObjectChanged", "ObjectsListed"}


def test_a_recorded_cluster_keeps_what_it_is_asked_and_sends_nothing() -> None:
    cluster = RecordedCluster()
    effect = KubeEffect(op="event", kind="RayCluster", namespace="default", name="x", reason="Admitted")
    cluster.perform(effect, 5.0)
    assert cluster.asked == [(5.0, effect)] and cluster.take_watch_events() == []


def test_a_bigger_quota_on_a_deployments_log_shortens_the_wait_and_says_what_it_cannot_model(live: Path) -> None:
    """No --approximate: the recorded inputs replay at their times on both sides. ``second`` waited ~58 s for
    ``first`` to go; with room for both it is admitted at once, and the what-if says its pods still come when
    KubeRay made them in the recording."""
    source = LogFile(live)
    log = list(envelopes(source))
    bigger = parse_scenario(SCENARIO).documents[0]
    bigger[0]["spec"]["capability"]["cpu"] = 8
    outcome = what_if(log, name="live", until=None, recorded_policy=source.header.decided_with(), change=None,
                      extra=bigger, deployed=True)
    assert outcome.replayed == len(inputs(log))
    assert re.fullmatch(r"\d+ of the log's \d+ decisions made again by the same service about the same subject "
                        r"\(\d+ byte for byte; \d+ made in all\)", outcome.difference)
    doc = comparison(outcome, source.header.decided_with())
    before, after = (doc["workloads"]["default/second"][side]["waits"] for side in ("recorded", "new"))
    assert before and after and before[0] > 55 and after[0] < 1
    [gap] = outcome.unmodeled
    assert gap.key == "default/second" and gap.new is not None and gap.recorded is not None and gap.new < gap.recorded
    assert "its pods appear when KubeRay created them in the recording" in gap.words(str)


def test_the_cli_runs_a_deployments_what_if_without_approximate(live: Path, tmp_path: Path) -> None:
    queue = tmp_path / "queue.yaml"
    queue.write_text(QUEUE.format(cpu=8))
    policy = tmp_path / "same.yaml"
    policy.write_text("{}\n")
    result = invoke("replay", live, "--what-if", policy, "--apply", queue)
    clean_exit(result, 0)
    out = flat(result.stdout)
    assert "both sides replay its" in out and "recorded watch events at their recorded times" in out
    assert "the recorded side is near the log, not equal" in out  # the builder's log keeps scenario times inside
    assert "not modeled" in out and "default/second: admitted at 2026-" in out
