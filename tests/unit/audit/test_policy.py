"""shared/audit/replay.py: the policy a replay decides with comes from the log's ``PolicyApplied``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.audit.errors import CannotReproduce
from shared.audit.logfile import LogFile
from shared.audit.replay import Divergence, Replayer, policy_changes, starting_policy, verify
from shared.kernel.events import PolicyApplied, to_json, wrap
from shared.kernel.policy import Policy
from shared.kernel.topology import SERVICES, destinations
from shared.runtime.build import code_digest, policy_applied
from tests.builders.audit import exported, lines_of, rewritten, scenario_run

NAME = "kai-priority-preemption"


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return exported(scenario_run(NAME), tmp_path / "log.jsonl")


def _applied(policy: Policy, services: tuple[str, ...], at: float, source: str = "queue") -> bytes:
    return to_json(wrap(policy_applied(policy, services), source=source, cause=None, index=0, at=at)) + b"\n"


def test_the_embedded_log_starts_with_the_policy_of_all_four_services(log: Path) -> None:
    run = scenario_run(NAME)
    first = run.runtime.log[0]
    assert first.type == "PolicyApplied" and first.causation_id is None and destinations(first) == ()
    p = first.payload
    assert isinstance(p, PolicyApplied)
    assert p.services == SERVICES and Policy.from_mapping(p.policy) == run.policy
    assert (p.policy_digest, p.code_digest) == (run.policy.digest(), code_digest())
    assert sum(e.type == "PolicyApplied" for e in run.runtime.log) == 1
    assert starting_policy(LogFile(log)) == run.policy and policy_changes(LogFile(log)) == 0


def test_policy_digest_and_differences_ignore_how_the_policy_was_written() -> None:
    a = Policy.from_mapping({"queueing": "StrictFIFO", "min_runtime_seconds": 60})
    b = Policy.from_mapping({"min_runtime_seconds": 60.0, "queueing": "StrictFIFO", "placement": "binpack"})
    assert a.digest() == b.digest() and a.differences(b) == []
    assert Policy().differences(a) == ["min_runtime_seconds: 0.0 != 60.0", "queueing: 'BestEffortFIFO' != 'StrictFIFO'"]


def test_a_switch_mid_log_rebuilds_the_service_from_its_inbox_under_the_new_policy(log: Path, tmp_path: Path) -> None:
    """A service restarted with another policy folds its whole inbox again under it: the replay does the
    same at the ``PolicyApplied``, and the decisions that follow are compared under the new policy."""
    run = scenario_run(NAME)
    lines = lines_of(log)
    newer = run.policy.model_copy(update={"backoff_max_seconds": 61.0})
    middle = len(lines) // 2
    at = json.loads(lines[middle])["occurred_at"]
    switched = rewritten(log, lines[:middle] + [_applied(newer, ("queue",), at)] + lines[middle:],
                         tmp_path / "switched.jsonl")
    notes: list[str] = []
    replayer = Replayer(None, note=notes.append)
    tally = verify(LogFile(switched), None, replayer=replayer)  # a backoff cap no decision reached: same log
    assert tally.different == 0 and replayer.policies["queue"] == newer and replayer.policies["admission"] == run.policy
    assert replayer.services["queue"].core.policy == newer
    assert len(notes) == 1 and f"policy changes at line {middle + 2}: from here with policy {newer.digest()}: queue (" in notes[0]
    assert "backoff_max_seconds: 61.0 != 60.0" in notes[0]
    assert policy_changes(LogFile(switched)) == 1 and starting_policy(LogFile(switched)) == run.policy


def test_a_switch_to_a_policy_that_decides_otherwise_diverges_after_it_and_blames_the_policy_change(
        log: Path, tmp_path: Path) -> None:
    run = scenario_run(NAME)
    lines = lines_of(log)
    strict = run.policy.model_copy(update={"min_runtime_seconds": 10_000.0})
    switched = rewritten(log, lines[:1] + [_applied(strict, SERVICES, 0.0, source="runtime")] + lines[1:],
                         tmp_path / "strict.jsonl")
    replayer = Replayer(None)
    with pytest.raises(Divergence) as caught:
        verify(LogFile(switched), None, replayer=replayer)
    assert replayer.policies["placement"] == strict  # the later event wins: nothing was handled before it
    assert caught.value.blame.startswith("the log was altered")  # its code and policy are the recorded ones


def test_the_same_policy_again_changes_nothing(log: Path, tmp_path: Path) -> None:
    run = scenario_run(NAME)
    lines = lines_of(log)
    middle = len(lines) // 2
    again = rewritten(log, lines[:middle] + [_applied(run.policy, ("queue",), 1.0)] + lines[middle:],
                      tmp_path / "again.jsonl")
    replayer = Replayer(None)
    tally = verify(LogFile(again), None, replayer=replayer)
    assert tally.different == 0 and replayer.notes == []
    assert policy_changes(LogFile(again)) == 0


def test_an_override_decides_throughout_and_says_where_it_differs(log: Path) -> None:
    run = scenario_run(NAME)
    other = run.policy.model_copy(update={"min_runtime_seconds": 10_000.0})
    replayer = Replayer(run.policy, override=other)
    with pytest.raises(Divergence) as caught:
        verify(LogFile(log), run.policy, replayer=replayer)
    assert all(p == other for p in replayer.policies.values())
    assert len(replayer.notes) == 1
    assert replayer.notes[0].startswith("policy differs: admission, queue, placement, reconciler decided with policy ")
    assert "min_runtime_seconds: 10000.0 != 0.0" in replayer.notes[0]
    assert caught.value.blame.startswith("the code or policy differs: this replay decides under --policy")


def test_no_policy_anywhere_cannot_be_replayed(log: Path, tmp_path: Path) -> None:
    lines = [line for line in lines_of(log) if b'"type":"PolicyApplied"' not in line]
    bare = rewritten(log, lines, tmp_path / "bare.jsonl")
    with pytest.raises(CannotReproduce, match="before it records the policy"):
        verify(LogFile(bare), None)


def test_a_kafka_log_puts_a_services_policy_where_it_took_it_in_its_inbox() -> None:
    """``replay_order``: a restarted service's ``PolicyApplied`` goes right after the last input it had
    handled (``after``) and before the next, whatever the topic's order; with none, before the first."""
    from shared.audit.kafka import replay_order
    from shared.kernel.events import TimerFired

    x1, x2, x3 = (wrap(TimerFired(key=f"k{n}"), source="clock", cause=None, index=n, at=float(n)) for n in (1, 2, 3))
    handled = {"queue": [x1.id, x2.id, x3.id]}
    for after, expected in ((x1.id, [x1, "P", x2, x3]), (None, ["P", x1, x2, x3]), (x3.id, [x1, x2, x3, "P"])):
        p = wrap(policy_applied(Policy(), ("queue",), after=after), source="queue", cause=None, index=0, at=9.0)
        log = [x1, x2, x3, p] if after != x3.id else [p, x1, x2, x3]  # written late, or early
        order = [log[i] for i in replay_order(log, handled)]
        assert [e if e is not p else "P" for e in order] == expected
