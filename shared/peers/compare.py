"""One scenario file, scheduled once by a real peer and once by muster, compared checkpoint by checkpoint.

Both runs happen on the same dev cluster (``shared.parts.devcluster``), emptied before each, with real
KubeRay run with the peer's ``--batch-scheduler`` (so the PodGroups are the ones production has):

- the peer's run: its processes started (``Peer.start``), kube-scheduler running beside it as in a
  cluster that runs the peer, muster not running. The scenario's nodes become KWOK nodes and its steps
  are applied in order through the API server (``LiveCluster.apply``/``delete``, the helpers muster's
  live run uses); after each instant the run waits until what a snapshot reads has stayed the same for
  ``quiet`` seconds (a peer schedules in periods: Volcano each second), then takes the checkpoints.
- muster's run: ``simulate_live``'s, as the parity tier runs it (``DevCluster.prepare``, virtual time
  that moves on once the cluster settles), with a snapshot taken as time passes each checkpoint.

Both runs schedule the same variant of the file (``variant``): beside KAI, a leaf queue without a parent is
put under one of unlimited quota (``under_a_parent``), since real KAI schedules nothing in a queue without
one. Where one of the peer's rules counts seconds of the wall clock (KAI's minimum runtimes, its stale-gang
grace period: ``keeps_clock``), the peer's run is paced, each instant applied at its time after the first.

The checkpoints are the instants of the file's steps and expectations and its ``until``. At each one,
per workload: running (some pod bound) or waiting, pods bound of its pods, pods evicted since the
previous checkpoint (preempted or reclaimed; a pod made again has another UID), or gone; per queue the
requests of its bound pods (``shared.peers.observe``). Node names are not compared: two schedulers may
score nodes differently and both be right.

A difference is either fixed in muster or marked deliberate in docs/design/peers.md (its table, the one
place ``deliberate`` reads): ``python -m shared.peers.compare PEER`` runs the whole set and writes the
table of docs/peers.md; tests/peers runs a subset and fails on any difference not marked.
"""

from __future__ import annotations

import copy
import re
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from shared.kubernetes.realcluster import LiveCluster, LiveRuntime
from shared.kubernetes.resources import KAI_QUEUE
from shared.parts import catalog
from shared.parts.devcluster import DevCluster
from shared.parts.peers import Peer
from shared.peers.observe import Snapshot, read, snapshot, usage_text, workload_keys
from shared.runtime.simulate import play
from shared.sim.cluster import ScenarioError as Refused
from shared.sim.scenario import Scenario, ScenarioError, load_scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIO_DIRS = (ROOT / "tests" / "scenarios", ROOT / "examples", ROOT.parent / "shared" / "scenarios",
                 ROOT / "tests" / "peers" / "scenarios")
"""Where the compared files come from (a name found twice is run once, the first found)."""
DELIBERATE = ROOT / "docs" / "design" / "peers.md"


@dataclass(frozen=True)
class Row:
    scenario: str
    at: float
    subject: str
    """``namespace/name`` of a workload, ``queue NAME``, or ``run`` (a step the API server refused)."""
    peer: str
    muster: str

    @property
    def same(self) -> bool:
        return self.peer == self.muster


@dataclass
class Comparison:
    peer: str
    configuration: str
    rows: list[Row] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def differing(self) -> dict[str, list[Row]]:
        """Scenario -> its rows that differ."""
        out: dict[str, list[Row]] = {}
        for row in self.rows:
            if not row.same:
                out.setdefault(row.scenario, []).append(row)
        return out


# --------------------------------------------------------------------------- which files
def scenario_files(peer: Peer) -> list[Path]:
    """The files of the peer's dialect (their manifests imply its KubeRay setting) that configure nothing of
    muster's own (no ``policy:`` block: queueing, placement or scheduler names the peer has no knob for)."""
    seen: dict[str, Path] = {}
    for folder in SCENARIO_DIRS:
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
            if path.stem in seen:
                continue
            scenario = load_scenario(path)
            if scenario.batch_scheduler == peer.batch_scheduler and not scenario.policy:
                seen[path.stem] = path
    return sorted(seen.values(), key=lambda p: p.stem)


# --------------------------------------------------------------------------- what is run
KAI_PARENT = "compare-parent"
"""The parent a KAI queue without one is put under for both runs (``under_a_parent``)."""


def under_a_parent(scenario: Scenario) -> Scenario:
    """The file with every KAI queue that names no parent and is no other's parent (a leaf queue without a
    department) put under one of unlimited quota and limit, for both runs. Real KAI never schedules a queue
    without a parent (``buildActiveJobOrderPriorityQueues`` skips a queue whose department is unknown,
    docs/design/peers.md), so as written such a file compares
    only KAI's silence. Under a parent whose quota is the whole cluster (KAI's ``-1``: its deserved share
    is all it asks for, ``setDeservedResource``) the queues divide the cluster among themselves as
    top-level queues do, and reclaim among siblings is judged below the common parent
    (``getLeveledQueues``), which is what the file meant. Returns ``scenario`` itself if nothing changes."""

    def kai_queue(doc: dict[str, Any]) -> bool:
        return doc.get("kind") == "Queue" and doc.get("apiVersion") == KAI_QUEUE.api_version

    departments = {(doc.get("spec") or {}).get("parentQueue") for docs in scenario.documents for doc in docs
                   if kai_queue(doc)}

    def orphan(doc: dict[str, Any]) -> bool:
        return (kai_queue(doc) and not (doc.get("spec") or {}).get("parentQueue")
                and (doc.get("metadata") or {}).get("name") not in departments)

    def adopted(doc: dict[str, Any]) -> dict[str, Any]:
        doc = copy.deepcopy(doc)
        doc.setdefault("spec", {})["parentQueue"] = KAI_PARENT
        return doc

    if not any(orphan(doc) for docs in scenario.documents for doc in docs):
        return scenario
    steps = [step.model_dump(exclude_none=True) for step in scenario.steps]
    for data, docs in zip(steps, scenario.documents):
        if any(orphan(doc) for doc in docs):
            data["apply"] = yaml.safe_dump_all([adopted(doc) if orphan(doc) else doc for doc in docs], sort_keys=False)
    unlimited = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
    parent = {"apiVersion": KAI_QUEUE.api_version, "kind": "Queue", "metadata": {"name": KAI_PARENT},
              "spec": {"resources": {resource: dict(unlimited) for resource in ("cpu", "gpu", "memory")}}}
    first = min(step.at for step in scenario.steps)
    steps.insert(0, {"at": first, "apply": yaml.safe_dump(parent, sort_keys=False)})
    return Scenario.model_validate({**scenario.model_dump(exclude_none=True), "steps": steps})


def variant(scenario: Scenario, peer: Peer) -> Scenario:
    """What both runs of a file schedule beside ``peer`` (``under_a_parent`` for KAI)."""
    return under_a_parent(scenario) if peer.name == "kai" else scenario


TIME_RULES = ("preemptMinRuntime", "reclaimMinRuntime")
"""KAI queue fields measured in seconds of running (its minruntime plugin)."""


def keeps_clock(scenario: Scenario, peer: Peer) -> bool:
    """Whether the peer's run must apply the file's steps at their instants by the wall clock: a rule of the
    peer that counts seconds decides the file. KAI's minimum runtimes (``isReclaimMinRuntimeProtected``,
    ``time.Now().Before(protectedUntil)``) and its stale-gang grace period (``handleStaleJob``, 60 s by
    default: a file that takes a node away leaves a gang below its minimum) count the wall clock; a run
    that settles step after step would pass the file's minutes in seconds and never see them come due."""
    if peer.name != "kai":
        return False
    for step, docs in zip(scenario.steps, scenario.documents):
        if step.delete is not None and step.delete.kind == "Node":
            return True
        for doc in docs:
            resources = (doc.get("spec") or {}) if doc.get("kind") == "Queue" else {}
            if any(rule in resources or rule in (resources.get("resources") or {}) for rule in TIME_RULES):
                return True
    return False


def checkpoints(scenario: Scenario) -> list[float]:
    return sorted({s.at for s in scenario.steps} | {e.at for e in scenario.expect} | {scenario.until})


# --------------------------------------------------------------------------- the two runs
Snapshots = dict[float, Snapshot]


def _kubectl(cluster: DevCluster) -> Callable[..., str]:
    return lambda *args: cluster.kubectl(*args).stdout


def run_peer(scenario: Scenario, cluster: DevCluster, peer: Peer, configuration: str, *, quiet: float = 3.0,
             limit: float = 60.0, paced: bool = False) -> tuple[Snapshots, str | None]:
    """The peer's run (see the module docstring): a snapshot per checkpoint, and the refusal that ended
    it early, if a step was refused. ``paced``: each instant waits for its time by the wall clock, counted
    from the first (``keeps_clock``), before its steps are applied or its checkpoint taken, and its
    checkpoint is read before the next instant's time."""
    cluster.reset()
    cluster.kube_scheduler(True)
    if cluster.batch_scheduler != peer.batch_scheduler:
        cluster.start_kuberay(peer.batch_scheduler)
    keys = workload_keys(scenario)
    kubectl = _kubectl(cluster)
    observe = lambda: snapshot(read(kubectl, peer), keys, peer)  # noqa: E731
    parts = peer.start(cluster, configuration)
    snaps: Snapshots = {}
    try:
        live = LiveCluster(cluster.kubeconfig, kubectl=catalog.binary("kubernetes", "kubectl"))
        for spec in scenario.cluster.nodes:
            for manifest in spec.manifests():
                live.apply(manifest, 0.0)
        points = checkpoints(scenario)
        instants = sorted({s.at for s in scenario.steps} | set(points))
        begun = time.monotonic() - instants[0]
        for i, t in enumerate(instants):
            if paced:
                time.sleep(max(0.0, begun + t - time.monotonic()))
            for index, step in enumerate(scenario.steps):
                if step.at != t:
                    continue
                try:
                    if step.delete is not None:
                        live.delete(step.delete.kind, step.delete.namespace, step.delete.name, t)
                    for doc in scenario.documents[index]:
                        live.apply(doc, t)
                except (Refused, ScenarioError) as exc:
                    return snaps, _refusal(exc)
            # paced, a checkpoint is read before the next instant comes due by the wall clock (a rule coming
            # due there must not show at this one); a second of it is left for the read itself
            last = i + 1 == len(instants)
            bound = limit if not paced or last else min(limit, begun + instants[i + 1] - time.monotonic() - 1.0)
            settled = settle(observe, quiet, bound)
            if t in points:
                snaps[t] = settled
    finally:
        peer.stop(cluster, parts)
    return snaps, None


def settle(observe: Callable[[], Snapshot], quiet: float, limit: float) -> Snapshot:
    """The snapshot once it has stayed the same for ``quiet`` seconds (at most ``limit``)."""
    started = time.monotonic()
    last = observe()
    since = time.monotonic()
    while time.monotonic() - since < quiet and time.monotonic() - started < limit:
        time.sleep(0.5)
        now = observe()
        if now.fingerprint() != last.fingerprint():
            since = time.monotonic()
        last = now
    return last


class _Checkpointed(LiveRuntime):
    """muster's live runtime, which takes a snapshot as virtual time passes each checkpoint: everything
    up to the checkpoint has been drained and the cluster has settled, and nothing happens until ``t``."""

    points: deque[float]
    take: Callable[[float], None]

    def _advance(self, t: float) -> None:
        while self.points and self.points[0] < t:
            self.take(self.points.popleft())
        super()._advance(t)


def run_muster(scenario: Scenario, cluster: DevCluster, peer: Peer) -> tuple[Snapshots, str | None]:
    """muster's run of the file under the peer's KubeRay setting (``simulate_live`` with checkpoints)."""
    scenario = scenario.under(peer.batch_scheduler)
    cluster.prepare(scenario)
    keys = workload_keys(scenario)
    kubectl = _kubectl(cluster)
    snaps: Snapshots = {}

    def take(t: float) -> None:
        snaps[t] = snapshot(read(kubectl, peer), keys, peer)

    effective = scenario.effective_policy()
    live = LiveCluster(cluster.kubeconfig, kubectl=catalog.binary("kubernetes", "kubectl"),
                       pod_startup=scenario.startup_seconds).start()
    runtime = _Checkpointed(effective, live, keep_log=False)  # type: ignore[arg-type]
    runtime.points = deque(checkpoints(scenario))
    runtime.take = take
    refused = None
    try:
        play(scenario, effective, runtime)
    except (Refused, ScenarioError) as exc:
        refused = _refusal(exc)
    finally:
        live.close()
    if refused is None:
        while runtime.points:
            take(runtime.points.popleft())
    return snaps, refused


def _refusal(exc: ValueError) -> str:
    """What the API server refused, without the parts that differ between two runs."""
    text = str(exc).split(": the API server refused it: ", 1)[-1]
    return "refused: " + re.sub(r"\s+", " ", text)[:160]


# --------------------------------------------------------------------------- the comparison
def outcomes(snaps: Snapshots) -> dict[tuple[float, str], str]:
    """(checkpoint, subject) -> what a reader is shown (see the module docstring)."""
    out: dict[tuple[float, str], str] = {}
    previous: Snapshot | None = None
    existed: set[str] = set()
    for t in sorted(snaps):
        snap = snaps[t]
        for key, now in snap.workloads.items():
            before = previous.workloads.get(key) if previous is not None else None
            if not now.exists:
                if key in existed:
                    out[(t, key)] = "gone"
                continue
            existed.add(key)
            bound, total = len(now.bound), len(now.bound) + now.waiting
            text = f"running {bound}/{total}" if bound else f"waiting 0/{total}"
            if bound and len(now.sets) > 1 and bound < total:  # which of a Ray cluster's pods run, when not all do
                text += " (" + ", ".join(f"{name} {b}/{n}" for name, b, n in now.sets) + ")"
            if before is not None and before.exists and before.bound - now.bound:
                text += f", {len(before.bound - now.bound)} evicted"
            out[(t, key)] = text
        for queue, usage in snap.usage.items():
            out[(t, f"queue {queue}")] = usage_text(usage)
        previous = snap
    return out


def compare(name: str, peer_run: tuple[Snapshots, str | None], muster_run: tuple[Snapshots, str | None]) -> list[Row]:
    """The rows of one file: every (checkpoint, subject) either run shows, in time order."""
    (peer_snaps, peer_refused), (muster_snaps, muster_refused) = peer_run, muster_run
    a, b = outcomes(peer_snaps), outcomes(muster_snaps)
    rows = [Row(name, t, subject, a.get((t, subject), _absent(subject)), b.get((t, subject), _absent(subject)))
            for t, subject in sorted(set(a) | set(b), key=lambda k: (k[0], k[1].startswith("queue "), k[1]))]
    if peer_refused or muster_refused:
        rows.append(Row(name, -1.0, "run", peer_refused or "ran", muster_refused or "ran"))
    return rows


def _absent(subject: str) -> str:
    return "none" if subject.startswith("queue ") else "not seen"


def compare_file(path: Path, cluster: DevCluster, peer: Peer, configuration: str) -> list[Row]:
    scenario = variant(load_scenario(path), peer)
    paced = keeps_clock(scenario, peer)
    return compare(path.stem, run_peer(scenario, cluster, peer, configuration, paced=paced),
                   run_muster(scenario, cluster, peer))


# --------------------------------------------------------------------------- what is deliberate
def deliberate(peer: str, source: Path = DELIBERATE) -> dict[str, str]:
    """Scenario -> why muster differs from ``peer`` there on purpose: the rows ``| peer | scenario | why |``
    of the table in docs/design/peers.md."""
    marked: dict[str, str] = {}
    for line in source.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 3 and cells[0] == peer:
            marked[cells[1].strip("`")] = cells[2]
    return marked


def unmarked(comparison: Comparison, marked: dict[str, str], ran: list[str]) -> list[str]:
    """What fails the comparison: a file that differs and is not marked, or one marked that no longer differs."""
    differing = comparison.differing()
    out = [f"{name}: differs and is not marked deliberate in docs/design/peers.md:\n  " + "\n  ".join(
        f"{row.at:g}s {row.subject}: {comparison.peer} {row.peer!r}, muster {row.muster!r}" for row in rows)
        for name, rows in sorted(differing.items()) if name not in marked]
    out += [f"{name}: marked deliberate in docs/design/peers.md but no longer differs: take it off"
            for name in sorted(marked) if name in ran and name not in differing]
    return out


# --------------------------------------------------------------------------- docs/peers.md
def table(comparison: Comparison, marked: dict[str, str], versions: str) -> str:
    """The generated section of docs/peers.md for one peer."""
    differing = comparison.differing()
    lines = [f"## {comparison.peer} ({versions}, configuration `{comparison.configuration}`)", "",
             f"{len({r.scenario for r in comparison.rows})} scenario files, "
             f"{sum(1 for r in comparison.rows if r.same)} of {len(comparison.rows)} rows the same; "
             f"files that differ: {', '.join(f'`{n}`' for n in sorted(differing)) or 'none'} "
             "(each marked deliberate in [design/peers.md](design/peers.md), with the reason).", "",
             "| scenario | checkpoints | rows | different | |", "|---|---|---|---|---|"]
    for name in dict.fromkeys(r.scenario for r in comparison.rows):
        rows = [r for r in comparison.rows if r.scenario == name]
        lines.append(f"| `{name}` | {len({r.at for r in rows})} | {len(rows)} | {sum(not r.same for r in rows)} | "
                     f"{'same' if name not in differing else 'marked deliberate' if name in marked else '**not marked**'} |")
    lines += ["", f"| scenario | at | workload or queue | {comparison.peer} | muster | |", "|---|---|---|---|---|---|"]
    for row in comparison.rows:
        at = "—" if row.at < 0 else f"{row.at:g}s"
        lines.append(f"| `{row.scenario}` | {at} | {row.subject} | {row.peer} | {row.muster} | "
                     f"{'same' if row.same else '**different**'} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- make compare
PEERS_DOC = ROOT / "docs" / "peers.md"
HEADER = """# muster beside the real peers

Generated by `make compare PEER=NAME` (`shared/peers/compare.py`): every scenario file of the peer's
dialect, run on a fresh dev cluster twice, once scheduled by the real peer and once by muster, compared
at each checkpoint (the instants of the file's steps and expectations, and its end). Per workload:
running (pods bound of its pods) or waiting, pods evicted since the previous checkpoint (preempted or
reclaimed), or gone; per queue, the requests of its bound pods. Each file that differs is marked
deliberate, with the reason, in [design/peers.md](design/peers.md); `tests/peers` runs a few of these
files and fails on any difference not marked there.
"""


def with_section(doc: str, peer: str, section: str) -> str:
    """docs/peers.md with ``peer``'s section (``## peer (...``) replaced by ``section``, the other peers' kept,
    sections in name order: each peer's ``make compare`` rewrites only its own."""
    sections: dict[str, str] = {}
    for chunk in re.split(r"(?m)^(?=## )", doc)[1:]:
        sections[chunk[3:].split(" ", 1)[0]] = chunk.rstrip("\n") + "\n"
    sections[peer] = section
    return HEADER + "".join("\n" + sections[name] for name in sorted(sections))


def results_file(peer: str) -> Path:
    """Every file's rows of the last runs (``make compare``): a run of a few files replaces theirs."""
    return ROOT / "build" / f"peers-{peer}.json"


def main(argv: list[str]) -> int:
    """``python -m shared.peers.compare PEER [CONFIGURATION] [FILE-STEM ...]`` (``make compare``)."""
    import json
    import sys

    from shared.parts.devcluster import down
    from shared.parts.peers import peer as find_peer

    name = argv[0] if argv else "volcano"
    peer = find_peer(name)
    if argv[1:] == ["--render"]:
        return render(peer)
    configuration = argv[1] if len(argv) > 1 and argv[1] else peer.configurations[0]
    only = set(argv[2:])
    every = scenario_files(peer)
    files = [p for p in every if not only or p.stem in only]
    saved = results_file(name)
    kept = json.loads(saved.read_text()) if only and saved.exists() else {}
    if kept.get("configuration") != configuration:
        kept = {}
    comparison = Comparison(name, configuration, [Row(**r) for r in kept.get("rows", []) if r["scenario"] not in only],
                            {k: v for k, v in kept.get("seconds", {}).items() if k not in only})
    root = ROOT / "build" / f"compare-{name}"
    down(root)
    cluster = DevCluster(root, batch_scheduler=peer.batch_scheduler).up()
    try:
        for path in files:
            started = time.monotonic()
            try:
                rows = compare_file(path, cluster, peer, configuration)
            except Exception as exc:  # one file's trouble (a part that died, a watch that would not start) is a row
                rows = [Row(path.stem, -1.0, "run", f"failed: {' '.join(str(exc).split())[:200]}", "not compared")]
            comparison.rows = [r for r in comparison.rows if r.scenario != path.stem] + rows
            comparison.seconds[path.stem] = round(time.monotonic() - started, 1)
            differ = sum(1 for r in rows if not r.same)
            print(f"{path.stem}: {len(rows)} rows, {differ} different ({comparison.seconds[path.stem]:.0f} s)",
                  flush=True)
            saved.parent.mkdir(exist_ok=True)
            saved.write_text(json.dumps({"peer": name, "configuration": configuration, "seconds": comparison.seconds,
                                         "rows": [r.__dict__ for r in comparison.rows]}, indent=1))
    finally:
        cluster.stop()
        down(root)
    return render(peer)


def render(peer: Peer) -> int:
    """docs/peers.md from the saved rows (``results_file``) and the marks of docs/design/peers.md; prints what
    is not marked (1) or nothing (0). ``make compare`` ends with it; ``--render`` alone redoes it."""
    import json
    import sys

    saved = json.loads(results_file(peer.name).read_text())
    order = {p.stem: i for i, p in enumerate(scenario_files(peer))}
    rows = sorted((Row(**r) for r in saved["rows"] if r["scenario"] in order), key=lambda r: order[r.scenario])
    comparison = Comparison(peer.name, saved["configuration"], rows, saved.get("seconds", {}))
    marked = deliberate(peer.name)
    versions = f"{catalog.pins()[peer.part]['module']} {catalog.version(peer.part)}"
    PEERS_DOC.write_text(with_section(PEERS_DOC.read_text() if PEERS_DOC.exists() else "", peer.name,
                                      table(comparison, marked, versions)))
    problems = unmarked(comparison, marked, sorted({r.scenario for r in rows}))
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
