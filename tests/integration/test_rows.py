"""shared/history/rows.py without a database: the converter is a pure function of (batch, stored rows).

These live with the integration tests because they guard the store's contract with
``ResultProjection``: if the projection gains state, the store must learn to carry it.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from shared.history import rows
from shared.history.rows import ConversionError, Located, Projector, StoredState, convert, prepare
from shared.kernel.projection import PodView, ResultProjection
from tests.integration.conftest import SCENARIOS, scenario_run

PREEMPTION = next(p for p in SCENARIOS if p.stem == "kai-priority-preemption")


def test_the_store_carries_all_of_the_projections_state():
    """A new attribute of ResultProjection or PodView must be stored (shared/history/rows.py) before
    this passes; WorkloadView's fields travel whole in ``workloads.fold_state``."""
    # ``_created`` numbers new views in memory; the store numbers them itself (``next_ordinal``);
    # the indexes of the views are rebuilt as views are loaded
    assert set(vars(ResultProjection())) - {"_created"} - rows._DERIVED_STATE == rows._FOLD_STATE
    assert tuple(f.name for f in dataclasses.fields(PodView)) == rows._POD_FIELDS


def test_fold_state_round_trips_every_workload_field():
    run = scenario_run(PREEMPTION)
    for view in run.history.workloads.values():
        dumped = json.loads(rows._VIEW.dump_json(view, exclude=rows._NOT_FOLD_STATE))
        back = rows._VIEW.validate_python({**dumped, "key": view.key, "transitions": list(view.transitions)})
        assert back == view


def _cold(batch):
    return StoredState(workload_keys=Projector().needs(batch).workload_keys, queues={}, holding={})


def test_convert_is_deterministic():
    log = scenario_run(PREEMPTION).runtime.log
    batch = prepare([Located(e) for e in log])
    assert convert(batch, _cold(batch), consumer="c") == convert(batch, _cold(batch), consumer="c")


def test_prepare_drops_stored_and_repeated_envelopes_and_keeps_offsets():
    log = scenario_run(PREEMPTION).runtime.log[:10]
    items = [Located(e, "t", 0, i) for i, e in enumerate(log)] + [Located(log[0], "t", 1, 99)]
    batch = prepare(items, stored_ids={log[1].id})
    assert [i.envelope.id for i in batch.items] == [e.id for e in log if e.id != log[1].id]
    assert batch.skipped == 2
    assert batch.offsets == [("t", 0, 10), ("t", 1, 100)]


def test_a_projector_folding_outside_convert_finds_each_pods_workload_itself():
    """``Projector`` takes a pod's workload from ``prepare`` while it converts; folded any other way
    it must find it as ``ResultProjection`` does."""
    log = scenario_run(PREEMPTION).runtime.log
    batch = prepare([Located(e) for e in log])
    projector, reference = Projector(), ResultProjection()
    projector.seed(_cold(batch))
    for env in log:
        projector.apply(env)
        reference.apply(env)
    assert projector.pods and projector.pods == reference.pods


def test_a_workload_that_was_not_loaded_is_refused_not_invented():
    log = scenario_run(PREEMPTION).runtime.log
    batch = prepare([Located(e) for e in log])
    projector = Projector()
    projector.seed(StoredState(queues={}, holding={}))   # the workloads' rows were not loaded
    with pytest.raises(ConversionError, match="not loaded before its events were folded"):
        projector.convert(batch, consumer="c")


def test_one_batch_or_many_give_the_same_rows_for_every_workload():
    log = scenario_run(PREEMPTION).runtime.log
    whole = prepare([Located(e) for e in log])
    one = convert(whole, _cold(whole), consumer="c")
    projector = Projector(max_workloads=1)
    projector.seed(StoredState(queues={}, holding={}))
    rows_by_key: dict[str, dict] = {}
    transitions = []
    stored: dict[str, dict] = {}
    placements: dict[tuple[str, str, int], dict] = {}
    for start in range(0, len(log), 9):
        batch = prepare([Located(e) for e in log[start:start + 9]])
        need = projector.needs(batch)
        projector.seed(StoredState(
            workload_keys=need.workload_keys,
            workloads={k: stored[k] for k in need.workload_keys if k in stored},
            placements={k: sorted((r for (wk, _, _), r in placements.items() if wk == k),
                                  key=lambda r: (r["pod_ordinal"], r["seq"])) for k in need.workload_keys},
            holding={k: r for k, r in stored.items() if r["holds_quota"]} if need.holding_quota else None))
        ops = projector.convert(batch, consumer="c")
        for row in ops.workloads:
            stored[row["key"]] = {**row, "fold_state": json.loads(row["fold_state"])}  # as the store reads it back
            rows_by_key[row["key"]] = row
        for row in ops.placements:
            placements[(row["workload_key"], row["pod"], row["seq"])] = row
        transitions += ops.transitions
    assert {r["key"]: r["fold_state"] for r in one.workloads} == {k: r["fold_state"] for k, r in rows_by_key.items()}
    key = lambda r: (r["workload_key"], r["seq"])  # noqa: E731
    assert sorted(one.transitions, key=key) == sorted(transitions, key=key)
    assert {(r["workload_key"], r["pod"], r["seq"]): r for r in one.placements} == placements
