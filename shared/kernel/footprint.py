"""How much a service keeps: the object graph behind a core, measured without a profiler.

A long-running service must keep state in proportion to the objects alive in the cluster, never to
its history. ``retained`` walks everything reachable from a core (its dicts, lists, sets,
instances, arrays) once and reports the bytes they occupy and how many entries their containers
hold. The entry count is exact and deterministic (the unit tests compare it with a baseline); the
bytes are what ``make bench``'s soak plots against finished jobs.
"""

from __future__ import annotations

import gc
import sys
import types
from dataclasses import dataclass
from typing import Any, Iterable

_OPAQUE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.CodeType,
           types.MethodType, types.FrameType)
"""Reachable but not state: classes, modules and code are shared by every instance."""

_CONTAINERS = (dict, list, set, frozenset, tuple)


@dataclass(frozen=True)
class Footprint:
    bytes: int
    """``sys.getsizeof`` summed over every object reachable once (numpy arrays include their data)."""
    entries: int
    """Items held by every reachable dict, list, set and tuple (and anything with ``__len__`` of those)."""
    objects: int


def retained(root: Any, *, exclude: Iterable[Any] = ()) -> Footprint:
    """The footprint of everything reachable from ``root``, each object once; ``exclude`` (and what
    only it reaches) is left out — the policy every core shares, say."""
    seen: set[int] = {id(x) for x in exclude}
    stack = [root]
    size = entries = count = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _OPAQUE):
            continue
        seen.add(id(obj))
        count += 1
        size += sys.getsizeof(obj)
        if isinstance(obj, _CONTAINERS) or type(obj).__name__ == "deque":
            entries += len(obj)
        stack.extend(gc.get_referents(obj))
    return Footprint(size, entries, count)
