"""Whether tracing is on, and the settings muster refuses: the standard ``OTEL_*`` variables
(see ``shared.observability.tracing.otel``), read without importing OpenTelemetry, so a service with tracing off
never loads it."""

from __future__ import annotations

import os
from typing import Mapping

ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
EPOCH_ENV = "MUSTER_TRACE_EPOCH"
"""Seconds added to event times when spans are drawn in event time (``simulate --bus --trace``
sets it for its services); 0 by default: in the deployment event time is wall-clock time."""


class TracingConfigError(ValueError):
    """An ``OTEL_*`` setting muster cannot follow; the message names it."""


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """True when an OTLP endpoint is set and nothing turns tracing off: nothing is exported (and
    nothing is computed for it) otherwise."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return any(env.get(name, "").strip() for name in ENDPOINTS)


def check(env: Mapping[str, str] | None = None) -> None:
    """Refuse, in one line, what would fail only once spans are sent."""
    env = os.environ if env is None else env
    for name in PROTOCOLS:
        value = env.get(name, "").strip()
        if value and value != "http/protobuf":
            raise TracingConfigError(f"{name}={value!r}: muster sends OTLP over HTTP only; use http/protobuf")
    exporter = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter not in ("otlp", "none", ""):
        raise TracingConfigError(f"OTEL_TRACES_EXPORTER={exporter!r}: muster exports 'otlp' (or 'none')")
    sampler(env)


SAMPLERS = ("always_on", "always_off", "traceidratio")


def sampler(env: Mapping[str, str] | None = None) -> tuple[str, float]:
    """``OTEL_TRACES_SAMPLER`` as (root sampler, ratio). A ``parentbased_`` sampler decides as its
    root one here: a workload's trace has no parent outside muster."""
    env = os.environ if env is None else env
    raw = env.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
    name = raw.removeprefix("parentbased_")
    if name not in SAMPLERS:
        raise TracingConfigError(f"OTEL_TRACES_SAMPLER={raw!r}: one of {', '.join(SAMPLERS)} "
                                 "(or their parentbased_ forms)")
    ratio = 1.0
    if name == "traceidratio":
        arg = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip() or "1.0"
        try:
            ratio = float(arg)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise TracingConfigError(f"OTEL_TRACES_SAMPLER_ARG={arg!r}: a ratio from 0 to 1")
    return name, ratio


def epoch_from_env(env: Mapping[str, str] | None = None) -> float:
    env = os.environ if env is None else env
    raw = env.get(EPOCH_ENV, "").strip()
    try:
        return float(raw) if raw else 0.0
    except ValueError:
        raise TracingConfigError(f"{EPOCH_ENV}={raw!r}: a number of seconds") from None


def epoch_for(first: float, now: float) -> float:
    """Where a run's time 0 is shown: event times that are wall-clock times already (a deployment's
    log) stay where they are; a simulated run's seconds are shown as if it had started ``now``."""
    from shared.kernel.eventtime import is_wall_clock

    return 0.0 if is_wall_clock(first) else now
