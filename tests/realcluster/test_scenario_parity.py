"""The parity tier: each scenario of tests/scenarios on the real cluster against its embedded run.

The session's dev cluster (``devcluster``: etcd, kube-apiserver, KWOK, real KubeRay) runs each file
through ``simulate_live`` after ``DevCluster.prepare`` (emptied, KubeRay with the scenario's
``--batch-scheduler``, kube-scheduler stopped while muster answers to ``default-scheduler``), and the
result must equal the embedded run's: the same phases and reasons in the same order for every
workload (times within ``TIME_TOLERANCE``), the same pods bound per workload (pod set, node, GPU
devices, bound intervals; pod names differ, KubeRay's suffixes are random), the same queues' usage,
members and order; and ``--check`` passes.

Which files run: ``MUSTER_REAL=all`` every file; unset, the files ``examples/`` holds (every
``../shared/scenarios`` file is among them), which fit the suite's budget; ``MUSTER_REAL=0`` none.
The files are ordered by batch-scheduler setting, so KubeRay restarts at most once per setting.

``KNOWN`` lists the files whose real run still differs, each with the difference: strict xfails, so
a file that starts to match fails until it is taken off the list.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import pytest

from shared.realcluster import TIME_TOLERANCE
from shared.scenario import ScenarioError, load_scenario
from shared.simulate import simulate, simulate_live

if TYPE_CHECKING:
    from shared.parts.devcluster import DevCluster

ROOT = Path(__file__).parents[2]
SCENARIOS = sorted((ROOT / "tests" / "scenarios").glob("*.yaml"))
EXAMPLES = {p.name for p in (ROOT / "examples").glob("*.yaml")}

_RAYJOB_PODS = ("real KubeRay labels a RayJob's pods with ray.io/cluster only (labelPod, common/pod.go), the "
                "simulated one also with ray.io/originated-from-*: muster maps them to the RayCluster, not the "
                "RayJob, and never binds them")
_GPU_LIMITS = ("the manifests request nvidia.com/gpu without a limit: the real API server refuses such a pod "
               "(an extended resource's request must equal its limit), so KubeRay makes none; the simulated "
               "API server takes it")
KNOWN: dict[str, str] = {
    "kept-cluster-no-quota-but-capacity": _RAYJOB_PODS,
    "kube-queue-gang-insufficient": _RAYJOB_PODS,
    "kube-queue-priority-jump": _RAYJOB_PODS,
    "kube-queue-quota-tree-rayjobs": _RAYJOB_PODS,
    "kube-queue-rayjob-submitter-not-charged": _RAYJOB_PODS,
    "kuberay-volcano-moving-off-volcano": _RAYJOB_PODS,
    "rayjob-submission-modes": _RAYJOB_PODS,
    "kai-reclaim-below-quota": _GPU_LIMITS,
    "volcano-deserved-reclaim": _GPU_LIMITS,
    "volcano-preemptable-false": _GPU_LIMITS,
    "volcano-reclaim-keeps-guarantee": _GPU_LIMITS,
    "kube-queue-min-reclaimed-under-root-max": _GPU_LIMITS,
    "node-removed-gang-replaced": "real KubeRay re-creates the lost workers in separate requests: muster binds "
                                  "the first replacement at 30s on node-3 alone, where the simulated KubeRay makes "
                                  "both at once and the gang waits for node-4 at 60s",
    "usage-beyond-64-bits": "its Pods have no image: the real API server refuses them (spec.containers[0].image: "
                            "Required value), the simulated one takes them",
}

REFUSED: dict[str, str] = {
    "bad-input-rejected": 'The RayCluster "cpu-lots" is invalid: spec.headGroupSpec.template.spec.containers[0]'
                          '.resources.requests.cpu: Invalid value: "lots"',
}
"""Files whose bad input the real API server refuses itself (the CRD's schema), where the embedded run
has muster reject it: the run stops at the refusal, whose message must say what and why."""


def _selected() -> list[Path]:
    mode = os.environ.get("MUSTER_REAL", "").strip().lower()
    if mode in ("0", "off", "no", "none"):
        return []
    chosen = SCENARIOS if mode == "all" else [p for p in SCENARIOS if p.name in EXAMPLES]

    def order(path: Path) -> tuple[str, str]:
        return (load_scenario(path).batch_scheduler, path.stem)

    return sorted(chosen, key=order)


SELECTED = _selected()
TIMES = ROOT / "build" / "parity-times.json"
"""Each file's wall seconds on the real cluster (preparing the cluster, then the run), for the README."""


def _pods(workload: Mapping[str, Any]) -> list[tuple[str, str, str, list[tuple[float, float | None]]]]:
    rows = [(str(p["pod_set"]), str(p["node"]), json.dumps(p["gpu"], sort_keys=True),
             [(float(a), None if b is None else float(b)) for a, b in p["bound"]]) for p in workload["pods"]]
    return sorted(rows, key=lambda r: (r[:3], [(a, float("inf") if b is None else b) for a, b in r[3]]))


_POD_SUFFIX = re.compile(r"(-head|-worker)-[a-z0-9]{5}\b")


def _unnamed(reason: str) -> str:
    """A reason with KubeRay's pod-name suffixes taken out: random on the real cluster, hashes in the simulated."""
    return _POD_SUFFIX.sub(r"\1-*", reason)


def _close(a: float | None, b: float | None) -> bool:
    return a is None and b is None or (a is not None and b is not None and abs(a - b) <= TIME_TOLERANCE)


def differences(embedded: Mapping[str, Any], real: Mapping[str, Any]) -> list[str]:
    """Where the real run's result document differs from the embedded run's (empty: none)."""
    out: list[str] = []
    ew, rw = embedded["workloads"], real["workloads"]
    for key in sorted(set(ew) | set(rw)):
        if key not in rw or key not in ew:
            out.append(f"{key}: {'not seen on the real cluster' if key not in rw else 'only on the real cluster'}")
            continue
        e, r = ew[key], rw[key]
        for field in ("kind", "queue", "priority", "gang", "phase"):
            if e.get(field) != r.get(field):
                out.append(f"{key}: {field} {e.get(field)!r} embedded, {r.get(field)!r} real")
        steps_e = [(t["phase"], _unnamed(t["reason"])) for t in e["transitions"]]
        steps_r = [(t["phase"], _unnamed(t["reason"])) for t in r["transitions"]]
        if steps_e != steps_r:
            out.append(f"{key}: transitions {steps_e} embedded, {steps_r} real")
        else:
            out += [f"{key}: {a['phase']} at {a['t']}s embedded, {b['t']}s real"
                    for a, b in zip(e["transitions"], r["transitions"]) if not _close(a["t"], b["t"])]
        pods_e, pods_r = _pods(e), _pods(r)
        same = len(pods_e) == len(pods_r) and all(
            a[:3] == b[:3] and len(a[3]) == len(b[3])
            and all(_close(x[0], y[0]) and _close(x[1], y[1]) for x, y in zip(a[3], b[3]))
            for a, b in zip(pods_e, pods_r))
        if not same:
            out.append(f"{key}: pods {pods_e} embedded, {pods_r} real")
    for name in sorted(set(embedded["queues"]) | set(real["queues"])):
        if embedded["queues"].get(name) != real["queues"].get(name):
            out.append(f"queue {name}: {embedded['queues'].get(name)} embedded, {real['queues'].get(name)} real")
    return out


def test_differences_are_seen() -> None:
    """The comparison itself: a moved transition, an extra bound pod, another queue usage all show."""
    doc = {"workloads": {"ns/w": {"kind": "RayCluster", "queue": "q", "priority": 0, "gang": None, "phase": "Running",
                                  "transitions": [{"t": 1.0, "phase": "Queued", "reason": "waiting"},
                                                  {"t": 3.0, "phase": "Running", "reason": "bound"}],
                                  "pods": [{"pod_set": "head", "node": "n", "gpu": None, "bound": [[1.0, None]]}]}},
           "queues": {"q": {"usage": {"cpu": "1"}, "active": ["ns/w"], "pending": [], "backoff": []}}}
    assert differences(doc, json.loads(json.dumps(doc))) == []
    late = json.loads(json.dumps(doc))
    late["workloads"]["ns/w"]["transitions"][1]["t"] = 3.0 + TIME_TOLERANCE + 1
    extra = json.loads(json.dumps(doc))
    extra["workloads"]["ns/w"]["pods"].append({"pod_set": "head", "node": "m", "gpu": None, "bound": [[1.0, None]]})
    usage = json.loads(json.dumps(doc))
    usage["queues"]["q"]["usage"] = {"cpu": "2"}
    assert [len(differences(doc, other)) for other in (late, extra, usage)] == [1, 1, 1]


SOMETIMES = frozenset({"node-removed-gang-replaced"})
"""Differences that depend on timing, not strict: whether KubeRay's separate re-creations reach muster
within one settle window decides whether the partial bind happens (it did in 2 of 4 runs on
2026-12-06). A strict xfail would fail the suite whenever it did not."""

PARAMS = [pytest.param(p, id=p.stem, marks=[pytest.mark.xfail(strict=p.stem not in SOMETIMES, reason=KNOWN[p.stem])]
                       if p.stem in KNOWN else []) for p in SELECTED]


@pytest.mark.parametrize("path", PARAMS)
def test_scenario_on_the_real_cluster_matches_its_embedded_run(path: Path, devcluster: "DevCluster") -> None:
    scenario = load_scenario(path)
    embedded = simulate(scenario)
    started = time.monotonic()
    devcluster.prepare(scenario)
    prepared = time.monotonic()
    try:
        if path.stem in REFUSED:
            with pytest.raises(ScenarioError, match="the API server refused it") as refused:
                simulate_live(scenario, devcluster.kubeconfig)
            assert REFUSED[path.stem] in str(refused.value)
            return
        real = simulate_live(scenario, devcluster.kubeconfig)
    finally:
        _note_time(path.stem, prepared - started, time.monotonic() - prepared)
    found = differences(embedded.result(), real.result())
    assert not found, "\n".join(found)
    failures = real.check()
    assert not failures, "\n".join(str(f) for f in failures)


def _note_time(stem: str, prepare: float, run: float) -> None:
    TIMES.parent.mkdir(exist_ok=True)
    times = json.loads(TIMES.read_text()) if TIMES.exists() else {}
    times[stem] = {"prepare_s": round(prepare, 1), "run_s": round(run, 1)}
    TIMES.write_text(json.dumps(times, indent=1, sort_keys=True) + "\n")
