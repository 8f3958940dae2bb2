"""The node index (``NodeTable.scores``): kept score vectors brought up to date row by row give the
very floats, and so the very nodes, that scoring every node afresh gives."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from services.placement import nodes as node_table
from services.placement.gang import pod_demand
from services.placement.nodes import FRAGMENTATION, NodeTable
from services.placement.statement import Statement
from shared.kernel import quantity as q
from shared.kernel.model import PodSet, Toleration
from tests.builders import node, pod_set

STRATEGIES = ("binpack", "spread", FRAGMENTATION)
_GPU_TAINT = {"key": "gpu", "value": "yes", "effect": "NoSchedule"}

_SHAPES = st.sampled_from([
    pod_set("a", cpu="1"),
    pod_set("b", cpu="3", memory="5Gi"),
    pod_set("c", cpu="500m", memory="700Mi"),
    PodSet(name="g", count=1, resources=q.parse_resources({"cpu": "1", "nvidia.com/gpu": "1"}),
           tolerations=(Toleration(key="gpu", operator="Exists", effect="NoSchedule"),)),
    PodSet(name="h", count=1, resources=q.parse_resources({"cpu": "1"}), gpu_share=300,
           tolerations=(Toleration(key="gpu", operator="Exists", effect="NoSchedule"),)),
    PodSet(name="z", count=1, resources=q.parse_resources({"cpu": "2"}), node_selector={"zone": "b"}),
])
_NODE = st.builds(lambda cpu, gpu, zone: node("x", cpu=str(cpu), memory=f"{cpu * 3}Gi",
                                               gpu=str(gpu) if gpu else None, labels={"zone": zone},
                                               taints=[_GPU_TAINT] if gpu else None),
                  st.integers(1, 8), st.sampled_from([0, 0, 1, 2]), st.sampled_from(["a", "b"]))
_STEP = st.one_of(
    st.tuples(st.just("place"), _SHAPES, st.integers(1, 4), st.sampled_from(STRATEGIES), st.booleans()),
    st.tuples(st.just("node"), st.integers(0, 7), _NODE),
    st.tuples(st.just("gone"), st.integers(0, 7)),
)


def _table(specs: list[dict]) -> NodeTable:
    table = NodeTable()
    for i, spec in enumerate(specs):
        table.upsert(f"n{i}", {**spec, "metadata": {**spec["metadata"], "name": f"n{i}"}})
    return table


def _full_scan(table: NodeTable, ps: PodSet, strategy: str) -> np.ndarray:
    """Every node scored afresh: what the gang placer used before the index."""
    demand = pod_demand(table, ps)
    static = table.static_mask(ps)
    rows = np.flatnonzero(table.feasible(demand, static, slice(0, table.n)))
    out = np.full(table.n, -np.inf)
    out[rows] = table.score(demand, strategy, rows)
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(_NODE, min_size=1, max_size=8), st.lists(_STEP, max_size=25))
def test_kept_scores_equal_a_full_scan_after_any_changes(nodes, steps):
    table = _table(nodes)
    for step in steps:
        if step[0] == "place":
            _, ps, count, strategy, keep = step
            demand = pod_demand(table, ps)
            assert np.array_equal(table.scores(demand, ps, strategy), _full_scan(table, ps, strategy))
            stmt = Statement(table)
            for i in range(count):  # charges the best node each time, as the gang placer does
                scores = table.scores(demand, ps, strategy)
                best = int(scores.argmax())
                if scores[best] == -np.inf:
                    break
                devices = table.devices_for(best, demand, strategy)
                assert devices is not None
                stmt.charge(best, demand, devices)
                if strategy != FRAGMENTATION:
                    assert table.fit_score(demand, table.static_mask(ps), strategy, best) == \
                        _full_scan(table, ps, strategy)[best]
            stmt.commit() if keep else stmt.rollback()
        elif step[0] == "node":
            _, i, spec = step
            table.upsert(f"n{i}", {**spec, "metadata": {**spec["metadata"], "name": f"n{i}"}})
        else:
            table.remove(f"n{step[1]}")
        for ps in (pod_set("a", cpu="1"), pod_set("b", cpu="3", memory="5Gi")):
            for strategy in STRATEGIES:
                assert np.array_equal(table.scores(pod_demand(table, ps), ps, strategy), _full_scan(table, ps, strategy))


def test_a_long_run_of_changes_starts_the_log_afresh(monkeypatch):
    monkeypatch.setattr(node_table, "CHANGED_ROWS", 8)
    table = _table([node("x", cpu="64")] * 3)
    ps = pod_set("a", cpu="1")
    demand = pod_demand(table, ps)
    table.scores(demand, ps, "binpack")
    for i in range(20):
        table.charge(i % 3, demand, ())
        assert len(table.scored.changed) < 8
        assert np.array_equal(table.scores(demand, ps, "binpack"), _full_scan(table, ps, "binpack"))
