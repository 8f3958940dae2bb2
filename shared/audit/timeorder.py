"""Whether a log's event time runs forwards along every cause: what waits and trace spans rely on.

Two rules (``shared.runtime.service`` keeps them; this module checks a log for them):

    cause      every envelope is stamped no earlier than the envelope that caused it;
    service    every service's time is the latest it has seen: an output is stamped no earlier than
               any input its service handled up to (and with) its cause, so one service's outputs,
               in the order it made them, never go back in time.

A timer fired late is stamped when it fired, and a service whose time had passed its due instant
handles it at its own time. The raw stamps of one inbox may still interleave (several services
write into it, each at its own pace); the time each envelope is *handled* at is what cannot go back,
and it is what the outputs carry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from shared.audit.replay import Router
from shared.kernel.events import Envelope
from shared.kernel.topology import SERVICES

_SERVICES = frozenset(SERVICES)


@dataclass(frozen=True)
class Backwards:
    """One envelope stamped before something it must follow."""

    env: Envelope
    rule: str
    """``cause`` or ``service`` (see the module docstring)."""
    before: float
    """The time it should not precede."""

    def __str__(self) -> str:
        e = self.env
        follows = "its cause" if self.rule == "cause" else f"{e.source}'s time when it handled the cause"
        return (f"{e.type} {e.subject} ({e.id}) at {e.occurred_at!r} is {self.before - e.occurred_at:.6f}s "
                f"before {follows} ({self.before!r})")


def backwards(envelopes: Iterable[Envelope]) -> list[Backwards]:
    """Every envelope of a log (in log order: each inbox's own) that breaks a rule, in log order."""
    router = Router()
    times: dict[str, float] = {}
    now: dict[str, float] = {}
    handled_at: dict[tuple[str, str], float] = {}
    """(service, input id) -> the service's time when it handled that input."""
    found: list[Backwards] = []
    for env in envelopes:
        t = env.occurred_at
        cause = env.causation_id
        if cause is not None and cause in times and t < times[cause]:
            found.append(Backwards(env, "cause", times[cause]))
        if env.source in _SERVICES and cause is not None:
            seen = handled_at.get((env.source, cause))
            if seen is not None and t < seen:
                found.append(Backwards(env, "service", seen))
        times[env.id] = t
        for target in router.targets(env) or ():
            if target in _SERVICES and (target, env.id) not in handled_at:
                now[target] = max(now.get(target, t), t)
                handled_at[(target, env.id)] = now[target]
    return found
