"""A log of hostile input verifies: what is stored is what was decided on (issue 33, hardening)."""

from __future__ import annotations

from pathlib import Path

from tests.builders.cli import clean_exit, flat, invoke

SCENARIO = """\
name: non-finite
cluster:
  nodes:
    - name: n1
      capacity: {cpu: "16", memory: 64Gi, pods: "110"}
steps:
  - at: 0s
    apply: |
      apiVersion: ray.io/v1
      kind: RayCluster
      metadata: {name: c1, namespace: default}
      spec:
        headGroupSpec:
          template:
            spec:
              containers: [{name: h, image: x, resources: {requests: {cpu: .inf, memory: .nan}}}]
"""


def test_a_non_finite_number_is_refused_at_ingest_and_its_log_verifies(tmp_path: Path) -> None:
    scenario = tmp_path / "nan.yaml"
    scenario.write_text(SCENARIO)
    store = f"sqlite:///{tmp_path / 'nan.db'}"
    clean_exit(invoke("simulate", scenario, "-q", "--store", store), 0)
    out = tmp_path / "nan.jsonl"
    clean_exit(invoke("log", "export", "--store", store, "--out", out), 0)
    assert ":NaN" not in out.read_text() and ":null" not in out.read_text().split("refused")[0][-300:]
    result = invoke("replay", out, "--verify")
    clean_exit(result, 0)
    assert "0 different" in flat(result.stdout)
    shown = invoke("simulate", scenario)
    assert "refused at ingest: spec.headGroupSpec.template.spec.containers[0].resources.requests.cpu: inf is not a finite number" in flat(shown.stdout)
