"""shared/runtime/embedded.py: delivery order, the virtual clock and timers, dedupe, runaway protection.

The cores here are ``FakeCore``s (tests/builders/shared.py) that record every delivery into one
shared trace and answer with scripted payloads, so the tests see the runtime's rules and nothing else.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from shared.runtime.embedded import EmbeddedRuntime, RunawayError
from shared.kernel.events import (
    Envelope, GangRunning, KubeEffect, TimerSet, WorkloadDeleted, WorkloadWithdrawn, derive_id,
)
from shared.kernel.policy import Policy
from shared.kernel.topology import SERVICES
from tests.builders import node, ray_cluster
from tests.builders.shared import RecordingCluster, Trace, at, fake_cores


def _runtime(trace: Trace, limit: int = 2_000_000, **reactions: Callable[[Envelope], Any]) -> EmbeddedRuntime:
    rt = EmbeddedRuntime(Policy(), RecordingCluster(trace), cores=fake_cores(trace, **reactions),
                         max_deliveries_per_instant=limit)
    rt.announced = True  # fake cores decide with no policy: the log these tests read holds only deliveries
    return rt


def _publish(rt: EmbeddedRuntime, payload: Any, index: int = 0) -> Callable[[float], None]:
    return lambda now: rt.publish(at(payload, now, source="test", index=index))


def _on(type_: str, *payloads: Any) -> Callable[[Envelope], list[Any]]:
    """A reaction: answer envelopes of ``type_`` with ``payloads``."""
    return lambda env: list(payloads) if env.type == type_ else []


def _core_deliveries(trace: Trace) -> list[tuple]:
    return [t for t in trace if t[0] in SERVICES]


def test_one_global_fifo_breadth_first():
    trace: Trace = []
    rt = _runtime(trace,
                  queue=_on("WorkloadDeleted", WorkloadWithdrawn(key="w", reason="gone")),
                  reconciler=_on("WorkloadDeleted", KubeEffect(op="event", kind="RayCluster", namespace="default",
                                                               name="w", reason="Deleted")))
    seen: list[Envelope] = []
    rt.subscribe(seen.append)
    rt.run([(0.0, _publish(rt, WorkloadDeleted(key="w")))], until=1.0)
    # queue and reconciler both get the input before placement gets queue's output (not depth-first)
    assert trace == [
        ("queue", "WorkloadDeleted", 0.0, "w"),
        ("reconciler", "WorkloadDeleted", 0.0, "w"),
        ("placement", "WorkloadWithdrawn", 0.0, "w"),
        ("reconciler", "WorkloadWithdrawn", 0.0, "w"),
        ("cluster-effect", "event", 0.0, "w"),
    ]
    root, withdrawn, effect = rt.log
    assert [e.type for e in rt.log] == ["WorkloadDeleted", "WorkloadWithdrawn", "KubeEffect"]
    assert seen == rt.log
    assert (withdrawn.id, withdrawn.source, withdrawn.causation_id, withdrawn.correlation_id) == \
        (derive_id("queue", root.id, 0), "queue", root.id, root.id)
    assert (effect.id, effect.source, effect.causation_id) == (derive_id("reconciler", root.id, 0), "reconciler", root.id)
    assert rt.now == 1.0


def test_outputs_of_one_handle_keep_their_order_and_indexes():
    trace: Trace = []
    rt = _runtime(trace, queue=_on("WorkloadDeleted", WorkloadWithdrawn(key="a", reason="1"),
                                   WorkloadWithdrawn(key="b", reason="2"), WorkloadWithdrawn(key="c", reason="3")))
    rt.run([(0.0, _publish(rt, WorkloadDeleted(key="w")))], until=0.0)
    root = rt.log[0]
    assert [(e.payload.key, e.id) for e in rt.log[1:]] == [
        ("a", derive_id("queue", root.id, 0)), ("b", derive_id("queue", root.id, 1)), ("c", derive_id("queue", root.id, 2))]
    assert [t[3] for t in trace if t[0] == "placement"] == ["a", "b", "c"]


def test_timer_fires_only_at_quiescence_even_when_due_now():
    trace: Trace = []
    rt = _runtime(trace,
                  queue=_on("WorkloadDeleted", TimerSet(key="t", at=0.0), WorkloadWithdrawn(key="w", reason="x")),
                  placement=_on("WorkloadWithdrawn", GangRunning(key="w", reason="chain")))
    rt.run([(0.0, _publish(rt, WorkloadDeleted(key="w")))], until=0.0)
    assert _core_deliveries(trace) == [
        ("queue", "WorkloadDeleted", 0.0, "w"),
        ("reconciler", "WorkloadDeleted", 0.0, "w"),
        ("placement", "WorkloadWithdrawn", 0.0, "w"),
        ("reconciler", "WorkloadWithdrawn", 0.0, "w"),
        ("queue", "GangRunning", 0.0, "w"),
        ("reconciler", "GangRunning", 0.0, "w"),
        ("queue", "TimerFired", 0.0, "t"),           # last: everything else at t=0 came first
    ]
    timer_set = next(e for e in rt.log if e.type == "TimerSet")
    fired = next(e for e in rt.log if e.type == "TimerFired")
    assert (fired.source, fired.causation_id, fired.occurred_at, fired.id) == \
        ("clock", timer_set.id, 0.0, derive_id("clock", timer_set.id, 0))
    assert rt.log[-1] is fired  # logged for replay


def test_at_one_instant_steps_then_cluster_timers_then_service_timers():
    trace: Trace = []
    rt = _runtime(trace, queue=_on("WorkloadDeleted", TimerSet(key="svc", at=5.0)))

    def cluster_timer(now: float) -> None:  # armed after the service timer: order is not arming order
        rt.cluster.api.request_timer(5.0, "probe|x")

    def step(now: float) -> None:
        trace.append(("step", now))

    rt.run([(5.0, step), (1.0, cluster_timer), (0.0, _publish(rt, WorkloadDeleted(key="w")))], until=10.0)
    after_start = trace[trace.index(("reconciler", "WorkloadDeleted", 0.0, "w")) + 1:]
    assert after_start == [
        ("step", 5.0),
        ("cluster-timer", "probe|x", 5.0),
        ("queue", "TimerFired", 5.0, "svc"),
    ]
    assert rt.now == 10.0


def test_timer_set_in_the_past_fires_at_now():
    trace: Trace = []
    rt = _runtime(trace, queue=_on("WorkloadDeleted", TimerSet(key="late", at=1.0)))
    rt.run([(3.0, _publish(rt, WorkloadDeleted(key="w")))], until=4.0)
    assert _core_deliveries(trace)[-1] == ("queue", "TimerFired", 3.0, "late")
    assert [e.occurred_at for e in rt.log if e.type == "TimerFired"] == [3.0]


def test_same_service_key_and_time_fires_once_other_services_and_times_fire_separately():
    trace: Trace = []
    rt = _runtime(trace,
                  queue=_on("WorkloadDeleted", TimerSet(key="k", at=4.0), TimerSet(key="k", at=4.0),
                            TimerSet(key="k", at=6.0)),
                  reconciler=_on("WorkloadDeleted", TimerSet(key="k", at=4.0)))
    rt.run([(0.0, _publish(rt, WorkloadDeleted(key="w"))),
            (1.0, _publish(rt, WorkloadDeleted(key="w"), index=1))], until=10.0)  # a second cause re-arms (k, 4)
    fired = [t for t in trace if t[1] == "TimerFired"]
    assert fired == [
        ("queue", "TimerFired", 4.0, "k"),
        ("reconciler", "TimerFired", 4.0, "k"),
        ("queue", "TimerFired", 6.0, "k"),
    ]
    assert sum(1 for e in rt.log if e.type == "TimerSet") == 8  # every request is logged, not every one fires


def test_timer_at_until_fires_later_ones_do_not():
    trace: Trace = []
    rt = _runtime(trace, queue=_on("WorkloadDeleted", TimerSet(key="edge", at=10.0), TimerSet(key="after", at=10.5)))
    rt.run([(0.0, _publish(rt, WorkloadDeleted(key="w")))], until=10.0)
    assert [t[3] for t in trace if t[1] == "TimerFired"] == ["edge"]
    assert rt.now == 10.0


def test_redelivered_envelope_is_ignored_per_service():
    trace: Trace = []
    rt = _runtime(trace)
    env = at(WorkloadDeleted(key="w"), 0.0, source="test", index=7)
    twin = at(WorkloadDeleted(key="w"), 0.0, source="test", index=8)  # same payload, new id: a new event

    def step(now: float) -> None:
        rt.publish(env)
        rt.publish(env)
        rt.publish(twin)

    rt.run([(0.0, step)], until=0.0)
    assert [t[0] for t in trace] == ["queue", "reconciler", "queue", "reconciler"]
    assert [e.id for e in rt.core("queue").handled] == [env.id, twin.id]
    assert [e.id for e in rt.log] == [env.id, env.id, twin.id]


def test_runaway_feedback_loop_raises():
    trace: Trace = []
    rt = _runtime(trace, limit=100, queue=_on("WorkloadDeleted", WorkloadDeleted(key="w")))
    with pytest.raises(RunawayError, match=r"^more than 100 deliveries at t=2s; last: WorkloadDeleted w$"):
        rt.run([(2.0, _publish(rt, WorkloadDeleted(key="w")))], until=5.0)


def _thirty(rt: EmbeddedRuntime, base: int) -> Callable[[float], None]:
    return lambda now: [rt.publish(at(WorkloadDeleted(key=f"w{i}"), now, index=base + i)) for i in range(30)]


def test_delivery_limit_counts_per_instant():
    trace: Trace = []
    rt = _runtime(trace, limit=100)
    rt.run([(0.0, _thirty(rt, 0)), (1.0, _thirty(rt, 100))], until=2.0)  # 60 + 60 deliveries, 1s apart
    assert len(trace) == 120
    rt2 = _runtime([], limit=100)
    with pytest.raises(RunawayError):
        rt2.run([(0.0, _thirty(rt2, 0)), (0.0, _thirty(rt2, 100))], until=2.0)  # 120 at one instant


def test_watch_events_become_ingest_envelopes_routed_by_kind():
    trace: Trace = []
    rt = _runtime(trace)
    rt.run([(2.0, lambda now: rt.cluster.apply(node("n1"), now))], until=3.0)
    assert trace == [("placement", "ObjectChanged", 2.0, "n1")]
    env = rt.log[0]
    assert (env.type, env.source, env.subject, env.occurred_at, env.causation_id, env.payload.change,
            env.payload.kind) == ("ObjectChanged", "ingest", "Node/n1", 2.0, None, "Added", "Node")


def test_workload_objects_go_to_admission_and_their_pods_to_placement():
    trace: Trace = []
    rt = _runtime(trace)
    rt.run([(1.0, lambda now: rt.cluster.apply(ray_cluster("rc"), now))], until=1.0)
    admission = [(e.payload.kind, e.payload.name) for e in rt.core("admission").handled]
    placement = {(e.payload.kind, e.payload.name.rsplit("-", 1)[0]) for e in rt.core("placement").handled}
    assert admission and {k for k, _ in admission} == {"RayCluster"}
    assert placement == {("Pod", "rc-head"), ("Pod", "rc-worker-worker")}
    assert rt.core("queue").handled == [] and rt.core("reconciler").handled == []
    assert {e.source for e in rt.log} == {"ingest"}


def test_steps_run_in_time_order_and_not_after_until():
    trace: Trace = []
    rt = _runtime(trace)
    steps = [(t, (lambda now, t=t: trace.append(("step", t, now)))) for t in (7.0, 1.0, 3.0, 3.0, 12.0)]
    rt.run(steps, until=10.0)
    assert trace == [("step", 1.0, 1.0), ("step", 3.0, 3.0), ("step", 3.0, 3.0), ("step", 7.0, 7.0)]
    assert rt.now == 10.0


def test_default_cores_are_the_four_services():
    from shared.sim.cluster import SimCluster
    rt = EmbeddedRuntime(Policy(), SimCluster())
    assert list(rt.cores) == list(SERVICES)
    assert [rt.core(s).service for s in SERVICES] == list(SERVICES)


def test_a_core_that_raises_rejects_the_workload_and_the_run_goes_on():
    from shared.kernel.events import WorkloadRejected

    trace: Trace = []

    def admission(env: Envelope) -> list[Any]:
        if env.payload.name == "poison":
            raise RuntimeError("a bug")
        return []

    rt = _runtime(trace, admission=admission)

    def apply(now: float) -> None:
        rt.cluster.apply(ray_cluster("poison"), now)
        rt.cluster.apply(ray_cluster("fine"), now)

    rt.run([(0.0, apply)], until=1.0)
    [fault] = rt.faults
    assert fault.service == "admission" and fault.error.startswith("admission failed on ObjectChanged RayCluster/")
    rejected = [e for e in rt.log if isinstance(e.payload, WorkloadRejected)]
    assert [(e.source, e.payload.key) for e in rejected] == [("admission", "default/poison")]
    assert [t[3] for t in trace if t[0] == "admission"] == ["poison", "fine"]  # the next one handled too
    assert ("queue", "WorkloadRejected", 0.0, "default/poison") in trace  # routed as any rejection


def test_a_run_that_keeps_no_log_decides_the_same_and_counts_what_it_published():
    """``keep_log=False`` (``muster simulate`` without --store or --trace) drops the replay copy only:
    the same result, the same checks, and as many envelopes published as the kept log holds."""
    from shared.runtime.simulate import simulate
    from shared.sim.scenario import load_scenario
    from tests.builders.shared import VOLCANO

    kept, dropped = simulate(load_scenario(VOLCANO)), simulate(load_scenario(VOLCANO), keep_log=False)
    assert dropped.runtime.log == [] and kept.runtime.log
    assert dropped.runtime.published == kept.runtime.published == len(kept.runtime.log)
    results = [run.result() for run in (kept, dropped)]
    for result in results:
        del result["stats"]["wall_seconds"]
    assert results[0] == results[1]
    assert [str(f) for f in dropped.check()] == [str(f) for f in kept.check()]


def test_an_effect_that_causes_itself_again_is_stopped_with_a_reason():
    """An annotation that flips the value it reads (each write differs from the last, so nothing dedupes it):
    the real SimCluster turns every write into a watch event that makes the next one. The runtime stops
    applying the effect once it came ``MAX_REPEATS`` times at one instant, says why once, and time goes on."""
    from shared.runtime.cycles import MAX_REPEATS

    def flip(env: Envelope) -> list[Any]:
        p = env.payload
        if env.type != "ObjectChanged" or p.kind != "RayCluster" or p.change == "Deleted":
            return []
        now = p.object["metadata"].get("annotations", {}).get("muster.dev/flip")
        return [KubeEffect(op="annotate", kind="RayCluster", namespace="default", name=p.name,
                           annotations={"muster.dev/flip": "b" if now == "a" else "a"})]

    trace: Trace = []
    rt = _runtime(trace, admission=flip)
    rt.run([(1.0, lambda now: rt.cluster.apply(ray_cluster("loop"), now))], until=5.0)
    applied = [t for t in trace if t[0] == "cluster-effect" and t[3] == "loop"]
    assert len(applied) == 2 * MAX_REPEATS  # each of the two values MAX_REPEATS times, then neither
    assert rt.cycles_stopped == [
        f"effect annotate RayCluster/default/loop came {MAX_REPEATS + 1} times within 0s of event time: applying it "
        "causes the watch event that causes it again (a cycle), so it is not applied again"]
    assert rt.now == 5.0
