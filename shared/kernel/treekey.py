"""A key that tells two trees of a watched object apart exactly where ``repr`` would, far more cheaply.

A core that skips reading an object again when the part it reads is unchanged needs a test that
``==`` is not: ``True == 1 == 1.0`` and ``-0.0 == 0.0`` in Python, yet a parser reads ``replicas:
true`` as no integer and ``1.0`` as a float. ``repr`` tells them apart but builds a string of the
whole tree on every watch event (most of which change only a status).

``tree_key`` is ``marshal.dumps(value, 2)``: a type code before every value (``T``, ``i``, ``g``:
True, 1 and 1.0 differ), a float as its eight bytes (-0.0 is not 0.0), a string as its UTF-8, a
dict's items in order, a list apart from a tuple. Version 2, because from version 3 on marshal marks
an object by its reference count and whether it is interned, so two equal trees could be written
differently; version 2 writes a tree as a function of its types and values alone. Equal keys so mean
equal ``repr`` for every tree of dict, list, tuple, str, int, float, bool and None — all a JSON or
YAML document is read into — and a differing key at worst reads a tree again that ``repr`` would have
skipped (two NaNs of different bits). What marshal refuses (a ``datetime`` a YAML timestamp becomes,
a subclass of ``str``) is keyed by its ``repr`` (a ``str``, never equal to a ``bytes`` key). One case
is not told apart: marshal writes any buffer (``bytearray``, ``memoryview``) as ``bytes``; no decoded
or YAML-read object holds one.
"""

from __future__ import annotations

import marshal
from typing import Any

_dumps = marshal.dumps


def tree_key(value: Any) -> bytes | str:
    """A key equal for two values exactly when their ``repr`` is (see the module docstring)."""
    try:
        return _dumps(value, 2)
    except ValueError:  # unmarshallable, or nested too deep: ``repr`` decides (and raises) as before
        return repr(value)
