"""Kubernetes resource quantities as exact integers.

Every amount is held in *milli-units* (``cpu: "1"`` is 1000, ``memory: 1Gi`` is 1024**3 * 1000),
the same fixed-point Kubernetes uses internally (``MilliValue``), so sums never drift and
comparisons are exact. ``Resources`` is a plain ``dict[str, int]`` of such amounts.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Mapping

from shared.kernel.validation import quoted

Resources = dict[str, int]

_BINARY = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5, "Ei": 1024**6}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
            "P": Decimal(10**15), "E": Decimal(10**18)}
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?")
"""apimachinery's ``resource.Quantity`` grammar (``quantity.go``): a signed decimal number, then a binary
suffix, a decimal suffix or an ``e``/``E`` exponent, never both (``1e3m`` is refused), ASCII digits only."""

MAX_MILLI = 2**63 - 1
"""The largest amount muster holds, in milli-units: a signed 64-bit integer, like Kubernetes'
``int64Amount`` and the store's ``BIGINT`` columns. Kubernetes caps a quantity at 2**63-1 *units*;
muster refuses one whose milli-value does not fit (above about 9.2e15 units: 8 PiB of memory, 9.2
quadrillion CPUs) rather than overflow a sum or a column later."""

MAX_TEXT = 64
"""The longest quantity string taken. The canonical form of any amount up to ``MAX_MILLI`` is at most
22 characters; longer text is padding (``0000...1``) or an amount out of range, and parsing a
4,000-digit number costs more than a watch event is worth."""

#: Resource names users write that mean the same thing (KAI's queue speaks of ``gpu``).
ALIASES = {"gpu": "nvidia.com/gpu", "gpus": "nvidia.com/gpu"}
GPU = "nvidia.com/gpu"
CPU = "cpu"
MEMORY = "memory"
PODS = "pods"


class QuantityError(ValueError):
    """A quantity string that Kubernetes would refuse."""


def canonical_name(name: str) -> str:
    return ALIASES.get(name, name)


_PARSED: dict[str, int] = {}
"""Strings already parsed (non-negative ones): a cluster's pods ask for the same few quantities
again and again, and every watch event of a pod reads them (in a replay, a visible part of its time)."""
_PARSED_MAX = 4096


def parse_quantity(value: object, *, allow_negative: bool = False) -> int:
    """Parse ``"500m"``, ``"4Gi"``, ``2``, ``"1e3"`` into milli-units (rounded up, as Kubernetes does)."""
    if type(value) is str:
        known = _PARSED.get(value)
        if known is not None:
            return known
        milli = _parse_quantity(value, allow_negative=allow_negative)
        if milli >= 0:
            if len(_PARSED) >= _PARSED_MAX:
                _PARSED.clear()
            _PARSED[value] = milli
        return milli
    return _parse_quantity(value, allow_negative=allow_negative)


def _parse_quantity(value: object, *, allow_negative: bool) -> int:
    if isinstance(value, bool):
        raise QuantityError(f"{quoted(value)} is not a quantity")
    if isinstance(value, int):
        if abs(value) > MAX_MILLI:
            raise QuantityError(_too_large(value if value.bit_length() < 128 else f"{value.bit_length()}-bit integer"))
        amount = Decimal(value)
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(f"{quoted(value)} is not a finite quantity")
        amount = Decimal(repr(value))
    elif isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise QuantityError(f"{value[:20]!r}... ({len(value)} characters) is not a quantity muster accepts "
                                f"(at most {MAX_TEXT} characters)")
        match = _QUANTITY.fullmatch(value.strip())  # Quantity.UnmarshalJSON trims spaces
        if not match:
            raise QuantityError(f"{quoted(value)} is not a quantity")
        number, exponent, suffix = match.group(1), match.group(2) or "", match.group(3) or ""
        try:
            amount = Decimal(number + exponent) * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix])
        except ArithmeticError:
            raise QuantityError(f"{quoted(value)} is not a quantity") from None
    else:
        raise QuantityError(f"{quoted(value)} is not a quantity")
    if not amount.is_finite():
        raise QuantityError(f"{quoted(value)} is not a finite quantity")
    if amount < 0 and not allow_negative:
        raise QuantityError(f"{quoted(value)} is negative")
    if amount and amount.adjusted() > 18:  # decided on the exponent: 1e999990 never becomes an int
        raise QuantityError(_too_large(value))
    try:
        milli = int((amount * 1000).to_integral_value(rounding="ROUND_CEILING"))
    except ArithmeticError:
        raise QuantityError(_too_large(value)) from None
    if not -MAX_MILLI <= milli <= MAX_MILLI:
        raise QuantityError(_too_large(value))
    return milli


def _too_large(value: object) -> str:
    return f"{quoted(value)} is too large (muster holds at most {MAX_MILLI // 1000} units, 2**63-1 milli-units)"


def check_total(res: Mapping[str, int], where: str) -> None:
    """Refuse a sum that no longer fits a signed 64-bit column (a gang of huge pods, a node count)."""
    for name in sorted(res):
        if abs(res[name]) > MAX_MILLI:
            raise QuantityError(f"{where}.{name}: the total {res[name] // 1000} is too large "
                                f"(muster holds at most {MAX_MILLI // 1000} units)")


def format_quantity(name: str, milli: int) -> str:
    """Render milli-units the way ``kubectl`` would: ``3``, ``500m``, ``4Gi``, ``12G``."""
    if milli % 1000:
        return f"{milli}m"
    whole = milli // 1000
    if name == CPU or whole == 0:
        return str(whole)
    options = [str(whole)]
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        if whole % _BINARY[suffix] == 0:
            options.append(f"{whole // _BINARY[suffix]}{suffix}")
            break
    for suffix in ("E", "P", "T", "G", "M", "k"):
        unit = int(_DECIMAL[suffix])
        if whole % unit == 0:
            options.append(f"{whole // unit}{suffix}")
            break
    return min(options, key=lambda text: (len(text), text[-1:] != "i"))


def parse_resources(spec: Mapping[str, object] | None, *, where: str = "resources") -> Resources:
    """Parse a ``{name: quantity}`` mapping; the error names the field and the value."""
    out: Resources = {}
    for name, value in (spec or {}).items():
        try:
            out[canonical_name(str(name))] = parse_quantity(value)
        except QuantityError as exc:
            raise QuantityError(f"{where}.{name}: {exc}") from None
    return out


def format_resources(res: Mapping[str, int]) -> dict[str, str]:
    return {name: format_quantity(name, res[name]) for name in sorted(res) if res[name]}


def add(a: Mapping[str, int], b: Mapping[str, int], times: int = 1) -> Resources:
    out = dict(a)
    for name, value in b.items():
        out[name] = out.get(name, 0) + value * times
    return out


def sub(a: Mapping[str, int], b: Mapping[str, int]) -> Resources:
    out = dict(a)
    for name, value in b.items():
        out[name] = out.get(name, 0) - value
    return out


def fits(request: Mapping[str, int], free: Mapping[str, int]) -> bool:
    """True when every requested amount is available (a missing name means zero available)."""
    return all(value <= free.get(name, 0) for name, value in request.items() if value > 0)


def shortfalls(request: Mapping[str, int], free: Mapping[str, int]) -> list[str]:
    """Names of the resources that do not fit, sorted."""
    return sorted(name for name, value in request.items() if value > 0 and value > free.get(name, 0))


def human(name: str, milli: int) -> str:
    """Same as ``format_quantity`` but tolerant of negative numbers, for reasons."""
    return ("-" + format_quantity(name, -milli)) if milli < 0 else format_quantity(name, milli)
