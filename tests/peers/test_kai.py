"""The real KAI Scheduler beside muster: a few scenario files, each run on the dev cluster scheduled by
KAI's programs (``shared.parts.kai``) and by muster, compared checkpoint by checkpoint
(``shared.peers.compare``).

Most files of KAI's dialect put their workloads in a queue with no parent, which real KAI never
schedules (docs/design/peers.md); the subset (``SUBSET``) is of files whose queues have a parent, so that
what is compared is a scheduling decision: a department's limit binding its teams (a gang waiting whole
until the department has room), and two half-GPU workers sharing one GPU (KubeRay + KAI's guide). ``make compare PEER=kai`` runs every file of the dialect and writes its section of
docs/peers.md. A file that differs must be marked deliberate in docs/design/peers.md, and a marked file
must still differ.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import pytest

from shared.parts.peers import KAI
from shared.peers.compare import HEADER, Comparison, compare_file, deliberate, scenario_files, unmarked, with_section

if TYPE_CHECKING:
    from shared.parts.devcluster import DevCluster

SUBSET = ("kai-parent-limit-binds-children", "kai-queues-gpu-sharing")


def test_the_subset_is_of_the_dialect_and_every_marked_file_exists() -> None:
    names = {path.stem for path in scenario_files(KAI)}
    assert set(SUBSET) <= names
    assert set(deliberate("kai")) <= names


def test_each_peers_compare_rewrites_only_its_own_section_of_the_generated_page() -> None:
    volcano = "## volcano (v1.10.0)\n\n| a |\n"
    page = with_section(HEADER, "volcano", volcano)
    both = with_section(page, "kai", "## kai (v0.12.0)\n\n| b |\n")
    assert both == HEADER + "\n## kai (v0.12.0)\n\n| b |\n" + "\n" + volcano
    again = with_section(both, "kai", "## kai (v0.12.0)\n\n| c |\n")
    assert again == HEADER + "\n## kai (v0.12.0)\n\n| c |\n" + "\n" + volcano
    assert with_section(again, "volcano", volcano) == again


def queues_without_parent(path: Path) -> list[str]:
    """The queues the file's workloads name (KAI's queue label) that the file gives no ``parentQueue``."""
    from shared.sim.scenario import load_scenario

    parents: dict[str, str | None] = {}
    named: set[str] = set()

    def labels(node: object) -> None:
        if isinstance(node, dict):
            queue = (node.get("labels") or {}).get(KAI.queue_label) if isinstance(node.get("labels"), dict) else None
            if queue:
                named.add(str(queue))
            for value in node.values():
                labels(value)
        elif isinstance(node, list):
            for value in node:
                labels(value)

    for docs in load_scenario(path).documents:
        for doc in docs:
            if doc.get("kind") == "Queue":
                parents[doc["metadata"]["name"]] = (doc.get("spec") or {}).get("parentQueue")
            else:
                labels(doc)
    return sorted(queue for queue in named if not parents.get(queue))


def test_a_file_whose_queues_real_kai_never_schedules_is_marked_as_such() -> None:
    """Real KAI schedules no workload of a queue without a parent (docs/design/peers.md): such a file is
    marked deliberate and its reason says it cannot run on real KAI as written, naming the queues."""
    marked = deliberate("kai")
    for path in scenario_files(KAI):
        orphans = queues_without_parent(path)
        if orphans:
            reason = marked.get(path.stem, "")
            assert reason.startswith("Cannot run on real KAI as written"), path.stem
            assert all(f"`{queue}`" in reason for queue in orphans), (path.stem, orphans)


def test_the_subset_compares_files_real_kai_can_run() -> None:
    assert all(not queues_without_parent(FILES[name]) for name in SUBSET)


@pytest.fixture(scope="module")
def kai_cluster(devcluster: "DevCluster") -> Iterator["DevCluster"]:
    from shared.parts.catalog import MissingPart, built

    try:
        built(KAI.part)
    except MissingPart as exc:
        pytest.skip(str(exc)) if exc.unreachable else pytest.fail(str(exc))
    yield devcluster
    devcluster.reset()
    devcluster.start_kuberay("none")
    devcluster.kube_scheduler(True)


FILES = {path.stem: path for path in scenario_files(KAI)}


@pytest.mark.parametrize("name", SUBSET)
def test_kai_and_muster_agree_or_differ_only_where_marked(name: str, kai_cluster: "DevCluster") -> None:
    path: Path = FILES[name]
    configuration = KAI.configurations[0]
    comparison = Comparison("kai", configuration, compare_file(path, kai_cluster, KAI, configuration))
    assert comparison.rows, "no checkpoint was compared"
    marked = {k: v for k, v in deliberate("kai").items() if k == name}
    problems = unmarked(comparison, marked, [name])
    assert not problems, "\n".join(problems)
