"""Volcano, KAI v2 and ElasticQuotaTree queues normalised into one tree, with validation."""

from __future__ import annotations

import pytest

from services.admission.dialects import queue_fields
from services.reconciler.core import ReconcilerCore
from services.reconciler.status import STATUS_TIMER
from shared.kernel.events import QueueDefined, QueueRejected, QueueRemoved, TimerFired
from shared.kernel.footprint import retained
from shared.kernel.model import UNLIMITED, QueueSource, QueueSpec
from shared.kernel.policy import Policy
from tests.builders import envelope
from tests.builders.admission import (
    AdmissionDriver,
    eqt_node,
    elastic_quota_tree,
    kai_queue,
    kai_resource,
    volcano_queue,
    with_status,
)

GI = 1024**3 * 1000
MB = 10**6 * 1000


def only_defined(out: list) -> list[QueueSpec]:
    """The queues defined, without the object they came from (``test_each_queue_names_its_object``)."""
    assert all(isinstance(e, QueueDefined) for e in out), out
    return [e.queue.model_copy(update={"source": None}) for e in out]


# --------------------------------------------------------------------------- Volcano
def test_volcano_queue_fields() -> None:
    out = AdmissionDriver().send(volcano_queue("q", capability={"cpu": 4, "memory": "6Gi"},
                                               guarantee={"cpu": "1"}, weight=3, reclaimable=False, priority=7))
    assert only_defined(out) == [QueueSpec(name="q", **queue_fields("volcano"), guarantee={"cpu": 1000},
                                           limit={"cpu": 4000, "memory": 6 * GI}, weight=3000, priority=7,
                                           reclaimable=False, state="Open")]


def test_volcano_deserved_is_read_and_cut_to_capability() -> None:
    """Volcano's capacity plugin: deserved = min(spec.deserved, capability), raised to the guarantee."""
    out = AdmissionDriver().send(volcano_queue("q", capability={"nvidia.com/gpu": 6}, guarantee={"nvidia.com/gpu": 2},
                                               deserved={"nvidia.com/gpu": 8, "cpu": "4"}))
    [spec] = only_defined(out)
    assert spec.deserved == {"nvidia.com/gpu": 6000, "cpu": 4000}
    assert (spec.entitled_of("nvidia.com/gpu"), spec.entitled_of("cpu"), spec.entitled_of("memory")) == (6000, 4000, 0)
    [low] = only_defined(AdmissionDriver().send(volcano_queue("q", guarantee={"cpu": "3"}, deserved={"cpu": "1"})))
    assert low.entitled_of("cpu") == 3000  # never below the guarantee


def test_volcano_bad_deserved_is_rejected_naming_the_field() -> None:
    [out] = AdmissionDriver().send(volcano_queue("q", deserved={"cpu": "lots"}))
    assert isinstance(out, QueueRejected) and "spec.deserved" in out.reason


def test_volcano_defaults() -> None:
    [spec] = only_defined(AdmissionDriver().send(volcano_queue("q")))
    assert (spec.weight, spec.reclaimable, spec.state, spec.parent, spec.guarantee, spec.limit) == (1000, True, "Open", None, {}, {})
    assert spec.limit_word == "capability"


@pytest.mark.parametrize(("spec_state", "status_state", "expected"),
                         [("Closed", None, "Open"), (None, "Closing", "Closing"), ("Open", "Closed", "Closed")])
def test_volcano_state_is_read_from_status_only(spec_state: str | None, status_state: str | None, expected: str) -> None:
    """Volcano's QueueSpec has no state (its CRD prunes one): only status.state closes a queue."""
    [spec] = only_defined(AdmissionDriver().send(volcano_queue("q", state=spec_state, status_state=status_state)))
    assert spec.state == expected


def test_volcano_parent_root_means_none_unless_root_is_defined() -> None:
    d = AdmissionDriver()
    assert only_defined(d.send(volcano_queue("a", parent="root")))[0].parent is None
    d.send(volcano_queue("root"))
    assert only_defined(d.send(volcano_queue("b", parent="root")))[0].parent == "root"


def test_volcano_unknown_parent_is_rejected_then_defined_when_the_parent_arrives() -> None:
    d = AdmissionDriver()
    assert d.send(volcano_queue("child", parent="dept")) == [
        QueueRejected(name="child", kind="Queue", reason="spec.parent: parent queue 'dept' does not exist")]
    out = d.send(volcano_queue("dept"))
    assert [(type(e).__name__, e.queue.name, e.queue.parent) for e in out] == [
        ("QueueDefined", "dept", None), ("QueueDefined", "child", "dept")]


@pytest.mark.parametrize(
    ("queue", "reason"),
    [
        (volcano_queue("q", capability={"cpu": "lots"}), "spec.capability.cpu: 'lots' is not a quantity"),
        (volcano_queue("q", capability={"memory": "-1Gi"}), "spec.capability.memory: '-1Gi' is negative"),
        (volcano_queue("q", guarantee={"cpu": "x"}), "spec.guarantee.resource.cpu: 'x' is not a quantity"),
        (volcano_queue("q", weight=0), "spec.weight: 0 is less than 1"),
        (volcano_queue("q", weight="2"), "spec.weight: '2' is not an integer"),
        (volcano_queue("q", reclaimable="yes"), "spec.reclaimable: 'yes' is not true or false"),
        (volcano_queue("q", status_state="Paused"), "status.state: 'Paused' is not one of Open, Closed, Closing"),
        (volcano_queue("q", parent="q"), "spec.parent: 'q' is the queue itself"),
        (volcano_queue("q", spec_capability=["cpu"]), "spec.capability: a list is not a mapping"),
        ({**volcano_queue("q"), "spec": "open"}, "spec: 'open' is not a mapping"),
    ],
)
def test_volcano_rejections(queue: dict, reason: str) -> None:
    assert AdmissionDriver().send(queue) == [QueueRejected(name="q", kind="Queue", reason=reason)]


# --------------------------------------------------------------------------- KAI
def test_kai_units_cpu_millicores_memory_megabytes_gpu_devices() -> None:
    q = kai_queue("team", priority=5,
                  cpu=kai_resource(quota=2000, limit=4500, over_quota_weight=2),
                  memory=kai_resource(quota=1000, limit=-1, over_quota_weight=None),
                  gpu=kai_resource(quota=0.5, limit=2, over_quota_weight=3))
    [spec] = only_defined(AdmissionDriver().send(q))
    assert spec == QueueSpec(name="team", **queue_fields("kai"), priority=5, weight=3000,
                             guarantee={"cpu": 2000, "memory": 1000 * MB, "nvidia.com/gpu": 500},
                             limit={"cpu": 4500, "memory": UNLIMITED, "nvidia.com/gpu": 2000})
    assert spec.limit_of("memory") is None and spec.limit_of("cpu") == 4500
    assert spec.limit_word == "limit"


def test_kai_minus_one_is_unlimited_and_missing_fields_are_absent() -> None:
    [spec] = only_defined(AdmissionDriver().send(kai_queue("q", cpu={"quota": -1}, memory={}, gpu={"limit": -1})))
    assert spec.guarantee == {"cpu": UNLIMITED}
    assert spec.limit == {"nvidia.com/gpu": UNLIMITED}
    assert spec.guarantee_of("cpu") is None and spec.guarantee_of("memory") == 0


@pytest.mark.parametrize(
    ("cpu_weight", "gpu_weight", "expected"),
    [(2, 5, 5000), (2, None, 2000), (None, None, 1000), (1.5, None, 1500), (0, None, 0), (0.4, None, 400),
     (None, 1.6, 1600), (0.0004, None, 0), (0.0005, None, 1), (1.0015, None, 1002), (2.5e-3, 7, 7000)],
)
def test_kai_weight_is_gpu_then_cpu_then_one_in_thousandths_rounded_half_up(cpu_weight, gpu_weight, expected: int) -> None:
    q = kai_queue("q", cpu=kai_resource(over_quota_weight=cpu_weight), gpu=kai_resource(over_quota_weight=gpu_weight))
    assert only_defined(AdmissionDriver().send(q))[0].weight == expected


@pytest.mark.parametrize(
    ("extra", "expected"),
    [({}, None), ({"preemptMinRuntime": "5m"}, 300.0), ({"reclaimMinRuntime": "30s"}, 30.0),
     ({"preemptMinRuntime": "1h30m", "reclaimMinRuntime": "10m"}, 5400.0), ({"preemptMinRuntime": "1.5s"}, 1.5),
     ({"preemptMinRuntime": "0"}, 0.0)],
)
def test_kai_min_runtime_seconds(extra: dict, expected: float | None) -> None:
    assert only_defined(AdmissionDriver().send(kai_queue("q", **extra)))[0].min_runtime == expected


def test_kai_parent_queue_must_exist() -> None:
    d = AdmissionDriver()
    assert d.send(kai_queue("team-a", parent="department-1")) == [QueueRejected(
        name="team-a", kind="Queue", reason="spec.parentQueue: parent queue 'department-1' does not exist")]
    assert [e.queue.name for e in d.send(kai_queue("department-1"))] == ["department-1", "team-a"]
    assert d.core.queues.specs["team-a"].parent == "department-1"


@pytest.mark.parametrize(
    ("queue", "reason"),
    [
        (kai_queue("q", cpu=kai_resource(quota=-2)), "spec.resources.cpu.quota: -2 is negative (use -1 for unlimited)"),
        (kai_queue("q", gpu=kai_resource(limit="4")), "spec.resources.gpu.limit: '4' is not a number"),
        (kai_queue("q", memory=kai_resource(quota=True)), "spec.resources.memory.quota: true is not a number"),
        (kai_queue("q", cpu=kai_resource(over_quota_weight=-1)), "spec.resources.cpu.overQuotaWeight: -1 is negative"),
        (kai_queue("q", preemptMinRuntime="soon"), "spec.preemptMinRuntime: 'soon' is not a duration (e.g. 30s, 5m, 1h30m)"),
        (kai_queue("q", priority="high"), "spec.priority: 'high' is not an integer"),
        (kai_queue("q", cpu=[1]), "spec.resources.cpu: a list is not a mapping"),
        (kai_queue("q", cpu=kai_resource(limit=float("inf"))), "spec.resources.cpu.limit: inf is not a number"),
        (kai_queue("q", gpu=kai_resource(quota=float("nan"))), "spec.resources.gpu.quota: nan is not a number"),
        (kai_queue("q", gpu=kai_resource(over_quota_weight=float("inf"))),
         "spec.resources.gpu.overQuotaWeight: inf is not a number"),
        (kai_queue("q", preemptMinRuntime=float("nan")),
         "spec.preemptMinRuntime: nan is not a duration (e.g. 30s, 5m, 1h30m)"),
    ],
)
def test_kai_rejections(queue: dict, reason: str) -> None:
    assert AdmissionDriver().send(queue) == [QueueRejected(name="q", kind="Queue", reason=reason)]


# --------------------------------------------------------------------------- ElasticQuotaTree
def video_tree(video_min_cpu: int = 12) -> dict:
    """The kube-queue-quota-tree-rayjobs scenario's tree."""
    return elastic_quota_tree(eqt_node(
        "root", min={"cpu": 100, "memory": "50Gi", "nvidia.com/gpu": 16},
        max={"cpu": 100, "memory": "50Gi", "nvidia.com/gpu": 16},
        children=[eqt_node("algorithm", min={"cpu": 50, "memory": "25Gi", "nvidia.com/gpu": 10},
                           max={"cpu": 80, "memory": "50Gi", "nvidia.com/gpu": 14},
                           children=[eqt_node("video", min={"cpu": video_min_cpu, "memory": "12Gi", "nvidia.com/gpu": 2},
                                              max={"cpu": 14, "memory": "14Gi", "nvidia.com/gpu": 4},
                                              namespaces=["video"])])]))


def test_elastic_quota_tree_every_node_is_a_queue_parents_first() -> None:
    specs = only_defined(AdmissionDriver().send(video_tree()))
    assert [(s.name, s.parent, s.namespaces, s.dialect) for s in specs] == [
        ("root", None, (), "elasticquotatree"), ("algorithm", "root", (), "elasticquotatree"),
        ("video", "algorithm", ("video",), "elasticquotatree")]
    video = specs[2]
    assert video.guarantee == {"cpu": 12_000, "memory": 12 * GI, "nvidia.com/gpu": 2000}
    assert video.limit == {"cpu": 14_000, "memory": 14 * GI, "nvidia.com/gpu": 4000}
    assert video.limit_word == "max"


def node_with(children_min: list[int], parent_min: int = 10, parent_max: int | None = None) -> dict:
    return elastic_quota_tree(eqt_node("root", min={"cpu": parent_min},
                                       max={"cpu": parent_max} if parent_max is not None else None,
                                       children=[eqt_node(f"c{i}", min={"cpu": m}) for i, m in enumerate(children_min)]))


@pytest.mark.parametrize(
    ("tree", "name", "reason"),
    [
        (node_with([], parent_min=10, parent_max=5), "root", "spec.root.min.cpu: 10 is greater than max 5"),
        (node_with([11]), "c0", "spec.root.children[c0].min.cpu: 11 is greater than parent root min 10"),
        (node_with([6, 5]), "root", "spec.root.children: total min cpu 11 is greater than root min 10"),
        (elastic_quota_tree(eqt_node("root", min={"cpu": "many"})), "root", "spec.root.min.cpu: 'many' is not a quantity"),
        (elastic_quota_tree(eqt_node("root", children=[eqt_node("a"), eqt_node("a")])), "a",
         "spec.root.children[a].name: 'a' appears twice in the tree"),
        (elastic_quota_tree(eqt_node("root", children=[{"min": {}}])), "elasticquotatree",
         "spec.root.children[0].name: missing"),
        ({**elastic_quota_tree(eqt_node("root")), "spec": {}}, "elasticquotatree", "spec.root: missing"),
    ],
)
def test_elastic_quota_tree_rejections(tree: dict, name: str, reason: str) -> None:
    meta = tree["metadata"]
    where = {} if name == meta["name"] else {"object_namespace": meta.get("namespace", ""), "object_name": meta["name"]}
    assert AdmissionDriver().send(tree) == [QueueRejected(name=name, kind="ElasticQuotaTree", reason=reason, **where)]


def test_elastic_quota_tree_sum_of_children_equal_to_parent_is_fine() -> None:
    assert [s.name for s in only_defined(AdmissionDriver().send(node_with([6, 4])))] == ["root", "c0", "c1"]


def test_elastic_quota_tree_changes_define_what_changed_and_remove_what_is_gone() -> None:
    d = AdmissionDriver()
    d.send(video_tree())
    assert d.send(video_tree(), "Modified") == []
    out = d.send(video_tree(video_min_cpu=10), "Modified")
    assert [(type(e).__name__, e.queue.name) for e in out] == [("QueueDefined", "video")]
    smaller = elastic_quota_tree(eqt_node("root", min={"cpu": 100}))
    tree = QueueSource(kind="ElasticQuotaTree", api_version="scheduling.sigs.k8s.io/v1beta1",
                       namespace="kube-system", name="elasticquotatree")
    assert d.send(smaller, "Modified") == [QueueRemoved(name="video"), QueueRemoved(name="algorithm"),
                                           QueueDefined(queue=QueueSpec(name="root", **queue_fields("elasticquotatree"),
                                                                        guarantee={"cpu": 100_000}, source=tree))]
    assert d.send(smaller, "Deleted") == [QueueRemoved(name="root")]
    assert d.send(smaller, "Deleted") == []


# --------------------------------------------------------------------------- the book
def test_status_only_change_defines_nothing_new_and_deletion_removes_once() -> None:
    d = AdmissionDriver()
    q = volcano_queue("q", capability={"cpu": 4})
    assert len(d.send(q)) == 1
    assert d.send(q) == []
    assert d.send(with_status(q, allocated={"cpu": "3"}), "Modified") == []
    assert only_defined(d.send(volcano_queue("q", capability={"cpu": 8}), "Modified"))[0].limit == {"cpu": 8000}
    assert d.send(q, "Deleted") == [QueueRemoved(name="q")]
    assert d.send(q, "Deleted") == []


def test_invalid_change_keeps_the_previous_definition_and_repeats_no_rejection() -> None:
    d = AdmissionDriver()
    d.send(volcano_queue("q", capability={"cpu": 4}))
    bad = volcano_queue("q", capability={"cpu": "four"})
    assert d.send(bad, "Modified") == [QueueRejected(name="q", kind="Queue", reason="spec.capability.cpu: 'four' is not a quantity")]
    assert d.send(bad, "Modified") == []
    assert d.core.queues.specs["q"].limit == {"cpu": 4000}
    assert d.send(bad, "Deleted") == [QueueRemoved(name="q")]


def test_deleting_a_queue_object_that_defined_nothing_ends_its_rejection() -> None:
    """A refused queue object that is deleted is no rejected queue any more: readers that keep the
    rejection (the result view's ``rejected_queues``, the reconciler's memory of what it wrote on the
    object) hear QueueRemoved, as for a queue that was defined. Never for a name another object
    defines (that one stays)."""
    d = AdmissionDriver()
    bad = volcano_queue("q", capability={"cpu": "four"})
    assert isinstance(d.send(bad)[0], QueueRejected)
    assert d.send(bad, "Deleted") == [QueueRemoved(name="q")]
    assert d.send(bad, "Deleted") == []
    d.send(kai_queue("team"))
    claim = volcano_queue("team")
    assert isinstance(d.send(claim)[0], QueueRejected)
    assert d.send(claim, "Deleted") == []
    assert d.core.queues.specs["team"].dialect == "kai"


def test_one_name_one_owner_across_dialects() -> None:
    d = AdmissionDriver()
    d.send(kai_queue("team"))
    assert d.send(volcano_queue("team")) == [QueueRejected(
        name="team", kind="Queue", reason="queue team is already defined by scheduling.run.ai/Queue/team")]
    assert d.core.queues.specs["team"].dialect == "kai"


@pytest.mark.parametrize("obj", [
    {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Queue", "metadata": {"name": "x"}, "spec": {}},
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "video"}},
    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "video"}, "data": {"a": "b"}},
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "default"}, "spec": "weird"},
])
def test_other_kinds_and_groups_are_ignored_quietly(obj: dict) -> None:
    d = AdmissionDriver()
    assert d.send(obj) == [] and d.send(obj, "Modified") == [] and d.send(obj, "Deleted") == []


@pytest.mark.parametrize(("queue", "prefix"), [
    (volcano_queue("q", capability={"cpu": float("inf")}), "spec.capability.cpu: inf is not a "),
    (volcano_queue("q", guarantee={"memory": "1e1000000"}), "spec.guarantee.resource.memory: '1e1000000' is not a "),
])
def test_volcano_non_finite_quantities_are_rejected_naming_the_field(queue: dict, prefix: str) -> None:
    [out] = AdmissionDriver().send(queue)
    assert isinstance(out, QueueRejected) and out.reason.startswith(prefix) and "quantity" in out.reason, out


def test_each_queue_names_its_object() -> None:
    """The reconciler writes a queue's status into the object that defines it (services/reconciler/status.py)."""
    d = AdmissionDriver()
    volcano = d.send(volcano_queue("v"))[0].queue.source
    kai = d.send(kai_queue("k"))[0].queue.source
    tree = [e.queue.source for e in d.send(video_tree())]
    assert volcano == QueueSource(kind="Queue", api_version="scheduling.volcano.sh/v1beta1", name="v")
    assert kai == QueueSource(kind="Queue", api_version="scheduling.run.ai/v2", name="k")
    assert {(s.kind, s.namespace, s.name) for s in tree} == {("ElasticQuotaTree", "kube-system", "elasticquotatree")}


def test_a_definition_retries_the_rejected_queue_objects_only_in_the_order_they_came(monkeypatch) -> None:
    """A definition re-parses what was rejected, not every queue object the book holds."""
    from services.admission.queues import QueueBook

    d = AdmissionDriver()
    for i in range(200):
        d.send(volcano_queue(f"q{i}"))
    d.send(volcano_queue("late-child", parent="dept"))
    d.send(volcano_queue("bad", weight=0))
    d.send(volcano_queue("early-child", parent="dept"))
    parsed: list[str] = []
    parse = QueueBook._parse
    monkeypatch.setattr(QueueBook, "_parse", lambda book, source: parsed.append(source.name) or parse(book, source))
    out = d.send(volcano_queue("dept"))
    assert [(type(e).__name__, e.queue.name) for e in out] == [
        ("QueueDefined", "dept"), ("QueueDefined", "late-child"), ("QueueDefined", "early-child")]
    assert parsed == ["dept", "late-child", "bad", "early-child", "bad"]  # a second pass for what is still rejected
    book = d.core.queues
    assert list(book._rejected) == ["scheduling.volcano.sh/Queue/bad"]  # all a retry walks
    parsed.clear()
    d.send(volcano_queue("bad"))  # fixed: nothing is left to retry
    assert parsed == ["bad"] and book._rejected == {}
    d.send(volcano_queue("orphan", parent="gone"))
    d.send(volcano_queue("orphan"), "Deleted")
    assert book._rejected == {}  # a deleted object is never retried


def _refused_tree(bad: str) -> dict:
    """An ElasticQuotaTree refused for its node ``bad`` (min above max)."""
    return elastic_quota_tree(eqt_node("root", min={"cpu": 10}, max={"cpu": 10}, children=[
        eqt_node(name, min={"cpu": 4 if name == bad else 1}, max={"cpu": 2}) for name in ("video", "research")]))


def test_deleting_a_queue_object_refused_under_two_names_ends_both_rejections() -> None:
    """An ElasticQuotaTree refused for one node, then (edited) for another: two queues carry its
    rejection, and its deletion ends both (the reconciler forgets the object only once no refused
    queue names it), never one that another object defines."""
    d, tree = AdmissionDriver(), _refused_tree
    assert [(e.name, type(e)) for e in d.send(tree("video"))] == [("video", QueueRejected)]
    assert [(e.name, type(e)) for e in d.send(tree("research"))] == [("research", QueueRejected)]
    assert d.send(tree("research"), "Deleted") == [QueueRemoved(name="research"), QueueRemoved(name="video")]


def test_the_reconciler_forgets_a_queue_object_refused_under_two_names_once_it_is_deleted() -> None:
    """What admission says of such an object, fed to the reconciler: what it wrote on the object (its
    rejection annotation and event) and which queues name it go with the object."""
    admission, reconciler = AdmissionDriver(), ReconcilerCore(Policy())
    before = retained(reconciler).entries
    for i, (obj, change) in enumerate([(_refused_tree("video"), "Added"), (_refused_tree("research"), "Modified"),
                                       (_refused_tree("research"), "Deleted")]):
        for payload in admission.send(obj, change, at=float(i)):
            reconciler.handle(envelope(payload, at=float(i)))
    reconciler.handle(envelope(TimerFired(key=STATUS_TIMER), at=9.0))  # the queues' status, written
    assert retained(reconciler).entries == before
