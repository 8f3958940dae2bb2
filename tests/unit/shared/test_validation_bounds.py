import json

import pytest

from shared.kernel.validation import _json_text, tree_problem


@pytest.mark.parametrize("value", [
    {"a": [1, 2.5, float("nan"), float("inf"), None, True, "é\u2028\x00", {"k": "v"}]},
    {1: "int key", 2.5: "float key", None: "none key", True: "bool key", (1, 2): "skipped", "s": "text"},
    {"object": object.__new__(type("Opaque", (), {"__str__": lambda self: "opaque"}))},
    ["\ud800 lone surrogate"], "text", 3,
])
def test_one_encoder_made_once_writes_what_dumps_writes(value):
    """``tree_problem`` measures text with a C encoder it makes once; it must write exactly what
    ``json.dumps`` with ``tree_problem``'s old arguments wrote, or the byte bound would move."""
    assert _json_text(value) == json.dumps(value, ensure_ascii=False, check_circular=False, skipkeys=True,
                                           default=str)


def test_byte_bound_is_exact_at_the_limit():
    overhead = len(json.dumps({"k": ""}, ensure_ascii=False))
    assert tree_problem({"k": "x" * (1000 - overhead)}, max_bytes=1000) is None
    assert tree_problem({"k": "x" * (1001 - overhead)}, max_bytes=1000) == "larger than 0 KiB of text"
    assert tree_problem({"k": "é" * 10}, max_bytes=len('{"k": ""}') + 19) is not None  # UTF-8 bytes, not characters
