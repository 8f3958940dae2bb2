"""In which order a worker hands its inbox to its core.

``Arrival`` (the deployment): in the order the inbox partition holds the envelopes. That order is
the one total order the service's state is a fold over; a restart replays it.

``Rounds`` (``muster simulate --bus``): envelopes wait until the driver's ``Release`` names them,
and are handled in the order it names them. Several services write into one inbox at once, so
the partition's order within an instant depends on who was faster; the driver knows the embedded
runtime's breadth-first order (``shared.runtime.embedded``) and releases each round in exactly that order,
which is what makes both runtimes take the same decisions. A ``Release`` is a record in the same
partition, after every envelope it names, so a restart that replays the partition releases the
same envelopes in the same order again.
"""

from __future__ import annotations

from typing import Protocol

from shared.kernel.events import Envelope
from shared.runtime.bus.codec import Release


class SequencingError(RuntimeError):
    """The inbox does not hold what a ``Release`` names (a truncated or foreign topic)."""


class Ordering(Protocol):
    def offer(self, env: Envelope) -> list[Envelope]:
        """An envelope arrived; return what may be handled now, in order."""
        ...

    def release(self, message: Release) -> list[Envelope]:
        """A round was released; return its envelopes in the order to handle them."""
        ...


class Arrival:
    """Handle each envelope as it arrives."""

    def offer(self, env: Envelope) -> list[Envelope]:
        return [env]

    def release(self, message: Release) -> list[Envelope]:
        raise SequencingError(f"round {message.round} released to a worker that handles its inbox in arrival "
                              "order: only `muster simulate --bus` releases rounds (start it with rounds ordering)")


class Rounds:
    """Hold envelopes until a ``Release`` names them."""

    def __init__(self) -> None:
        self._held: dict[str, Envelope] = {}
        self.round = -1

    def offer(self, env: Envelope) -> list[Envelope]:
        self._held.setdefault(env.id, env)  # a redelivered copy is the same envelope
        return []

    def release(self, message: Release) -> list[Envelope]:
        if message.round <= self.round:
            return []  # released before: this is a redelivered record
        missing = [i for i in message.ids if i not in self._held]
        if missing:
            raise SequencingError(f"round {message.round} names {len(missing)} envelope(s) this inbox does not hold "
                                  f"(first: {missing[0]}): was the topic truncated or shared with another run?")
        self.round = message.round
        return [self._held.pop(i) for i in dict.fromkeys(message.ids)]

    @property
    def held(self) -> int:
        return len(self._held)
