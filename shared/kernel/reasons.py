"""Reason fragments every service writes, so one wait reads the same whoever explains it."""

from __future__ import annotations

import difflib
from typing import Iterable, Mapping

from shared.kernel import quantity as q
from shared.kernel.model import Gang


def gang_line(gang: Gang) -> str:
    """Volcano's pod-group line that opens every "cannot go" reason (ends with ``; ``)."""
    tasks = sum(ps.count for ps in gang.pod_sets if ps.in_gang)
    return (f"{tasks}/{tasks} tasks in gang unschedulable: pod group is not ready, "
            f"{tasks} Pending, {gang.min_member} minAvailable; ")


def amounts(res: Mapping[str, int]) -> str:
    """``cpu 3, memory 4Gi`` for a reason."""
    return ", ".join(f"{name} {q.human(name, res[name])}" for name in sorted(res) if res[name])


def close_names(name: str, names: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` of ``names`` spelled nearly like ``name`` (a typo: ``team_a`` for ``team-a``), closest
    first, ties by name; ``name`` itself is none of them. Deterministic: the same names in any order give
    the same answer."""
    matcher = difflib.SequenceMatcher(b=name)  # as ``difflib.get_close_matches``, whose ties go to the later name
    scored: list[tuple[float, str]] = []
    for other in set(names) - {name}:
        matcher.set_seq1(other)
        if matcher.real_quick_ratio() >= 0.6 and matcher.quick_ratio() >= 0.6 and matcher.ratio() >= 0.6:
            scored.append((-matcher.ratio(), other))
    return [other for _, other in sorted(scored)[:n]]


def did_you_mean(names: list[str]) -> str:
    """``; did you mean team-a?`` (``team-a or team-b``) to end a reason; "" for no names."""
    if not names:
        return ""
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    return f"; did you mean {listed}?"

