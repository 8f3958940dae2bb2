"""``tree_key``: equal exactly when ``repr`` is, for what a decoded or YAML-read object holds."""

from __future__ import annotations

import datetime
import itertools
import json
import sys

import pytest

from shared.kernel.treekey import tree_key

# values ``==`` takes for one another that ``repr`` (and a parser) tells apart
LOOKALIKES = [True, 1, 1.0, "1", 0, 0.0, -0.0, False, None, [1], (1,), {"a": 1, "b": 2}, {"b": 2, "a": 1},
              [True], [1.0], {"x": True}, {"x": 1}, {"x": 1.0}, 10 ** 30, float(10 ** 30), "é", "e"]


@pytest.mark.parametrize("a, b", list(itertools.product(LOOKALIKES, repeat=2)))
def test_keys_are_equal_exactly_when_repr_is(a: object, b: object) -> None:
    assert (tree_key(a) == tree_key(b)) == (repr(a) == repr(b))


def test_a_tree_decoded_twice_has_one_key_whatever_is_shared_or_interned() -> None:
    # marshal from version 3 writes an object by its reference count and interning: equal trees could differ
    text = '{"spec": {"replicas": 1, "names": ["w", "w"], "ok": true, "cpu": 1.5, "nested": {"k": [null, "w"]}}}'
    first, second = json.loads(text), json.loads(text)
    shared_name = sys.intern("w")
    second["spec"]["names"] = [shared_name, shared_name]
    assert tree_key(first) == tree_key(second)
    assert repr(first) == repr(second)


class _Text(str):
    pass


@pytest.mark.parametrize("odd", [datetime.date(2024, 1, 1), datetime.datetime(2024, 1, 1, 12), _Text("w")])
def test_what_marshal_refuses_is_keyed_by_repr(odd: object) -> None:
    # a YAML timestamp, a subclass of str: not marshalled, so ``repr`` is the key (and never equals a marshalled one)
    tree = {"spec": {"when": odd}}
    assert tree_key(tree) == repr(tree)
    assert tree_key({"spec": {"when": str(odd)}}) != tree_key(tree)


def test_a_tree_too_deep_to_marshal_falls_back_to_repr() -> None:
    deep: list = []
    for _ in range(2500):
        deep = [deep]
    try:
        expected = repr(deep)
    except RecursionError:
        with pytest.raises(RecursionError):
            tree_key(deep)
    else:
        assert tree_key(deep) == expected
