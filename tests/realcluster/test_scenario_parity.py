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
Each file runs under every batch-scheduler setting it applies to (``settings``): the one it names or
its manifests imply, and KubeRay's default (``none``: no PodGroups, pods keep their template's
scheduler name) unless it names its setting, as a file whose meaning needs one does. The runs are
ordered by setting, so KubeRay restarts at most once per setting.

``KNOWN`` lists the files whose real run still differs, each with the difference: strict xfails, so
a file that starts to match fails until it is taken off the list.

A RayJob's end cannot happen on KWOK: real KubeRay learns it from the Ray dashboard, and no Ray runs
(its submitter runs until the RayJob goes, ``shared.parts.kwok``). A file whose embedded run has a
RayJob end (``muster.dev/sim-duration``) is compared up to that instant (``ray_job_end``): the
transitions and bound intervals before it, and the expectations before it; the end and what follows
it are shown by the embedded run of the same file (``tests/scenarios``, the goldens).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import pytest

from shared.kubernetes.realcluster import TIME_TOLERANCE
from shared.kubernetes.realcluster import simulate_live
from shared.runtime.simulate import simulate
from shared.sim.scenario import Scenario, ScenarioError, load_scenario

if TYPE_CHECKING:
    from shared.parts.devcluster import DevCluster
    from shared.sim.batchscheduler import Setting

ROOT = Path(__file__).parents[2]
SCENARIOS = sorted((ROOT / "tests" / "scenarios").glob("*.yaml"))
EXAMPLES = {p.name for p in (ROOT / "examples").glob("*.yaml")}

KNOWN: dict[str, str] = {}
"""None today: node-removed-gang-replaced was the last (real KubeRay re-creates a lost node's workers one
request at a time, and muster bound the first alone; placement now re-places a displaced gang only
once every pod of the lost node is gone, ``Slots.relocate``)."""

REFUSED: dict[str, str] = {
    "bad-input-rejected": 'The RayCluster "cpu-lots" is invalid: spec.headGroupSpec.template.spec.containers[0]'
                          '.resources.requests.cpu: Invalid value: "lots"',
}
"""Files whose bad input the real API server refuses itself (the CRD's schema), where the embedded run
has muster reject it: the run stops at the refusal, whose message must say what and why."""


def settings(scenario: Scenario) -> list[Setting]:
    """The KubeRay ``--batch-scheduler`` settings a file applies to: its own (named, or implied by its
    labels) and, unless it names it, KubeRay's default, where muster reads the same queue labels."""
    own = scenario.batch_scheduler
    return [own] if scenario.cluster.kuberay.batch_scheduler is not None or own == "none" else [own, "none"]


def _selected() -> list[tuple[Path, Setting, str]]:
    """Each run: the file, the setting, and its name (the file's, with the setting when not its own:
    ``volcano-gang-queue[none]``)."""
    mode = os.environ.get("MUSTER_REAL", "").strip().lower()
    if mode in ("0", "off", "no", "none"):
        return []
    chosen = SCENARIOS if mode == "all" else [p for p in SCENARIOS if p.name in EXAMPLES]
    runs = [(path, setting, path.stem if i == 0 else f"{path.stem}[{setting}]")
            for path in chosen for i, setting in enumerate(settings(load_scenario(path)))]
    return sorted(runs, key=lambda run: (run[1], run[0].stem))


SELECTED = _selected()
TIMES = ROOT / "build" / "parity-times.json"
"""Each file's wall seconds on the real cluster (preparing the cluster, then the run), for docs/parts.md."""


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


def ray_job_end(result: Mapping[str, Any]) -> float | None:
    """The first instant a RayJob of the run ends of itself (KubeRay's status says it finished), or None."""
    ends = [t["t"] for w in result["workloads"].values() if w.get("kind") == "RayJob"
            for t in w["transitions"] if str(t["reason"]).startswith("RayJob finished")]
    return min(ends) if ends else None


def before(result: Mapping[str, Any], until: float) -> dict[str, Any]:
    """The result as it stood just before ``until``: later transitions and bindings left out, intervals
    still open then left open, each workload's phase its last one before; queues' end state not known."""
    workloads: dict[str, Any] = {}
    for key, w in result["workloads"].items():
        steps = [t for t in w["transitions"] if t["t"] < until]
        if not steps:
            continue
        pods = [{**p, "bound": [[a, b if b is not None and b < until else None] for a, b in p["bound"] if a < until]}
                for p in w["pods"]]
        workloads[key] = {**w, "transitions": steps, "phase": steps[-1]["phase"], "pods": [p for p in pods if p["bound"]]}
    return {**result, "workloads": workloads, "queues": {}}


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


def test_a_file_runs_under_its_own_setting_and_kuberays_default_unless_it_names_one() -> None:
    from shared.sim.scenario import parse_scenario

    def scenario(labels: dict[str, str], kuberay: dict[str, str] | None = None) -> Scenario:
        cluster = {"metadata": {"name": "rc", "namespace": "ns", "labels": labels},
                   "spec": {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}},
                   "apiVersion": "ray.io/v1", "kind": "RayCluster"}
        return parse_scenario(json.dumps({"name": "a", "cluster": {"kuberay": kuberay or {}},
                                          "steps": [{"at": 0, "apply": json.dumps(cluster)}]}))

    assert settings(scenario({"volcano.sh/queue-name": "q"})) == ["volcano", "none"]
    assert settings(scenario({"kai.scheduler/queue": "q"})) == ["kai-scheduler", "none"]
    assert settings(scenario({})) == ["none"]
    assert settings(scenario({"volcano.sh/queue-name": "q"}, {"batch_scheduler": "volcano"})) == ["volcano"]


def test_a_run_is_compared_up_to_its_first_rayjob_end():
    job = {"kind": "RayJob", "queue": "q", "priority": 0, "gang": None, "phase": "Succeeded",
           "transitions": [{"t": 1.0, "phase": "Running", "reason": "bound"},
                           {"t": 30.0, "phase": "Succeeded", "reason": "RayJob finished: jobStatus SUCCEEDED"}],
           "pods": [{"pod_set": "head", "node": "n", "gpu": None, "bound": [[1.0, 30.0]]}]}
    late = {"kind": "RayCluster", "queue": "q", "priority": 0, "gang": None, "phase": "Running",
            "transitions": [{"t": 30.0, "phase": "Running", "reason": "bound"}], "pods": []}
    embedded = {"workloads": {"ns/j": job, "ns/late": late}, "queues": {"q": {"usage": {}}}}
    assert ray_job_end(embedded) == 30.0
    real = {"workloads": {"ns/j": {**job, "phase": "Running", "transitions": job["transitions"][:1],
                                   "pods": [{**job["pods"][0], "bound": [[1.0, None]]}]}},
            "queues": {"q": {"usage": {"cpu": "1"}}}}
    assert differences(before(embedded, 30.0), before(real, 30.0)) == []
    running_late = json.loads(json.dumps(real))
    running_late["workloads"]["ns/j"]["transitions"][0]["t"] = 1.0 + TIME_TOLERANCE + 1
    assert len(differences(before(embedded, 30.0), before(running_late, 30.0))) == 1


PARAMS = [pytest.param(path, setting, name, id=name,
                       marks=[pytest.mark.xfail(strict=True, reason=KNOWN[name])] if name in KNOWN else [])
          for path, setting, name in SELECTED]


@pytest.mark.parametrize("path, setting, name", PARAMS)
def test_scenario_on_the_real_cluster_matches_its_embedded_run(path: Path, setting: "Setting", name: str,
                                                               devcluster: "DevCluster") -> None:
    scenario = load_scenario(path).under(setting)
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
        _note_time(name, prepared - started, time.monotonic() - prepared)
    expected, got = embedded.result(), real.result()
    until = ray_job_end(expected)
    if until is not None:  # a RayJob's end cannot happen on KWOK: compared up to it (see the module)
        expected, got = before(expected, until), before(got, until)
    found = differences(expected, got)
    assert not found, "\n".join(found)
    failures = [f for f in real.check() if until is None or f.expectation.at < until - TIME_TOLERANCE]
    assert not failures, "\n".join(str(f) for f in failures)


def _note_time(stem: str, prepare: float, run: float) -> None:
    TIMES.parent.mkdir(exist_ok=True)
    times = json.loads(TIMES.read_text()) if TIMES.exists() else {}
    times[stem] = {"prepare_s": round(prepare, 1), "run_s": round(run, 1)}
    TIMES.write_text(json.dumps(times, indent=1, sort_keys=True) + "\n")
