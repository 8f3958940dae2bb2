"""Mutated manifests through ingest → admission → queue: nothing raises, nothing is left unanswered.

Each example takes the manifests users write (RayJob, RayCluster, the queue kinds of each dialect,
PodGroup, Pod, PriorityClass, Node), mutates them (a value of another type, a field dropped or
added, huge or odd values: non-finite numbers, 70-bit integers, long strings, half a surrogate
pair, deep nesting) and feeds each through the path a watch event takes: ``ingest.observe``,
the admission service, and the queue service for what admission routes to it. It asserts:

- no exception escapes, and no core raises either (``Service.failed``: a core that did would be
  contained, but the contract is a rejection with a reason, not a contained failure);
- every workload object (RayJob, RayCluster) is accepted or rejected with a reason, every queue
  object of a dialect muster reads is defined or rejected with a reason;
- every envelope emitted on the way encodes and decodes with the bus codec to the same envelope.

Bounded time: ``MUSTER_FUZZ_EXAMPLES`` examples (default 150), no deadline per example (the
machine is shared), a few seconds in all.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.admission.core import AdmissionCore
from services.queue.core import QueueCore
from services.reconciler.ingest import watch_envelope
from shared.runtime.bus import codec
from shared.kernel.events import (
    Envelope,
    QueueDefined,
    QueueRejected,
    TimerFired,
    TimerSet,
    WorkloadRejected,
    WorkloadSubmitted,
    WorkloadUpdated,
    wrap,
)
from shared.kernel.policy import Policy
from shared.kernel.topology import destinations
from shared.runtime.service import Service
from tests.builders import node, pod, ray_cluster, ray_job, worker_group
from tests.builders.admission import (
    elastic_quota_tree,
    eqt_node,
    gang_pod,
    kai_queue,
    kai_resource,
    pod_group,
    priority_class,
    volcano_queue,
)

EXAMPLES = int(os.environ.get("MUSTER_FUZZ_EXAMPLES", "150"))

BASES: dict[str, dict[str, Any]] = {
    "RayCluster": ray_cluster("rc", labels={"volcano.sh/queue-name": "vq"},
                              workers=[worker_group("w", 2, {"cpu": "1", "memory": "1Gi"})]),
    "RayJob": ray_job("rj", labels={"kai.scheduler/queue": "kq"}),
    "VolcanoQueue": volcano_queue("vq", capability={"cpu": "8", "memory": "16Gi"}),
    "KaiQueue": kai_queue("kq", cpu=kai_resource(4, 8)),
    "ElasticQuotaTree": elastic_quota_tree(eqt_node("root", min={"cpu": "8"}, max={"cpu": "8"}, children=[
        eqt_node("team", min={"cpu": "2"}, max={"cpu": "4"}, namespaces=["team"])])),
    "PodGroup": pod_group("pg", 2),
    "Pod": gang_pod("pg-0", "pg"),
    "PriorityClass": priority_class("train", 50),
    "Node": node("n1", gpu="4"),
    "PlainPod": pod("single", requests={"cpu": "1"}),
}

ODD: list[Any] = [
    None, True, 0, -1, 2**70, -(2**63), 1e308, float("inf"), float("-inf"), float("nan"), "", " ", "-1",
    "1e999", "0.0000000001", "99999999999999999999Ti", "1.5.5", "\ud800", "é" * 3, "x" * 5_000, [], {},
    [1, "a", None], {"a": {"b": {"c": {}}}}, "default", "kube-system", "cpu", "nvidia.com/gpu", 3.5, "1m",
]
"""Values a mutation may put anywhere (other types, non-finite, huge, empty, half a surrogate pair)."""


def _deep(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"x": value}
    return value


VALUES = st.one_of(st.sampled_from(ODD).map(copy.deepcopy), st.integers(), st.floats(), st.text(max_size=20),
                   st.integers(min_value=10, max_value=60).map(_deep))
"""Fresh values: a mutation changes what it put in place later, never the list above."""


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside ``obj`` (dict keys and list indexes)."""
    out: list[tuple] = []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        out.append(prefix + (key,))
        out.extend(_paths(value, prefix + (key,)))
    return out


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> dict[str, Any]:
    """``base`` with one to four mutations: a value replaced, a key dropped, or a key added."""
    obj = copy.deepcopy(base)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        paths = _paths(obj)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent: Any = obj
        for key in path[:-1]:
            parent = parent[key]
        last = path[-1]
        action = draw(st.sampled_from(["replace", "replace", "drop", "add"]))
        if action == "replace":
            parent[last] = draw(VALUES)
        elif action == "drop":
            del parent[last]
        elif isinstance(parent[last], dict):
            parent[last][draw(st.sampled_from(["extra", "spec", "status", "metadata", "labels", "\ud800", ""]))] = \
                draw(VALUES)
        elif isinstance(parent[last], list):
            parent[last].append(draw(VALUES))
        else:
            parent[last] = draw(VALUES)
    return obj


MANIFESTS = st.sampled_from(sorted(BASES)).flatmap(lambda kind: st.tuples(
    st.just(kind), mutated(BASES[kind]), st.sampled_from(["Added", "Added", "Modified", "Deleted"])))


def _round_trips(env: Envelope) -> None:
    value = codec.encode(env)
    back = codec.decode(value, codec.envelope_headers(env))
    assert isinstance(back, Envelope) and back.id == env.id and back.type == env.type


def _holds_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, dict):
        return any(_holds_surrogate(k) or _holds_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_surrogate(v) for v in value)
    return False


def _encodable(text: str) -> str:
    """A name as the answer names it: lone surrogates escaped so that it encodes as UTF-8, cut at 253
    characters (ingest's form of a name from a hostile server)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")[:253]


def _answered(kind: str, obj: dict[str, Any], out: list[Envelope], answered: set[str]) -> None:
    """A workload object is accepted or rejected with a reason, a queue object defined or rejected;
    or it was answered before (the same object applied again unchanged needs no new answer)."""
    for env in out:
        p = env.payload
        if isinstance(p, (WorkloadRejected, QueueRejected)):
            assert p.reason.strip(), p
        if isinstance(p, (WorkloadSubmitted, WorkloadUpdated)):
            answered.add(p.workload.key)
        elif isinstance(p, WorkloadRejected):
            answered.add(p.key)
        elif isinstance(p, QueueDefined):
            answered.add(f"queue/{p.queue.name}")
        elif isinstance(p, QueueRejected):
            answered.add(f"queue/{p.name}")
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not (isinstance(name, str) and name and isinstance(obj.get("spec"), dict)
            and obj.get("apiVersion") == BASES[kind]["apiVersion"] and obj.get("kind") == BASES[kind]["kind"]):
        return  # not an object of a kind muster reads (or nameless): passed by
    name = _encodable(name)
    if kind in ("RayCluster", "RayJob"):
        namespace = _encodable(meta.get("namespace")) if isinstance(meta.get("namespace"), str) else ""
        assert f"{namespace or 'default'}/{name}" in answered, (kind, [env.payload for env in out])
    if kind in ("VolcanoQueue", "KaiQueue"):
        assert f"queue/{name}" in answered, (kind, [env.payload for env in out])


def _through_queue(queue: Service, env: Envelope) -> None:
    """The queue handles ``env``, and the timers it sets fire at once (its scheduling cycle runs)."""
    pending = [env]
    while pending:
        for out in queue.handle(pending.pop(0)):
            _round_trips(out)
            if isinstance(out.payload, TimerSet):
                pending.append(wrap(TimerFired(key=out.payload.key), source="clock", cause=out, index=0,
                                    at=max(out.payload.at, out.occurred_at)))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(st.lists(MANIFESTS, min_size=1, max_size=6))
def test_mutated_manifests_are_answered_and_never_raise(manifests: list[tuple[str, dict[str, Any], str]]) -> None:
    policy = Policy()
    admission, queue = Service(AdmissionCore(policy)), Service(QueueCore(policy))
    at = 1.0
    # the unmutated queues first, so that workloads have somewhere to go
    feed = [(kind, copy.deepcopy(BASES[kind]), "Added") for kind in ("VolcanoQueue", "KaiQueue", "ElasticQuotaTree")]
    answered: set[str] = set()
    for kind, obj, change in feed + manifests:
        at += 1.0
        try:  # the watch event as the cluster link makes it, and its encoding
            watched = watch_envelope(change, obj, at)  # type: ignore[arg-type]
            codec.encode(watched)
        except ValueError:
            assert _holds_surrogate(obj), obj
            continue  # text no JSON can hold: the cluster link dead-letters it (test_cluster_bridge)
        _round_trips(watched)
        out: list[Envelope] = []
        if "admission" in destinations(watched):
            out = admission.handle(watched)
            for env in out:
                _round_trips(env)
                if "queue" in destinations(env):
                    _through_queue(queue, env)
        if change != "Deleted":
            _answered(kind, obj, out, answered)
        assert admission.failed == 0 and queue.failed == 0, (admission.take_faults(), queue.take_faults())
