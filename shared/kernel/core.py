"""What every decision core looks like to a runtime.

A core is a deterministic fold: ``handle(envelope)`` updates its private state and returns the
payloads it emits, in order. No I/O, no wall clock (``envelope.occurred_at`` is now), no randomness.
Timers are ``TimerSet`` payloads; the runtime answers with a ``TimerFired`` envelope later.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from shared.kernel.events import Envelope


class Emitted(Protocol):
    """A payload a core emits: ``events.wrap`` envelopes it by its type and subject."""

    @property
    def type(self) -> str: ...

    @property
    def subject(self) -> str: ...


class Core(Protocol):
    service: str

    def handle(self, env: Envelope) -> Sequence[Emitted]:
        """Fold one inbox event; return the payloads to publish (the runtime envelopes them)."""
        ...
