"""A service's state as JSON and back, without running anyone's code (snapshots).

A snapshot is read from a Kafka topic, so whoever can write that topic chooses its bytes. A pickle
would let them name any callable and have it called on load; this encoding cannot. It is JSON of a
tree of tagged nodes that say what each value was — a list, a dict, a set, an instance of one of
muster's state classes with its fields — and decoding only ever:

- makes containers (list, tuple, dict, OrderedDict, Counter, set, frozenset, deque) and numbers,
  text and bytes (a mapping that holds only JSON, such as a watched object, is written as that JSON);
- makes an instance of a class that muster's pure modules define (``services.*`` and ``shared.*``,
  never an adapter: ``ADAPTERS``), already imported by the process (nothing is imported on a
  snapshot's say-so), *without calling its ``__init__``*: the instance is allocated and its fields
  set, as ``copy.copy`` does; a pydantic model's fields go through pydantic's own ``__setstate__``;
- binds a method of such an instance (a core keeps its policy's ``answers_to``), if its class
  defines it as a plain function;
- looks an enum member up by value, and makes a numpy array or scalar of a plain numeric dtype from
  its bytes.

Anything else — a function, a class from elsewhere, a field that is no node — is a ``StateError``
naming it. What comes back has the same shape as what went in, including shared references and
cycles (an object reachable twice is one object after decoding: nodes carry a reference number the
first time and are referred to by it afterwards), so a restored core decides as the original.

The format is versioned (``FORMAT``); a blob of another format is refused.

A pydantic model is written through pydantic's layout, not its API: its fields, extra, fields set
and private attributes are what ``BaseModel.__getstate__`` returns under the keys ``__dict__``,
``__pydantic_extra__``, ``__pydantic_fields_set__`` and ``__pydantic_private__``, and decoding hands
``__setstate__`` the same keys (it reads each with a default: a key it expected under another name
would come back empty, one the encoder does not write would be lost, and neither would fail); the
document itself is written by ``pydantic_core.to_json``. So this codec holds to the pin of the
kernel's craft on pydantic's internals, ``shared.kernel.fastmodel.PYDANTIC_VERSION``, and
tests/unit/shared/test_fastmodel.py fails loudly when a pydantic of another layout comes: a sample
of every payload type must have exactly those state keys, and must come back equal through
``encode`` and ``decode``, alone and enveloped. Upgrading pydantic means running that test.
"""

from __future__ import annotations

import base64
import enum
import json
import math
import sys
import types
from collections import Counter, OrderedDict, deque
from itertools import chain
from typing import Any, Callable, Iterable

import numpy as np
import pydantic
import pydantic_core

FORMAT = 1
"""This encoding's layout; bump it when a node's shape changes (older blobs are then refused)."""

ALLOWED_PACKAGES = ("services.", "shared.")
ADAPTERS = ("shared.runtime.bus", "shared.cli", "shared.history", "shared.observability.metrics",
            "shared.observability.tracing.otel", "shared.observability.tracing.live", "shared.kubernetes",
            "shared.parts", "services.reconciler.ingest")
"""Modules whose classes a snapshot may never name: they talk to the outside world."""

_NUMERIC_KINDS = frozenset("biufc")
"""numpy dtype kinds a snapshot may hold (bool, integers, floats, complex): never object arrays."""


class StateError(ValueError):
    """A state that cannot be encoded, or a blob that is no state this codec made: why, in one line."""


# --------------------------------------------------------------------------- encoding
_INF = (float("inf"), float("-inf"))
_SCALARS = frozenset({str, int, bool, float, type(None)})


class _Encoder:
    def __init__(self, *, raw: bool = True) -> None:
        self.raw_ok = raw
        """Write JSON-native mappings as they are (``_native``)."""
        self.raw: set[int] = set()
        """Ids of the containers written as they are."""
        self.shared_raw = False
        """A container written as it is is reachable twice: encode again without ``raw``."""
        self.refs: dict[int, int] = {}
        self.shapes: dict[tuple[type, tuple[str, ...]], int] = {}
        self.shape_list: list[list[Any]] = []
        self._plain: dict[type, Callable[[Any], Any]] = {
            list: self._list, tuple: self._tuple, dict: self._dict, set: self._set, frozenset: self._frozenset,
            OrderedDict: self._ordered, Counter: self._counter, deque: self._deque, bytes: self._bytes,
        }

    def node(self, x: Any) -> Any:
        t = type(x)
        if x is None or t is str or t is bool or t is int:
            return x
        if t is float:
            return x if x == x and x not in (float("inf"), float("-inf")) else ["f", repr(x)]
        ref = self.refs.get(id(x))
        if ref is not None:
            return ["r", ref]
        if id(x) in self.raw:
            self.shared_raw = True
        plain = self._plain.get(t)
        if plain is not None:
            return plain(x)
        if isinstance(x, enum.Enum):
            return ["e", _class_name(t), self.node(x.value)]
        if isinstance(x, np.ndarray):
            return self._array(x)
        if isinstance(x, np.generic):
            if x.dtype.kind not in _NUMERIC_KINDS:
                raise StateError(f"cannot encode a numpy scalar of dtype {x.dtype}")
            return ["g", x.dtype.str, _b64(x.tobytes())]
        if isinstance(x, pydantic.BaseModel):
            return self._model(x)
        if t is types.MethodType:
            return self._method(x)
        if isinstance(x, (list, tuple, dict, set, frozenset, str, int, float, bytes)):
            raise StateError(f"cannot encode {t.__module__}.{t.__qualname__}: a subclass of a builtin")
        return self._object(x)

    def _new(self, x: Any) -> int:
        ref = self.refs[id(x)] = len(self.refs)
        return ref

    def _each(self, items: Iterable[Any]) -> list[Any]:
        """``items`` as nodes: as they are when all are text, numbers or None (a dedupe window's ids,
        a key tuple), which saves a call per item; else one by one."""
        out = list(items)
        kinds = set(map(type, out))
        if kinds <= _SCALARS and (float not in kinds or all(map(math.isfinite, (v for v in out if type(v) is float)))):
            return out
        return [self.node(i) for i in out]

    def _list(self, x: list[Any]) -> Any:
        ref = self._new(x)
        return ["l", ref, self._each(x)]

    def _tuple(self, x: tuple[Any, ...]) -> Any:
        kinds = set(map(type, x))
        if kinds <= _SCALARS and float not in kinds:  # immutable all through: no reference to keep
            return ["T", list(x)]
        ref = self._new(x)
        return ["t", ref, self._each(x)]

    def _pairs(self, x: dict[Any, Any]) -> list[Any]:
        return self._each(chain.from_iterable(x.items()))

    def _dict(self, x: dict[Any, Any]) -> Any:
        if self.raw_ok:
            ids: set[int] = set()
            if self._native(x, ids):
                self.raw |= ids
                return x
        ref = self._new(x)
        return ["d", ref, self._pairs(x)]

    def _native(self, x: Any, ids: set[int]) -> bool:
        """True when ``x``, a dict or list, holds JSON only (text keys, finite numbers, text, booleans,
        None, dicts and lists of them) none of which is reachable from elsewhere so far: as a watch
        event's object decodes. Such a mapping is written as it is, a fast path for the objects a core
        keeps (the tagged nodes cost a function call per value); the ids of what it holds go to
        ``ids``. One reached again later sets ``shared_raw``, and ``encode`` starts over without it."""
        key = id(x)
        if key in self.refs:
            return False
        if key in self.raw or key in ids:
            self.shared_raw = True
            return False
        ids.add(key)
        values: Iterable[Any] = x
        if type(x) is dict:
            for k in x:
                if type(k) is not str:
                    return False
            values = x.values()
        for v in values:
            t = type(v)
            if t is str or t is int or t is bool or v is None:
                continue
            if t is float:
                if v != v or v in _INF:
                    return False
                continue
            if (t is not dict and t is not list) or not self._native(v, ids):
                return False
        return True

    def _ordered(self, x: OrderedDict[Any, Any]) -> Any:
        ref = self._new(x)
        return ["o", ref, self._pairs(x)]

    def _counter(self, x: Counter[Any]) -> Any:
        ref = self._new(x)
        return ["c", ref, self._pairs(x)]

    def _set(self, x: set[Any]) -> Any:
        ref = self._new(x)
        return ["s", ref, self._each(x)]

    def _frozenset(self, x: frozenset[Any]) -> Any:
        ref = self._new(x)
        return ["z", ref, self._each(x)]

    def _deque(self, x: deque[Any]) -> Any:
        ref = self._new(x)
        return ["q", ref, x.maxlen, self._each(x)]

    def _bytes(self, x: bytes) -> Any:
        return ["b", _b64(x)]

    def _array(self, x: np.ndarray) -> Any:
        if x.dtype.kind not in _NUMERIC_KINDS:
            raise StateError(f"cannot encode a numpy array of dtype {x.dtype}")
        ref = self._new(x)
        return ["a", ref, x.dtype.str, list(x.shape), _b64(np.ascontiguousarray(x).tobytes())]

    def _model(self, x: pydantic.BaseModel) -> Any:
        ref = self._new(x)
        state = x.__getstate__()
        return ["p", ref, _class_name(type(x)), self.node(state["__dict__"]), self.node(state["__pydantic_extra__"]),
                self.node(state["__pydantic_fields_set__"]), self.node(state["__pydantic_private__"])]

    def _method(self, x: types.MethodType) -> Any:
        name = x.__func__.__name__
        if getattr(type(x.__self__), name, None) is not x.__func__:
            raise StateError(f"cannot encode the bound method {x.__qualname__}: not its class's own")
        return ["m", self.node(x.__self__), name]

    def _object(self, x: Any) -> Any:
        t = type(x)
        _check_class(t)
        ref = self._new(x)
        names: list[str] = list(getattr(x, "__dict__", ()))
        for cls in t.__mro__:
            for slot in cls.__dict__.get("__slots__", ()):
                if slot not in ("__dict__", "__weakref__") and hasattr(x, slot):
                    names.append(slot)
        fields = tuple(names)
        key = (t, fields)
        shape = self.shapes.get(key)
        if shape is None:
            shape = self.shapes[key] = len(self.shape_list)
            self.shape_list.append([_class_name(t), list(fields)])
        return ["i", ref, shape, [self.node(getattr(x, name)) for name in fields]]


def encode(state: Any) -> bytes:
    """``state`` as JSON bytes (see the module docstring); ``StateError`` names what it cannot hold."""
    encoder = _Encoder()
    root = encoder.node(state)
    if encoder.shared_raw:  # a mapping written as JSON is reachable twice: keep it one object
        encoder = _Encoder(raw=False)
        root = encoder.node(state)
    doc = {"format": FORMAT, "shapes": encoder.shape_list, "root": root}
    try:  # pydantic-core's writer: the same JSON as ``json``'s for much less CPU (a snapshot's budget is CPU)
        return pydantic_core.to_json(doc)
    except pydantic_core.PydanticSerializationError:  # text UTF-8 cannot hold (half a surrogate pair): escaped
        return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


# --------------------------------------------------------------------------- decoding
class _Decoder:
    def __init__(self, shapes: list[Any]) -> None:
        self.refs: dict[int, Any] = {}
        self.shapes = [self._shape(s) for s in shapes]
        self._tags: dict[str, Callable[[list[Any]], Any]] = {
            "r": self._ref, "f": self._float, "l": self._list, "t": self._tuple, "T": self._plain_tuple, "d": self._dict,
            "o": self._ordered, "c": self._counter, "s": self._set, "z": self._frozenset, "q": self._deque,
            "b": self._bytes, "e": self._enum, "a": self._array, "g": self._scalar, "p": self._model,
            "i": self._object, "m": self._method,
        }

    @staticmethod
    def _shape(raw: Any) -> tuple[type, list[str]]:
        if not (isinstance(raw, list) and len(raw) == 2 and isinstance(raw[0], str) and isinstance(raw[1], list)
                and all(isinstance(n, str) for n in raw[1])):
            raise StateError(f"malformed class shape {raw!r:.80}")
        cls = _resolve(raw[0])
        if issubclass(cls, (pydantic.BaseModel, enum.Enum, tuple, list, dict, set, frozenset, str, bytes, int,
                            float)):
            raise StateError(f"{raw[0]} cannot be made field by field")
        return cls, raw[1]

    def node(self, n: Any) -> Any:
        if type(n) is not list:
            if n is None or type(n) in (str, bool, int, float, dict):
                return n  # a dict is a JSON-native mapping, written as it was (``_Encoder._native``)
            raise StateError(f"unexpected {type(n).__name__} in a state")
        if not n or type(n[0]) is not str or n[0] not in self._tags:
            raise StateError(f"unknown state node {n[:1]!r:.60}")
        return self._tags[n[0]](n)

    def _register(self, ref: Any, value: Any) -> Any:
        if type(ref) is not int or ref in self.refs:
            raise StateError(f"bad reference number {ref!r:.30}")
        self.refs[ref] = value
        return value

    def _ref(self, n: list[Any]) -> Any:
        try:
            return self.refs[n[1]]
        except (KeyError, IndexError, TypeError):
            raise StateError(f"reference to an unknown object {n[1:2]!r:.30}") from None

    def _float(self, n: list[Any]) -> float:
        if n[1] not in ("nan", "inf", "-inf"):
            raise StateError(f"not a special float: {n[1]!r:.30}")
        return float(n[1])

    def _items(self, raw: Any) -> list[Any]:
        if type(raw) is not list:
            raise StateError("a container's items must be a list")
        for i in raw:
            if type(i) is list:
                return [self.node(i) for i in raw]
        for i in raw:  # text, numbers, None and JSON mappings are themselves (``node``)
            if not (i is None or type(i) in (str, bool, int, float, dict)):
                raise StateError(f"unexpected {type(i).__name__} in a state")
        return raw

    def _list(self, n: list[Any]) -> list[Any]:
        out: list[Any] = self._register(n[1], [])
        out.extend(self._items(n[2]))
        return out

    def _tuple(self, n: list[Any]) -> tuple[Any, ...]:
        return self._register(n[1], tuple(self._items(n[2])))

    def _plain_tuple(self, n: list[Any]) -> tuple[Any, ...]:
        items = n[1]
        if type(items) is not list or not set(map(type, items)) <= _SCALARS:
            raise StateError("a plain tuple holds text and numbers only")
        return tuple(items)

    def _fill(self, target: Any, raw: Any) -> Any:
        items = self._items(raw)
        if len(items) % 2:
            raise StateError("a mapping needs key, value pairs")
        for i in range(0, len(items), 2):
            target[items[i]] = items[i + 1]
        return target

    def _dict(self, n: list[Any]) -> dict[Any, Any]:
        return self._fill(self._register(n[1], {}), n[2])

    def _ordered(self, n: list[Any]) -> OrderedDict[Any, Any]:
        return self._fill(self._register(n[1], OrderedDict()), n[2])

    def _counter(self, n: list[Any]) -> Counter[Any]:
        return self._fill(self._register(n[1], Counter()), n[2])

    def _set(self, n: list[Any]) -> set[Any]:
        out: set[Any] = self._register(n[1], set())
        out.update(self._items(n[2]))
        return out

    def _frozenset(self, n: list[Any]) -> frozenset[Any]:
        return self._register(n[1], frozenset(self._items(n[2])))

    def _deque(self, n: list[Any]) -> deque[Any]:
        maxlen = n[2]
        if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
            raise StateError("a deque's maxlen must be a count")
        out: deque[Any] = self._register(n[1], deque(maxlen=maxlen))
        out.extend(self._items(n[3]))
        return out

    def _bytes(self, n: list[Any]) -> bytes:
        return _unb64(n[1])

    def _enum(self, n: list[Any]) -> Any:
        cls = _resolve(n[1])
        if not issubclass(cls, enum.Enum):
            raise StateError(f"{n[1]} is no enum")
        try:
            return cls(self.node(n[2]))
        except ValueError as exc:
            raise StateError(str(exc)) from None

    def _array(self, n: list[Any]) -> np.ndarray:
        dtype = _dtype(n[2])
        shape = n[3]
        if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
            raise StateError("an array's shape must be a list of counts")
        try:
            array = np.frombuffer(_unb64(n[4]), dtype=dtype).reshape(shape).copy()
        except ValueError as exc:
            raise StateError(f"array does not fit its shape: {exc}") from None
        return self._register(n[1], array)

    def _scalar(self, n: list[Any]) -> Any:
        try:
            return np.frombuffer(_unb64(n[2]), dtype=_dtype(n[1]))[0]
        except (ValueError, IndexError) as exc:
            raise StateError(f"bad numpy scalar: {exc}") from None

    def _model(self, n: list[Any]) -> pydantic.BaseModel:
        cls = _resolve(n[2])
        if not issubclass(cls, pydantic.BaseModel):
            raise StateError(f"{n[2]} is no pydantic model")
        model = self._register(n[1], cls.__new__(cls))
        fields, extra, fields_set, private = (self.node(part) for part in n[3:7])
        if type(fields) is not dict or not (extra is None or type(extra) is dict) \
                or type(fields_set) is not set or not (private is None or type(private) is dict):
            raise StateError(f"malformed state of {n[2]}")
        model.__setstate__({"__dict__": fields, "__pydantic_extra__": extra, "__pydantic_fields_set__": fields_set,
                            "__pydantic_private__": private})
        return model

    def _method(self, n: list[Any]) -> Any:
        owner, name = self.node(n[1]), n[2]
        cls = type(owner)
        if type(name) is not str or name.startswith("__") or not cls.__module__.startswith(ALLOWED_PACKAGES) \
                or cls.__module__.startswith(ADAPTERS) or not isinstance(getattr(cls, name, None), types.FunctionType):
            raise StateError(f"a state may not name the method {name!r:.40} of {cls.__qualname__}")
        return getattr(owner, name)

    def _object(self, n: list[Any]) -> Any:
        shape = n[2]
        if type(shape) is not int or not 0 <= shape < len(self.shapes):
            raise StateError(f"unknown class shape {shape!r:.30}")
        cls, names = self.shapes[shape]
        obj = self._register(n[1], object.__new__(cls))
        values = self._items(n[3])
        if len(values) != len(names):
            raise StateError(f"{cls.__qualname__} needs {len(names)} fields, the state has {len(values)}")
        for name, value in zip(names, values):
            object.__setattr__(obj, name, value)
        return obj


def decode(blob: bytes) -> Any:
    """The state ``encode`` made of ``blob``; ``StateError`` for anything else (see the module docstring)."""
    try:
        doc = json.loads(blob)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StateError(f"state is no JSON: {exc}") from None
    except RecursionError:  # nested deeper than the parser goes: no state of muster's is
        raise StateError("state is nested too deeply to be read") from None
    if type(doc) is not dict or doc.get("format") != FORMAT:
        found = doc.get("format") if type(doc) is dict else None
        raise StateError(f"state format {found!r:.20}, this muster reads {FORMAT}")
    shapes = doc.get("shapes")
    if type(shapes) is not list:
        raise StateError("state has no class shapes")
    try:
        return _Decoder(shapes).node(doc.get("root"))
    except StateError:
        raise
    except RecursionError:
        raise StateError("malformed state: nested too deeply to be read") from None
    except (IndexError, TypeError, ValueError, AttributeError, KeyError, OverflowError) as exc:
        raise StateError(f"malformed state: {type(exc).__name__}: {exc}"[:300]) from None


# --------------------------------------------------------------------------- helpers
def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _check_class(cls: type) -> None:
    module = cls.__module__
    if not module.startswith(ALLOWED_PACKAGES) or module.startswith(ADAPTERS) or "<locals>" in cls.__qualname__:
        raise StateError(f"a state may not hold {module}.{cls.__qualname__} (only muster's pure state classes)")


def _resolve(name: Any) -> type:
    """The class ``module:qualname`` names, if it is one of muster's pure state classes already loaded."""
    if type(name) is not str or name.count(":") != 1:
        raise StateError(f"malformed class name {name!r:.80}")
    module_name, qualname = name.split(":")
    module = sys.modules.get(module_name)
    if module is None or not module_name.startswith(ALLOWED_PACKAGES) or module_name.startswith(ADAPTERS):
        raise StateError(f"a state may not name {name} (only muster's pure state classes, already loaded)")
    found: Any = module
    for part in qualname.split("."):
        if part.startswith("__"):
            raise StateError(f"a state may not name {name}")
        found = getattr(found, part, None)
    if not isinstance(found, type) or found.__module__ != module_name or found.__qualname__ != qualname \
            or issubclass(found, BaseException):
        raise StateError(f"{name} is no state class of muster's")
    return found


def _dtype(raw: Any) -> np.dtype[Any]:
    if type(raw) is not str or len(raw) > 8:
        raise StateError(f"bad dtype {raw!r:.20}")
    try:
        dtype = np.dtype(raw)
    except TypeError as exc:
        raise StateError(f"bad dtype {raw!r:.20}: {exc}") from None
    if dtype.kind not in _NUMERIC_KINDS:
        raise StateError(f"a state may not hold arrays of dtype {dtype}")
    return dtype


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _unb64(raw: Any) -> bytes:
    if type(raw) is not str:
        raise StateError("bytes must be base64 text")
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError as exc:
        raise StateError(f"bad base64: {exc}") from None
