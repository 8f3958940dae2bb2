"""The node table is bounded by the live nodes (``NodeTable.compact``): an autoscaler that names
every node anew must not grow placement's rows, arrays and score vectors for ever, and dropping the
rows of gone nodes must not change a single decision."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.soak_bench import windows
from services.placement import PlacementCore
from services.placement import nodes as node_table
from shared.kernel.events import Dequeued, GangPlaced, WorkloadWithdrawn
from shared.kernel.footprint import retained
from shared.kernel.policy import Policy
from shared.runtime.statecodec import decode, encode
from tests.builders import envelope, gang, node, pod_set, workload
from tests.builders.placement import PlacementDriver, bound, node_changed, of_type, pod_changed, ray_pod

LIVE = 8


def _churn(d: PlacementDriver, start: int, rounds: int) -> list[int]:
    """Each round a new uniquely named node comes, a gang lands and runs, the oldest node and the gang
    of two rounds before go: live nodes stay at ``LIVE``. The table's row count after each round."""
    rows = []
    for r in range(start, start + rounds):
        d.add_node(f"n{LIVE + r}", cpu="4")
        spec = workload(f"ns/w{r}", gang_=gang(pod_set("head", 1, cpu="1"), pod_set("worker", 2, cpu="1")))
        out = d.dequeue(spec)
        assert of_type(out, GangPlaced), f"round {r}: {out}"
        d.run(spec, out)
        old = f"ns/w{r - 2}"
        for key in list(d.core.pods_of.get(old, {})):
            d.pod(dict(d.core.pods[key].obj), "Deleted")
        d.withdraw(old)
        d.feed(node_changed(node(f"n{r}", cpu="4"), "Deleted"))
        d.settle()
        rows.append(d.core.nodes.n)
    return rows


def test_rows_stay_bounded_by_live_nodes_under_autoscaler_churn() -> None:
    d = PlacementDriver(Policy(), *(node(f"n{i}", cpu="4") for i in range(LIVE)))
    rows = _churn(d, 0, 400)
    table = d.core.nodes
    # gone rows are dropped once they outnumber live ones and reach COMPACT_MIN (plus a few still
    # referred to by the pods of the last gangs)
    bound_rows = LIVE + node_table.COMPACT_MIN + 8
    assert max(rows) <= bound_rows, max(rows)
    assert table.present.shape[0] <= 2 * bound_rows
    assert table.live == LIVE
    assert len(table.index) == table.n == len(table.labels) == len(table.taints)
    assert f"n{399 + LIVE}" in table.index and "n0" not in table.index
    # what the core retains does not grow with the nodes seen: the same give or take the gone rows
    # between two compactions (a row is a few entries), after 200 more rounds
    before = retained(d.core, exclude=[d.core.policy, *windows(d.core)]).entries
    _churn(d, 400, 200)
    after = retained(d.core, exclude=[d.core.policy, *windows(d.core)]).entries
    assert after <= before + 4 * node_table.COMPACT_MIN, (before, after)


def test_a_gone_node_still_referred_to_keeps_its_row() -> None:
    """A pod still charged to a node that left keeps that row (and its name) through a compaction."""
    d = PlacementDriver(Policy())
    d.add_node("keep", cpu="4")
    d.pod(ray_pod("x", "head", node_name="keep", requests={"cpu": "1"}), "Added")
    d.feed(node_changed(node("keep"), "Deleted"))
    for i in range(3 * node_table.COMPACT_MIN):
        d.add_node(f"m{i}")
        d.feed(node_changed(node(f"m{i}"), "Deleted"))
    table = d.core.nodes
    assert table.n < 2 * node_table.COMPACT_MIN
    rec = next(iter(d.core.pods.values()))
    assert rec.node is not None and table.names[rec.node] == "keep"
    d.add_node("keep", cpu="4")  # it comes back: the pod's charge is still there
    assert int(table.free[table.col["cpu"], rec.node]) == 3000


# --------------------------------------------------------------------------- same decisions
_SHAPE = st.sampled_from([
    gang(pod_set("head", 1, cpu="1")),
    gang(pod_set("head", 1, cpu="2"), pod_set("worker", 2, cpu="1")),
    gang(pod_set("head", 1, cpu="3", memory="4Gi")),
])
_STEP = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 6)),
    st.tuples(st.just("add"), st.integers(1, 6)),
    st.tuples(st.just("delete"), st.integers(0, 50)),
    st.tuples(st.just("delete"), st.integers(0, 50)),
    st.tuples(st.just("place"), _SHAPE),
    st.tuples(st.just("run"), st.integers(0, 50)),
    st.tuples(st.just("finish"), st.integers(0, 50)),
    st.tuples(st.just("snapshot"), st.just(0)),
)


def _core(compact_min: int | None) -> PlacementCore:
    core = PlacementCore(Policy())
    core.nodes.compact_min = compact_min
    return core


@settings(max_examples=60, deadline=None)
@given(st.lists(_STEP, min_size=10, max_size=150))
def test_compaction_never_changes_a_decision(steps: list[tuple[str, Any]]) -> None:
    """Over random node churn (new names only, as an autoscaler makes them), placements, running pods
    and finishing gangs, a core that compacts early and one that never does emit the very same events;
    a compacting core restored from a snapshot goes on deciding alike."""
    cores = [_core(None), _core(2)]
    live: list[str] = []
    placed: dict[str, tuple[Any, GangPlaced]] = {}
    running: list[str] = []
    seq = 0

    def feed(payload: Any) -> list[Any]:
        env = envelope(payload, at=float(seq))
        outs = [core.handle(env) for core in cores]
        assert outs[0] == outs[1], payload
        return outs[0]

    for kind, arg in steps:
        seq += 1
        if kind == "add":
            name = f"n{seq}"
            live.append(name)
            feed(node_changed(node(name, cpu=str(arg), memory=f"{arg * 2}Gi")))
        elif kind == "delete" and live:
            name = live.pop(arg % len(live))
            feed(node_changed(node(name), "Deleted"))
        elif kind == "place":
            spec = workload(f"ns/w{seq}", gang_=arg)
            out = feed(Dequeued(key=spec.key, queue=spec.queue, workload=spec, reason="test"))
            for p in of_type(out, GangPlaced):
                placed[spec.key] = (spec, p)
        elif kind == "run" and placed:
            key = sorted(placed)[arg % len(placed)]
            spec, p = placed.pop(key)
            for slot in p.slots:
                obj = ray_pod(spec.name, slot.pod_set, slot.index, namespace=spec.namespace,
                              requests={k: f"{v}m" for k, v in next(
                                  ps for ps in spec.gang.pod_sets if ps.name == slot.pod_set).resources.items()})
                feed(pod_changed(obj))
                feed(pod_changed(bound(obj, slot.node, "Running"), "Modified"))
            running.append(key)
        elif kind == "finish" and running:
            key = running.pop(arg % len(running))
            for pod_key in list(cores[0].pods_of.get(key, {})):
                feed(pod_changed(dict(cores[0].pods[pod_key].obj), "Deleted"))
            feed(WorkloadWithdrawn(key=key, reason="test"))
        elif kind == "snapshot":
            cores[1] = decode(encode(cores[1]))
    assert cores[1].nodes.n <= cores[0].nodes.n
    assert cores[1].nodes.live == cores[0].nodes.live == len(live)
