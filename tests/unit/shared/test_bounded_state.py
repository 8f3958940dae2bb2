"""Issue 14 §2: what the cores keep follows live objects, not history.

RayJobs go through their whole life (queued, admitted, run, finished, torn down, deleted) on the
embedded runtime; once they are all gone, each core holds exactly as many entries as it did after
one job, however many passed through. The bounded windows (placement's shape mix and node index;
the services' dedupe windows, ``Seen``, are no part of a core) are left out; ``make bench``'s soak measures the bytes over a day.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest

from bench.soak_bench import rayjob, steps, windows
from shared.kernel.dedupe import Seen, dedupe_window, forget_before
from shared.kernel.footprint import retained
from shared.kernel.policy import Policy
from shared.runtime.embedded import EmbeddedRuntime
from shared.sim.cluster import SimCluster
from tests.builders import node, ray_cluster, worker_group

GAP = 30.0
"""Seconds between two arrivals: a few jobs overlap, as in a busy cluster."""


POLICY = Policy.from_mapping({"scheduler_names": [*Policy().scheduler_names, "default-scheduler"]})
"""Muster binds the pods that name no scheduler too (the simulated KubeRay's)."""


def _entries_after(jobs: int) -> dict[str, int]:
    policy = POLICY
    cluster = SimCluster(pod_startup=2.0, annotation_history=False)
    runtime = EmbeddedRuntime(policy, cluster)
    plan = steps(cluster, jobs, nodes=8, seconds=jobs * GAP)
    # Long after the last deletion one more job comes and goes: the tombstones of the others expire.
    late = jobs * GAP + 2 * 3600.0
    plan.append((late, lambda now: cluster.apply(rayjob(10**6, 60), now)))
    plan.append((late + 30, lambda now: cluster.delete("RayJob", "soak", f"job-{10**6}", now)))
    runtime.run(sorted(plan, key=lambda s: s[0]), late + 600)
    entries = {name: retained(core, exclude=[policy, *windows(core)]).entries for name, core in runtime.cores.items()}
    # The simulated cluster too (what ``muster simulate`` runs): Events expire after the API server's
    # --event-ttl, and nothing else of a deleted object stays, but for the count of pods each
    # KubeRay slot ever had (so a name is never used twice: one entry per slot ever made).
    entries["cluster"] = retained(cluster, exclude=[cluster.kuberay._generations]).entries
    entries["runtime"] = retained([runtime._timers, runtime._deliveries]).entries
    return entries


@pytest.fixture(scope="module")
def baseline() -> dict[str, int]:
    return _entries_after(1)


@pytest.mark.parametrize("jobs", [6, 25])
def test_state_after_finished_jobs_returns_to_the_baseline(baseline, jobs):
    assert _entries_after(jobs) == baseline


def test_the_dedupe_window_is_sized_from_the_commit_interval():
    assert dedupe_window(2.0) == 2 * dedupe_window(1.0)
    assert dedupe_window(0.5) < dedupe_window(1.0) < 1_000_000


def test_each_source_keeps_its_own_window():
    seen = Seen(2)
    seen.add("a", "admission")
    for i in range(10):  # a busy source cannot push out another's ids
        seen.add(str(i), "placement")
    assert "a" in seen and len(seen) == 3
    assert seen.add("a", "admission") is False


def test_forget_before_drops_only_what_was_noted_before_the_horizon():
    """The tombstones and recent writes the cores and the cluster link keep for a time: oldest first,
    so dropping stops at the first entry still inside the window (a later one noted earlier stays)."""
    gone = OrderedDict([("a", 1.0), ("b", 5.0), ("c", 2.0)])
    forget_before(gone, 5.0)
    assert list(gone) == ["b", "c"]
    tombstones = OrderedDict([("x", ("uid-x", 3.0)), ("y", ("uid-y", 9.0))])
    forget_before(tombstones, 4.0, lambda entry: entry[1])
    assert tombstones == OrderedDict([("y", ("uid-y", 9.0))])
    forget_before(tombstones, 100.0, lambda entry: entry[1])
    assert not tombstones


def _reconciler_entries_after(replaced: int) -> int:
    """A RayCluster runs while its worker pods are deleted one after another (lost, evicted by
    someone else, an autoscaler's churn); KubeRay makes each a successor under a new name, which
    muster places and binds. What the reconciler keeps once the last successor is bound."""
    cluster = SimCluster(pod_startup=2.0, annotation_history=False)
    runtime = EmbeddedRuntime(POLICY, cluster)

    def boot(now: float) -> None:
        cluster.apply(node("n1", cpu="64", memory="256Gi"), now)
        cluster.apply(ray_cluster("rc", workers=[worker_group(replicas=2)]), now)

    def lose_a_worker(now: float) -> None:
        workers = sorted(p["metadata"]["name"] for p in cluster.api.objects("Pod", "default")
                         if p["metadata"]["labels"].get("ray.io/node-type") == "worker")
        cluster.delete("Pod", "default", workers[0], now)

    plan = [(0.0, boot)] + [(10.0 * (i + 1), lose_a_worker) for i in range(replaced)]
    runtime.run(plan, 10.0 * (replaced + 2))
    core = runtime.cores["reconciler"]
    return retained(core, exclude=windows(core)).entries


def test_the_reconciler_keeps_only_the_live_pods_of_a_workload_whose_pods_come_and_go():
    """Bounded state within one live workload: per-pod memory (what was bound, which pods the workload
    had) follows the pods that exist, not every pod the workload ever had."""
    assert _reconciler_entries_after(8) == _reconciler_entries_after(2)
