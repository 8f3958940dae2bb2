"""shared/kernel/faults.py: what a core's failure on an envelope rejects, and the reason it gives."""

from __future__ import annotations

from typing import Any

import pytest

from shared.kernel.events import (
    CapacityChanged,
    Enqueued,
    ObjectChanged,
    QueueDefined,
    QueueRejected,
    QueueRemoved,
    TimerFired,
    WorkloadRejected,
    WorkloadSubmitted,
)
from shared.kernel.faults import describe, rejections
from tests.builders import envelope, node, queue_spec, ray_cluster, ray_job, workload
from tests.builders.admission import changed, gang_pod, volcano_queue

ERROR = "admission failed on ObjectChanged x: KeyError: 'spec'"


def _rejected(payload: Any, service: str = "admission") -> list[Any]:
    return rejections(service, envelope(payload, at=1.0), ERROR)


@pytest.mark.parametrize(("obj", "key", "kind"), [
    (ray_cluster("rc", "team"), "team/rc", "RayCluster"),
    (ray_job("rj"), "default/rj", "RayJob"),
    (gang_pod("pg-0", "pg"), "default/pg", "PodGroup"),
], ids=["RayCluster", "RayJob", "gang pod"])
def test_a_workload_object_is_rejected(obj: dict, key: str, kind: str) -> None:
    [out] = _rejected(changed(obj))
    assert isinstance(out, WorkloadRejected) and (out.key, out.kind) == (key, kind)
    assert ERROR in out.reason and "apply it again" in out.reason


def test_a_queue_object_gets_a_queue_rejection() -> None:
    [out] = _rejected(changed(volcano_queue("vq")))
    assert isinstance(out, QueueRejected) and (out.name, out.kind) == ("vq", "Queue")


@pytest.mark.parametrize("payload", [
    changed(node("n1")),
    changed(ray_cluster("rc"), "Deleted"),
    QueueRemoved(name="q"),
    TimerFired(key="cycle"),
    CapacityChanged(total={}, nodes=0, released=False),
    Enqueued(key="default/w", queue="q", reason="waiting"),  # names no kind to reject
    WorkloadRejected(key="default/w", kind="RayCluster", reason="bad"),  # never a rejection for a rejection
    QueueRejected(name="q", kind="Queue", reason="bad"),
], ids=lambda p: p.type)
def test_what_concerns_no_live_workload_or_queue_rejects_nothing(payload: Any) -> None:
    assert _rejected(payload, "queue") == []


def test_workload_and_queue_events_reject_their_subject() -> None:
    [out] = _rejected(WorkloadSubmitted(workload=workload("default/w")), "queue")
    assert isinstance(out, WorkloadRejected) and out.key == "default/w" and out.kind == "RayCluster"
    [out] = _rejected(QueueDefined(queue=queue_spec("q")), "queue")
    assert isinstance(out, QueueRejected) and out.name == "q"


def test_the_error_is_one_line_naming_the_service_the_event_and_the_exception() -> None:
    env = envelope(changed(ray_cluster("rc")), at=1.0)
    text = describe("admission", env, ValueError("first\nsecond"))
    assert text == "admission failed on ObjectChanged RayCluster/default/rc: ValueError: first"
    assert describe("queue", env, KeyError()) == "queue failed on ObjectChanged RayCluster/default/rc: KeyError"


def test_a_nameless_or_odd_object_is_still_answered_without_raising() -> None:
    obj = ray_cluster("rc")
    obj["metadata"] = True
    [out] = _rejected(ObjectChanged(change="Added", kind="RayCluster", name="rc", object=obj))
    assert out.key == "default/rc"
