"""shared/runtime/bus/sequencing.py: arrival order, and rounds held until the driver releases them."""

from __future__ import annotations

import pytest

from shared.kernel.events import WorkloadDeleted
from shared.runtime.bus.codec import Release
from shared.runtime.bus.sequencing import Arrival, Rounds, SequencingError
from tests.builders.shared import at


def _env(name: str):
    return at(WorkloadDeleted(key=f"default/{name}"), 1.0)


A, B, C = _env("a"), _env("b"), _env("c")


def _rounds(*envs) -> Rounds:
    rounds = Rounds()
    for env in envs:
        assert rounds.offer(env) == []
    return rounds


def test_arrival_passes_an_envelope_straight_through():
    assert Arrival().offer(A) == [A]


def test_arrival_refuses_a_release():
    with pytest.raises(SequencingError):
        Arrival().release(Release(0, (A.id,)))


def test_rounds_holds_envelopes_until_released():
    rounds = _rounds(A, B)
    assert rounds.held == 2


def test_rounds_releases_in_the_order_the_release_names():
    rounds = _rounds(A, B, C)
    assert rounds.release(Release(0, (C.id, A.id, B.id))) == [C, A, B]
    assert rounds.held == 0


def test_rounds_ignores_a_round_released_before():
    rounds = _rounds(A, B)
    rounds.release(Release(0, (A.id,)))
    assert rounds.release(Release(0, (B.id,))) == []
    assert rounds.held == 1


def test_rounds_names_an_envelope_it_does_not_hold():
    rounds = _rounds(A)
    with pytest.raises(SequencingError, match=B.id):
        rounds.release(Release(0, (A.id, B.id)))


def test_rounds_keeps_one_copy_of_a_redelivered_envelope():
    rounds = _rounds(A, A)
    assert rounds.held == 1
    assert rounds.release(Release(0, (A.id,))) == [A]


def test_rounds_tolerates_an_id_named_twice_in_one_release():
    rounds = _rounds(A, B)
    assert rounds.release(Release(0, (B.id, A.id, B.id))) == [B, A]
