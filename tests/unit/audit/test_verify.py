"""shared/audit/replay.py: every scenario's log verifies; a tampered one fails where the tamper is."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.audit.errors import CannotReproduce
from shared.audit.logfile import LogFile, open_log
from shared.audit.replay import Divergence, Replayer, Router, inbox, replay, verify
from shared.kernel.events import TimerFired, TimerSet, to_json, wrap
from shared.kernel.topology import SERVICES
from tests.builders.audit import (
    SCENARIO_FILES, decision_lines, exported, header_of, lines_of, rewritten, scenario_run,
)

PREEMPTION = "kai-priority-preemption"


@pytest.mark.parametrize("name", [p.stem for p in SCENARIO_FILES])
def test_every_scenarios_log_verifies_clean(name: str, tmp_path: Path) -> None:
    run = scenario_run(name)
    source = LogFile(exported(run, tmp_path / "log.jsonl"))
    tally = verify(source, source.header.decided_with())
    decisions = sum(1 for e in run.runtime.log if e.source in SERVICES)
    assert (tally.events, tally.derived, tally.identical, tally.different) == (len(run.runtime.log), decisions,
                                                                             decisions, 0)


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return exported(scenario_run(PREEMPTION), tmp_path / "log.jsonl")


def _diverges(path: Path) -> Divergence:
    source = LogFile(path)
    with pytest.raises(Divergence) as caught:
        verify(source, source.header.decided_with())
    return caught.value


def test_an_altered_decision_is_found_on_its_line_with_both_envelopes(log: Path, tmp_path: Path) -> None:
    lines = lines_of(log)
    i = decision_lines(lines)[3]
    lines[i] = lines[i].replace(b'"reason":"', b'"reason":"forged ', 1)
    d = _diverges(rewritten(log, lines, tmp_path / "altered.jsonl"))
    assert (d.kind, d.where) == ("differs", f"line {i + 2}")
    assert d.recorded_raw == lines[i].rstrip(b"\n")
    assert d.derived is not None and d.derived.data == lines_of(log)[i].rstrip(b"\n")
    assert d.cause is not None and d.cause.id == d.recorded.causation_id


def test_a_dropped_decision_is_missed_where_its_effect_or_successor_comes(log: Path, tmp_path: Path) -> None:
    lines = lines_of(log)
    i = decision_lines(lines)[3]
    dropped = lines[i][7:31].decode()
    d = _diverges(rewritten(log, lines[:i] + lines[i + 1:], tmp_path / "dropped.jsonl"))
    assert d.kind == "missing"
    assert d.derived is not None and d.derived.envelope.id == dropped
    assert int(d.where.split()[1]) in (i + 2, i + 3)  # at the first line that comes after the dropped one


def test_a_reordered_decision_is_found_where_the_order_breaks(log: Path, tmp_path: Path) -> None:
    lines = lines_of(log)
    i = decision_lines(lines)[3]
    j = next(k for k in range(i + 1, len(lines)) if b'"source":"queue"' in lines[k])
    swapped = lines[:]
    swapped[i], swapped[j] = swapped[j], swapped[i]
    d = _diverges(rewritten(log, swapped, tmp_path / "reordered.jsonl"))
    assert d.kind in ("missing", "unexpected")
    assert int(d.where.split()[1]) <= j + 2


def test_a_duplicated_decision_is_found_on_the_copy(log: Path, tmp_path: Path) -> None:
    lines = lines_of(log)
    i = decision_lines(lines)[3]
    d = _diverges(rewritten(log, lines[:i + 1] + [lines[i]] + lines[i + 1:], tmp_path / "duplicated.jsonl"))
    assert (d.kind, d.where) == ("unexpected", f"line {i + 3}")
    assert "duplicate" in d.message


def test_a_copy_of_a_decision_long_after_it_is_named_a_duplicate(log: Path, tmp_path: Path) -> None:
    lines = lines_of(log)
    i = decision_lines(lines)[0]
    d = _diverges(rewritten(log, lines + [lines[i]], tmp_path / "late-copy.jsonl"))  # the replayer keeps no set of ids
    assert (d.kind, d.where) == ("unexpected", f"line {len(lines) + 2}")
    assert "duplicate" in d.message


def test_a_replayer_keeps_nothing_per_verified_decision(log: Path) -> None:
    replayer = Replayer(scenario_run(PREEMPTION).policy)
    tally = verify(LogFile(log), scenario_run(PREEMPTION).policy, replayer=replayer)
    assert tally.identical > 20
    held = {name: len(value) for name, value in vars(replayer).items() if isinstance(value, (set, dict, list))}
    assert all(n < tally.identical for n in held.values()), held  # only what is owed, per service, and routing


def test_a_decision_cut_from_the_end_is_owed_when_the_log_ends(log: Path, tmp_path: Path) -> None:
    lines = lines_of(log)
    last = max(i for i, line in enumerate(lines) if b'"source":"reconciler"' in line and b'"KubeEffect"' in line)
    d = _diverges(rewritten(log, lines[:last], tmp_path / "cut.jsonl"))  # the log ends before it
    assert d.kind == "unfinished"
    assert d.derived is not None and d.derived.data == lines[last].rstrip(b"\n")


def test_a_dropped_timer_is_missed_where_it_fires(log: Path, tmp_path: Path) -> None:
    lines = lines_of(log)
    i = next(i for i, line in enumerate(lines) if b'"type":"TimerSet"' in line)
    timer = lines[i][7:31]
    fired = next(k for k in range(i, len(lines)) if b'"causation_id":"%s"' % timer in lines[k])
    d = _diverges(rewritten(log, lines[:i] + lines[i + 1:], tmp_path / "timer.jsonl"))
    assert (d.kind, d.where) == ("missing", f"line {fired + 1}")
    assert d.derived is not None and d.derived.envelope.type == "TimerSet"


def test_a_timer_no_service_set_is_unexpected(log: Path, tmp_path: Path) -> None:
    lines = lines_of(log)
    k = next(k for k, line in enumerate(lines) if b'"type":"TimerFired"' in line)
    cause = lines[k].split(b'"causation_id":"')[1][:24]
    lines[k] = lines[k].replace(cause, b"0" * 24)
    d = _diverges(rewritten(log, lines, tmp_path / "timer.jsonl"))
    assert (d.kind, d.where) == ("unexpected", f"line {k + 2}")
    assert "no service set" in d.message


def test_replay_yields_each_envelope_with_what_each_service_derived_from_it(log: Path) -> None:
    run = scenario_run(PREEMPTION)
    steps = list(replay(LogFile(log), run.policy))
    assert [s.envelope.id for s in steps] == [e.id for e in run.runtime.log]
    derived = [to_json(out) for s in steps for _, outs in s.outputs for out in outs]
    assert sorted(derived) == sorted(to_json(e) for e in run.runtime.log if e.source in SERVICES)
    assert steps[0].where == "line 2"


def test_without_checking_a_replay_only_feeds_the_cores(log: Path, tmp_path: Path) -> None:
    lines = lines_of(log)
    i = decision_lines(lines)[3]
    lines[i] = lines[i].replace(b'"reason":"', b'"reason":"forged ', 1)
    altered = rewritten(log, lines, tmp_path / "altered.jsonl")
    assert len(list(replay(LogFile(altered), scenario_run(PREEMPTION).policy, check=False))) == len(lines)


@pytest.mark.parametrize("service", SERVICES)
def test_a_services_inbox_is_the_log_routed_to_it(service: str) -> None:
    log = scenario_run(PREEMPTION).runtime.log
    got = list(inbox(log, service))
    assert got and all(e in log for e in got)
    assert [log.index(e) for e in got] == sorted(log.index(e) for e in got)


def test_a_log_without_its_policy_cannot_be_verified(tmp_path: Path) -> None:
    run = scenario_run(PREEMPTION)
    path = tmp_path / "nopolicy.jsonl"
    from shared.audit.logfile import write_log

    write_log(path, header_of(run).model_copy(update={"policy": None}), (to_json(e) for e in run.runtime.log))
    with pytest.raises(CannotReproduce, match="does not record the policy"):
        open_log(str(path)).header.decided_with()
    assert verify(open_log(str(path), policy=run.policy), run.policy).different == 0


def test_a_policy_this_muster_does_not_read_cannot_reproduce(tmp_path: Path) -> None:
    run = scenario_run(PREEMPTION)
    path = tmp_path / "odd.jsonl"
    from shared.audit.logfile import write_log

    write_log(path, header_of(run).model_copy(update={"policy": {"queueing": "Lottery"}}), [])
    with pytest.raises(CannotReproduce, match="queueing"):
        LogFile(path).header.decided_with()


def test_a_window_of_a_history_is_not_verified(log: Path, tmp_path: Path) -> None:
    from shared.audit.export import export

    window = tmp_path / "window.jsonl"
    export(LogFile(log), window, since=30.0)
    with pytest.raises(CannotReproduce, match="window"):
        LogFile(window).header.whole("--verify")


def test_the_replayer_counts_deliveries_per_service_handling(log: Path) -> None:
    replayer = Replayer(scenario_run(PREEMPTION).policy)
    for _ in replayer.run(LogFile(log)):
        pass
    assert replayer.tally.delivered >= replayer.tally.events - sum(
        1 for e in scenario_run(PREEMPTION).runtime.log if e.type in ("TimerSet", "KubeEffect"))


def _timer_pair(key: str, at: float, t: float, source: str = "queue", index: int = 0):
    """A ``TimerSet`` of ``source`` at event time ``t`` and the ``TimerFired`` a clock answers it with."""
    timer_set = wrap(TimerSet(key=key, at=at), source=source, cause=envelope_at(t, index), index=0)
    return timer_set, wrap(TimerFired(key=key), source="clock", cause=timer_set, index=0, at=max(at, t))


def envelope_at(t: float, index: int):
    return wrap(TimerFired(key="cause"), source="clock", cause=None, index=index, at=t)


def test_the_router_remembers_timers_pending_and_a_window_of_settled_ones() -> None:
    router = Router(window=3)
    for n in range(50):
        timer_set, fired = _timer_pair("cycle", float(n + 1), float(n), index=n)
        assert router.targets(timer_set) == ()
        assert router.targets(fired) == ("queue",)
        assert router.targets(fired) == ("queue",)  # a copy (a restarted clock): still its service's
    assert len(router) == 3  # the last three settled; none pending
    first, _ = _timer_pair("cycle", 1.0, 0.0, index=0)
    assert router.targets(_timer_pair("cycle", 1.0, 0.0, index=0)[1]) is None  # settled long ago: forgotten
    assert first.id not in router._settled


def test_a_second_timer_set_for_the_same_instant_settles_with_the_one_that_fires() -> None:
    router = Router()
    one, fired = _timer_pair("cycle", 5.0, 1.0, index=1)
    two, _ = _timer_pair("cycle", 5.0, 2.0, index=2)  # the clock has one armed for (queue, cycle, 5): never fires
    other, _ = _timer_pair("status", 5.0, 2.0, source="reconciler", index=3)
    for timer_set in (one, two, other):
        router.targets(timer_set)
    assert router.targets(fired) == ("queue",)
    assert set(router._pending) == {other.id} and set(router._settled) == {one.id, two.id}

