"""Queue trees of any depth: parent chains and cycles walked with loops, never recursion.

A 10,000-deep chain is deeper than Python's recursion limit (1,000): any recursive walk over parents
or children (definition, cycle check, ancestry, quota roll-up) would raise RecursionError here."""

from __future__ import annotations

import pytest

from services.admission.fields import Invalid
from services.admission.queues import _known_parent, elastic_quota_tree
from services.queue.tree import QueueTree
from shared.kernel.model import QueueSpec
from tests.builders.admission import elastic_quota_tree as eqt, eqt_node

DEPTH = 10_000


def _chain() -> dict[str, QueueSpec]:
    specs = {"q0": QueueSpec(name="q0")}
    for i in range(1, DEPTH):
        name, parent = f"q{i}", f"q{i - 1}"
        assert _known_parent(name, parent, "spec.parent", specs) == parent
        specs[name] = QueueSpec(name=name, parent=parent)
    return specs


def test_admission_checks_a_10000_deep_volcano_chain_and_refuses_its_cycle() -> None:
    specs = _chain()
    with pytest.raises(Invalid) as exc:
        _known_parent("q0", f"q{DEPTH - 1}", "spec.parent", specs)
    assert "would make a cycle (q0 -> q9999 -> q9998" in exc.value.reason and "\n" not in exc.value.reason


def test_the_queue_core_tree_walks_a_10000_deep_chain() -> None:
    tree = QueueTree(default_queue="default")
    assert tree.define(QueueSpec(name="q0")) is None
    for i in range(1, DEPTH):
        assert tree.define(QueueSpec(name=f"q{i}", parent=f"q{i - 1}")) is None
    assert len(tree.ancestry(f"q{DEPTH - 1}")) == DEPTH
    usage = tree.roll_up({f"q{DEPTH - 1}": {"cpu": 1000}})
    assert usage["q0"] == {"cpu": 1000}
    assert "would make a cycle" in (tree.define(QueueSpec(name="q0", parent=f"q{DEPTH - 1}")) or "")


def test_a_10000_deep_elastic_quota_tree_is_read_without_recursion() -> None:
    root = eqt_node("q0", min={"cpu": "1"})
    node = root
    for i in range(1, DEPTH):
        child = eqt_node(f"q{i}", min={"cpu": "1"})
        node["children"] = [child]
        node = child
    specs = elastic_quota_tree(eqt(root))
    assert [s.name for s in specs[:3]] == ["q0", "q1", "q2"] and len(specs) == DEPTH
    assert specs[-1].parent == f"q{DEPTH - 2}"
