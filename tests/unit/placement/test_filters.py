"""Which nodes a pod shape may use: nodeSelector, taints vs tolerations, required affinity, cordon."""

from __future__ import annotations

import pytest

from shared.kernel.events import GangPlaced, PlacementFailed
from tests.builders import gang, node, pod_set, workload
from tests.builders.placement import PlacementDriver, constrained, expr, node_changed, one

TAINT = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}


def place_one(ps, *nodes) -> str | None:
    """Node of the single pod, or None when it fits nowhere."""
    d = PlacementDriver(None, *nodes)
    out = d.dequeue(workload("ns/w", gang_=gang(ps)))
    placed = [p for p in out if isinstance(p, GangPlaced)]
    return placed[0].slots[0].node if placed else None


HEAD = pod_set("head", 1, cpu="1")


def test_node_selector_needs_every_label():
    ps = constrained(HEAD, node_selector={"zone": "b", "disk": "ssd"})
    nodes = (node("a", labels={"zone": "b"}), node("b", labels={"zone": "b", "disk": "ssd"}))
    assert place_one(ps, *nodes) == "b"
    assert place_one(ps, nodes[0]) is None


@pytest.mark.parametrize("tolerations, expected", [
    ([], "clean"),
    ([{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}], "tainted"),
    ([{"key": "dedicated", "operator": "Equal", "value": "cpu", "effect": "NoSchedule"}], "clean"),
    ([{"key": "dedicated", "operator": "Exists"}], "tainted"),
    ([{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}], "clean"),
    ([{"operator": "Exists"}], "tainted"),  # empty key + Exists tolerates every taint
    ([{"key": "other", "operator": "Exists"}], "clean"),
])
def test_taints_need_a_matching_toleration(tolerations, expected):
    # The tainted node is first (preferred on ties), so landing on "clean" means it was filtered out.
    nodes = (node("tainted", taints=[TAINT]), node("clean"))
    assert place_one(constrained(HEAD, tolerations=tolerations), *nodes) == expected


@pytest.mark.parametrize("effect, usable", [("NoSchedule", False), ("NoExecute", False), ("PreferNoSchedule", True)])
def test_only_hard_taint_effects_filter(effect, usable):
    nodes = (node("tainted", taints=[{"key": "k", "value": "v", "effect": effect}]),)
    assert place_one(HEAD, *nodes) == ("tainted" if usable else None)


@pytest.mark.parametrize("term, expected", [
    ([expr("zone", "In", "z2", "z3")], "n2"),
    ([expr("zone", "NotIn", "z1")], "n2"),
    ([expr("gpu", "Exists")], "n2"),
    ([expr("gpu", "DoesNotExist")], "n1"),
    ([expr("zone", "In", "z2"), expr("gpu", "DoesNotExist")], None),  # AND within a term
])
def test_required_node_affinity_operators(term, expected):
    nodes = (node("n1", labels={"zone": "z1"}), node("n2", labels={"zone": "z2", "gpu": "a100"}))
    assert place_one(constrained(HEAD, affinity=[term]), *nodes) == expected


def test_affinity_terms_are_ored():
    nodes = (node("n1", labels={"zone": "z1"}), node("n2", labels={"zone": "z2"}))
    ps = constrained(HEAD, affinity=[[expr("zone", "In", "z9")], [expr("zone", "In", "z2")]])
    assert place_one(ps, *nodes) == "n2"


def test_cordoned_node_is_skipped_unless_tolerated():
    nodes = (node("cordoned", unschedulable=True), node("open"))
    assert place_one(HEAD, *nodes) == "open"
    tolerant = constrained(HEAD, tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                                               "effect": "NoSchedule"}])
    assert place_one(tolerant, *nodes) == "cordoned"


def test_label_change_on_a_node_is_seen_by_later_placements():
    d = PlacementDriver(None, node("n1"))
    ps = constrained(HEAD, node_selector={"pool": "ray"})
    assert isinstance(d.dequeue(workload("ns/a", gang_=gang(ps)))[0], PlacementFailed)
    d.feed(node_changed(
        node("n1", labels={"pool": "ray"}), "Modified"))
    assert one(d.dequeue(workload("ns/b", gang_=gang(ps))), GangPlaced).slots[0].node == "n1"


def test_resources_filter_every_resource_including_unknown_ones():
    d = PlacementDriver(None, node("n1", cpu="8", memory="4Gi"))
    out = d.dequeue(workload("ns/w", gang_=gang(pod_set("head", 1, cpu="1", memory="8Gi"))))
    assert one(out, PlacementFailed).reason.endswith(
        "0/1 nodes are available: 1 Insufficient memory. It can never fit in the cluster as it is: a head pod "
        "needs memory 8Gi, the largest node it may use has memory 4Gi (it waits for nodes to join or change).")
    out = d.dequeue(workload("ns/x", gang_=gang(pod_set("head", 1, cpu="1", **{"example.com/fpga": "1"}))))
    assert one(out, PlacementFailed).reason.endswith(
        "0/1 nodes are available: 1 Insufficient example.com/fpga. It can never fit in the cluster as it is: a "
        "head pod needs example.com/fpga 1, the largest node it may use has example.com/fpga 0 (it waits for "
        "nodes to join or change).")
