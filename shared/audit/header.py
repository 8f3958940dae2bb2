"""The first line of an exported log (and the store's ``log_header`` row): what it was made under.

``{"muster_log": 1, "muster_version": "0.1.0", "schema_version": 1, "policy": {...}, "origin":
"simulate", "scenario": "fair-share-two-teams", "until": 300.0, "since": null, "before": null}``

``policy`` is the policy the log starts with, as ``Policy`` serialises it, or null when nothing
recorded it. The log itself carries the policy: every service writes a ``PolicyApplied`` event when it
starts with a policy (the embedded runtime once, first), which ``muster replay`` reads, switching a
service's policy where its log says it changed; the header's is the fallback for logs made before
that event, and a Kafka export names the log's first one (or ``--policy``'s). ``since`` and
``before`` are set when only a window of the history was exported (a ``--since``/``--until`` that
left envelopes out; one that cuts nothing exports the whole history, unmarked): such a
log can be read, explained and reported on, but not verified or replayed under another policy,
which need the history from its start. The header holds no wall-clock time, so exporting the same
history twice gives the same file. A log read off Kafka names the exporting muster's versions (the
log topic does not say which muster wrote it; every envelope carries its schema version).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictInt, ValidationError

from shared.audit.errors import CannotReproduce, NotAnEnvelope
from shared.kernel.events import FIRST_SCHEMA_VERSION, SCHEMA_VERSION
from shared.kernel.eventtime import SCENARIO, TimeFormat
from shared.kernel.policy import Policy
from shared.kernel.validation import first_errors
from shared.runtime.build import muster_version

FORMAT = 1
"""Version of the file layout (header, envelope lines, end line)."""
CHAINED = 2
"""The layout of a chained log: each envelope line wraps the envelope with its link and place in the
hash chain, and signed records have lines of their own (``shared.audit.integrity``)."""
LAYOUTS = (FORMAT, CHAINED)

Origin = Literal["simulate", "kafka", "store", "import"]


class LogHeader(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    muster_log: StrictInt = FORMAT
    muster_version: str
    schema_version: StrictInt = SCHEMA_VERSION
    policy: dict[str, Any] | None = None
    origin: str = "simulate"
    scenario: str | None = None
    until: float | None = None
    """Scenario time the run went to (a simulated run; what-if runs its twins as far)."""
    since: float | None = None
    before: float | None = None
    """The exported window (``--since``/``--until``) when the log is not the whole history."""
    inbox_order: bool = True
    """False for the history a projector wrote from Kafka (and a file exported from it): the log
    topic's order, in which two services' outputs of one moment may stand the other way round from
    how a third service read them, so its decisions cannot be derived again (``whole``)."""

    @classmethod
    def made_now(cls, policy: Policy | None, *, origin: str, scenario: str | None = None,
                 until: float | None = None) -> "LogHeader":
        """The header for a log this muster makes (with this muster's versions)."""
        return cls(muster_version=muster_version(), policy=None if policy is None else policy.model_dump(mode="json"),
                   origin=origin, scenario=scenario, until=until)

    @classmethod
    def parse(cls, line: bytes, where: str) -> "LogHeader":
        """The header from its JSON line; ``NotAnEnvelope`` when it is not one, ``CannotReproduce``
        when it is one of a layout or schema this muster does not read (newer, or before the first)."""
        import json

        try:
            raw = json.loads(line)
        except ValueError as exc:
            raise NotAnEnvelope(f"{where}: not a muster log header ({exc})") from None
        if not isinstance(raw, dict) or "muster_log" not in raw:
            raise NotAnEnvelope(f"{where}: not a muster log: the first line must be its header "
                                '({"muster_log": 1, ...}), as `muster log export` writes it')
        layout = raw["muster_log"]
        if type(layout) is int and layout not in LAYOUTS:  # before validation: a newer layout may hold other keys
            raise CannotReproduce(f"{where}: log layout {layout} is " + (f"newer than this muster's ({CHAINED})" if
                                  layout > CHAINED else f"unknown (this muster reads {FORMAT} and {CHAINED})"))
        try:
            header = cls.model_validate(raw)
        except ValidationError as exc:
            raise NotAnEnvelope(f"{where}: a bad log header: {first_errors(exc, 1)}") from None
        if header.schema_version > SCHEMA_VERSION:
            raise CannotReproduce(f"{where}: the log's event schema version {header.schema_version} is newer than "
                                  f"this muster's ({SCHEMA_VERSION})")
        if header.schema_version < FIRST_SCHEMA_VERSION:
            raise CannotReproduce(f"{where}: the log's event schema version {header.schema_version} is unknown "
                                  f"(versions start at {FIRST_SCHEMA_VERSION})")
        return header

    def line(self) -> bytes:
        return self.model_dump_json().encode() + b"\n"

    @property
    def chained(self) -> bool:
        return self.muster_log == CHAINED

    @property
    def windowed(self) -> bool:
        return self.since is not None or self.before is not None

    def window_note(self, clock: TimeFormat = SCENARIO) -> str | None:
        """The one line explain and report put first when the log is a window (None for a whole log)."""
        return window_note(self.since, self.before, clock)

    def whole(self, what: str) -> None:
        """Refuse a log ``what`` cannot replay: a window of a history, or one out of inbox order."""
        if self.windowed:
            raise CannotReproduce(f"the log is a window of a history (exported with --since/--until): {what} needs "
                                  "the whole history from its start")
        if not self.inbox_order:
            raise CannotReproduce(
                f"{what} needs each service's inbox order, which a history the projector wrote from Kafka does not "
                "keep (it holds the log topic's order): use the Kafka log itself (kafka://HOST:PORT) or a file "
                "`muster log export --from kafka://...` wrote; this one can be read, explained and reported on")

    def decided_with(self, override: Policy | None = None) -> Policy:
        """The policy the log's decisions were made with (``override`` wins: ``--policy``)."""
        if override is not None:
            return override
        if self.policy is None:
            raise CannotReproduce("the log does not record the policy it was made under (a Kafka deployment's "
                                  "services take theirs from --policy): pass the same file with --policy")
        try:
            return Policy.from_mapping(self.policy)
        except ValidationError as exc:
            raise CannotReproduce(f"the log's policy is not one this muster reads: {first_errors(exc, 1)}") from None

    def policy_or_none(self) -> Policy | None:
        """The header's policy, None when it names none (the log's ``PolicyApplied`` events may);
        ``CannotReproduce`` for one this muster does not read."""
        return None if self.policy is None else self.decided_with()

    def for_store(self) -> dict[str, Any]:
        return {"muster_version": self.muster_version, "schema_version": self.schema_version, "policy": self.policy,
                "origin": self.origin, "scenario": self.scenario, "until": self.until}


def window_note(since: float | None, before: float | None, clock: TimeFormat = SCENARIO) -> str | None:
    """What a reader of a window must know before any figure: a window from T lost the state before T
    (queues defined, quota held, positions), so its figures count only what it holds; a window up to T
    knows nothing after T. None for a whole log. Times as ``clock`` shows them."""
    if since is not None:
        to = f" to {clock.at(before)}" if before is not None else ""
        return (f"this log is a window from {clock.at(since)}{to}: state before it is unknown; figures below count "
                "only what the window holds")
    if before is not None:
        return f"this log is a window up to {clock.at(before)}: nothing after it is in it"
    return None
