"""The real KAI Scheduler beside muster: a few scenario files, each run on the dev cluster scheduled by
KAI's programs (``shared.parts.kai``) and by muster, compared checkpoint by checkpoint
(``shared.peers.compare``).

Most files of KAI's dialect put their workloads in a queue with no parent, which real KAI never
schedules: both runs put such a queue under a parent of unlimited quota (``variant``, docs/design/peers.md).
The subset (``SUBSET``) runs in the suite's time: reclaim between two sibling queues, one of them below its
quota, with the queues put under that parent (the variant end to end), and two half-GPU workers sharing one
GPU (KubeRay + KAI's guide). ``make compare PEER=kai`` runs every file of the dialect and writes its section of
docs/peers.md. A file that differs must be marked deliberate in docs/design/peers.md, and a marked file
must still differ.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import pytest

from shared.parts.peers import KAI, VOLCANO
from shared.peers.compare import (HEADER, KAI_PARENT, Comparison, compare_file, deliberate, keeps_clock, scenario_files,
                                  unmarked, variant, with_section)
from shared.sim.scenario import load_scenario, parse_scenario
from tests.peers.cluster import peer_cluster

if TYPE_CHECKING:
    from shared.parts.devcluster import DevCluster
    from shared.sim.scenario import Scenario

SUBSET = ("kai-reclaim-below-quota", "kai-queues-gpu-sharing")


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


def queues_without_parent(scenario: "Scenario") -> list[str]:
    """The queues the file's workloads name (KAI's queue label) that the file gives no ``parentQueue``."""
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

    for docs in scenario.documents:
        for doc in docs:
            if doc.get("kind") == "Queue":
                parents[doc["metadata"]["name"]] = (doc.get("spec") or {}).get("parentQueue")
            else:
                labels(doc)
    return sorted(queue for queue in named if not parents.get(queue))


def test_every_file_of_the_dialect_runs_with_each_workloads_queue_under_a_parent() -> None:
    """Real KAI schedules no workload of a queue without a parent (docs/design/peers.md): both runs of a file
    put such a queue under one of unlimited quota, so what is compared is a decision, not KAI's silence."""
    orphaned = [path.stem for path in scenario_files(KAI) if queues_without_parent(load_scenario(path))]
    assert orphaned, "no file of the dialect has a queue without a parent: the variant is not exercised"
    for path in scenario_files(KAI):
        assert queues_without_parent(variant(load_scenario(path), KAI)) == [], path.stem


QUEUES = """
name: q
cluster: {nodes: [{name: n, capacity: {cpu: 4, memory: 8Gi}}]}
steps:
  - at: 2s
    apply: |
      apiVersion: scheduling.run.ai/v2
      kind: Queue
      metadata: {name: dept}
      spec: {resources: {cpu: {quota: 4, limit: -1, overQuotaWeight: 1}}}
      ---
      apiVersion: scheduling.run.ai/v2
      kind: Queue
      metadata: {name: team}
      spec: {parentQueue: dept, resources: {cpu: {quota: 2, limit: -1, overQuotaWeight: 1}}}
      ---
      apiVersion: scheduling.run.ai/v2
      kind: Queue
      metadata: {name: alone}
      spec: {resources: {cpu: {quota: 2, limit: -1, overQuotaWeight: 1}}}
      ---
      apiVersion: scheduling.volcano.sh/v1beta1
      kind: Queue
      metadata: {name: vq}
      spec: {weight: 1}
until: 10s
"""


def test_only_a_leaf_kai_queue_without_a_parent_is_put_under_the_unlimited_one_made_first() -> None:
    scenario = parse_scenario(QUEUES)
    out = variant(scenario, KAI)
    queues = {doc["metadata"]["name"]: doc for docs in out.documents for doc in docs if doc.get("kind") == "Queue"}
    assert out.documents[0] == ({"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": KAI_PARENT},
                                 "spec": {"resources": {r: {"quota": -1, "limit": -1, "overQuotaWeight": 1}
                                                        for r in ("cpu", "gpu", "memory")}}},)
    assert out.steps[0].at == 2.0 and len(out.steps) == len(scenario.steps) + 1
    assert queues["alone"]["spec"]["parentQueue"] == KAI_PARENT
    assert "parentQueue" not in queues["dept"]["spec"]  # a department stays top-level (KAI has two levels)
    assert queues["team"]["spec"]["parentQueue"] == "dept"
    assert "parentQueue" not in queues["vq"]["spec"]  # another dialect's queue is not KAI's
    assert "parentQueue" not in scenario.documents[0][2]["spec"]  # the file's own documents are not changed
    assert variant(scenario, VOLCANO) is scenario
    assert variant(out, KAI) is out  # nothing left to put under a parent


def test_the_peers_run_keeps_the_files_clock_where_a_kai_rule_counts_seconds() -> None:
    clocked = {path.stem for path in scenario_files(KAI) if keeps_clock(load_scenario(path), KAI)}
    assert clocked == {"kai-preempt-min-runtime", "kai-reclaim-min-runtime", "kai-stale-gang-evicted"}
    assert not keeps_clock(parse_scenario(QUEUES), KAI)
    timed = parse_scenario(QUEUES.replace("metadata: {name: alone}\n      spec: {",
                                          "metadata: {name: alone}\n      spec: {reclaimMinRuntime: 30s, ", 1))
    assert keeps_clock(timed, KAI) and not keeps_clock(timed, VOLCANO)


@pytest.fixture(scope="module")
def kai_cluster(devcluster: "DevCluster") -> Iterator["DevCluster"]:
    yield from peer_cluster(devcluster, KAI)


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
