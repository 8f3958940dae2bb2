"""Whatever order the watches of different resources deliver them in, every pod is stamped with the
workload it truly serves (``services.reconciler.owners``): a RayJob's cluster pods and submitter pods
with the RayJob, a RayCluster's own pods with nothing, a plain Job's pods with nothing."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from services.reconciler.owners import Owners
from shared.kernel import kube
from tests.unit.reconciler.test_owners import job_pod, ray_pod, raycluster, rayjob


def _world(jobs: int, clusters: int, plain_jobs: int) -> tuple[list[dict[str, Any]], dict[str, str | None]]:
    """The objects of a namespace and, per pod, the ``namespace/name`` of the workload it serves (None:
    a RayCluster's own pods are keyed by their cluster, a plain Job's by nothing)."""
    objects: list[dict[str, Any]] = []
    truth: dict[str, str | None] = {}
    for i in range(jobs):
        name, cluster = f"job{i}", f"job{i}-x{i}k2p"
        objects += [rayjob(name), raycluster(cluster, job=name)]
        for pod in (ray_pod(f"{cluster}-head-a", cluster), ray_pod(f"{cluster}-w-worker-b", cluster),
                    job_pod(f"{name}-s{i}", name)):
            objects.append(pod)
            truth[pod["metadata"]["name"]] = f"team-a/{name}"
    for i in range(clusters):
        name = f"rc{i}"
        objects.append(raycluster(name))
        pod = ray_pod(f"{name}-head-c", name)
        objects.append(pod)
        truth[pod["metadata"]["name"]] = f"team-a/{name}"
    for i in range(plain_jobs):
        pod = job_pod(f"etl{i}-d", f"etl{i}")
        objects.append(pod)
        truth[pod["metadata"]["name"]] = None
    return objects, truth


@settings(max_examples=200, deadline=None)
@given(st.data(), st.integers(0, 3), st.integers(0, 3), st.integers(0, 2))
def test_every_pod_is_stamped_with_its_true_owner_in_any_delivery_order(data: st.DataObject, jobs: int,
                                                                        clusters: int, plain_jobs: int) -> None:
    objects, truth = _world(jobs, clusters, plain_jobs)
    order = data.draw(st.permutations(objects))
    existing = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    owners = Owners()
    for obj in order:
        wanted = owners.look_up(obj)
        if wanted is not None:  # the API server answers from what exists
            owners.learn(wanted, existing.get((wanted[0], wanted[2])))
        seen = owners.stamped("Added", obj)
        if obj["kind"] == "Pod":
            assert kube.workload_key_of_pod(seen) == truth[obj["metadata"]["name"]], obj["metadata"]["name"]
    assert owners.lookups <= 2 * jobs + clusters + plain_jobs  # each RayCluster and Job name asked after once at most
