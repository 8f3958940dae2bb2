"""``muster simulate --check``: compare a run against the scenario's ``expect:`` list.

Each expectation is judged at its own time from the recorded history (transitions, bound
intervals, annotation writes), so one run answers every ``at``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from shared.kernel import quantity as q
from shared.kernel.projection import ResultProjection
from shared.sim.scenario import Expectation

AnnotationLookup = Callable[[str, str, str], list[tuple[float, dict[str, str]]]]


@dataclass(frozen=True)
class Failure:
    expectation: Expectation
    field: str
    expected: Any
    actual: Any

    def __str__(self) -> str:
        e = self.expectation
        return f"at {e.at:g}s {e.workload}: {self.field}: expected {self.expected!r}, got {self.actual!r}"


def _gang_pods_bound(history: ResultProjection, key: str, at: float) -> list[Any]:
    return [p for p in history.pods_of(key) if p.pod_set != "submitter" and p.bound_at(at)]


def check(history: ResultProjection, expectations: list[Expectation],
          annotations: AnnotationLookup | None = None, *, tolerance: float = 0.0) -> list[Failure]:
    """Every failed expectation field, in order; empty means the scenario passed.

    With ``tolerance`` (a run on a real cluster: ``shared.kubernetes.realcluster.TIME_TOLERANCE``) an expectation
    holds when it holds at some time within ``tolerance`` seconds of its own: at either end of that
    window or at any transition or binding of its workload inside it. Its failures are those at its
    own time."""
    failures: list[Failure] = []
    for e in expectations:
        own = _check_one(history, e, e.at, annotations)
        if own and tolerance > 0 and any(not _check_one(history, e, t, annotations)
                                         for t in _moments(history, e, tolerance)):
            continue
        failures.extend(own)
    return failures


def _moments(history: ResultProjection, e: Expectation, tolerance: float) -> list[float]:
    """The times within ``tolerance`` of ``e.at`` at which its workload's state may differ."""
    low, high = max(0.0, e.at - tolerance), e.at + tolerance
    times = {low, high}
    view = history.workloads.get(e.workload)
    if view is not None:
        times.update(float(tr["t"]) for tr in view.transitions if low <= float(tr["t"]) <= high)
    for pod in history.pods_of(e.workload):
        for start, end in pod.bound:
            times.update(t for t in (start, end) if t is not None and low <= t <= high)
    return sorted(times)


def _check_one(history: ResultProjection, e: Expectation, at: float,
               annotations: AnnotationLookup | None) -> list[Failure]:
    """The failed fields of ``e`` judged at ``at``."""
    failures: list[Failure] = []

    def fail(field: str, expected: Any, actual: Any) -> None:
        failures.append(Failure(e, field, expected, actual))

    view = history.workloads.get(e.workload)
    if view is None:
        fail("workload", "known to muster", "never seen")
        return failures
    phase, reason = view.phase_at(at)
    if e.phase is not None and phase != e.phase:
        fail("phase", e.phase, f"{phase} ({reason})" if reason else phase)
    if e.reason_contains is not None and e.reason_contains not in reason:
        fail("reason_contains", e.reason_contains, reason)
    if e.elastic_reason_contains is not None:
        elastic_reason = view.elastic_waiting_at(at)
        if (e.elastic_reason_contains not in elastic_reason) if e.elastic_reason_contains else elastic_reason:
            fail("elastic_reason_contains", e.elastic_reason_contains, elastic_reason)
    if e.warning_contains is not None:
        warned = view.warned_by(at)
        if not any(e.warning_contains in w for w in warned) if e.warning_contains else warned:
            fail("warning_contains", e.warning_contains, warned)
    bound = _gang_pods_bound(history, e.workload, at)
    if e.pods_bound is not None and len(bound) != e.pods_bound:
        fail("pods_bound", e.pods_bound, len(bound))
    for field_name, pod_sets, by_gpu in (("same_node", e.same_node, False), ("same_gpu", e.same_gpu, True)):
        if pod_sets is None:
            continue
        pods = [p for p in history.pods_of(e.workload) if p.pod_set in pod_sets and p.bound_at(at)]
        places = sorted({(p.node, tuple((p.gpu or {}).get("devices", ())) if by_gpu else ()) for p in pods},
                        key=str)
        shared_ok = bool(pods) and len(places) == 1 and (not by_gpu or bool(places[0][1]))
        if not shared_ok:
            fail(field_name, f"all bound {'/'.join(pod_sets)} pods on one {'GPU' if by_gpu else 'node'}",
                 [(p.name, p.node, (p.gpu or {}).get("devices")) for p in pods])
    if e.distinct_nodes is not None:
        pods = [p for p in history.pods_of(e.workload) if p.pod_set in e.distinct_nodes and p.bound_at(at)]
        if not pods or len({p.node for p in pods}) != len(pods):
            fail("distinct_nodes", f"every bound {'/'.join(e.distinct_nodes)} pod on a node of its own",
                 sorted((p.name, p.node) for p in pods))
    if e.pods_per_node is not None:
        per_node: dict[str, int] = {}
        for p in history.pods_of(e.workload):
            if p.bound_at(at) and p.node:
                per_node[p.node] = per_node.get(p.node, 0) + 1
        if per_node != e.pods_per_node:
            fail("pods_per_node", e.pods_per_node, dict(sorted(per_node.items())))
    for pod_set, node in (e.on_node or {}).items():
        pods = [p for p in history.pods_of(e.workload) if p.pod_set == pod_set and p.bound_at(at)]
        if not pods or any(p.node != node for p in pods):
            fail("on_node", f"every bound {pod_set} pod on {node}", [(p.name, p.node) for p in pods])
    if e.min_member is not None and view.min_member != e.min_member:
        fail("min_member", e.min_member, view.min_member)
    if e.resources is not None:
        try:
            expected = {k: v for k, v in q.parse_resources(e.resources, where="expect.resources").items() if v}
        except q.QuantityError as exc:
            fail("resources", e.resources, f"unparseable expectation: {exc}")
        else:
            if expected != view.resources:
                fail("resources", q.format_resources(expected), q.format_resources(view.resources))
    if e.annotations_present is not None:
        ns, name = e.workload.split("/", 1)
        writes = annotations(view.kind, ns, name) if annotations else []
        current: dict[str, str] = {}
        for t, values in writes:
            if t <= at:
                current = values
        wanted = e.annotations_present
        if isinstance(wanted, dict):
            missing = {k: v for k, v in wanted.items() if current.get(k) != v}
        else:
            missing = [k for k in wanted if k not in current]
        if missing:
            fail("annotations_present", wanted, {k: current.get(k) for k in (missing if isinstance(missing, list) else missing.keys())})
    return failures
