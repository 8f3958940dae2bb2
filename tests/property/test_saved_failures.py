"""Minimal scenarios the property test found, each pinned to the one check it violates.

An open bug is ``xfail(strict=True)``: when it is fixed the test XPASSes and fails the suite, so the
mark is removed and the scenario stays as a regression test (all three are fixed).
"""

from __future__ import annotations

from pathlib import Path

from tests.property.test_invariants import run_and_check

FAILURES = Path(__file__).parent / "failures"


def test_saved_scenarios_run_without_exceptions() -> None:
    for path in sorted(FAILURES.glob("*.yaml")):
        violations, _ = run_and_check(path.read_text(), mask_known_bugs=False)
        assert not [v for v in violations if v.startswith("simulate raised")], path.name


def test_same_name_rayjob_raycluster_no_node_overcommitted() -> None:
    violations, _ = run_and_check((FAILURES / "same-name-rayjob-raycluster-overcommit.yaml").read_text(), mask_known_bugs=False)
    over = [v for v in violations if "over-committed" in v]
    assert not over, "\n".join(over)


def test_reclaim_victim_quota_no_queue_over_limit() -> None:
    violations, _ = run_and_check(
        (FAILURES / "reclaim-victim-quota-reused-after-placement-failed.yaml").read_text(), mask_known_bugs=False)
    over = [v for v in violations if "over its limit" in v]
    assert not over, "\n".join(over)


def test_same_name_podgang_raycluster_no_gang_partly_bound() -> None:
    """Fixed: a pod-gated gang binds nothing until a pod waits for every gang slot (placement), and a
    pod group with fewer valid pods than its minimum is held in its queue (admission's not_ready)."""
    violations, _ = run_and_check((FAILURES / "same-name-podgang-raycluster-partly-bound.yaml").read_text(), mask_known_bugs=False)
    partly = [v for v in violations if "partly bound" in v]
    assert not partly, "\n".join(partly)


def test_volcano_pinned_worker_group_without_pods_keeps_its_workload_from_being_a_victim() -> None:
    """Found while reading the opt-out per pod set: a worker group of 0 replicas whose template says
    ``volcano.sh/preemptable: "false"`` must pin its workload (the pods a scale-up brings would run on
    the preemptibility it was admitted with), not count as no pin at all."""
    violations, _ = run_and_check((FAILURES / "volcano-pinned-group-without-pods-evicted.yaml").read_text(),
                                  mask_known_bugs=False)
    evicted = [v for v in violations if "evicted" in v]
    assert not evicted, "\n".join(evicted)
