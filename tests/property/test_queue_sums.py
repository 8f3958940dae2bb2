"""Usage and queue members kept as workloads change equal summing every workload afresh, after any
sequence of events (``shared.kernel.projection.QueueSums``, ``ResultProjection.hold``; the reconciler's
``StatusBook`` counts).

The references below are the full recomputations the incremental code replaced: every workload
walked per read. Random sequences mix the events that move a workload's charge or place in line
(submission, edits, queueing, admission, elastic grants and releases, placement and pods bound,
preemption, the end of a workload, deletion and the status book forgetting it) with queue definitions whose parents
change, go missing or form cycles.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from services.reconciler.status import StatusBook
from shared.kernel import quantity as q
from shared.kernel.events import (
    BackedOff, Dequeued, ElasticGranted, ElasticReleased, Enqueued, GangPlaced, GangRunning, PlacementFailed,
    PodAssigned, PreemptionRequested, QueueDefined, QueueRemoved, ReclaimRequested, WorkloadDeleted, WorkloadFinished,
    WorkloadRejected, WorkloadSubmitted, WorkloadUpdated, WorkloadWithdrawn,
)
from shared.kernel.model import QueueSource
from shared.kernel.policy import Policy
from shared.kernel.projection import QueueSums, ResultProjection, WorkloadView
from tests.builders import envelope, gang, pod_set, queue_spec, workload

MAX_EXAMPLES = int(os.environ.get("MUSTER_PROPERTY_EXAMPLES", "200"))
QUEUES = ("a", "b", "c", "d")
KEYS = ("ns/w0", "ns/w1", "ns/w2", "ns/w3", "ns/w4")
GANGS = (
    gang(pod_set("head", 1, cpu="1", memory="1Gi"), pod_set("worker", 2, cpu="2", memory="1Gi")),
    gang(pod_set("head", 1, **{"nvidia.com/gpu": "1"}), pod_set("worker", 1, cpu="500m")),
    gang(pod_set("head", 1, cpu="0")),  # a zero amount: present in the sums, dropped from status text
    gang(pod_set("head", 1, cpu="1"), pod_set("worker", 3, memory="2Gi")),
)
SOURCES = {
    "volcano": QueueSource(kind="Queue", api_version="scheduling.volcano.sh/v1beta1", name=""),
    "kai": QueueSource(kind="Queue", api_version="scheduling.run.ai/v2", name=""),
    "elasticquotatree": QueueSource(kind="ElasticQuotaTree", api_version="scheduling.sigs.k8s.io/v1beta1",
                                    namespace="kube-system", name="tree"),
}


# --------------------------------------------------------------------------- references (every workload, per read)
def usage_of(views: dict[str, WorkloadView], queues: dict[str, Any]) -> dict[str, dict[str, int]]:
    usage: dict[str, dict[str, int]] = {}
    for view in views.values():
        if not view.holds_quota or view.queue is None:
            continue
        name: str | None = view.queue
        seen: list[str] = []
        while name is not None and name not in seen:
            seen.append(name)
            held = usage.setdefault(name, {})
            for resource, amount in view.demand.items():
                held[resource] = held.get(resource, 0) + amount
            spec = queues.get(name)
            name = spec.parent if spec else None
    return usage


def queue_views_of(h: ResultProjection, names: list[str]) -> dict[str, Any]:
    usage = usage_of(h.workloads, h.queues)
    members_of: dict[str, list[WorkloadView]] = {name: [] for name in names}
    for view in sorted(h.workloads.values(), key=lambda v: v.order):
        if view.queue in members_of:
            members_of[view.queue].append(view)
    out: dict[str, Any] = {}
    for name in names:
        members = members_of[name]
        backoff = [v for v in members if v.queue_state == "backoff" and (v.requeue_at or 0) > h.now]
        waiting = sorted((v for v in members if v.queue_state in ("pending", "backoff") and v not in backoff),
                         key=lambda v: (-v.priority, v.order))
        out[name] = {"usage": q.format_resources(usage.get(name, {})),
                     "active": [v.key for v in members if v.holds_quota],
                     "pending": [{"workload": v.key, "position": i + 1} for i, v in enumerate(waiting)],
                     "backoff": [v.key for v in backoff]}
        if name in h.rejected_queues:
            out[name]["rejected"] = h.rejected_queues[name]
    return out


def subtree(queues: dict[str, Any], name: str) -> list[str]:
    out, todo = [], [name]
    while todo:
        current = todo.pop()
        out.append(current)
        todo += sorted(s.name for s in queues.values() if s.parent == current and s.name not in out)
    return out


def queue_status_of(h: ResultProjection, name: str) -> dict[str, Any]:
    """What the status book wrote for queue ``name`` when it walked every live workload."""
    spec = h.queues[name]
    live = [v for v in h.workloads.values() if v.phase not in (None, "Deleted")]
    members = [v for v in live if v.queue == name]
    allocated = q.format_resources(usage_of(h.workloads, h.queues).get(name, {}))
    if spec.dialect == "volcano":
        return {"state": spec.state, "pending": sum(not v.holds_quota and v.phase in ("Queued", "Preempted")
                                                    for v in members),
                "inqueue": sum(v.holds_quota and v.phase != "Running" for v in members),
                "running": sum(v.holds_quota and v.phase == "Running" for v in members), "allocated": allocated}
    if spec.dialect == "kai":
        requested: dict[str, int] = {}
        for sub in subtree(h.queues, name):
            for v in live:
                if v.queue == sub and (v.holds_quota or v.queue_state in ("pending", "backoff")):
                    requested = q.add(requested, v.demand)
        return {"allocated": allocated, "requested": q.format_resources(requested)}
    view = queue_views_of(h, [name])[name]
    entry: dict[str, Any] = {"used": view["usage"]}
    if view["pending"] or view["backoff"] or members:
        entry["queueItemDetails"] = {"active": [item["workload"].rpartition("/")[2] for item in view["pending"]],
                                     "backoff": [key.rpartition("/")[2] for key in view["backoff"]]}
    return entry


# --------------------------------------------------------------------------- random event sequences
def _event(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["define", "define", "remove", "submit", "update", "enqueue", "backoff", "dequeue",
                                 "reclaim", "placed", "failed", "running", "preempt", "finish", "delete",
                                 "withdraw", "grant", "release", "rejected", "submit", "dequeue", "placed",
                                 "enqueue", "enqueue", "running", "assigned"]))
    queue = draw(st.sampled_from(QUEUES))
    if kind not in ("define", "remove"):
        queue = draw(st.sampled_from(("a", "a", "a", queue)))  # workloads crowd a queue: counts above one
    if kind == "define":
        dialect = draw(st.sampled_from(["volcano", "kai", "elasticquotatree", "builtin"]))
        parent = draw(st.sampled_from((None, None) + QUEUES + ("missing",)))
        source = SOURCES.get(dialect)
        if source is not None and dialect != "elasticquotatree":
            source = source.model_copy(update={"name": queue})
        return QueueDefined(queue=queue_spec(queue, parent=parent, dialect=dialect, source=source))
    if kind == "remove":
        return QueueRemoved(name=queue)
    key = draw(st.sampled_from(KEYS))
    spec = workload(key, queue=queue, kind="RayCluster", priority=draw(st.sampled_from([0, 5])),
                    gang_=draw(st.sampled_from(GANGS)))
    reason = "r"
    return {
        "submit": lambda: WorkloadSubmitted(workload=spec),
        "update": lambda: WorkloadUpdated(workload=spec),
        "enqueue": lambda: Enqueued(key=key, queue=queue, reason=reason),
        "backoff": lambda: BackedOff(key=key, queue=queue, requeue_at=draw(st.sampled_from([0.0, 1e9])), attempts=1,
                                     reason=reason),
        "dequeue": lambda: Dequeued(key=key, queue=queue, workload=spec, reason=reason),
        "reclaim": lambda: ReclaimRequested(key=key, queue=queue, workload=spec, victims=(), reason=reason),
        "placed": lambda: GangPlaced(key=key, queue=queue, kind="RayCluster", gate="pods", slots=(), reason=reason),
        "failed": lambda: PlacementFailed(key=key, queue=queue, reason=reason),
        "running": lambda: GangRunning(key=key, reason=reason),
        "assigned": lambda: PodAssigned(key=key, pod_namespace="ns", pod=f"{key[3:]}-head", pod_set="head", node="n"),
        "preempt": lambda: PreemptionRequested(key=key, kind="RayCluster", gate="pods", preemptor="x", pods=(),
                                               reason=reason),
        "finish": lambda: WorkloadFinished(key=key, outcome=draw(st.sampled_from(["Succeeded", "Failed"])),
                                           reason=reason),
        "delete": lambda: WorkloadDeleted(key=key),
        "withdraw": lambda: WorkloadWithdrawn(key=key, reason=reason),
        "grant": lambda: ElasticGranted(key=key, queue=queue, pod_set="worker", count=draw(st.integers(1, 2)),
                                        admission=draw(st.integers(0, 1)), reason=reason),
        "release": lambda: ElasticReleased(key=key, pod_set="worker", count=draw(st.integers(1, 3)),
                                           admission=draw(st.integers(0, 1)), reason=reason),
        "rejected": lambda: WorkloadRejected(key=key, kind="RayCluster", reason=reason),
    }[kind]()


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[Any, bool]]:
    """Events, each with whether the status book flushes after it (and forgets the deleted)."""
    return [(_event(draw), draw(st.booleans())) for _ in range(draw(st.integers(10, 80)))]


@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True, database=None)
@given(histories())
@example([(QueueDefined(queue=queue_spec("a", dialect="elasticquotatree", source=SOURCES["elasticquotatree"])), False),
          (WorkloadSubmitted(workload=workload("ns/w0", queue="a", gang_=GANGS[0])), True)])  # no phase yet: not live
@example([(QueueDefined(queue=queue_spec("a", source=SOURCES["volcano"].model_copy(update={"name": "a"}))), False),
          (Dequeued(key="ns/w0", queue="a", workload=workload("ns/w0", queue="a"), reason="r"), True)])  # held, no phase
def test_usage_and_members_kept_as_workloads_change_equal_a_full_recomputation(events: list[tuple[Any, bool]]) -> None:
    h = ResultProjection()
    book = StatusBook(Policy(scheduler_names=("muster", "volcano", "kai-scheduler")))
    for i, (payload, flush) in enumerate(events):
        env = envelope(payload, at=float(i))
        h.apply(env)
        book.observe(env)
        assert h.queue_usage() == usage_of(h.workloads, h.queues)
        names = sorted(set(h.queues) | {v.queue for v in h.workloads.values() if v.queue} | set(h.queue_usage()))
        assert h.queue_views() == queue_views_of(h, names)
        assert h.queue_views(QUEUES[:2]) == queue_views_of(h, list(QUEUES[:2]))
        if flush:
            # Every queue touched, so that every status is written and compared.
            book._queues.update(dict.fromkeys(book.view.queues))
            expected = {name: queue_status_of(book.view, name) for name in book.view.queues
                        if book.view.queues[name].source is not None}
            for effect in book.flush():
                if effect.kind == "PodGroup":
                    continue
                if effect.kind == "ElasticQuotaTree":
                    for name, entry in effect.status["queues"].items():
                        details = entry.get("queueItemDetails")
                        got = {"used": entry["used"]}
                        if details is not None:
                            got["queueItemDetails"] = {"active": [a["name"] for a in details["active"]],
                                                       "backoff": [b["name"] for b in details["backoff"]]}
                        assert got == expected[name], name
                else:
                    assert effect.status == expected[effect.name], effect.name
            assert book.view.queue_usage() == usage_of(book.view.workloads, book.view.queues)


@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from((None,) + QUEUES),
                          st.dictionaries(st.sampled_from(["cpu", "memory", "gpu"]), st.integers(0, 3), max_size=3)),
                max_size=40))
def test_queue_sums_equal_the_sums_of_what_each_key_contributes_now(steps: list[tuple[str, str | None, dict]]) -> None:
    sums = QueueSums()
    now: dict[str, tuple[str, dict[str, int]]] = {}
    for key, queue, amounts in steps:
        sums.set(key, queue, amounts)
        if queue is None:
            now.pop(key, None)
        else:
            now[key] = (queue, dict(amounts))
        expected: dict[str, dict[str, int]] = {}
        for queue_, amounts_ in now.values():
            total = expected.setdefault(queue_, {})
            for name, amount in amounts_.items():
                total[name] = total.get(name, 0) + amount
        assert sums.direct == expected
