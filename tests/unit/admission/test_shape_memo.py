"""The shape a Ray workload's spec gives, remembered across workloads, is the one parsing it gives."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.admission import core as admission_core
from services.admission.core import RayWorkload, _shape
from services.admission.dialects import KUBERAY, GangRules
from services.admission.fields import Invalid
from services.admission.workloads import gang_of, parse_ray_cluster, parse_ray_job, with_minimum
from tests.builders import ray_cluster, ray_job, worker_group

# Values a parser reads differently though ``==`` takes them as one (1, 1.0, True), and text.
_REPLICAS = st.sampled_from([1, 1.0, True, 2])
_CPU = st.sampled_from(["1", 1, 1.0, True])
_RULES = st.sampled_from([KUBERAY, GangRules(ray_minimum="min-replicas", charge_submitter=False)])


def _workload(obj: dict[str, Any]) -> RayWorkload:
    return RayWorkload(kind=obj["kind"], key=f"default/{obj['metadata']['name']}", namespace="default",
                       name=obj["metadata"]["name"], obj=obj, first_seen=0.0, gate="pods")


def _parsed(obj: dict[str, Any], rules: GangRules) -> Any:
    parse = parse_ray_cluster if obj["kind"] == "RayCluster" else parse_ray_job
    try:
        return parse(obj["metadata"]["name"], obj, rules)
    except Invalid as exc:
        return exc.reason


def _ray_object(kind: str, name: str, replicas: Any, cpu: Any, min_replicas: Any, mode: str | None) -> dict[str, Any]:
    group = worker_group(replicas=replicas, requests={"cpu": cpu, "memory": "1Gi"}, min_replicas=min_replicas)
    if kind == "RayCluster":
        return ray_cluster(name, workers=[group], enableInTreeAutoscaling=True)
    return ray_job(name, workers=[group], submission_mode=mode, enableInTreeAutoscaling=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["RayCluster", "RayJob"]), st.sampled_from(["a", "job-1", "job-2"]),
                          _REPLICAS, _CPU, _RULES), min_size=1, max_size=10),
       st.sampled_from([None, 0, 1, 1.0]), st.sampled_from([None, "HTTPMode", "SidecarMode"]))
def test_a_remembered_shape_is_the_parsed_shape(items: list[tuple[str, str, Any, Any, GangRules]], min_replicas: Any,
                                                mode: str | None) -> None:
    """Workloads of several names whose specs differ only where ``==`` cannot tell (``1``, ``1.0``,
    ``true``), under two dialects' rules, one after another through the memo: each gets exactly
    what parsing its own object gives (its own cluster name too), or the same refusal."""
    admission_core._shapes_memo.clear()
    for kind, name, replicas, cpu, rules in items:
        obj = _ray_object(kind, name, replicas, cpu, min_replicas, mode)
        expected = _parsed(obj, rules)
        try:
            got: Any = _shape(_workload(obj), rules)
        except Invalid as exc:
            got = exc.reason
        assert got == expected
        if not isinstance(expected, str):
            assert repr(got) == repr(expected)  # the same types as well as equal values


def test_a_refused_spec_is_not_remembered() -> None:
    admission_core._shapes_memo.clear()
    bad = ray_cluster("bad", workers=[worker_group(min_replicas=3, max_replicas=1)])
    for _ in range(2):
        with pytest.raises(Invalid):
            _shape(_workload(bad), KUBERAY)
    assert not admission_core._shapes_memo


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3), st.booleans()), min_size=1, max_size=4),
       st.integers(0, 12))
def test_with_minimum_is_the_copied_gang(sets: list[tuple[int, int, bool]], min_member: int) -> None:
    """``with_minimum`` keeps the gang it was given when nothing moves: equal to the gang rebuilt
    from copies of every pod set, as it was made before."""
    from shared.kernel.model import PodSet
    gang = gang_of([PodSet(name=f"s{i}", count=count, elastic=elastic, in_gang=in_gang, resources={"cpu": 1000})
                    for i, (count, elastic, in_gang) in enumerate(sets)])
    left, copied = min_member, []
    for ps in gang.pod_sets:
        if not ps.in_gang:
            copied.append(ps)
            continue
        take = min(left, ps.desired)
        left -= take
        copied.append(ps.model_copy(update={"count": take, "elastic": ps.desired - take}))
    got = with_minimum(gang, min_member)
    assert got == gang_of(copied)
    assert got.model_dump_json() == gang_of(copied).model_dump_json()
