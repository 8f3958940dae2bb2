"""Every tunable in one typed object. Cores receive it; nothing reads globals or the environment.

Load from YAML with ``Policy.from_yaml`` (``muster simulate --policy FILE``) or a scenario's
``policy:`` block. Unknown keys are an error, so a typo never silently falls back to a default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from shared.kernel.duration import DurationError, parse_duration
from shared.kernel.kube import DEFAULT_SCHEDULER
from shared.kernel.validation import first_errors, read_text, yaml_error

Queueing = Literal["StrictFIFO", "BestEffortFIFO"]
Strategy = Literal["binpack", "spread", "fragmentation"]


def grace_period(value: Any) -> Any:
    """A staleness grace period as KAI writes one: a duration (``60s``, ``2m``, or seconds), negative
    for never (``-1s``, ``-1``: KAI's "negative values means infinite")."""
    if value is None:
        return None  # unset (a queue's override); the global key's type refuses it
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{value!r} is not a duration (write e.g. 60s, 2m, or -1s for never)")
    magnitude: str | float
    if isinstance(value, str):
        negative = value.strip().startswith("-")
        magnitude = value.strip()[1:] if negative else value
    else:
        negative, magnitude = value < 0, abs(value)
    try:
        seconds = parse_duration(magnitude, where="staleness grace period")
    except DurationError as exc:
        raise ValueError(str(exc)) from None
    return -seconds if negative else seconds


class QueuePolicy(BaseModel):
    """Overrides for one queue; unset fields fall back to the global policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    queueing: Queueing | None = None
    placement: Strategy | None = None
    min_runtime_seconds: float | None = Field(default=None, ge=0)
    staleness_grace_period: float | None = None
    """This queue's own ``default_staleness_grace_period``."""

    _grace = field_validator("staleness_grace_period", mode="before")(grace_period)


class Policy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    queueing: Queueing = "BestEffortFIFO"
    """StrictFIFO: a queue's head blocks the queue until it is admitted. BestEffortFIFO: a head that
    does not fit is skipped (it backs off) and the next workload may go. Never across queues."""
    placement: Strategy = "binpack"
    """binpack: fill the most-allocated node that fits; spread: the least-allocated; fragmentation: the
    node (and GPU device) where the cluster's GPU fragmentation, measured against the mix of recently
    arrived pods, rises least (FGD), then as binpack."""
    backoff_base_seconds: float = Field(default=1.0, gt=0)
    backoff_max_seconds: float = Field(default=60.0, gt=0)
    min_runtime_seconds: float = Field(default=0.0, ge=0)
    """A workload that has run less than this is never a preemption or reclaim victim."""
    default_queue: str = "default"
    """Queue for workloads that name none; it exists implicitly, unlimited, unless defined."""
    unknown_queue: Literal["wait", "reject"] = "wait"
    """A workload naming a queue that does not exist: wait Queued (with a reason) until it is
    defined, or be Rejected at once."""
    scheduler_names: tuple[str, ...] = ("muster",)
    """The ``spec.schedulerName``s muster schedules pods for (``--scheduler-names muster,volcano`` for a
    cluster moving off Volcano, whose KubeRay names ``volcano`` on every pod). Pods for any other
    scheduler are only counted as used capacity. ``muster simulate`` adds the name its simulated
    KubeRay gives the pods unless the scenario or ``--policy`` names them (``Scenario.effective_policy``)."""
    max_gang_pods: int = Field(default=10_000, ge=1)
    """A gang with more pods than this is rejected at admission: a typo (``replicas: 3000000``) must
    not become a workload that can never be placed or that swamps the scheduler."""
    default_staleness_grace_period: float = 60.0
    """Seconds a running gang of a queue that evicts stale gangs (KAI's) may stay below its minimum
    before it is evicted; negative: never. KAI's ``--default-staleness-grace-period`` (its config's
    ``globalDefaultStalenessGracePeriod``), written the same way: ``60s``, ``2m``, ``-1s``."""
    overcommit_factor: float = Field(default=1.2, ge=1.0)
    """Volcano queues only: a waiting workload is enqueued (may be placed, reclaim or preempt) only while
    its minimum, with what every workload holds or has reserved, fits this many times the cluster's
    capacity. Volcano's overcommit plugin's ``overcommit-factor`` (default 1.2; below 1 it falls back to
    the default, muster refuses it)."""
    queues: dict[str, QueuePolicy] = {}

    _grace = field_validator("default_staleness_grace_period", mode="before")(grace_period)

    @field_validator("scheduler_names", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        """``muster,volcano`` (the flag's form) or a list; never empty, no empty name."""
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",")]
        if isinstance(value, (list, tuple)):
            if not value:
                raise ValueError("name at least one scheduler")
            for name in value:
                if not isinstance(name, str) or not name.strip():
                    raise ValueError(f"a scheduler name must be a non-empty string, got {name!r}")
            return tuple(dict.fromkeys(name.strip() for name in value))
        return value

    def answers_to(self, scheduler_name: str | None) -> bool:
        """Whether muster schedules a pod whose ``spec.schedulerName`` is this. Unset means
        ``default-scheduler``, as the API server defaults it. The one place that reads the names:
        admission and placement ask here."""
        return (scheduler_name or DEFAULT_SCHEDULER) in self.scheduler_names

    def with_scheduler_names(self, names: str | list[str] | None) -> "Policy":
        """This policy answering to ``names`` (``--scheduler-names``); unchanged for None. Raises
        ``PolicyError`` for an empty list."""
        if names is None:
            return self
        try:
            return Policy.model_validate({**self.model_dump(exclude_unset=True), "scheduler_names": names})
        except ValidationError as exc:
            raise PolicyError(f"--scheduler-names {names!r}: {exc.errors()[0]['msg']}") from None

    def queueing_for(self, queue: str) -> Queueing:
        override = self.queues.get(queue)
        return override.queueing if override and override.queueing else self.queueing

    def placement_for(self, queue: str) -> Strategy:
        override = self.queues.get(queue)
        return override.placement if override and override.placement else self.placement

    def min_runtime_for(self, queue: str) -> float:
        override = self.queues.get(queue)
        if override and override.min_runtime_seconds is not None:
            return override.min_runtime_seconds
        return self.min_runtime_seconds

    def staleness_grace_period_for(self, queue: str) -> float | None:
        """Seconds this queue's running gangs may stay below their minimum; None: never evicted."""
        override = self.queues.get(queue)
        grace = self.default_staleness_grace_period
        if override and override.staleness_grace_period is not None:
            grace = override.staleness_grace_period
        return grace if grace >= 0 else None

    def as_json(self) -> dict[str, Any]:
        """Every key, defaults included, as JSON holds it: what a log records (``PolicyApplied``)."""
        return self.model_dump(mode="json")

    def digest(self) -> str:
        """Equal for equal policies, whatever file or key order they came from: what a log and a
        replay compare before any decision (``shared.audit.replay``)."""
        import hashlib
        import json

        text = json.dumps(self.as_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()

    def differences(self, other: "Policy") -> list[str]:
        """The keys whose values differ from ``other``'s, each as ``key: mine != other's`` (sorted):
        what ``replay --verify`` names when it decides under a policy the log did not record."""
        mine, theirs = self.as_json(), other.as_json()
        return [f"{key}: {mine.get(key)!r} != {theirs.get(key)!r}" for key in sorted(set(mine) | set(theirs))
                if mine.get(key) != theirs.get(key)]

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None) -> "Policy":
        return cls.model_validate(data or {})

    def layered_dump(self, override: dict[str, Any] | None) -> dict[str, Any]:
        """``override`` (a ``policy:`` block, a what-if file) over this policy's set keys, as a mapping:
        its keys replace these, but ``queues`` merge queue by queue (``layered`` validates it)."""
        merged = self.model_dump(exclude_defaults=True)
        override = dict(override or {})
        queues = {**merged.get("queues", {}), **(override.pop("queues", None) or {})}
        merged.update(override)
        if queues:
            merged["queues"] = queues
        return merged

    def layered(self, override: dict[str, Any] | None) -> "Policy":
        """This policy with ``override`` over it (``layered_dump``); ``ValidationError`` for a bad key."""
        return Policy.from_mapping(self.layered_dump(override))

    @classmethod
    def from_yaml(cls, path: str | Path) -> "Policy":
        """Raises ``PolicyError`` with the offending field named."""
        try:
            data = yaml.safe_load(read_text(path, "policy", PolicyError))
        except yaml.YAMLError as exc:
            raise PolicyError(f"cannot read policy {yaml_error(exc, str(path))}") from None
        if data is not None and not isinstance(data, dict):
            raise PolicyError(f"invalid policy {path}: a policy is a mapping of keys (queueing, placement, ...), "
                              f"not a {type(data).__name__}")
        try:
            return cls.from_mapping(data)
        except ValidationError as exc:
            raise PolicyError(f"invalid policy {path}: {first_errors(exc, values=True)}") from None


class PolicyError(ValueError):
    pass
