"""The one way muster picks victims, whoever evicts (in-queue preemption in placement or the queue).

Pure and generic: the caller orders the candidates (who goes first) and says when a set suffices.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

V = TypeVar("V")


def minimal_victims(ordered: Sequence[V], fits: Callable[[list[V]], bool]) -> list[V] | None:
    """Greedy add in order until ``fits``, then drop every victim the others already cover (last taken
    first), so no victim can be spared; None when even all of them do not suffice."""
    chosen: list[V] = []
    for candidate in ordered:
        chosen.append(candidate)
        if fits(chosen):
            break
    else:
        return None
    for candidate in reversed(list(chosen)):
        rest = [v for v in chosen if v is not candidate]
        if fits(rest):
            chosen = rest
    return chosen
