"""Bad input never raises; the node table's invariants hold under any sequence of gangs."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from services.placement import gpu
from shared.kernel.events import GangPlaced, ObjectChanged, PlacementFailed
from tests.builders import gang, node, pod, pod_set, workload
from tests.builders.placement import PlacementDriver, node_changed, one


def test_malformed_objects_are_tolerated():
    d = PlacementDriver()
    bad_node = node("n1", cpu="8")
    bad_node["status"]["allocatable"]["memory"] = "lots"
    bad_node["spec"]["taints"] = ["not-a-taint", {"effect": "NoSchedule"}]
    d.feed(node_changed(bad_node))
    weird = [
        {"metadata": {"name": "p1"}, "spec": {"containers": "nope", "nodeName": "n1"}},
        {"metadata": {"name": "p2", "annotations": {"gpu-fraction": "2.5", "muster.dev/gpu-devices": "-1,x"}},
         "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"requests": {"cpu": "-1"}}}]}},
        {"metadata": "nope", "spec": None, "status": None},
        pod("huge", requests={"memory": "10Ei"}, node_name="n1"),
    ]
    for obj in weird:
        name = obj["metadata"]["name"] if isinstance(obj["metadata"], dict) else "x"
        d.feed(ObjectChanged(change="Added", kind="Pod", name=name, object=obj))
    # p1 and p2 still count as pods; cpu of the unreadable ones counts as nothing.
    placed = one(d.dequeue(workload("ns/w", gang_=gang(pod_set("head", 1, cpu="8")))), GangPlaced)
    assert placed.slots[0].node == "n1"


def test_non_finite_quantities_are_tolerated():
    """YAML ``.inf``/``.nan`` and ``1e1000000`` escape shared.kernel.quantity as arithmetic errors, not
    QuantityError; placement must still not raise (a pod of a rejected RayCluster carries them)."""
    d = PlacementDriver()
    n1 = node("n1", cpu="8")
    n1["status"]["allocatable"]["memory"] = float("inf")
    n1["status"]["allocatable"]["example.com/dongle"] = "1e1000000"
    d.feed(node_changed(n1))
    for name, value in (("inf", float("inf")), ("nan", float("nan")), ("huge", "1e1000000")):
        obj = pod(name, node_name="n1")
        obj["spec"]["containers"][0]["resources"] = {"requests": {"cpu": value}}
        d.feed(ObjectChanged(change="Added", kind="Pod", name=name, object=obj))
    placed = one(d.dequeue(workload("ns/w", gang_=gang(pod_set("head", 1, cpu="8")))), GangPlaced)
    assert placed.slots[0].node == "n1"


def test_a_pod_with_negative_device_annotation_is_charged_to_no_device():
    d = PlacementDriver(None, node("n1", gpu="1"))
    d.pod(pod("p", node_name="n1", annotations={"gpu-fraction": "0.5", "muster.dev/gpu-devices": "-1"}))
    assert d.core.nodes.device_row(0)[0] == 0


gangs = st.lists(st.tuples(st.integers(1, 4), st.integers(0, 3), st.sampled_from([0, 0, 250, 500, 1000]),
                           st.integers(0, 2)), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(gangs=gangs, withdraw_every=st.integers(2, 5), spread=st.booleans())
def test_table_invariants(gangs, withdraw_every, spread):
    from shared.kernel.policy import Policy

    d = PlacementDriver(Policy(placement="spread" if spread else "binpack"),
                        node("a", cpu="8", gpu="2"), node("b", cpu="4", gpu="1"), node("c", cpu="6"))
    keys = []
    for i, (cpu, workers, share, whole) in enumerate(gangs):
        resources = {"cpu": str(cpu)}
        if whole and not share:
            resources["nvidia.com/gpu"] = str(whole)
        sets = [pod_set("head", 1, cpu="1")] + ([pod_set("w", workers, gpu_share=share, **resources)] if workers else [])
        spec = workload(f"ns/g{i}", gang_=gang(*sets))
        out = d.dequeue(spec)
        assert len(out) >= 1 and isinstance(out[0], (GangPlaced, PlacementFailed))
        if isinstance(out[0], GangPlaced):
            keys.append(spec.key)
        if i % withdraw_every == 0 and keys:
            d.withdraw(keys.pop(0))
        table = d.core.nodes
        n = table.n
        devices = table.gpu_used[:n]
        assert ((devices <= gpu.FULL) | (devices >= gpu.SENTINEL)).all()
        assert (table.free[:, :n] >= 0).all()
        assert np.array_equal(table.free[:, :n], table.alloc[:, :n] - table.used[:, :n])
    for key in keys:
        d.withdraw(key)
    table = d.core.nodes
    assert not table.used[:, :table.n].any()
    assert ((table.gpu_used[:table.n] == 0) | (table.gpu_used[:table.n] >= gpu.SENTINEL)).all()
