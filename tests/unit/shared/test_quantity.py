"""shared/kernel/quantity.py: Kubernetes quantities as exact milli-unit integers."""

from __future__ import annotations

import pytest

from shared.kernel import quantity as q
from shared.kernel.quantity import (
    QuantityError, add, canonical_name, fits, format_quantity, format_resources, human, parse_quantity,
    parse_resources, shortfalls, sub,
)

GI = 1024**3


@pytest.mark.parametrize("text, milli", [
    ("500m", 500),
    ("1", 1_000),
    ("+1", 1_000),
    (" 2 ", 2_000),
    ("1.5", 1_500),
    (".5", 500),
    ("5.", 5_000),
    ("0.1", 100),
    ("12500m", 12_500),
    ("1e3", 1_000_000),
    ("1E3", 1_000_000),
    ("1e-3", 1),
    ("1k", 1_000_000),
    ("1Ki", 1_024_000),
    ("4Gi", 4 * GI * 1000),
    ("4G", 4 * 10**9 * 1000),
    ("1024Mi", GI * 1000),
    ("2Ti", 2 * 1024**4 * 1000),
    ("4Pi", 4 * 1024**5 * 1000),
    ("9223372036854775807m", 2**63 - 1),   # the largest amount: 2**63-1 milli-units
    ("0000000001", 1_000),
    ("1n", 1),              # rounded up to one milli-unit, as Kubernetes rounds MilliValue
    ("0.5m", 1),
    ("-0", 0),
    (2, 2_000),
    (0, 0),
    (2.5, 2_500),
    (0.1, 100),
])
def test_parse_quantity_in_milli_units(text, milli):
    assert parse_quantity(text) == milli


@pytest.mark.parametrize("value, message", [
    ("-1", "'-1' is negative"),
    ("-500m", "'-500m' is negative"),
    (-1, "-1 is negative"),
    ("abc", "'abc' is not a quantity"),
    ("", "'' is not a quantity"),
    ("1Kb", "'1Kb' is not a quantity"),
    ("1ki", "'1ki' is not a quantity"),
    ("1 Gi", "'1 Gi' is not a quantity"),
    ("Gi", "'Gi' is not a quantity"),
    ("1e", "'1e' is not a quantity"),
    ("--1", "'--1' is not a quantity"),
    ("1.2.3", "'1.2.3' is not a quantity"),
    ("0x10", "'0x10' is not a quantity"),
    (None, "None is not a quantity"),
    (True, "True is not a quantity"),
    ([1], "[1] is not a quantity"),
])
def test_parse_quantity_rejects_with_the_value(value, message):
    with pytest.raises(QuantityError) as exc:
        parse_quantity(value)
    assert str(exc.value) == message


def test_negative_allowed_when_asked():
    assert parse_quantity("-1500m", allow_negative=True) == -1_500
    assert parse_quantity("-4Gi", allow_negative=True) == -4 * GI * 1000


@pytest.mark.parametrize("value", [float("inf"), float("nan"), "1e1000000"], ids=["inf", "nan", "huge-exponent"])
def test_non_finite_or_huge_quantities_are_quantity_errors(value):
    with pytest.raises(QuantityError):
        parse_quantity(value)


@pytest.mark.parametrize("name, milli, text", [
    ("cpu", 500, "500m"),
    ("cpu", 3_000, "3"),
    ("cpu", 12_500, "12500m"),
    ("cpu", 1_000_000, "1000"),             # cpu is never given a suffix
    ("cpu", 0, "0"),
    ("memory", 0, "0"),
    ("memory", 4 * GI * 1000, "4Gi"),
    ("memory", 4 * 10**9 * 1000, "4G"),
    ("memory", 1_024_000, "1Ki"),
    ("memory", 1_000_000, "1k"),
    ("memory", 1000 * 1024**2 * 1000, "1000Mi"),
    ("memory", 1_024_000 * 1000, "1024k"),  # shorter than 1000Ki
    ("memory", 128_000, "128"),
    ("memory", 1_500, "1500m"),
    ("ephemeral-storage", 1536 * 1024 * 1000, "1536Ki"),
    ("nvidia.com/gpu", 4_000, "4"),
    ("nvidia.com/gpu", 500, "500m"),
    ("pods", 110_000, "110"),
])
def test_format_quantity_is_the_shortest_kubectl_form(name, milli, text):
    assert format_quantity(name, milli) == text


@pytest.mark.parametrize("text", ["500m", "3", "12500m", "4Gi", "4G", "1Ki", "1k", "1000Mi", "128", "1536Ki", "7Ti"])
@pytest.mark.parametrize("name", ["memory", "ephemeral-storage"])
def test_canonical_forms_round_trip(name, text):
    assert format_quantity(name, parse_quantity(text)) == text


@pytest.mark.parametrize("name, text, canonical", [
    ("memory", "1024Mi", "1Gi"),
    ("memory", "1000000k", "1G"),
    ("memory", "1e3", "1k"),
    ("memory", "4096Mi", "4Gi"),
    ("cpu", "1000m", "1"),
    ("cpu", "0.5", "500m"),
    ("cpu", "1e-3", "1m"),
    ("cpu", "2k", "2000"),
])
def test_non_canonical_input_formats_canonically(name, text, canonical):
    assert format_quantity(name, parse_quantity(text)) == canonical


@pytest.mark.parametrize("name, milli, text", [
    ("cpu", -500, "-500m"),
    ("cpu", -3_000, "-3"),
    ("memory", -4 * GI * 1000, "-4Gi"),
    ("memory", 6 * GI * 1000, "6Gi"),
    ("cpu", 0, "0"),
])
def test_human_tolerates_negative_amounts(name, milli, text):
    assert human(name, milli) == text


def test_parse_resources_canonicalises_names_and_parses_each_value():
    assert parse_resources({"cpu": "500m", "memory": "4Gi", "gpu": 2, "nvidia.com/gpu.shared": "1"}) == {
        "cpu": 500, "memory": 4 * GI * 1000, "nvidia.com/gpu": 2_000, "nvidia.com/gpu.shared": 1_000}
    assert parse_resources({"gpus": "1"}) == {"nvidia.com/gpu": 1_000}
    assert parse_resources(None) == {}
    assert parse_resources({}) == {}


@pytest.mark.parametrize("spec, where, message", [
    ({"cpu": "1", "memory": "lots"}, "spec.containers[ray].resources.requests",
     "spec.containers[ray].resources.requests.memory: 'lots' is not a quantity"),
    ({"cpu": "-1"}, "resources", "resources.cpu: '-1' is negative"),
    ({"gpu": "x"}, "queue.quota", "queue.quota.gpu: 'x' is not a quantity"),  # the name as the user wrote it
])
def test_parse_resources_names_the_field(spec, where, message):
    with pytest.raises(QuantityError) as exc:
        parse_resources(spec, where=where)
    assert str(exc.value) == message


def test_parse_resources_default_where_is_resources():
    with pytest.raises(QuantityError, match=r"^resources\.cpu: 'lots' is not a quantity$"):
        parse_resources({"cpu": "lots"})


def test_canonical_name():
    assert [canonical_name(n) for n in ("gpu", "gpus", "cpu", "nvidia.com/gpu", "GPU")] == \
        ["nvidia.com/gpu", "nvidia.com/gpu", "cpu", "nvidia.com/gpu", "GPU"]


def test_format_resources_sorts_and_drops_zeros():
    out = format_resources({"memory": 4 * GI * 1000, "cpu": 3_000, "nvidia.com/gpu": 0, "pods": 2_000})
    assert out == {"cpu": "3", "memory": "4Gi", "pods": "2"}
    assert list(out) == ["cpu", "memory", "pods"]


def test_arithmetic_is_exact_and_does_not_mutate():
    a = {"cpu": 1_000, "memory": 5}
    b = {"cpu": 500, "nvidia.com/gpu": 1_000}
    assert add(a, b) == {"cpu": 1_500, "memory": 5, "nvidia.com/gpu": 1_000}
    assert add(a, b, 3) == {"cpu": 2_500, "memory": 5, "nvidia.com/gpu": 3_000}
    assert sub(a, b) == {"cpu": 500, "memory": 5, "nvidia.com/gpu": -1_000}
    assert a == {"cpu": 1_000, "memory": 5} and b == {"cpu": 500, "nvidia.com/gpu": 1_000}
    # 0.1 + 0.2 CPU is exactly 300m, no float drift
    assert add({"cpu": parse_quantity("0.1")}, {"cpu": parse_quantity("0.2")}) == {"cpu": 300}


@pytest.mark.parametrize("request_, free, ok, short", [
    ({"cpu": 1_000}, {"cpu": 1_000}, True, []),
    ({"cpu": 1_001}, {"cpu": 1_000}, False, ["cpu"]),
    ({"nvidia.com/gpu": 1_000}, {"cpu": 8_000}, False, ["nvidia.com/gpu"]),  # missing means zero
    ({"nvidia.com/gpu": 0, "cpu": 1}, {"cpu": 1}, True, []),                  # zero requests always fit
    ({"memory": 2, "cpu": 2}, {"memory": 1, "cpu": 1}, False, ["cpu", "memory"]),
    ({}, {}, True, []),
])
def test_fits_and_shortfalls(request_, free, ok, short):
    assert fits(request_, free) is ok
    assert shortfalls(request_, free) == short


def test_module_constants():
    assert (q.CPU, q.MEMORY, q.GPU, q.PODS) == ("cpu", "memory", "nvidia.com/gpu", "pods")
    assert issubclass(QuantityError, ValueError)


@pytest.mark.parametrize("value", [
    "1e999990", "1e400", "1.0e19", "9" * 4000, "1Ei", "9223372036854775808m", "9223372036854776",
    10**30, 2**4000, "1E",
], ids=["exp-999990", "exp-400", "1e19", "4000-digits", "1Ei", "2**63m", "just-over", "int-1e30", "int-4000-bit", "1-exa"])
def test_amounts_beyond_64_bit_milli_units_are_refused_cheaply(value):
    with pytest.raises(QuantityError) as exc:
        parse_quantity(value)
    message = str(exc.value)
    assert "too large" in message or "at most 64 characters" in message
    assert len(message) < 200 and "\n" not in message


@pytest.mark.parametrize("value", ["1e3Ki", "1e3m", "1Gi3", "1.5e", "e3", "1e+", "1e3.5", "\u00b2", "１", "1_000"])
def test_the_apimachinery_grammar_only(value):
    """Exponents do not take a suffix (apimachinery's ``parseQuantityString``: ``1e3m`` is ErrFormatWrong), digits are ASCII (``str.isdigit`` would take ``２``), no underscores."""
    with pytest.raises(QuantityError, match="is not a quantity"):
        parse_quantity(value)


def test_a_sum_beyond_64_bits_is_refused():
    q.check_total({"cpu": q.MAX_MILLI}, "gang")
    with pytest.raises(QuantityError, match="gang.memory: the total .* is too large"):
        q.check_total({"memory": q.MAX_MILLI + 1}, "gang")
