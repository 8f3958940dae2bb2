"""The differential test's generator (tests/builders/differential.py): one seed, one world, every trait in it."""

from __future__ import annotations

import json
import random

from tests.builders import differential


def test_a_seed_makes_the_same_world_byte_for_byte() -> None:
    """A disagreement is reproduced from the seed the failure prints, and nothing else."""
    def dump(seed: int) -> str:
        return json.dumps(differential.world(seed, cases=50).__dict__, default=lambda o: o.__dict__, sort_keys=True)

    assert dump(7) == dump(7)
    assert dump(7) != dump(8)


def test_the_default_world_exercises_every_trait_and_node_feature() -> None:
    """The test's own seed draws every trait of ``POD_TRAITS`` (and pinned cases), and its nodes every taint
    effect, a cordon, the odd generation labels and a one-pod node: a trait that no case draws tests nothing."""
    world = differential.world(differential.SEED, cases=differential.CASES)
    drawn = {trait.split(":")[0] for case in world.cases for trait in case.traits}

    def two() -> dict:
        return {"containers": [differential.container(name, {"cpu": "1", "memory": "1Gi"}) for name in "ab"]}

    named = {trait(random.Random(0), differential.Draft(nodes=list(world.nodes)), two()).split(":")[0]
             for _, trait in differential.POD_TRAITS}
    assert named - drawn == set()
    assert "pinned" in drawn
    affinity = {op for case in world.cases for trait in case.traits if trait.startswith("affinity:")
                for op in trait.split(":")[1].split("+")}
    assert set(differential.OPERATORS) <= affinity
    effects = {t["effect"] for n in world.nodes for t in n["spec"].get("taints", [])}
    assert effects == {"NoSchedule", "NoExecute", "PreferNoSchedule"}
    assert any(n["spec"].get("unschedulable") for n in world.nodes)
    generations = {n["metadata"]["labels"].get(differential.GENERATION) for n in world.nodes}
    assert set(differential.ODD_GENERATIONS) <= generations
    assert any(n["status"]["allocatable"]["pods"] == "1" for n in world.nodes)


def test_the_default_world_draws_each_constraints_variants() -> None:
    """Inter-pod affinity both ways by hostname, zone and a key some nodes lack; spread with minDomains and both
    inclusion policies; host ports on a sidecar; every kind of claim: a variant no case draws is not compared."""
    world = differential.world(differential.SEED, cases=differential.CASES)
    traits = [t for case in world.cases for t in case.traits]
    pod_affinity = {v for t in traits if t.startswith("pod-affinity:") for v in t.split(":")[1].split("+")}
    assert {f"{kind}-{key}" for kind in ("aff", "anti") for key in ("hostname", "zone", "team")} <= {
        v.rsplit("-", 1)[0] for v in pod_affinity}
    assert {"own", "listed", "elsewhere", "all"} <= {v.rsplit("-", 1)[1] for v in pod_affinity}
    spread = " ".join(t for t in traits if t.startswith("spread:"))
    assert all(part in spread for part in ("-min", "affinityH", "affinityI", "taintsH", "taintsI", "-soft", "team"))
    assert "host-ports:sidecar" in traits and "labels:shy" in traits
    claims = {v for t in traits if t.startswith("volume:") for v in t.split(":")[1].split("+")}
    assert claims == {"bound", "wffc", "wffc-zone", "wffc-pool", "immediate", "no-class", "prebound", "gone", "absent"}
    assert any(p.get("hostPort") for r in world.residents for c in r["spec"]["containers"] for p in c.get("ports", []))
