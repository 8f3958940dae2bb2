"""Input checks that end in one line: pydantic's errors, YAML errors, Kubernetes names and bounds.

pydantic's own text spans several lines and links its documentation; a user needs the field and the
complaint: ``queueing: Input should be 'StrictFIFO' or 'BestEffortFIFO'``. PyYAML's errors span lines
and name ``<unicode string>``; a user needs the file and the line.
"""

from __future__ import annotations

import json
import math
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, TypeGuard, TypeVar

from pydantic import ValidationError


_T = TypeVar("_T")


def one_of(value: object, allowed: Collection[_T]) -> TypeGuard[_T]:
    """``value in allowed``, which tells the type checker that ``value`` is one of them (the strings
    of a ``Literal``, read from user input)."""
    return value in allowed


def first_errors(exc: ValidationError, most: int = 3, *, values: bool = False) -> str:
    """``loc: msg`` of the first ``most`` errors, joined by ``; ``. With ``values``, `` (got VALUE)``
    where the message does not quote it and it is a scalar (a whole mapping would not fit on a line)."""
    parts = []
    for err in exc.errors()[:most]:
        loc = ".".join(str(p) for p in err["loc"])
        text = f"{loc}: {err['msg']}" if loc else err["msg"]
        value = err.get("input")
        if values and isinstance(value, (str, int, float)) and len(quoted(value)) <= 80:
            text += f" (got {quoted(value)})"
        parts.append(text)
    return "; ".join(parts)


# --------------------------------------------------------------------------- Kubernetes input bounds
# What the API server validates (k8s.io/apimachinery/pkg/util/validation), checked again where objects
# enter muster (the cluster link's ingest, scenario loading): an object muster cannot hold is refused
# there with one line, not deep inside a service, a topic or a column.

MAX_DEPTH = 64
"""Deepest nesting of maps and lists taken in an object. The deepest field muster reads (a RayJob's
node affinity values) sits 16 levels down; PyYAML and JSON encoders recurse per level."""

MAX_NODES = 200_000
"""Most maps, lists and scalars in one object or scenario document, counted as if every YAML alias
were expanded: a billion-laughs document is refused after this many, never expanded."""

MAX_BYTES = 512 * 1024
"""Most text (strings and keys, in UTF-8 bytes) one object may carry once ingest kept what muster
reads: well under Kafka's default 1 MB record, above the API server's 256 KiB annotation budget."""

TEXT_CHARS = 4096
"""Most characters of one text muster writes to Kubernetes (an annotation value, an Event's message):
a reason is built from bounded parts (a quoted value is at most 253 characters), and this bound holds
whatever a reason lists, well inside the API server's 256 KiB annotation budget."""


QUOTED_CHARS = 253
"""Most characters of a value a reason quotes (an object name's bound): longer text is cut with ``...``."""


def quoted(value: object) -> str:
    """``repr(value)`` for a reason, at most ``QUOTED_CHARS`` of a text (``shown`` beyond), an integer of
    more than 64 bits by its size: what a user wrote must not make a reason long."""
    if isinstance(value, str):
        return repr(value) if len(value) <= QUOTED_CHARS else shown(value, QUOTED_CHARS)
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit number"
    return repr(value)


_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""C0 controls but tab and newline, DEL, C1 controls (ESC starts ANSI and OSC 8 sequences, CSI is C1's
0x9b), and the bidirectional marks and overrides."""


def printable(text: str) -> str:
    """``text`` with every control character shown as its escape (``\\x1b``), so it prints as itself."""
    if text.isascii() and text.isprintable():  # the common case: names and reasons are plain ASCII
        return text
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                            else f"\\u{ord(m.group()):04x}", text)


def bounded(text: str, most: int = TEXT_CHARS) -> str:
    """``text`` cut to ``most`` characters, ``...`` saying it was cut."""
    return text if len(text) <= most else text[:most - 3] + "..."


_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", re.ASCII)
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII)
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]", re.ASCII)
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", re.ASCII)
_SURROGATE = re.compile("[\ud800-\udfff]")


def shown(text: str, most: int = 60) -> str:
    """``text`` quoted for a one-line error: cut short, lone surrogates and control characters escaped."""
    cut = text if len(text) <= most else text[:most] + "..."
    return repr(cut.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace"))


@lru_cache(maxsize=8192)  # the same names and labels come with every event of an object
def dns1123_subdomain(value: str) -> str | None:
    """Why ``value`` is not a DNS-1123 subdomain (most object names), None if it is."""
    if len(value) > 253:
        return f"{shown(value)} is longer than 253 characters"
    if not _DNS1123_SUBDOMAIN.fullmatch(value):
        return (f"{shown(value)} is not a DNS-1123 subdomain (lower case letters, digits, '-' and '.', "
                "starting and ending with a letter or digit)")
    return None


@lru_cache(maxsize=8192)  # the same names and labels come with every event of an object
def dns1123_label(value: str) -> str | None:
    """Why ``value`` is not a DNS-1123 label (namespaces), None if it is."""
    if len(value) > 63:
        return f"{shown(value)} is longer than 63 characters"
    if not _DNS1123_LABEL.fullmatch(value):
        return (f"{shown(value)} is not a DNS-1123 label (lower case letters, digits and '-', "
                "starting and ending with a letter or digit)")
    return None


@lru_cache(maxsize=8192)  # the same names and labels come with every event of an object
def qualified_name(value: str) -> str | None:
    """Why ``value`` is not a label or annotation key (``[prefix/]name``), None if it is."""
    prefix, _, name = value.rpartition("/")
    if "/" in value and (not prefix or dns1123_subdomain(prefix)):
        return f"{shown(value)} has an invalid prefix (a DNS-1123 subdomain before the '/')"
    if len(name) > 63 or not _QUALIFIED_NAME.fullmatch(name):
        return (f"{shown(value)} is not a qualified name (at most 63 letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit, after an optional DNS subdomain prefix and '/')")
    return None


@lru_cache(maxsize=8192)  # the same names and labels come with every event of an object
def label_value(value: str) -> str | None:
    """Why ``value`` is not a label value, None if it is."""
    if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
        return (f"{shown(value)} is not a label value (at most 63 letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit, or empty)")
    return None


def _c_encoder() -> Callable[[Any, int], Any] | None:
    """The C encoder ``json.dumps`` would build, or None where this Python's private signature differs."""
    make = getattr(json.encoder, "c_make_encoder", None)
    try:
        return make(None, str, json.encoder.encode_basestring, None, ": ", ", ", False, True, True) \
            if make is not None else None
    except TypeError:
        return None


_ENCODE = _c_encoder()
"""``json.dumps(value, ensure_ascii=False, check_circular=False, skipkeys=True, default=str)``'s C encoder,
made once: ``dumps`` with arguments builds a ``JSONEncoder`` and a C encoder on every call, which cost
twice the encoding of a watched object."""


def _json_text(value: Any) -> str:
    """``value`` as JSON text (see ``_ENCODE``): every text as it is, keys that are no text, number,
    boolean or None skipped, anything JSON has no form for as its ``str``."""
    if _ENCODE is None:
        return json.dumps(value, ensure_ascii=False, check_circular=False, skipkeys=True, default=str)
    return "".join(_ENCODE(value, 0))


def tree_problem(value: Any, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES,
                 max_bytes: int | None = None, finite: bool = False) -> str | None:
    """Why a decoded JSON/YAML value is too deep, too large, holds a key that is no text, text no encoder
    takes (lone surrogates), an integer ``int`` will not write or, with ``finite``, a NaN or infinity (which
    JSON stores as null: what is stored would not be what was decided on), None if it is fine. Iterative, and a shared (aliased) branch counts every time it is
    reached, so the walk stops after ``max_nodes`` however far aliases would expand.

    It runs on every watch event, so the Python walk visits maps and lists only; the text is checked
    in one pass of the C JSON encoder and one UTF-8 encoding."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    nodes = 1
    while stack:
        item, depth = stack.pop()
        kind_of_item = dict if isinstance(item, dict) else list
        children: Any = item.values() if kind_of_item is dict else item
        if depth > max_depth:
            return f"nested deeper than {max_depth} levels"
        nodes += len(children)
        if nodes > max_nodes:
            return f"more than {max_nodes} values (YAML aliases count each time they are used)"
        below = depth + 1
        if kind_of_item is dict:
            for key in item:
                if type(key) is not str:
                    return (f"a key is {'null' if key is None else type(key).__name__}, not a string "
                            "(JSON and the API server take text keys only)")
        for child in children:
            kind = type(child)  # most values are text: two comparisons, no ``isinstance``
            if kind is dict or kind is list or (kind is not str and isinstance(child, (dict, list))):
                stack.append((child, below))
    try:
        text = _json_text(value)
    except ValueError:  # ``int`` refuses to write more than 4,300 digits (``sys.get_int_max_str_digits``)
        return f"an integer of more than {sys.get_int_max_str_digits():,} digits"
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return f"text {shown(text[max(exc.start - 20, 0):exc.end + 20])} is not valid Unicode (a lone surrogate)"
    if max_bytes is not None and size > max_bytes:
        return f"larger than {max_bytes // 1024} KiB of text"
    if finite and ("NaN" in text or "Infinity" in text):  # the encoder's words for them
        where = _non_finite(value)
        if where is not None:
            return f"{where} is not a finite number (JSON and the API server hold no NaN or infinity)"
    return None


def _non_finite(value: Any) -> str | None:
    """Where a float NaN or infinity is in ``value`` and which (walked only when its JSON text suggests one)."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return f"{where.lstrip('.')}: {item}" if where else str(item)
        if isinstance(item, dict):
            stack.extend((f"{where}.{k}", v) for k, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(item))))
    return None


def object_problem(obj: Mapping[str, Any], *, require_name: bool = True) -> str | None:
    """Why the API server would refuse ``obj``'s name, namespace, labels or annotation keys (muster
    reads these as identities and selectors), None if it would not. Cluster-scoped kinds have no
    namespace; names of every kind muster reads are DNS-1123 subdomains, as ``ValidateObjectMeta``
    checks them for Pods, Nodes, CRDs and PriorityClasses."""
    meta = obj.get("metadata")
    if type(meta) is not dict and not isinstance(meta, Mapping):
        return "metadata: missing" if require_name or meta is not None else None
    name = meta.get("name")
    if name is not None or require_name:
        if not isinstance(name, str) or not name:
            return "metadata.name: missing"
        problem = dns1123_subdomain(name)
        if problem:
            return f"metadata.name: {problem}"
    namespace = meta.get("namespace")
    if namespace is not None:
        if not isinstance(namespace, str):
            return "metadata.namespace: not a string"
        problem = dns1123_label(namespace) if namespace else None
        if problem:
            return f"metadata.namespace: {problem}"
    for field in ("labels", "annotations"):
        values = meta.get(field)
        if values is None:
            continue
        if type(values) is not dict and not isinstance(values, Mapping):
            return f"metadata.{field}: not a mapping"
        for key, value in values.items():
            if type(key) is not str and not isinstance(key, str):
                return f"metadata.{field}: key {key!r} is not a string"
            problem = qualified_name(key)
            if problem:
                return f"metadata.{field}: {problem}"
            if type(value) is not str and not isinstance(value, str):
                return f"metadata.{field}.{key}: {shown(repr(value))} is not a string"
            problem = label_value(value) if field == "labels" else None
            if problem:
                return f"metadata.labels.{key}: {problem}"
    return None


POD_TEXT_FIELDS = ("nodeName", "schedulerName", "priorityClassName", "runtimeClassName")
"""Pod spec fields muster reads as names (keys of its books, the node a pod is bound to)."""


def pod_text_problem(obj: Mapping[str, Any]) -> str | None:
    """Why the API server's schema would refuse a Pod's ``POD_TEXT_FIELDS`` (a list for ``nodeName``), in
    its words; None for any other kind or a pod whose fields are text."""
    spec = obj.get("spec") if obj.get("kind") == "Pod" else None
    if type(spec) is not dict:
        return None
    for field in POD_TEXT_FIELDS:
        value = spec.get(field)
        if value is not None and type(value) is not str:
            return f"spec.{field}: Invalid value: {type(value).__name__!r}: spec.{field} in body must be of type string"
    return None


def read_text(path: str | Path, what: str, error: type[Exception]) -> str:
    """A file the user named as text (a policy, a scenario, manifests), read as UTF-8; ``error`` with
    one line naming it when it cannot be read or is not text (a binary file would otherwise end in
    ``UnicodeDecodeError``'s traceback): ``cannot read policy p.yaml: not UTF-8 text (byte 0x89 at offset 0)``."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"cannot read {what} {path}: not UTF-8 text "
                    f"(byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") from None


def yaml_error(exc: BaseException, origin: str, *, within: str = "") -> str:
    """PyYAML's error on one line: ``FILE:LINE:COLUMN: malformed YAML: problem (context)``; with
    ``within`` (YAML inside a field), ``FILE: FIELD: malformed YAML: problem (context, line L column C of FIELD)``."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or ["not YAML"])[0]
    notes = [str(getattr(exc, "context", None) or "")]
    if within and mark is not None:
        notes.append(f"line {mark.line + 1} column {mark.column + 1} of {within}")
    note = ", ".join(n for n in notes if n)
    where = (f"{origin}: {within}" if within else
             f"{origin}:{mark.line + 1}:{mark.column + 1}" if mark is not None else origin)
    return " ".join(f"{where}: malformed YAML: {problem}{f' ({note})' if note else ''}".split())
