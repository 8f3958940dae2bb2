"""The guard against an effect that feeds itself: applied, its watch event makes the same effect again.

Every core writes an effect once per value, so an effect recurs only when what it wrote comes back
changed by a bound or a rule elsewhere (a status refused at ingest, an annotation that flips a
rejection's reason and back). Such a cycle repeats at one instant without end, each round copying the
same text again. Both places that apply effects (the embedded runtime, the cluster link's
``EffectConsumer``) ask ``CycleGuard.allows`` before applying one and stop applying an effect that
has come ``MAX_REPEATS`` times within ``window`` seconds of event time, saying why once; the decisions
in the log are untouched (the cores decided them), only their application stops.
"""

from __future__ import annotations

from collections import deque

from shared.kernel.events import KubeEffect

MAX_REPEATS = 8
"""How often one effect (same operation, object and content) may be applied within the window. A
workload's effects repeat a value legitimately only when it changes in between (Queued, Admitted,
Queued again): a few times, never dozens at one instant."""


def effect_key(effect: KubeEffect) -> int:
    """What makes two effects the same: every field (hashed in this process only: the key is never kept)."""
    return hash((effect.op, effect.kind, effect.namespace, effect.name, effect.api_version, effect.node,
                 tuple(sorted(effect.annotations.items())), repr(effect.status), effect.reason, effect.message,
                 effect.event_type, effect.claims))


class CycleGuard:
    """Counts each effect's applications within ``window`` seconds of event time (0: one instant)."""

    def __init__(self, *, window: float = 0.0, most: int = MAX_REPEATS) -> None:
        self.window = window
        self.most = most
        self._seen: dict[int, deque[float]] = {}
        self._order: deque[tuple[float, int]] = deque()
        self.stopped: dict[int, str] = {}
        """Effects stopped (key -> the reason, said once each)."""

    def allows(self, effect: KubeEffect, at: float) -> str | None:
        """None if ``effect`` may be applied at ``at``; else why not (the first time only a new reason,
        then the same one)."""
        self._forget(at)
        key = effect_key(effect)
        times = self._seen.setdefault(key, deque())
        if len(times) >= self.most:
            if key not in self.stopped:
                self.stopped[key] = (
                    f"effect {effect.op} {effect.subject} came {len(times) + 1} times within "
                    f"{self.window:g}s of event time: applying it causes the watch event that causes it again "
                    "(a cycle), so it is not applied again")
            return self.stopped[key]
        times.append(at)
        self._order.append((at, key))
        return None

    def _forget(self, at: float) -> None:
        while self._order and self._order[0][0] < at - self.window:
            _, key = self._order.popleft()
            times = self._seen.get(key)
            if times:
                times.popleft()
                if not times:
                    del self._seen[key]
                    self.stopped.pop(key, None)
