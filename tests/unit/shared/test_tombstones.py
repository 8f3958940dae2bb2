"""shared/kernel/dedupe.py ``Tombstones``: the deleted objects admission and the reconciler remember
for a time, oldest first, let go of at the same instants ``forget_before`` lets them go."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given
from hypothesis import strategies as st

from shared.kernel.dedupe import Tombstones, forget_before
from shared.runtime.statecodec import decode, encode
from tests.builders.shared import tombstones


def test_a_tombstone_lasts_its_seconds_to_the_instant_and_no_longer():
    graves = tombstones(("ns/a", "uid-a", 10.0), seconds=600.0)
    graves.expire(610.0)  # deleted exactly ``seconds`` ago: still remembered
    assert "ns/a" in graves and graves.get("ns/a") == "uid-a"
    graves.expire(610.5)
    assert "ns/a" not in graves and graves.get("ns/a") is None and len(graves) == 0


def test_the_oldest_goes_first_and_a_key_buried_again_moves_to_the_end():
    graves = tombstones(("ns/a", "uid-a1", 0.0), ("ns/b", "uid-b", 5.0), ("ns/a", "uid-a2", 8.0), seconds=10.0)
    assert list(graves) == ["ns/b", "ns/a"] and graves.get("ns/a") == "uid-a2"
    graves.expire(15.5)  # b (5 s) expires; a, buried again at 8 s, does not
    assert list(graves) == ["ns/a"]


def test_a_lifted_tombstone_is_forgotten_and_the_others_stay():
    graves = tombstones(("ns/a", "uid-a", 1.0), ("ns/b", "uid-b", 2.0))
    graves.lift("ns/a")
    graves.lift("ns/gone")  # none: nothing to forget
    assert list(graves) == ["ns/b"]


def test_tombstones_that_keep_nothing_but_the_key():
    """The reconciler's: which keys were deleted, and when (for the expiry)."""
    graves: Tombstones[str, None] = Tombstones(600.0)
    graves.bury("ns/a", None, 3.0)
    assert "ns/a" in graves and graves.get("ns/a") is None
    graves.expire(604.0)
    assert not graves


def test_a_snapshot_brings_them_back_in_order_with_their_instants():
    graves = tombstones(("ns/b", "uid-b", 5.0), ("ns/a", "uid-a", 9.0), seconds=10.0)
    back = decode(encode(graves))
    assert type(back) is Tombstones and back.seconds == 10.0
    assert list(back) == ["ns/b", "ns/a"] and back.get("ns/a") == "uid-a"
    back.expire(15.5)
    assert list(back) == ["ns/a"]


_steps = st.lists(st.tuples(st.sampled_from(["bury", "lift", "expire"]), st.sampled_from(["a", "b", "c"]),
                            st.integers(0, 40).map(float)), max_size=40)


@given(_steps)
def test_they_keep_and_expire_exactly_what_the_cores_ordered_dicts_did(steps):
    """The bookkeeping admission and the reconciler wrote each for itself (an ``OrderedDict`` of key ->
    (value, deleted at), a deletion moved to the end, ``forget_before`` at ``now - seconds``), step
    for step: the same keys in the same order, at every instant."""
    seconds = 10.0
    graves: Tombstones[str, str] = Tombstones(seconds)
    before: OrderedDict[str, tuple[str, float]] = OrderedDict()
    now = 0.0
    for op, key, t in steps:
        now = max(now, t)
        if op == "bury":
            graves.bury(key, f"uid-{key}-{now:g}", now)
            before.pop(key, None)
            before[key] = (f"uid-{key}-{now:g}", now)
        elif op == "lift":
            graves.lift(key)
            before.pop(key, None)
        else:
            graves.expire(now)
            forget_before(before, now - seconds, lambda entry: entry[1])
        assert list(graves) == list(before)
        assert all(graves.get(k) == v for k, (v, _) in before.items())
