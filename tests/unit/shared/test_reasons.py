"""Reason fragments every service writes (``shared.kernel.reasons``)."""

from __future__ import annotations

from shared.kernel.reasons import close_names, did_you_mean


def test_close_names_are_typos_of_the_name_closest_first_never_the_name_itself() -> None:
    names = ["team-b", "team-a", "research", "team_a", "default"]
    assert close_names("team_a", names) == ["team-a", "team-b"]
    assert close_names("team_a", reversed(names)) == ["team-a", "team-b"]  # any order, same answer
    assert close_names("inference", names) == []
    assert close_names("q", [f"q{i}" for i in range(10)]) == ["q0", "q1", "q2"]


def test_did_you_mean_ends_a_reason() -> None:
    assert did_you_mean([]) == ""
    assert did_you_mean(["team-a"]) == "; did you mean team-a?"
    assert did_you_mean(["team-a", "team-b", "team-c"]) == "; did you mean team-a, team-b or team-c?"
