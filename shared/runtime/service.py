"""One service as every runtime runs it: a core behind a dedupe, its outputs enveloped.

The embedded runtime and the Kafka worker both hand a service its inbox through ``Service.handle``,
so delivery rules live in one place: an envelope id the service has handled already yields nothing
(at-least-once delivery makes redelivery normal), and each output's id derives from the service,
the input's id and the output's position, so handling the same input again — after a crash, in a
replay, on the other runtime — gives the same ids.

It is also where a service's time is kept: its "now" is the latest event time it has seen, so an
envelope that arrives stamped earlier (a timer due before the last input, another service's output
written a moment late) is handled at that now, and what it causes is stamped so. Event time then never
runs backwards along a cause, and each service's outputs are in time order: the waits, reports and
traces built from the log cannot go negative. On the embedded runtime, which delivers in time order,
it changes nothing.

It is also where a core that raises is contained (``shared.kernel.faults``): the exception becomes a
``Fault`` the runtime takes (``take_faults``) and the rejection of the object concerned, so one
envelope can never stop a service, and both runtimes answer it with the same outputs.
"""

from __future__ import annotations

import gc

from shared.kernel.core import Core
from shared.kernel.dedupe import DEDUPE_WINDOW, Seen
from shared.kernel.events import Envelope, wrap
from shared.kernel.fastmodel import built
from shared.kernel.faults import Fault, describe, rejections
from shared.observability.tracing.context import TraceContexts

GC_THRESHOLD = (10_000, 2, 50)
"""The cyclic collector's thresholds while services run, on Kafka or embedded (Python's are 700, 10,
10). A service keeps a large long-lived state and allocates fast (every record decoded, every output
enveloped), so at 700 a full collection — a walk over the whole state — came several times a second
under load and took a large share of a burst's CPU (and of ``muster simulate``'s). Generation 1
stays small (every second young collection) so its pauses stay short: at 10 it held so many objects
that its collections stopped the loop long enough to make a p99 of their own. Memory is freed by
reference counting as before; only cycles wait a little longer."""


def collect_less() -> None:
    """Set ``GC_THRESHOLD`` for this process, unless it already collects less often than that."""
    if gc.get_threshold()[0] < GC_THRESHOLD[0]:
        gc.set_threshold(*GC_THRESHOLD)


class Service:
    """A named core with its dedupe: ``handle(envelope) -> output envelopes``."""

    def __init__(self, core: Core, *, dedupe_window: int = DEDUPE_WINDOW, traced: bool = False) -> None:
        self.core = core
        self.name = core.service
        self.seen = Seen(dedupe_window)
        self.handled = 0
        self.duplicates = 0
        self.failed = 0
        """Envelopes the core raised on (each rejected what it concerned: ``shared.kernel.faults``)."""
        self.faults: list[Fault] = []
        """Failures not taken by the runtime yet (``take_faults``)."""
        self.now = float("-inf")
        """The latest event time handled: the service's clock (see the module docstring)."""
        self.contexts = TraceContexts(self.name) if traced else None
        """With tracing on, each output's ``trace`` (``shared.observability.tracing.context``); off, outputs keep
        their cause's (empty) one and nothing is computed."""

    def handled_before(self, env: Envelope) -> bool:
        """True (and counted) for a copy of an envelope this service has handled already."""
        if env.id in self.seen:
            self.duplicates += 1
            return True
        return False

    def handle(self, env: Envelope) -> list[Envelope]:
        """Fold one inbox envelope; a duplicate yields nothing."""
        if not self.seen.add(env.id, env.source):
            self.duplicates += 1
            return []
        self.handled += 1
        if env.occurred_at < self.now:
            env = late(env, self.now)
        else:
            self.now = env.occurred_at
        try:
            payloads = self.core.handle(env)
        except Exception as exc:  # noqa: BLE001 - any failure of the core: contained, see shared.kernel.faults
            error = describe(self.name, env, exc)
            self.failed += 1
            self.faults.append(Fault(self.name, env, error))
            payloads = rejections(self.name, env, error)
        if not payloads and self.contexts is None:  # most envelopes: no list made, no loop entered
            return []
        name = self.name
        outputs = [wrap(payload, source=name, cause=env, index=i) for i, payload in enumerate(payloads)]
        return outputs if self.contexts is None else self.contexts.fill(env, outputs)

    def take_faults(self) -> list[Fault]:
        """The failures since the last call (the runtime reports each once)."""
        faults, self.faults = self.faults, []
        return faults


def late(env: Envelope, now: float) -> Envelope:
    """``env`` as handled by a service whose time is already ``now``: the same envelope (id, cause,
    payload) at that time."""
    return built(Envelope, {**env.__dict__, "occurred_at": now})
