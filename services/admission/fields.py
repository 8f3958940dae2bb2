"""Typed reads of untrusted Kubernetes dicts: every failure is an ``Invalid`` naming the field and value.

Admission never raises on user input; parsers raise ``Invalid`` and the core turns it into a
Rejected event. Keeping the type checks here lets the dialect parsers read like the manifests.
"""

import math
import sys
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from shared.kernel import kube, quantity as q
from shared.kernel.validation import quoted

_MISSING: Any = object()


class Invalid(ValueError):
    """User input admission cannot accept; ``reason`` names the field and the value."""

    def __init__(self, reason: str, subject: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.subject = subject
        """For queue objects: which queue (tree node) the reason is about, when it is one node."""


def show(value: object) -> str:
    """A value as a reason quotes it: strings quoted and cut short (``validation.quoted``), numbers of
    more than 64 bits by their size, containers by kind (never a dump of a spec). A reason is copied
    into annotations, Events and the log: the value a user wrote must not make it long."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return quoted(value)
    if isinstance(value, int):
        return str(value) if value.bit_length() <= 64 else quoted(value)
    if isinstance(value, (float, Decimal)):
        return str(value)
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return type(value).__name__


def mapping(value: object, where: str) -> Mapping[str, Any]:
    """A required mapping (missing and null are refused)."""
    if value is None:
        raise Invalid(f"{where}: missing")
    if type(value) is not dict and not isinstance(value, Mapping):  # dict first: the ABC check runs a Python frame
        raise Invalid(f"{where}: {show(value)} is not a mapping")
    return value


def opt_mapping(value: object, where: str) -> Mapping[str, Any]:
    """An optional mapping: missing or null reads as empty."""
    return {} if value is None else mapping(value, where)


def opt_list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise Invalid(f"{where}: {show(value)} is not a list")
    return value


INT32_MAX = 2**31 - 1
"""Replicas, minMember, weights, priorities: the Kubernetes and CRD fields muster reads are ``int32``
(the API server refuses more), so a larger count is refused here before it multiplies a quantity."""


def integer(value: object, where: str, *, default: int, minimum: int | None = 0, maximum: int | None = INT32_MAX) -> int:
    """An integer field (a whole float is accepted, as JSON decoders produce them); None → default."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Invalid(f"{where}: {show(value)} is not an integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise Invalid(f"{where}: {show(value)} is not an integer")
        value = int(value)
    text = str(value) if value.bit_length() <= 64 else f"a {value.bit_length()}-bit number"
    if minimum is None and value < -INT32_MAX - 1:
        raise Invalid(f"{where}: {text} is less than {-INT32_MAX - 1}")
    if minimum is not None and value < minimum:
        raise Invalid(f"{where}: {text} is {'negative' if minimum == 0 else f'less than {minimum}'}")
    if maximum is not None and value > maximum:
        raise Invalid(f"{where}: {text} is more than {maximum}")
    return value


def quantities(value: object, where: str) -> dict[str, int]:
    """A ``{resource: quantity}`` map in milli-units; a bad entry is ``Invalid`` naming ``where.<resource>``.

    ``shared.kernel.quantity`` raises ``QuantityError`` for what Kubernetes refuses, but non-finite or
    astronomically large numbers (YAML ``.inf``/``.nan``, ``1e1000000``) escape it as arithmetic
    errors; those are not quantities either.
    """
    out: dict[str, int] = {}
    for name, raw in opt_mapping(value, where).items():
        try:
            out[q.canonical_name(str(name))] = q.parse_quantity(raw)
        except q.QuantityError as exc:
            raise Invalid(f"{where}.{name}: {exc}") from None
        except (ArithmeticError, ValueError):
            raise Invalid(f"{where}.{name}: {show(raw)} is not a quantity") from None
    return out


def number(value: object, where: str) -> float | int:
    """A finite number a float64 field holds (KAI's quotas and weights are ``float64`` in its CRD):
    a boolean, text, NaN, infinity or an integer beyond a float's range is ``Invalid`` saying which."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Invalid(f"{where}: {show(value)} is not a number")
    if isinstance(value, int):
        if abs(value) > _FLOAT_MAX:
            raise Invalid(f"{where}: {show(value)} is too large for a number (at most about 1.8e308)")
        return value
    if not math.isfinite(value):
        raise Invalid(f"{where}: {show(value)} is not a number")
    return value


_FLOAT_MAX = int(sys.float_info.max)


def boolean(value: object, where: str, *, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise Invalid(f"{where}: {show(value)} is not true or false")
    return value


def string(value: object, where: str, *, default: str = "") -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise Invalid(f"{where}: {show(value)} is not a string")
    return value


def string_map(value: object, where: str) -> dict[str, str]:
    """Labels, annotations, nodeSelector: string → string."""
    out: dict[str, str] = {}
    for k, v in opt_mapping(value, where).items():
        if not isinstance(v, str):
            raise Invalid(f"{where}.{k}: {show(v)} is not a string")
        out[str(k)] = v
    return out


def metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return opt_mapping(obj.get("metadata"), "metadata")


def labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return string_map(metadata(obj).get("labels"), "metadata.labels")


def annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    return string_map(metadata(obj).get("annotations"), "metadata.annotations")


def not_refused(obj: Mapping[str, Any]) -> None:
    """An object ingest refused (``shared.kernel.kube.REFUSED``) is ``Invalid`` with ingest's reason."""
    reason = kube.refused(obj)
    if reason is not None:
        raise Invalid(f"refused at ingest: {reason}")
