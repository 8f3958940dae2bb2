"""The real Volcano beside muster: a few scenario files, each run on the dev cluster scheduled by
vc-scheduler and by muster, compared checkpoint by checkpoint (``shared.peers.compare``).

The subset (``SUBSET``) keeps the tier within its budget: a gang that waits whole behind a queue's
capability (from KubeRay's Volcano guide), a gang as large as the cluster (Volcano's e2e suite), and a
preemption that stays within its queue (Volcano's e2e suite). ``make compare PEER=volcano`` runs every
file of the dialect and writes docs/peers.md. A file that differs must be marked deliberate in
docs/design/peers.md, and a marked file must still differ.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import pytest

from shared.peers.compare import Comparison, Row, compare, compare_file, deliberate, outcomes, scenario_files, unmarked
from shared.peers.observe import Snapshot, Workload
from shared.parts.peers import VOLCANO, volcano_conf
from tests.peers.cluster import peer_cluster

if TYPE_CHECKING:
    from shared.parts.devcluster import DevCluster

SUBSET = ("volcano-gang-queue", "volcano-e2e-gang-full-occupied", "volcano-e2e-preempt-same-queue")


def test_the_subset_is_of_the_dialect_and_every_marked_file_exists() -> None:
    names = {path.stem for path in scenario_files(VOLCANO)}
    assert set(SUBSET) <= names
    assert set(deliberate("volcano")) <= names


@pytest.mark.parametrize("path", sorted((Path(__file__).parent / "scenarios").glob("*.yaml")), ids=lambda p: p.stem)
def test_our_scenarios_from_volcanos_e2e_suite_hold_in_muster(path: Path) -> None:
    """The files written from Volcano's e2e cases say what Volcano's suite asserts; muster's embedded run keeps it."""
    from shared.runtime.simulate import simulate
    from shared.sim.scenario import load_scenario

    failures = simulate(load_scenario(path)).check()
    assert not failures, "\n".join(str(f) for f in failures)


def test_the_e2e_configuration_adds_reclaim_and_preempt_to_the_installers() -> None:
    installer = 'actions: "enqueue, allocate, backfill"\ntiers:\n- plugins:\n  - name: priority\n'
    assert volcano_conf(installer, "installer") == installer
    assert volcano_conf(installer, "e2e").splitlines() == [
        'actions: "enqueue, allocate, backfill, reclaim, preempt"', "tiers:", "- plugins:", "  - name: priority"]


def test_outcomes_show_evictions_and_a_difference_fails_unless_marked() -> None:
    queue = {"q": {"cpu": 2000}}
    snaps = {1.0: Snapshot({"ns/a": Workload(True, frozenset({"u1", "u2"}), 0, "q")}, queue),
             5.0: Snapshot({"ns/a": Workload(True, frozenset({"u3"}), 1, "q")}, {"q": {"cpu": 1000}}),
             9.0: Snapshot({"ns/a": Workload(False)}, {})}
    assert outcomes(snaps) == {(1.0, "ns/a"): "running 2/2", (1.0, "queue q"): "cpu 2",
                               (5.0, "ns/a"): "running 1/2, 2 evicted", (5.0, "queue q"): "cpu 1",
                               (9.0, "ns/a"): "gone"}
    other = {**snaps, 5.0: Snapshot({"ns/a": Workload(True, frozenset(), 2, "q")}, {})}
    rows = compare("f", (snaps, None), (other, None))
    assert [(r.at, r.subject) for r in rows if not r.same] == [(5.0, "ns/a"), (5.0, "queue q")]
    comparison = Comparison("volcano", "e2e", rows)
    assert len(unmarked(comparison, {}, ["f"])) == 1
    assert unmarked(comparison, {"f": "why"}, ["f"]) == []
    same = Comparison("volcano", "e2e", [Row("f", 1.0, "ns/a", "running 1/1", "running 1/1")])
    assert len(unmarked(same, {"f": "why"}, ["f"])) == 1  # marked, but no longer different


@pytest.fixture(scope="module")
def volcano_cluster(devcluster: "DevCluster") -> Iterator["DevCluster"]:
    yield from peer_cluster(devcluster, VOLCANO)


FILES = {path.stem: path for path in scenario_files(VOLCANO)}


@pytest.mark.parametrize("name", SUBSET)
def test_volcano_and_muster_agree_or_differ_only_where_marked(name: str, volcano_cluster: "DevCluster") -> None:
    path: Path = FILES[name]
    comparison = Comparison("volcano", VOLCANO.configurations[0], compare_file(path, volcano_cluster, VOLCANO,
                                                                               VOLCANO.configurations[0]))
    assert comparison.rows, "no checkpoint was compared"
    marked = {k: v for k, v in deliberate("volcano").items() if k == name}
    problems = unmarked(comparison, marked, [name])
    assert not problems, "\n".join(problems)
