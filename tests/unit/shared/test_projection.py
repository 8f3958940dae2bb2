"""shared/kernel/projection.py: the result view as a fold over hand-made envelopes."""

from __future__ import annotations

import json

import pytest

from shared.kernel.events import (
    BackedOff, Dequeued, ElasticGranted, ElasticReleased, Enqueued, GangEvicted, GangPlaced, GangRunning, GpuAssignment,
    PlacementFailed, PodAssigned,
    PreemptionRequested, QueueDefined, QueueRemoved, ReclaimRequested, SlotAssignment, TimerFired, WorkloadDeleted,
    WorkloadFinished, WorkloadRejected, WorkloadSubmitted, WorkloadUpdated,
)
from shared.kernel.projection import NOT_LIVE, PHASES, PodView, ResultProjection
from tests.builders import gang, pod, pod_set, queue_spec, workload
from tests.builders.shared import SCENARIOS, Clock, ray_pod, watch

KEY = "ns/w"


def _spec(key: str = KEY, queue: str = "q", priority: int = 0, cpu: str = "1", count: int = 2, gpu_share: int = 0):
    return workload(key, queue=queue, priority=priority,
                    gang_=gang(pod_set("head", 1, cpu="1", memory="2Gi"),
                               pod_set("worker", count, cpu=cpu, memory="1Gi", gpu_share=gpu_share)))


def _fold(*items) -> ResultProjection:
    """``items`` are (t, payload) or (t, payload, source)."""
    clock = Clock()
    h = ResultProjection("demo")
    for item in items:
        t, payload, *source = item
        h.apply(clock(payload, t, source=source[0] if source else "queue"))
    return h


def test_phases():
    assert PHASES == ("Rejected", "Queued", "Admitted", "Running", "Succeeded", "Failed", "Preempted", "Deleted")
    assert NOT_LIVE <= {None, *PHASES}  # a renamed phase must not leave the set naming one no view has


def test_transition_recorded_on_phase_or_reason_change_only():
    h = _fold(
        (0.0, WorkloadSubmitted(workload=_spec())),
        (1.0, Enqueued(key=KEY, queue="q", reason="waiting in queue q")),
        (2.0, BackedOff(key=KEY, queue="q", requeue_at=3.0, attempts=1, reason="waiting in queue q")),  # same: none
        (3.0, BackedOff(key=KEY, queue="q", requeue_at=5.0, attempts=2, reason="3/3 tasks in gang unschedulable")),
        (4.0, Dequeued(key=KEY, queue="q", workload=_spec(), reason="quota reserved")),               # no phase
        (4.0, GangPlaced(key=KEY, queue="q", kind="RayCluster", gate="pods", slots=(), reason="placed")),
        (6.0, GangRunning(key=KEY, reason="all running")),
        (6.0, GangRunning(key=KEY, reason="all running")),                                             # repeat
        (9.0, PreemptionRequested(key=KEY, kind="RayCluster", gate="pods", preemptor="ns/big", pods=(),
                                  reason="preempted by ns/big (priority 100)")),
        (9.0, Enqueued(key=KEY, queue="q", reason="preempted by ns/big (priority 100)")),            # new phase
        (12.5, WorkloadFinished(key=KEY, outcome="Failed", reason="job failed")),
    )
    view = h.workloads[KEY]
    assert view.transitions == [
        {"t": 1.0, "phase": "Queued", "reason": "waiting in queue q"},
        {"t": 3.0, "phase": "Queued", "reason": "3/3 tasks in gang unschedulable"},
        {"t": 4.0, "phase": "Admitted", "reason": "placed"},
        {"t": 6.0, "phase": "Running", "reason": "all running"},
        {"t": 9.0, "phase": "Preempted", "reason": "preempted by ns/big (priority 100)"},
        {"t": 9.0, "phase": "Queued", "reason": "preempted by ns/big (priority 100)"},
        {"t": 12.5, "phase": "Failed", "reason": "job failed"},
    ]
    assert (view.phase, view.reason) == ("Failed", "job failed")


@pytest.mark.parametrize("t, expected", [
    (0.5, (None, "")),
    (1.0, ("Queued", "waiting")),
    (3.9, ("Queued", "waiting")),
    (4.0, ("Admitted", "placed")),
    (100.0, ("Deleted", "deleted by its owner")),
])
def test_phase_at(t, expected):
    h = _fold((1.0, Enqueued(key=KEY, queue="q", reason="waiting")),
              (4.0, GangPlaced(key=KEY, queue="q", kind="RayCluster", gate="pods", slots=(), reason="placed")),
              (50.0, WorkloadDeleted(key=KEY)))
    assert h.workloads[KEY].phase_at(t) == expected


def test_transition_time_is_rounded_to_microseconds():
    h = _fold((1.23456789, Enqueued(key=KEY, queue="q", reason="r")))
    assert h.workloads[KEY].transitions == [{"t": 1.234568, "phase": "Queued", "reason": "r"}]


def test_succeeded_and_rejected_and_deleted():
    h = _fold((1.0, WorkloadRejected(key="ns/bad", kind="RayJob", reason="minReplicas 3 > maxReplicas 2")),
              (2.0, WorkloadFinished(key=KEY, outcome="Succeeded", reason="done")),
              (3.0, WorkloadDeleted(key="ns/gone")))
    assert (h.workloads["ns/bad"].kind, h.workloads["ns/bad"].phase, h.workloads["ns/bad"].queue) == \
        ("RayJob", "Rejected", None)
    assert h.workloads[KEY].phase == "Succeeded"
    assert h.workloads["ns/gone"].transitions == [{"t": 3.0, "phase": "Deleted", "reason": "deleted by its owner"}]


def test_submitted_and_updated_describe_the_workload():
    h = _fold((0.0, WorkloadSubmitted(workload=_spec(priority=5, count=2))),
              (1.0, WorkloadUpdated(workload=_spec(priority=7, count=4, queue="q2"))))
    view = h.workloads[KEY]
    assert (view.kind, view.queue, view.priority, view.min_member, view.resources) == \
        ("RayCluster", "q2", 7, 5, {"cpu": 5_000, "memory": (2 + 4) * 1024**3 * 1000})
    assert view.transitions == []


def test_pods_and_bound_intervals_from_watch_events():
    clock = Clock()
    h = ResultProjection("demo")
    head = ray_pod("w-head-aaaaa", "w", namespace="ns", node_type="head", group="headgroup")
    bound = ray_pod("w-head-aaaaa", "w", namespace="ns", node_type="head", group="headgroup", node="n1")
    for change, obj, t in [("Added", head, 1.0), ("Modified", bound, 2.0), ("Modified", bound, 3.0),
                           ("Deleted", bound, 5.0)]:
        h.apply(watch(change, obj, t, clock))
    worker = ray_pod("w-worker-worker-bbbbb", "w", namespace="ns", node="n2")
    h.apply(watch("Added", worker, 4.0, clock))
    submitter = ray_pod("w-submitter-ccccc", "w", namespace="ns", submitter=True, node="n1")
    h.apply(watch("Added", submitter, 4.5, clock))
    h.apply(watch("Added", pod("loner", "ns", node_name="n1"), 4.0, clock))  # no workload: ignored
    h.apply(watch("Modified", head, 6.0, clock))                             # gone pod unbound again: no interval
    assert [p.as_json() for p in h.pods_of("ns/w")] == [
        {"name": "w-head-aaaaa", "pod_set": "head", "node": "n1", "gpu": None, "bound": [[2.0, 5.0]]},
        {"name": "w-worker-worker-bbbbb", "pod_set": "worker", "node": "n2", "gpu": None, "bound": [[4.0, None]]},
        {"name": "w-submitter-ccccc", "pod_set": "submitter", "node": "n1", "gpu": None, "bound": [[4.5, None]]},
    ]
    assert set(h.pods) == {"ns/w"}
    assert h.pods["ns/w"]["w-head-aaaaa"].gone is True
    assert (h.events, h.decisions) == (8, 0)  # watch events are inputs, not decisions


def test_recreated_pod_rebinds_in_a_new_interval_on_its_new_node():
    clock = Clock()
    h = ResultProjection()
    first = ray_pod("w-head-aaaaa", "w", namespace="ns", node_type="head", node="n1")
    h.apply(watch("Added", first, 1.0, clock))
    h.apply(watch("Deleted", first, 2.0, clock))
    h.apply(watch("Added", ray_pod("w-head-aaaaa", "w", namespace="ns", node_type="head", node="n2"), 3.0, clock))
    assert h.pods_of("ns/w")[0].bound == [[1.0, 2.0], [3.0, None]]
    assert h.pods_of("ns/w")[0].node == "n2"


def test_pod_gang_pods_are_keyed_by_group():
    clock = Clock()
    h = ResultProjection()
    h.apply(watch("Added", pod("g-0", "ns", labels={"scheduling.x-k8s.io/pod-group": "g"}, node_name="n1"), 1.0, clock))
    h.apply(watch("Added", pod("g-1", "ns", labels={"pod-group.scheduling.sigs.k8s.io/name": "g"}), 1.0, clock))
    assert [(p.name, p.pod_set, p.node, p.bound) for p in h.pods_of("ns/g")] == \
        [("g-0", "pods", "n1", [[1.0, None]]), ("g-1", "pods", None, [])]


def test_pod_assigned_sets_node_and_gpu():
    gpu = GpuAssignment(devices=(0, 1), fraction=1.0, group="x")
    h = _fold((1.0, PodAssigned(key=KEY, pod_namespace="ns", pod="w-head-a", pod_set="head", node="n1", gpu=gpu)),
              (1.0, PodAssigned(key=KEY, pod_namespace="ns", pod="w-worker-b", pod_set="worker", node="n2")))
    assert [p.as_json() for p in h.pods_of(KEY)] == [
        {"name": "w-head-a", "pod_set": "head", "node": "n1", "gpu": {"devices": [0, 1], "fraction": 1.0}, "bound": []},
        {"name": "w-worker-b", "pod_set": "worker", "node": "n2", "gpu": None, "bound": []},
    ]


@pytest.mark.parametrize("t, bound", [(0.9, False), (1.0, True), (4.99, True), (5.0, False), (7.0, True)])
def test_pod_view_bound_at_is_half_open(t, bound):
    view = PodView(name="p", pod_set="head", bound=[[1.0, 5.0], [7.0, None]])
    assert view.bound_at(t) is bound


def _tree() -> list:
    return [(0.0, QueueDefined(queue=queue_spec("root"))),
            (0.0, QueueDefined(queue=queue_spec("team", parent="root"))),
            (0.0, QueueDefined(queue=queue_spec("leaf", parent="team"))),
            (0.0, QueueDefined(queue=queue_spec("other", parent="root")))]


def test_queue_usage_rolls_up_to_every_ancestor():
    h = _fold(*_tree(),
              (1.0, Dequeued(key="ns/a", queue="leaf", workload=_spec("ns/a", queue="leaf", count=2), reason="r")),
              (1.0, ReclaimRequested(key="ns/b", queue="team", workload=_spec("ns/b", queue="team", count=1),
                                     victims=(), reason="r")),
              (1.0, Dequeued(key="ns/c", queue="other", workload=_spec("ns/c", queue="other", count=0,
                                                                      gpu_share=500), reason="r")),
              (1.0, Dequeued(key="ns/d", queue="undefined", workload=_spec("ns/d", queue="undefined"), reason="r")))
    gi = 1024**3 * 1000
    assert h.queue_usage() == {
        "leaf": {"cpu": 3_000, "memory": 4 * gi},
        "team": {"cpu": 5_000, "memory": 7 * gi},
        "root": {"cpu": 6_000, "memory": 9 * gi},
        "other": {"cpu": 1_000, "memory": 2 * gi},
        "undefined": {"cpu": 3_000, "memory": 4 * gi},
    }
    # ns/c had no fractional pods (count=0); a fractional GPU is charged as quota GPU:
    h2 = _fold(*_tree(), (1.0, Dequeued(key="ns/f", queue="leaf", reason="r",
                                         workload=_spec("ns/f", queue="leaf", count=2, gpu_share=500))))
    assert h2.queue_usage()["root"]["nvidia.com/gpu"] == 1_000
    assert h2.result()["queues"]["leaf"]["usage"] == {"cpu": "3", "memory": "4Gi", "nvidia.com/gpu": "1"}
    assert h2.result()["workloads"]["ns/f"]["gang"]["resources"] == {"cpu": "3", "memory": "4Gi"}


def test_gpu_memory_pods_are_charged_as_the_queue_charges_them():
    """At the device memory their reservation names (``Dequeued.gpu_memory``), then at what they hold."""
    spec = workload("ns/m", queue="leaf", gang_=gang(pod_set("head", 1, cpu="1"),
                                                     pod_set("w", 2, cpu="1", gpu_memory=20480)))
    reserved = (1.0, Dequeued(key="ns/m", queue="leaf", workload=spec, reason="r", gpu_memory=40900))
    h = _fold(*_tree(), reserved)
    assert h.queue_usage()["leaf"] == {"cpu": 3_000, "nvidia.com/gpu": 1_020}   # 2 x 20480/40900 -> 2 x 0.51
    slots = (SlotAssignment(pod_set="head", index=0, node="n"),) + tuple(
        SlotAssignment(pod_set="w", index=i, node="n", gpu=GpuAssignment(devices=(i,), fraction=0.26, memory=20480))
        for i in range(2))
    h = _fold(*_tree(), reserved, (1.0, GangPlaced(key="ns/m", queue="leaf", kind="RayCluster", gate="pods",
                                                    slots=slots, reason="placed"), "placement"))
    assert h.queue_usage()["leaf"] == {"cpu": 3_000, "nvidia.com/gpu": 520}


@pytest.mark.parametrize("release", [
    lambda: PlacementFailed(key="ns/a", queue="leaf", reason="no fit"),
    lambda: BackedOff(key="ns/a", queue="leaf", requeue_at=9.0, attempts=1, reason="no fit"),
    lambda: PreemptionRequested(key="ns/a", kind="RayCluster", gate="pods", preemptor="x/y", pods=(), reason="p"),
    lambda: GangEvicted(key="ns/a", kind="RayCluster", gate="pods", pods=(), reason="stale gang evicted"),
    lambda: WorkloadFinished(key="ns/a", outcome="Succeeded", reason="done"),
    lambda: WorkloadDeleted(key="ns/a"),
])
def test_quota_released(release):
    h = _fold(*_tree(), (1.0, Dequeued(key="ns/a", queue="leaf", workload=_spec("ns/a", queue="leaf"), reason="r")),
              (2.0, release()))
    assert h.queue_usage() == {}
    assert h.result()["queues"]["leaf"]["active"] == []


def test_queue_usage_survives_a_parent_cycle():
    h = _fold((0.0, QueueDefined(queue=queue_spec("a", parent="b"))),
              (0.0, QueueDefined(queue=queue_spec("b", parent="a"))),
              (1.0, Dequeued(key="ns/x", queue="a", workload=_spec("ns/x", queue="a", count=0), reason="r")))
    assert h.queue_usage() == {"a": {"cpu": 1_000, "memory": 2 * 1024**3 * 1000},
                               "b": {"cpu": 1_000, "memory": 2 * 1024**3 * 1000}}


def test_queue_removed_stops_the_roll_up():
    h = _fold(*_tree(), (0.5, QueueRemoved(name="team")),
              (1.0, Dequeued(key="ns/a", queue="leaf", workload=_spec("ns/a", queue="leaf", count=0), reason="r")))
    assert set(h.queue_usage()) == {"leaf", "team"}


def test_result_shape_and_queue_lists():
    h = _fold(
        *_tree(),
        (1.0, WorkloadSubmitted(workload=_spec("ns/a", queue="leaf"))),
        (1.0, Dequeued(key="ns/a", queue="leaf", workload=_spec("ns/a", queue="leaf"), reason="r")),
        (1.0, GangPlaced(key="ns/a", queue="leaf", kind="RayCluster", gate="pods", slots=(), reason="placed")),
        (2.0, WorkloadSubmitted(workload=_spec("ns/b", queue="leaf", priority=1))),
        (2.0, Enqueued(key="ns/b", queue="leaf", reason="waiting")),
        (3.0, WorkloadSubmitted(workload=_spec("ns/c", queue="leaf", priority=5))),
        (3.0, Enqueued(key="ns/c", queue="leaf", reason="waiting")),
        (3.0, WorkloadSubmitted(workload=_spec("ns/d", queue="leaf"))),
        (3.0, BackedOff(key="ns/d", queue="leaf", requeue_at=60.0, attempts=1, reason="no fit")),
        (3.0, WorkloadSubmitted(workload=_spec("ns/e", queue="leaf", priority=1))),
        (3.0, BackedOff(key="ns/e", queue="leaf", requeue_at=4.0, attempts=1, reason="no fit")),  # expired by t=10
        (10.0, TimerFired(key="tick"), "clock"),
    )
    result = h.result(wall_seconds=0.12345)
    assert list(result) == ["scenario", "workloads", "queues", "stats"]
    assert result["scenario"] == "demo"
    assert list(result["workloads"]) == ["ns/a", "ns/b", "ns/c", "ns/d", "ns/e"]
    assert result["workloads"]["ns/a"] == {
        "kind": "RayCluster", "queue": "leaf", "priority": 0,
        "gang": {"min_member": 3, "resources": {"cpu": "3", "memory": "4Gi"}},
        "phase": "Admitted",
        "transitions": [{"t": 1.0, "phase": "Admitted", "reason": "placed"}],
        "pods": [],
    }
    assert result["queues"]["leaf"] == {
        "usage": {"cpu": "3", "memory": "4Gi"},
        "active": ["ns/a"],
        "pending": [{"workload": "ns/c", "position": 1}, {"workload": "ns/b", "position": 2},
                    {"workload": "ns/e", "position": 3}],
        "backoff": ["ns/d"],
    }
    assert list(result["queues"]) == ["leaf", "other", "root", "team"]
    assert result["queues"]["other"] == {"usage": {}, "active": [], "pending": [], "backoff": []}
    assert result["queues"]["root"]["usage"] == {"cpu": "3", "memory": "4Gi"}
    # 4 queue definitions + 11 workload events + 1 clock event; the clock is not a decision
    assert result["stats"] == {"events": 16, "decisions": 15, "wall_seconds": 0.123}


def test_result_of_nothing():
    assert ResultProjection("empty").result() == {
        "scenario": "empty", "workloads": {}, "queues": {},
        "stats": {"events": 0, "decisions": 0, "wall_seconds": 0.0}}


def test_now_is_the_latest_event_time():
    h = _fold((5.0, Enqueued(key=KEY, queue="q", reason="r")), (3.0, Enqueued(key=KEY, queue="q", reason="s")))
    assert h.now == 5.0


def test_queue_rejections_show_in_the_result_until_the_queue_is_defined() -> None:
    from shared.kernel.events import QueueDefined, QueueRejected
    from tests.builders import envelope, queue_spec

    history = ResultProjection("x")
    history.apply(envelope(QueueRejected(name="team", kind="Queue", reason="spec.capability: a list is not a mapping")))
    assert history.result()["queues"]["team"]["rejected"] == "spec.capability: a list is not a mapping"
    history.apply(envelope(QueueDefined(queue=queue_spec("team"))))
    assert "rejected" not in history.result()["queues"]["team"]


def test_a_pod_of_any_shape_never_breaks_the_history() -> None:
    from shared.kernel.events import ObjectChanged
    from tests.builders import envelope

    history = ResultProjection("x")
    bad = {"kind": "Pod", "metadata": {"name": "p", "labels": {"pod-group.scheduling.sigs.k8s.io/name": "g"}},
           "spec": [1]}
    history.apply(envelope(ObjectChanged(change="Added", kind="Pod", name="p", namespace="default", object=bad)))
    assert history.pods_of("default/g")[0].bound == []


def test_a_rejected_claim_of_another_kind_does_not_touch_the_workload_and_refused_edits_keep_the_phase() -> None:
    from shared.kernel.events import Enqueued, GangPlaced, WorkloadRejected, WorkloadSubmitted
    from tests.builders import envelope, workload

    history = ResultProjection("x")
    history.apply(envelope(WorkloadSubmitted(workload=workload("ns/x", kind="RayCluster")), 1.0))
    history.apply(envelope(Enqueued(key="ns/x", queue="default", reason="waiting in queue default"), 1.0))
    history.apply(envelope(WorkloadRejected(key="ns/x", kind="RayJob", reason="name taken"), 2.0))
    assert history.workloads["ns/x"].phase == "Queued"
    history.apply(envelope(GangPlaced(key="ns/x", queue="default", kind="RayCluster", gate="pods", slots=(),
                                      reason="placed"), 3.0))
    history.apply(envelope(WorkloadRejected(key="ns/x", kind="RayCluster", reason="cpu: 'lots'"), 4.0))
    view = history.workloads["ns/x"]
    assert (view.phase, view.reason) == ("Admitted", "edit refused, still running as admitted: cpu: 'lots'")


def test_a_rejection_is_the_last_word_even_when_the_queue_said_waiting_in_between() -> None:
    from shared.kernel.events import Enqueued, WorkloadRejected, WorkloadSubmitted, WorkloadWithdrawn
    from tests.builders import envelope, workload

    history = ResultProjection("x")
    history.apply(envelope(WorkloadSubmitted(workload=workload("ns/a")), 0.0))
    history.apply(envelope(WorkloadRejected(key="ns/a", kind="RayCluster", reason="can never fit"), 0.0))
    history.apply(envelope(Enqueued(key="ns/a", queue="default", reason="waiting in queue default"), 0.0))
    history.apply(envelope(WorkloadWithdrawn(key="ns/a", reason="can never fit"), 0.0))
    view = history.workloads["ns/a"]
    assert (view.phase, view.reason) == ("Rejected", "can never fit")
    assert history.result()["queues"]["default"]["pending"] == []


def test_warnings_are_kept_per_workload_as_told_a_repeat_once() -> None:
    from shared.kernel.events import WorkloadSubmitted, WorkloadWarned
    from tests.builders import envelope, workload

    history = ResultProjection("x")
    history.apply(envelope(WorkloadSubmitted(workload=workload("ns/a")), 1.0))
    warned = WorkloadWarned(key="ns/a", kind="RayCluster", cause="QueueLabelIgnored", reason="label q is not read")
    history.apply(envelope(warned, 1.0))
    history.apply(envelope(warned, 2.0))
    view = history.workloads["ns/a"]
    assert (view.warned_by(0.5), view.warned_by(1.0)) == ([], ["label q is not read"])
    assert history.warnings() == {"ns/a": [(1.0, "label q is not read")]}
    assert "warnings" not in history.result()["workloads"]["ns/a"]  # the result document's shape is fixed


# --------------------------------------------------------------------------- what the fold reads (EnvelopeRead)
def _read(env):
    from shared.kernel.events import to_json
    from shared.kernel.projection import ENVELOPE_READ

    return ENVELOPE_READ.validate_json(to_json(env))


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_the_fold_reads_nothing_of_a_watched_object_but_what_envelope_read_keeps(path) -> None:
    """The history store's projector folds ``EnvelopeRead``s: were the fold to read another part of
    a pod, the store's history would drift from ``muster simulate``'s. Every scenario, both ways."""
    from shared.runtime.simulate import simulate
    from shared.sim.scenario import load_scenario

    log = simulate(load_scenario(path)).runtime.log
    whole, read = ResultProjection("x"), ResultProjection("x")
    for env in log:
        whole.apply(env)
        read.apply(_read(env))
    assert read.result() == whole.result()
    assert read.pods == whole.pods


def test_envelope_read_keeps_the_namespace_labels_annotations_and_node_of_a_pod_and_nothing_else() -> None:
    from shared.kernel.events import ObjectChanged
    from shared.kernel.projection import ObjectChangedRead
    from tests.builders import envelope

    obj = {"apiVersion": "v1", "kind": "Pod", "spec": {"nodeName": "n1", "containers": [{"name": "ray"}]},
           "metadata": {"name": "p", "namespace": "ns", "labels": {"ray.io/cluster": "rc"}, "uid": "u",
                        "annotations": {"scheduling.k8s.io/group-name": "g"}},
           "status": {"phase": "Running"}}
    read = _read(envelope(ObjectChanged(change="Added", kind="Pod", name="p", namespace="ns", object=obj)))
    assert isinstance(read.payload, ObjectChangedRead) and isinstance(read.payload, ObjectChanged)
    assert read.payload.object == {"metadata": {"namespace": "ns", "labels": {"ray.io/cluster": "rc"},
                                                "annotations": {"scheduling.k8s.io/group-name": "g"}},
                                   "spec": {"nodeName": "n1"}}


@pytest.mark.parametrize("obj", [{}, {"metadata": "x", "spec": [1]}, {"metadata": {"labels": [1, 2]}},
                                 {"metadata": None, "spec": {"nodeName": 7}}],
                         ids=["empty", "not-objects", "labels-a-list", "null-and-a-number"])
def test_envelope_read_takes_an_object_of_any_shape_as_envelope_does(obj) -> None:
    """Accepting less than ``Envelope`` would dead-letter in the store what every service handled."""
    from shared.kernel.events import ObjectChanged
    from tests.builders import envelope

    env = envelope(ObjectChanged(change="Added", kind="Pod", name="p", namespace="ns", object=obj))
    assert _read(env).payload.object == obj


def test_envelope_read_refuses_what_envelope_refuses() -> None:
    from pydantic import ValidationError

    from shared.kernel.events import _ENVELOPE, to_json
    from shared.kernel.projection import ENVELOPE_READ
    from tests.builders.shared import at, sample_payloads

    for payload in sample_payloads().values():
        raw = to_json(at(payload, 1.0))
        assert ENVELOPE_READ.validate_json(raw).id == _ENVELOPE.validate_json(raw).id
    watch_event = json.loads(to_json(at(sample_payloads()["ObjectChanged"], 1.0)))
    for where, value in (("object", [watch_event["payload"]["object"]]), ("object", "a pod"),
                         ("change", "Touched"), ("name", 7)):
        bad = {**watch_event, "payload": {**watch_event["payload"], where: value}}
        for adapter in (_ENVELOPE, ENVELOPE_READ):
            with pytest.raises(ValidationError, match=where):
                adapter.validate_json(json.dumps(bad))


def test_elastic_pods_are_charged_per_workload_while_granted_and_only_for_their_admission() -> None:
    spec = _spec("ns/a", queue="leaf", count=1)
    granted = ElasticGranted(key="ns/a", queue="leaf", pod_set="worker", count=2, admission=4, reason="g")
    h = _fold(*_tree(), (1.0, Dequeued(key="ns/a", queue="leaf", workload=spec, reason="r")), (2.0, granted))
    gi = 1024**3 * 1000
    assert h.queue_usage()["leaf"] == {"cpu": 4_000, "memory": 5 * gi}         # head + 1 worker + 2 elastic
    released = ElasticReleased(key="ns/a", pod_set="worker", count=1, admission=4, reason="went away")
    h.apply(Clock("placement")(released, 3.0))
    assert h.queue_usage()["leaf"] == {"cpu": 3_000, "memory": 4 * gi}
    stale = released.model_copy(update={"admission": 3})
    h.apply(Clock("placement")(stale, 4.0))                                      # another admission's: nothing
    assert h.queue_usage()["leaf"]["cpu"] == 3_000
    h.apply(Clock("queue")(PreemptionRequested(key="ns/a", kind="RayCluster", gate="pods", preemptor="x/y",
                                               pods=(), reason="p"), 5.0))
    assert h.queue_usage() == {}


def test_a_gang_of_one_pod_lists_its_pod_and_a_plain_pod_of_nobody_is_ignored() -> None:
    clock = Clock()
    h = ResultProjection("demo")
    single = workload("ns/notebook", kind="Pod", gang_=gang(pod_set("pods", 1)))
    h.apply(clock(WorkloadSubmitted(workload=single), 1.0, source="admission"))
    h.apply(watch("Modified", pod("notebook", "ns", node_name="n1"), 2.0, clock))
    h.apply(watch("Added", pod("web", "ns", node_name="n1", scheduler="default-scheduler"), 2.0, clock))
    assert [(p.name, p.pod_set, p.node, p.bound) for p in h.pods_of("ns/notebook")] == [
        ("notebook", "pods", "n1", [[2.0, None]])]
    assert h.pods_of("ns/web") == [] and "ns/web" not in h.workloads
