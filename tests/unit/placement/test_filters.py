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


@pytest.mark.parametrize("generation, operator, value, matches", [
    ("4", "Gt", "3", True),
    ("3", "Gt", "3", False),
    ("3", "Lt", "4", True),
    ("4", "Lt", "4", False),
    ("007", "Gt", "6", True),            # ParseInt reads leading zeros
    ("-2", "Lt", "-1", True),
    ("3", "Gt", "+2", True),             # and a sign
    ("3_0", "Gt", "3", False),           # a label value Python's int reads as 30, ParseInt refuses
    ("v2", "Lt", "9", False),
    ("99999999999999999999", "Gt", "3", False),  # beyond int64: refused, not large
    (None, "Lt", "9", False),             # no label: no match, for Lt as for Gt
    ("3", "Gt", "three", False),          # a value that is no integer: the term matches no node
])
def test_gt_and_lt_compare_labels_as_kube_scheduler_parses_them(generation, operator, value, matches):
    """kube-scheduler reads both sides with strconv.ParseInt(v, 10, 64) and fails the term when either does
    not parse (k8s.io/apimachinery labels.Requirement.Matches); muster refused such pods before the
    differential test (tests/realcluster/test_kube_scheduler_differential.py) found them bound."""
    labels = {"gen": generation} if generation is not None else {}
    nodes = (node("n", labels=labels),)
    assert (place_one(constrained(HEAD, affinity=[[expr("gen", operator, value)]]), *nodes) == "n") is matches


def test_an_empty_term_matches_no_node_but_others_still_may():
    nodes = (node("n1", labels={"zone": "z1"}), node("n2", labels={"zone": "z2"}))
    assert place_one(constrained(HEAD, affinity=[[]]), *nodes) is None
    assert place_one(constrained(HEAD, affinity=[[], [expr("zone", "In", "z2")]]), *nodes) == "n2"


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
