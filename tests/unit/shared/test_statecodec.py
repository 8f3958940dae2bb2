"""shared/runtime/statecodec.py: a state comes back with its shape (shared references, cycles, every kind of
value muster's cores hold), and a blob that names anything but muster's pure state classes is refused
without running it."""

from __future__ import annotations

import json
import math
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np
import pytest

from services.queue.core import QueueCore
from shared.kernel.dedupe import Seen
from shared.kernel.events import TimerSet, wrap
from shared.kernel.policy import Policy
from shared.runtime import statecodec
from shared.runtime.statecodec import StateError, decode, encode


@dataclass
class Node:
    """A state class of a pure module (this test module is no muster package: registered below)."""

    name: str
    children: list["Node"] = field(default_factory=list)
    parent: "Node | None" = None


def test_containers_numbers_and_text_come_back_equal_and_of_the_same_types():
    state = {"list": [1, 2.5, "x", None, True], "tuple": (1, (2, 3)), "set": {1, 2}, "frozen": frozenset({"a"}),
             "ordered": OrderedDict([("b", 1), ("a", 2)]), "counter": Counter("abca"),
             "deque": deque([1, 2, 3], maxlen=5), "bytes": b"\x00\xff", "big": 2**80, "neg": -0.0,
             (1, "tuple key"): frozenset({(1, 2)}), 3: "int key"}
    back = decode(encode(state))
    assert back == state
    for key, value in state.items():
        assert type(back[key]) is type(value)
    assert list(back["ordered"]) == ["b", "a"] and back["deque"].maxlen == 5
    assert math.copysign(1.0, back["neg"]) == -1.0


def test_special_floats_and_numpy_values_survive():
    array = np.arange(12, dtype=np.int64).reshape(3, 4)
    back = decode(encode([math.inf, -math.inf, math.nan, array, np.float32(1.5), np.zeros(0, dtype=np.uint8)]))
    assert back[0] == math.inf and back[1] == -math.inf and math.isnan(back[2])
    assert back[3].dtype == array.dtype and (back[3] == array).all() and back[3].flags.writeable
    assert type(back[4]) is np.float32 and back[4] == 1.5
    assert back[5].shape == (0,)


def test_shared_references_and_cycles_stay_one_object():
    shared = [1, 2]
    state = {"a": shared, "b": shared}
    state["self"] = state
    back = decode(encode(state))
    assert back["a"] is back["b"] and back["self"] is back
    back["a"].append(3)
    assert back["b"] == [1, 2, 3]


def test_a_json_mapping_reachable_twice_stays_one_object():
    """Mappings of JSON (a watched object) are written as they are; one reachable twice is not."""
    obj = {"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"replicas": [1, 2.5, None, True]}}
    assert decode(encode({"obj": obj})) == {"obj": obj}
    state = {"obj": obj, "labels": obj["metadata"]["labels"]}
    back = decode(encode(state))
    assert back == state and back["labels"] is back["obj"]["metadata"]["labels"]
    tuples = {"k": (1, 2)}  # a tuple is no JSON: the mapping is tagged, and the tuple stays a tuple
    assert type(decode(encode(tuples))["k"]) is tuple


def test_pure_state_classes_pydantic_models_and_bound_methods(monkeypatch):
    monkeypatch.setattr(Node, "__module__", "shared.runtime.statecodec")  # as if a pure module defined it
    monkeypatch.setattr(statecodec, "Node", Node, raising=False)
    root = Node("root")
    root.children.append(Node("leaf", parent=root))
    core = QueueCore(Policy())
    timer = wrap(TimerSet(key="cycle", at=5.0), source="queue", cause=None, index=0, at=1.0)
    back = decode(encode({"tree": root, "core": core, "handle": core.handle, "timer": timer, "seen": Seen(3)}))
    tree = back["tree"]
    assert type(tree) is Node and tree.name == "root" and tree.parent is None
    assert tree.children[0].name == "leaf" and tree.children[0].parent is tree
    assert back["timer"] == timer and back["timer"].payload.at == 5.0
    assert back["handle"].__self__ is back["core"] and back["handle"].__func__ is QueueCore.handle
    assert back["seen"].capacity == 3


def _blob(shapes: list, root) -> bytes:
    return json.dumps({"format": statecodec.FORMAT, "shapes": shapes, "root": root}).encode()


@pytest.mark.parametrize("shapes, root, said", [
    ([["builtins:print", []]], ["i", 0, 0, []], "builtins:print"),
    ([["os:_wrap_close", []]], ["i", 0, 0, []], "os:_wrap_close"),
    ([["subprocess:Popen", ["args"]]], ["i", 0, 0, ["id"]], "subprocess:Popen"),
    ([["shared.runtime.bus.app:InboxReader", []]], ["i", 0, 0, []], "shared.runtime.bus.app:InboxReader"),
    ([["services.queue.core:QueueCore.__init__", []]], ["i", 0, 0, []], "QueueCore.__init__"),
    ([["services.queue.core:Ledger", []]], ["i", 0, 0, []], "no state class"),  # imported there, defined elsewhere
    ([], ["e", "enum:Enum", 1], "enum:Enum"),
    ([], ["p", 0, "pydantic:BaseModel", ["d", 1, []], None, ["s", 2, []], None], "pydantic:BaseModel"),
    ([], ["m", ["l", 0, []], "append"], "may not name the method"),
    ([], ["a", 0, "|O", [1], "AAAAAAAAAAA="], "dtype"),
    ([], ["r", 7], "unknown object"),
    ([], ["x", 1], "unknown state node"),
    ([], ["d", 0, ["key without value"]], "key, value pairs"),
    ([], ["l", 0, "no list"], "items must be a list"),
])
def test_a_blob_naming_anything_else_is_refused(shapes, root, said):
    with pytest.raises(StateError, match=said.replace(".", r"\.")):
        decode(_blob(shapes, root))


def test_a_class_of_a_module_not_loaded_is_not_imported_to_resolve_it():
    with pytest.raises(StateError, match="already loaded"):
        decode(_blob([["services.nowhere:Thing", []]], ["i", 0, 0, []]))


@pytest.mark.parametrize("blob", [b"", b"\x80\x04pickle", b'{"format": 99, "shapes": [], "root": 1}', b"[1, 2]",
                                  b'{"format": 1, "root": 1}'])
def test_garbage_and_other_formats_are_refused_in_one_line(blob):
    with pytest.raises(StateError) as caught:
        decode(blob)
    assert "\n" not in str(caught.value)


def test_what_cannot_be_written_is_said():
    with pytest.raises(StateError, match="builtins.function"):
        encode({"f": lambda: 1})
    with pytest.raises(StateError, match="dtype object"):
        encode(np.array([object()]))


def test_text_utf8_cannot_hold_and_deep_nesting_still_come_back():
    """The fast JSON writer refuses half a surrogate pair (UTF-8 cannot hold it) and nesting past its
    depth limit; such a state is written by the standard library's encoder instead, and decodes the same."""
    deep: list = []
    for _ in range(400):
        deep = [deep]
    state = {"half a pair": "a\ud800b", "accented": "é", "deep": deep}
    assert decode(encode(state)) == state


@pytest.mark.parametrize("opener, closer", [("[", "]"), ('{"a":', "}")], ids=["lists", "mappings"])
def test_a_blob_nested_past_the_parsers_depth_is_a_state_error_not_a_recursion_error(opener, closer):
    """json.loads raises RecursionError on it, which is no ValueError: it used to escape decode."""
    inner = opener * 100_000 + ("1" if closer == "}" else "") + closer * 100_000
    with pytest.raises(StateError, match="nested too deeply"):
        decode(('{"format": 1, "shapes": [], "root": %s}' % inner).encode())
