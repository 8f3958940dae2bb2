"""shared/audit/explain.py: every wait in every scenario is explained, with numbers."""

from __future__ import annotations

import re

import pytest

from shared.audit.explain import UnknownQueue, UnknownWorkload, explain, fold_until, queue_lines
from tests.builders.audit import SCENARIO_FILES, scenario_run

NUMBER = re.compile(r"\d")


def _waiting_moments(name: str) -> list[tuple[float, str]]:
    """(time, workload) for every workload waiting at the end of the run or at an expectation's time."""
    run = scenario_run(name)
    end = run.history.result()
    moments = [(run.runtime.now, key) for key, w in end["workloads"].items() if w["phase"] in ("Queued", "Preempted")]
    for e in run.scenario.expect:
        phase, _ = run.history.workloads[e.workload].phase_at(e.at) if e.workload in run.history.workloads else (None, "")
        if phase in ("Queued", "Preempted"):
            moments.append((e.at, e.workload))
    return moments


@pytest.mark.parametrize("name", [p.stem for p in SCENARIO_FILES])
def test_every_pending_workload_has_an_explanation_with_numbers(name: str) -> None:
    run = scenario_run(name)
    for at, key in _waiting_moments(name):
        doc = explain(fold_until(run.runtime.log, at, run.policy), key)
        assert doc["phase"] in ("Queued", "Preempted"), (at, key)
        body = doc["lines"][1:]
        assert body, (at, key)
        assert doc["reason"], (at, key)
        assert any(NUMBER.search(line) for line in body if not line.startswith("  why:")), (at, key, doc["lines"])
        assert doc["quota"], (at, key)
        assert doc.get("position") or doc["reason"], (at, key)


def test_a_preempted_workload_says_by_whom_under_which_rule_with_the_decisions() -> None:
    run = scenario_run("kai-priority-preemption")
    doc = explain(fold_until(run.runtime.log, 40.0, run.policy), "default/train-cluster")
    assert (doc["phase"], doc["since"], doc["for_seconds"]) == ("Queued", 30.0, 10.0)
    [p] = doc["preempted"]
    assert (p["by"], p["priority"], p["rule"], p["t"]) == ("default/build-cluster", 100, "priority preemption", 30.0)
    ids = {e.id: e for e in run.runtime.log}
    assert ids[p["decision"]].type == "PreemptionRequested" and ids[p["preemptor_decision"]].type in (
        "Dequeued", "ReclaimRequested")
    assert doc["nodes"]["reason"].endswith("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
    assert ids[doc["nodes"]["decision"]].type == "PlacementFailed"
    assert "backoff" not in doc  # no node and no victim: it waits for a release with room, not for a timer
    assert doc["position"] == {"queue": "team-a", "position": 1, "of": 1, "ahead": []}
    assert doc["gang"]["line"] == "2/2 tasks in gang unschedulable: pod group is not ready, 2 Pending, 2 minAvailable"
    assert any(line.startswith("  preempted at 30s by default/build-cluster (priority 100)") for line in doc["lines"])


def test_a_quota_wait_shows_usage_and_limit_up_the_tree() -> None:
    run = scenario_run("volcano-gang-queue")
    doc = explain(fold_until(run.runtime.log, 60.0, run.policy), "default/test-cluster-1")
    cpu = next(line for line in doc["quota"] if line["resource"] == "cpu")
    assert (cpu["queue"], cpu["used"], cpu["requested"], cpu["limit"], cpu["limit_word"], cpu["fits"]) == (
        "kuberay-test-queue", "3", "3", "4", "capability", False)
    assert "  quota kuberay-test-queue cpu: used 3 + requested 3 against capability 4: over" in doc["lines"]
    assert doc["nodes"] is None  # the quota stops it before placement is asked


def test_the_queue_lists_its_waiting_workloads_in_order() -> None:
    run = scenario_run("strict-vs-besteffort-fifo")
    moment = fold_until(run.runtime.log, None, run.policy)
    for queue in {w.queue for w in moment.history.workloads.values() if w.queue}:
        lines = queue_lines(moment, queue)
        assert [line["position"] for line in lines] == list(range(1, len(lines) + 1))
        assert all(moment.history.workloads[line["workload"]].queue == queue for line in lines)


def test_without_the_policy_positions_come_from_the_result_view() -> None:
    run = scenario_run("volcano-gang-queue")
    with_core = explain(fold_until(run.runtime.log, 60.0, run.policy), "default/test-cluster-1")
    without = explain(fold_until(run.runtime.log, 60.0, None), "default/test-cluster-1")
    assert with_core["position"] == without["position"]


def test_an_unknown_workload_names_the_ones_that_come_close() -> None:
    run = scenario_run("volcano-gang-queue")
    with pytest.raises(UnknownWorkload) as caught:
        explain(fold_until(run.runtime.log, None, run.policy), "default/test-cluster")
    assert caught.value.similar == ["default/test-cluster-0", "default/test-cluster-1"]


def test_a_typo_in_a_workload_name_names_the_ones_spelled_nearly_like_it() -> None:
    run = scenario_run("volcano-gang-queue")
    with pytest.raises(UnknownWorkload) as caught:
        explain(fold_until(run.runtime.log, None, run.policy), "default/test-clster-1")
    assert "default/test-cluster-1" in caught.value.similar


def test_an_unknown_queue_is_not_an_empty_queue() -> None:
    """A queue the log never defined nor used is a mistake to say, not "0 waiting"; the implicit default
    queue and a queue only named by its workloads are known."""
    run = scenario_run("unknown-queue-waits")
    moment = fold_until(run.runtime.log, 20.0, run.policy)  # queue "later" is defined at 30s
    assert "later" not in moment.history.queues
    assert [line["workload"] for line in queue_lines(moment, "later")] == ["default/early-bird"]
    assert queue_lines(moment, "default") == []
    moment = fold_until(run.runtime.log, None, run.policy)
    with pytest.raises(UnknownQueue) as caught:
        queue_lines(moment, "no-such-queue")
    assert caught.value.key == "no-such-queue"
    typo = sorted(moment.history.queues)[0]
    with pytest.raises(UnknownQueue) as caught:
        queue_lines(moment, typo[:-1])
    assert typo in caught.value.similar


def test_quota_lines_use_the_dialects_words() -> None:
    """kube-queue users read max and min, KAI users limit and quota, Volcano users capability and guarantee."""
    run = scenario_run("kube-queue-quota-tree-rayjobs")
    doc = explain(fold_until(run.runtime.log, 60.0, run.policy), "video/rayjob-video-b")
    assert "  quota video cpu: used 12 + requested 12 against max 14, min 12: over" in doc["lines"]
    kai = scenario_run("fair-share-two-teams")
    doc = explain(fold_until(kai.runtime.log, 60.0, kai.policy), "team-a/a-3")
    assert any(line.startswith("  quota team-a cpu: ") and line.endswith("against limit unlimited, quota 4: fits")
               for line in doc["lines"]), doc["lines"]


def test_a_workload_backing_off_says_which_attempt_and_when_it_retries() -> None:
    """placement-constraints: default/untolerated fits no node (its pool's one node is tainted), so every
    attempt fails and it backs off base x 2^(attempts-1) seconds: from 3s, retries at 4, 6, 10, 18s. Between
    a BackedOff and its retry, explain names the attempt, the retry time and the decision; at the retry the
    line is the next backoff's."""
    run = scenario_run("placement-constraints")
    key, base = "default/untolerated", run.policy.backoff_base_seconds
    backoffs = [e for e in run.runtime.log if e.type == "BackedOff" and e.payload.key == key]
    schedule = [(e.occurred_at, e.payload.attempts, e.occurred_at + base * 2 ** (e.payload.attempts - 1))
                for e in backoffs]
    assert schedule[:4] == [(3.0, 1, 4.0), (4.0, 2, 6.0), (6.0, 3, 10.0), (10.0, 4, 18.0)]
    for e, (t, attempt, retry) in zip(backoffs, schedule):
        assert e.payload.requeue_at == retry
        for at in (t, (t + retry) / 2, retry - 0.001):
            moment = fold_until(run.runtime.log, at, run.policy)
            doc = explain(moment, key)
            assert doc["backoff"] == {"until": retry, "attempts": attempt, "decision": e.id,
                                      "reason": e.payload.reason}, (at, doc.get("backoff"))
            assert (f"  backoff: attempt {attempt}, retries at {retry:g}s or when capacity frees "
                    f"(decision {e.id})") in doc["lines"], (at, doc["lines"])
            [listed] = [line for line in queue_lines(moment, "default") if line["workload"] == key]
            assert listed["backoff_until"] == retry
        after = explain(fold_until(run.runtime.log, retry, run.policy), key)
        assert after.get("backoff", {}).get("until") != retry  # retried: no longer this backoff
    line = next(text for text in explain(fold_until(run.runtime.log, 8.0, run.policy), key)["lines"]
                if text.startswith("  backoff:"))
    assert line.startswith("  backoff: attempt 3, retries at 10s or when capacity frees (decision ")


WINDOW_NOTE = ("this log is a window from {since:g}s: state before it is unknown; figures below count only what the "
               "window holds")


def _window(name: str, since: float, at: float, key: str) -> dict:
    """``key`` explained at ``at`` from the part of ``name``'s log at or after ``since``, as ``log export --since``
    keeps it and its header marks it."""
    run = scenario_run(name)
    kept = [e for e in run.runtime.log if e.occurred_at >= since]
    return explain(fold_until(kept, at, run.policy, since=since), key)


def test_a_window_says_so_first_and_names_a_queue_defined_before_it_instead_of_calling_it_unlimited() -> None:
    """volcano-gang-queue from 5s: kuberay-test-queue was defined at 0s and test-cluster-0 admitted before 5s.
    The recorded reason still says "capability cpu 4: used 3"; the explanation must not go on to call the queue
    undefined and unlimited with nothing used."""
    doc = _window("volcano-gang-queue", 5.0, 60.0, "default/test-cluster-1")
    assert doc["window"] == {"since": 5.0, "until": None}
    assert doc["lines"][0] == WINDOW_NOTE.format(since=5.0)
    assert doc["lines"][1].startswith("default/test-cluster-1 (RayCluster, queue kuberay-test-queue, priority 0) at "
                                      "60s")
    assert "capability cpu 4: used 3, requested 3" in doc["reason"]  # as recorded
    assert doc["quota"] == [{"queue": "kuberay-test-queue", "defined": False, "before_window": True}]
    quota = [line for line in doc["lines"] if line.startswith("  quota")]
    assert quota == ["  quota: queue kuberay-test-queue's definition is before the window (if it has one): its limits "
                     "are unknown"]
    whole = explain(fold_until(scenario_run("volcano-gang-queue").runtime.log, 60.0, None), "default/test-cluster-1")
    assert whole["window"] is None and not whole["lines"][0].startswith("this log is a window")


def test_in_a_window_usage_is_a_lower_bound_over_stands_and_fits_cannot_be_told() -> None:
    """A queue the window does define: its usage counts the window's holders only. Over the limit with those
    alone is over; within it, usage from before the window may still fill it."""
    over = _window("volcano-gang-queue", 0.0, 60.0, "default/test-cluster-1")
    assert ("  quota kuberay-test-queue cpu: used 3 in the window + requested 3 against capability 4: over"
            in over["lines"])
    fits = _window("fair-share-two-teams", 0.0, 60.0, "team-a/a-3")
    line = next(line for line in fits["lines"] if line.startswith("  quota team-a cpu: "))
    assert line.endswith("against limit unlimited, quota 4: unknown (usage from before the window is not in it)"), line
    assert " in the window + " in line
    team = [q for q in fits["quota"] if q["queue"] == "team-a"]
    assert team and all(q["fits"] is None and q["in_window"] for q in team)


@pytest.mark.parametrize("name", [p.stem for p in SCENARIO_FILES])
def test_no_explanation_of_a_window_says_a_quota_fits(name: str) -> None:
    """Every waiting workload of every scenario, explained from windows starting part way to the moment:
    the note comes first, and no quota line claims room the state before the window may have taken."""
    run = scenario_run(name)
    start = run.runtime.log[0].occurred_at
    for at, key in _waiting_moments(name):
        for since in {start + (at - start) * f for f in (0.0, 0.5, 1.0)}:
            try:
                doc = _window(name, since, at, key)
            except UnknownWorkload:
                continue  # nothing of it in the window: the command says so, naming the window
            assert doc["lines"][0] == WINDOW_NOTE.format(since=since), (since, at, key)
            for line in doc["lines"]:
                assert not (line.startswith("  quota") and line.endswith(": fits")), (since, at, key, line)
                assert "(not defined)" not in line or not line.startswith("  quota"), (since, at, key, line)
