"""Waiting for room: placement keys a gang it found no node and no victim for by its shape,
and every release it reports says how many gangs of each waiting shape the free nodes hold."""

from __future__ import annotations

from shared.kernel.events import CapacityChanged, PlacementFailed
from tests.builders import gang, node, pod_set, workload
from tests.builders.placement import PlacementDriver, bound, of_type, one, ray_pod


def _full() -> tuple[PlacementDriver, list]:
    d = PlacementDriver(None, node("n1", cpu="4"))
    big = workload("default/big", gang_=gang(pod_set("head", 1, cpu="4")))
    return d, d.run(big, d.dequeue(big))


def test_a_gang_without_room_or_victim_gets_a_room_key_shared_by_its_shape():
    d, _ = _full()
    a = one(d.dequeue(workload("default/a", gang_=gang(pod_set("head", 1, cpu="2")))), PlacementFailed)
    b = one(d.dequeue(workload("default/b", gang_=gang(pod_set("head", 1, cpu="2")))), PlacementFailed)
    c = one(d.dequeue(workload("default/c", gang_=gang(pod_set("head", 1, cpu="3")))), PlacementFailed)
    assert a.room_key and a.room_key == b.room_key != c.room_key


def test_a_release_names_how_many_waiting_gangs_of_each_shape_fit():
    d, _ = _full()
    keys = {}
    for name, cpu in (("a", "2"), ("b", "2"), ("c", "2"), ("d", "3")):
        keys[cpu] = one(d.dequeue(workload(f"default/{name}", gang_=gang(pod_set("head", 1, cpu=cpu)))),
                        PlacementFailed).room_key
    d.withdraw("default/big")
    head = bound(ray_pod("big", "head", requests={"cpu": "4"}), "n1", "Running")
    out = d.pod(head, "Deleted") + d.settle()
    [released] = [c for c in of_type(out, CapacityChanged) if c.released]
    assert released.room == {keys["2"]: 2, keys["3"]: 1}  # each shape alone; the queue's order decides


def test_a_new_attempt_or_a_withdrawal_stops_the_wait():
    d, _ = _full()
    spec = workload("default/a", gang_=gang(pod_set("head", 1, cpu="2")))
    one(d.dequeue(spec), PlacementFailed)
    d.withdraw("default/a")
    assert d.core.signals.waiting == {} and d.core.signals.shapes == {}
