"""Placement's decisions built without validation are the validated ones, byte for byte."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from services.placement.payloads import gang_placed, pod_assigned, slot_assignment
from shared.kernel.events import (
    Envelope, GangPlaced, GpuAssignment, PodAssigned, SlotAssignment, WorkloadDeleted, to_json, wrap,
)

_CAUSE = Envelope(id="c", type="WorkloadDeleted", subject="ns/w", source="queue", occurred_at=1.0,
                  correlation_id="c", payload=WorkloadDeleted(key="ns/w"))
_TEXT = st.text(max_size=8)
_GPU = st.one_of(st.none(), st.builds(GpuAssignment, devices=st.tuples(st.integers(0, 7)),
                                      fraction=st.sampled_from([1.0, 0.5, 0.25]), group=_TEXT))
# What may reach the builders: the exact types, and the odd ones validation coerces or refuses.
_INDEX = st.one_of(st.integers(0, 10**6), st.sampled_from([True, np.int64(3), 2.0, "4"]))
_ODD_TEXT = st.one_of(_TEXT, st.sampled_from([None, 1, b"x"]))


def _same(fast: Any, checked: Any) -> None:
    assert fast == checked and fast.__dict__ == checked.__dict__ and repr(fast) == repr(checked)  # types too
    assert list(fast.__dict__) == list(type(checked).model_fields)
    assert fast.model_dump_json() == checked.model_dump_json()
    if hasattr(fast, "type"):
        assert to_json(wrap(fast, source="placement", cause=_CAUSE, index=0)) == \
            to_json(wrap(checked, source="placement", cause=_CAUSE, index=0))


def _both(build: Any, cls: type, **fields: Any) -> None:
    try:
        checked = cls(**fields)
    except ValidationError:
        with pytest.raises(ValidationError):
            build(**fields)
        return
    _same(build(**fields), checked)


@settings(max_examples=300, deadline=None)
@given(_ODD_TEXT, _INDEX, _TEXT, _GPU)
def test_slot_assignment_is_the_validated_one(pod_set: Any, index: Any, node: str, gpu: Any) -> None:
    _both(slot_assignment, SlotAssignment, pod_set=pod_set, index=index, node=node, gpu=gpu)


@settings(max_examples=300, deadline=None)
@given(_ODD_TEXT, _TEXT, st.sampled_from(["RayJob", "Pod"]), st.sampled_from(["suspend", "pods", "other", 1]),
       st.lists(st.builds(SlotAssignment, pod_set=_TEXT, index=st.integers(0, 9), node=_TEXT, gpu=_GPU), max_size=4),
       st.booleans(), _ODD_TEXT)
def test_gang_placed_is_the_validated_one(key: Any, queue: str, kind: str, gate: Any, slots: list[SlotAssignment],
                                          as_list: bool, reason: Any) -> None:
    _both(gang_placed, GangPlaced, key=key, queue=queue, kind=kind, gate=gate,
          slots=list(slots) if as_list else tuple(slots), reason=reason)


@settings(max_examples=300, deadline=None)
@given(_ODD_TEXT, _TEXT, _TEXT, _TEXT, _ODD_TEXT, _GPU, st.sampled_from([True, False, 0, 1, "yes"]))
def test_pod_assigned_is_the_validated_one(key: Any, namespace: str, pod: str, pod_set: str, node: Any, gpu: Any,
                                           elastic: Any) -> None:
    _both(pod_assigned, PodAssigned, key=key, pod_namespace=namespace, pod=pod, pod_set=pod_set, node=node, gpu=gpu,
          elastic=elastic)
