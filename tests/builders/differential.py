"""Seeded worlds for the differential test against kube-scheduler (tests/realcluster/test_kube_scheduler_differential.py).

A ``World`` is made from one seed, with nothing but ``random.Random(seed)``: the same seed gives the
same objects, byte for byte (where kube-scheduler puts the residents may still vary: it breaks ties
between equally scored nodes at random, and the test's table says where they went). It holds

- ``nodes``: KWOK nodes (``shared.parts.kwok.node``) of varied ``cpu``/``memory``/``pods``/``nvidia.com/gpu``/
  ``example.com/fpga``/``ephemeral-storage`` capacity, labels (zone, pool, arch, team, a numeric
  ``muster.dev/generation`` for ``Gt``/``Lt``, sometimes not a number a label may still hold: ``3_0``,
  ``v2``, beyond int64), taints of every effect, some cordoned (``spec.unschedulable``); the first
  ``len(GUARANTEED)`` nodes carry one feature each, so every seed has them all;
- ``objects``: the cluster-scoped objects the pods need before they are created (RuntimeClasses with
  ``overhead.podFixed``: the API server sets a pod's ``spec.overhead`` from its RuntimeClass and refuses
  one that sets it itself);
- ``residents``: a few plain pods kube-scheduler binds first and that stay for the whole run, so that
  every case meets used nodes as well as empty ones (and muster counts pods of another scheduler);
- ``cases``: single pods, each made of a base (containers sized against a node's allocatable: well
  below, exactly, just above, far above) and the traits drawn for it, each trait a function of
  ``POD_TRAITS`` applied with its probability. A case names its traits (``Case.traits``), which the test's
  table shows and its allow-list matches.

Adding a constraint (inter-pod affinity, topology spread, host ports, volumes) is adding a function
``def trait(rng: random.Random, world: Draft, spec: dict) -> str`` that edits a case's pod ``spec`` and
returns the trait's name ("" when it added nothing), and a row ``(probability, trait)`` to
``POD_TRAITS``. What a trait needs of the world is added to ``Draft`` and made in ``world``:

- labels on the residents (``resident``) are what inter-pod affinity and anti-affinity select, and the
  residents spread over zones are what a topology spread constraint counts; a trait picks a resident's
  labels from ``Draft.residents``;
- host ports: give some residents a ``hostPort`` in ``resident``, and let the trait ask for the same port;
- volumes: the StorageClasses, PersistentVolumes and claims go to ``Draft.objects`` (created before
  the residents and the cases, in order; namespaced ones in ``NAMESPACE``), the trait mounts a claim.

The test then needs nothing new: it compares every case's verdict whatever made it. A new trait whose
rule muster does not follow yet shows as disagreements, which is the point.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable

from shared.kernel import kube
from shared.parts import kwok

SEED = 31
"""The seed the test runs unless ``MUSTER_DIFFERENTIAL_SEED`` names another."""
CASES = 500
"""Cases the test runs unless ``MUSTER_DIFFERENTIAL_CASES`` says how many."""
NAMESPACE = "default"
LABEL = "muster.dev/differential"
"""On every node and pod the world makes (``node``, ``resident``, ``case``): what the test deletes afterwards."""
GENERATION = "muster.dev/generation"
ZONE = "topology.kubernetes.io/zone"
ARCH = "kubernetes.io/arch"
GPU = "nvidia.com/gpu"
FPGA = "example.com/fpga"
NOWHERE = "example.com/nowhere"
"""An extended resource no node has: a pod asking for it fits nowhere."""
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"

GIB = 2**30
MIB = 2**20

RUNTIME_CLASSES: dict[str, dict[str, str]] = {
    "muster-small": {"cpu": "250m", "memory": "64Mi"},
    "muster-large": {"cpu": "1", "memory": "1Gi"},
}
"""RuntimeClass name -> its ``overhead.podFixed``."""

TAINTS: tuple[dict[str, str], ...] = (
    {"key": GPU, "value": "present", "effect": "NoSchedule"},
    {"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
    {"key": "maintenance", "value": "", "effect": "NoExecute"},
    {"key": "spot", "value": "true", "effect": "PreferNoSchedule"},
    {"key": "dedicated", "value": "web", "effect": "NoExecute"},
)
"""The taints nodes draw from (key, value, effect), every effect among them."""

ODD_GENERATIONS = ("3_0", "v2", "99999999999999999999", "007")
"""``muster.dev/generation`` values a label may hold that are not plain int64 decimals (or are, written oddly):
``Gt``/``Lt`` parse a label as Go's ``strconv.ParseInt(v, 10, 64)`` does, which refuses the first three."""


@dataclass(frozen=True)
class Case:
    """One pod to place, and the traits it exercises (for the table and the allow-list)."""

    name: str
    pod: dict[str, Any]
    traits: tuple[str, ...]


@dataclass(frozen=True)
class World:
    seed: int
    nodes: tuple[dict[str, Any], ...]
    objects: tuple[dict[str, Any], ...]
    residents: tuple[dict[str, Any], ...]
    cases: tuple[Case, ...]


@dataclass
class Draft:
    """What a trait may read while the world is made: the nodes, and the values drawn from them."""

    nodes: list[dict[str, Any]]
    residents: list[dict[str, Any]] = field(default_factory=list)
    objects: list[dict[str, Any]] = field(default_factory=list)

    def labels(self) -> dict[str, list[str]]:
        """Every node label key (but the per-node hostname) with its values, in node order."""
        out: dict[str, list[str]] = {}
        for n in self.nodes:
            for k, v in n["metadata"]["labels"].items():
                if k != "kubernetes.io/hostname" and v not in out.setdefault(k, []):
                    out[k].append(v)
        return out

    def taints(self) -> list[dict[str, str]]:
        seen: list[dict[str, str]] = []
        for n in self.nodes:
            for t in n["spec"].get("taints", []):
                if t not in seen:
                    seen.append(t)
        return seen

    def alloc(self, n: dict[str, Any], resource: str) -> int:
        """A node's allocatable of ``resource`` in milli-units (cpu) or units (the rest)."""
        raw = n["status"]["allocatable"].get(resource, "0")
        return _milli_cpu(raw) if resource == "cpu" else _units(raw)


# ------------------------------------------------------------------ quantities
def _milli_cpu(raw: str) -> int:
    return int(raw[:-1]) if raw.endswith("m") else int(raw) * 1000


def _units(raw: str) -> int:
    for suffix, factor in (("Gi", GIB), ("Mi", MIB), ("G", 10**9)):
        if raw.endswith(suffix):
            return int(raw[: -len(suffix)]) * factor
    return int(raw)


def cpu(milli: int) -> str:
    return f"{milli // 1000}" if milli % 1000 == 0 else f"{milli}m"


def memory(amount: int, rng: random.Random) -> str:
    """Bytes, written as a user might: ``Gi``/``Mi`` when exact (mostly), else plain bytes."""
    if amount % GIB == 0 and rng.random() < 0.7:
        return f"{amount // GIB}Gi"
    if amount % MIB == 0 and rng.random() < 0.7:
        return f"{amount // MIB}Mi"
    return str(amount)


def _split(total: int, parts: int, rng: random.Random, unit: int = 1) -> list[int]:
    """``total`` in ``parts`` positive shares (multiples of ``unit`` but the last), summing to it exactly."""
    if parts <= 1 or total < parts * unit:
        return [total]
    cuts = sorted(rng.sample(range(1, total // unit), parts - 1)) if total // unit > parts else list(range(1, parts))
    edges = [0, *(c * unit for c in cuts), total]
    return [b - a for a, b in zip(edges, edges[1:]) if b > a]


# ------------------------------------------------------------------ nodes
def _taint(n: dict[str, Any], taint: dict[str, str]) -> None:
    """Add ``taint`` unless the node has one of its key and effect (the API server refuses two)."""
    taints = n["spec"].setdefault("taints", [])
    if all((t["key"], t["effect"]) != (taint["key"], taint["effect"]) for t in taints):
        taints.append(dict(taint))


GUARANTEED: tuple[Callable[[dict[str, Any]], None], ...] = (
    lambda n: n["spec"].__setitem__("unschedulable", True),
    lambda n: _taint(n, TAINTS[2]),   # NoExecute
    lambda n: _taint(n, TAINTS[3]),   # PreferNoSchedule
    lambda n: _taint(n, TAINTS[1]),   # NoSchedule
    lambda n: n["metadata"]["labels"].__setitem__(GENERATION, ODD_GENERATIONS[0]),
    lambda n: n["metadata"]["labels"].__setitem__(GENERATION, ODD_GENERATIONS[1]),
    lambda n: n["metadata"]["labels"].__setitem__(GENERATION, ODD_GENERATIONS[2]),
    lambda n: n["metadata"]["labels"].__setitem__(GENERATION, ODD_GENERATIONS[3]),
    lambda n: n["status"]["allocatable"].__setitem__("pods", "1") or n["status"]["capacity"].__setitem__("pods", "1"),
)
"""One feature for each of the first nodes, whatever the seed draws for the rest."""


def node(rng: random.Random, index: int) -> dict[str, Any]:
    """One KWOK node: a pool (cpu, mem, gpu) sets its size; labels, taints and cordon are drawn."""
    pool = rng.choice(("cpu", "cpu", "mem", "gpu"))
    cores = rng.choice({"cpu": (4, 8, 16, 32), "mem": (8, 16), "gpu": (16, 32)}[pool])
    capacity: dict[str, str] = {
        "cpu": cpu(cores * 1000 - (500 if rng.random() < 0.2 else 0)),
        "memory": memory(rng.choice({"cpu": (8, 16, 32, 64), "mem": (128, 256), "gpu": (64, 128)}[pool]) * GIB, rng),
    }
    if pool == "gpu":
        capacity[GPU] = str(rng.choice((1, 2, 4, 8)))
    if rng.random() < 0.15:
        capacity[FPGA] = str(rng.choice((1, 2)))
    if rng.random() < 0.5:
        capacity["ephemeral-storage"] = f"{rng.choice((50, 100, 400))}Gi"
    labels = {ZONE: f"zone-{rng.choice('abc')}", "pool": pool, ARCH: "arm64" if rng.random() < 0.25 else "amd64"}
    if rng.random() < 0.75:
        labels[GENERATION] = str(rng.randint(1, 5))
    if rng.random() < 0.4:
        labels["team"] = rng.choice(("ml", "web"))
    taints: list[dict[str, str]] = []
    if pool == "gpu" and rng.random() < 0.6:
        taints.append(dict(TAINTS[0]))
    for taint in TAINTS[1:]:
        if rng.random() < 0.1 and all(t["key"] != taint["key"] for t in taints):
            taints.append(dict(taint))
    made = kwok.node(f"diff-{index:02d}", capacity, labels={LABEL: "node", **labels}, taints=taints,
                     unschedulable=rng.random() < 0.1)
    made["spec"].setdefault("taints", [])
    if index < len(GUARANTEED):
        GUARANTEED[index](made)
    if not made["spec"]["taints"]:
        del made["spec"]["taints"]
    return made


# ------------------------------------------------------------------ pods
def container(name: str, requests: dict[str, str], *, limits_only: bool = False) -> dict[str, Any]:
    """A container; extended resources (and ``nvidia.com/gpu``) are limited to their request, as the API
    server requires; ``limits_only``: the limits alone, the API server copies them to the requests."""
    extended = {k: v for k, v in requests.items() if "/" in k}
    resources: dict[str, Any] = {"limits": dict(requests)} if limits_only else {"requests": dict(requests)}
    if extended and not limits_only:
        resources["limits"] = extended
    return {"name": name, "image": "registry.k8s.io/pause:3.10", "resources": resources}


def pod(name: str, spec: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {**labels}},
            "spec": {"schedulerName": "default-scheduler", "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": 0, **spec}}


def resident(rng: random.Random, index: int, world: Draft) -> dict[str, Any]:
    """A pod bound before the cases and left running: cpu and memory a node's fraction, no constraints
    but tolerating every taint (so some land on tainted and cordoned-later nodes too)."""
    size = rng.choice(world.nodes)
    requests = {"cpu": cpu(max(100, int(world.alloc(size, "cpu") * rng.choice((0.25, 0.5))))),
                "memory": memory(world.alloc(size, "memory") // rng.choice((4, 2)), rng)}
    spec: dict[str, Any] = {"containers": [container("main", requests)]}
    if rng.random() < 0.5:
        spec["tolerations"] = [{"operator": "Exists"}]
    return pod(f"resident-{index}", spec, {LABEL: "resident", "app": f"resident-{index % 3}"})


def base(rng: random.Random, world: Draft) -> tuple[dict[str, Any], list[str]]:
    """A pod spec whose containers together ask a share of one node's cpu and memory: well below, all of
    it, a little more, or far more (exact fits and near misses are where two schedulers part). A third
    are pinned to that node (``kubernetes.io/hostname``): where a pod fits decides which node's edge
    is tried, and kube-scheduler, choosing the least allocated node, would rarely try it otherwise."""
    target = rng.choice(world.nodes)
    fill = rng.choice((0.25, 0.5, 0.9, 1.0, 1.0, 1.01, 1.5))
    milli = max(1, int(world.alloc(target, "cpu") * fill))
    mem = max(MIB, int(world.alloc(target, "memory") * rng.choice((0.1, 0.5, 1.0, fill))))
    parts = rng.choice((1, 1, 2, 3))
    cpus, mems = _split(milli, parts, rng), _split(mem, parts, rng, MIB)
    containers = [container(f"c{i}", {"cpu": cpu(c), "memory": memory(m, rng)})
                  for i, (c, m) in enumerate(zip(cpus, mems + mems[-1:] * (len(cpus) - len(mems))))]
    if rng.random() < 1 / 3:
        return ({"containers": containers, "nodeSelector": {"kubernetes.io/hostname": target["metadata"]["name"]}},
                [f"fill:{fill}", "pinned"])
    return {"containers": containers}, [f"fill:{fill}"]


def _ask(spec: dict[str, Any], resource: str, amount: str) -> None:
    """The first container asks ``amount`` of ``resource``: its request, and its limit where it must be
    the same (an extended resource, or a limit it states already; a limits-only container)."""
    resources = spec["containers"][0]["resources"]
    if "requests" in resources:
        resources["requests"][resource] = amount
    if "/" in resource or resource in resources.get("limits", {}) or "requests" not in resources:
        resources.setdefault("limits", {})[resource] = amount


def _total(spec: dict[str, Any], resource: str) -> int:
    """What the regular containers ask of ``resource`` (milli-cpu, bytes)."""
    total = 0
    for c in spec["containers"]:
        raw = c["resources"].get("requests", c["resources"].get("limits", {})).get(resource)
        if raw is not None:
            total += _milli_cpu(raw) if resource == "cpu" else _units(raw)
    return total


def init_containers(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    """Ordinary init containers, sometimes larger than the regular ones together (the pod needs the larger)."""
    inits = spec.setdefault("initContainers", [])
    for _ in range(rng.choice((1, 2))):
        scale = rng.choice((0.5, 1.2, 2.0))
        inits.append(container(f"init{len(inits)}", {"cpu": cpu(max(1, int(_total(spec, "cpu") * scale))),
                                                     "memory": memory(max(MIB, int(_total(spec, "memory") * scale)), rng)}))
    return "init"


def sidecars(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    """A restartable init container (``restartPolicy: Always``): it runs beside the regular ones, and beside
    every init container after it."""
    inits = spec.setdefault("initContainers", [])
    side = container(f"sidecar{len(inits)}", {"cpu": cpu(rng.choice((100, 500, 1000))),
                                              "memory": memory(rng.choice((64, 256)) * MIB, rng)})
    side["restartPolicy"] = "Always"
    inits.insert(rng.randint(0, len(inits)), side)
    return "sidecar"


def limits_only(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    """The first container states limits only: its requests are those limits."""
    first = spec["containers"][0]
    first["resources"] = {"limits": {**first["resources"].get("requests", {}), **first["resources"].get("limits", {})}}
    return "limits-only"


def micro_cpu(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    """cpu in millionths of a core (``u``) over two or more containers, each a little under a whole milli-core
    but the first a little over: their exact sum rounded up once is one milli-core less than each rounded up
    then added. The API server rounds each request up to milli-cores as it stores the pod, so both
    schedulers count the latter; this keeps it so."""
    asking = [c for c in spec["containers"] if "cpu" in c["resources"].get("requests", {})]
    if len(asking) < 2:
        return ""
    for i, c in enumerate(asking):
        milli = _milli_cpu(c["resources"]["requests"]["cpu"])
        c["resources"]["requests"]["cpu"] = f"{milli * 1000 - 600 + (1000 if i == 0 else 0)}u"
    return "micro-cpu"


def overhead(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    spec["runtimeClassName"] = rng.choice(sorted(RUNTIME_CLASSES))
    return "overhead"


def pod_level(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    """Pod-level ``spec.resources.requests`` of cpu, memory or both: at least what the containers ask
    together (init containers and sidecars counted; the API server refuses less), standing for them."""
    floor = kube.effective_requests(spec)  # milli-units; only a floor here, the test compares what comes of it
    asked: dict[str, str] = {}
    for resource in rng.choice((("cpu",), ("memory",), ("cpu", "memory"))):
        amount = -(-floor.get(resource, 0) * rng.choice((1.0, 1.5, 3.0)) // 1000)
        asked[resource] = cpu(int(amount * 1000) or 1) if resource == "cpu" else memory(int(amount) or MIB, rng)
    spec["resources"] = {"requests": asked}
    return "pod-level"


def gpus(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    _ask(spec, GPU, str(rng.choice((1, 1, 2, 4, 8, 9))))
    return "gpu"


def extended(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    name = FPGA if rng.random() < 0.85 else NOWHERE
    _ask(spec, name, str(rng.choice((1, 2, 3))))
    return "extended" if name == FPGA else "extended:nowhere"


def ephemeral(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    _ask(spec, "ephemeral-storage", f"{rng.choice((1, 100, 400, 401))}Gi")
    return "ephemeral-storage"


def huge(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    """More cpu or memory than any node has: fits nowhere."""
    if rng.random() < 0.5:
        _ask(spec, "cpu", "1000")
    else:
        _ask(spec, "memory", "4Ti")
    return "huge"


def node_selector(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    """A node's labels (one or two of them), or a value no node has."""
    target = rng.choice(world.nodes)["metadata"]["labels"]
    keys = [k for k in target if k not in (LABEL, "kubernetes.io/hostname")]
    chosen = {k: target[k] for k in rng.sample(keys, min(len(keys), rng.choice((1, 2))))}
    if rng.random() < 0.2:
        chosen[rng.choice(sorted(chosen))] = "nobody"
    spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **chosen}
    return "node-selector"


def tolerations(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    """Tolerations of the world's taints: Equal (right or wrong value), Exists by key, every effect or
    one, the cordon's taint, or everything (empty key, Exists)."""
    taints = world.taints() + [{"key": UNSCHEDULABLE_TAINT, "value": "", "effect": "NoSchedule"}]
    out: list[dict[str, Any]] = []
    kinds: list[str] = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        taint = rng.choice(taints)
        kind = rng.choice(("equal", "equal", "equal-wrong", "exists", "exists", "any-effect", "everything"))
        effect = "" if kind == "any-effect" else taint["effect"]
        if kind == "everything":
            out.append({"operator": "Exists", **({"effect": taint["effect"]} if rng.random() < 0.5 else {})})
        elif kind.startswith("exists") or kind == "any-effect" and rng.random() < 0.5:
            out.append({"key": taint["key"], "operator": "Exists", **({"effect": effect} if effect else {})})
        else:
            value = taint["value"] + ("x" if kind == "equal-wrong" else "")
            out.append({"key": taint["key"], "operator": "Equal", "value": value, **({"effect": effect} if effect else {})})
        kinds.append(kind)
    spec["tolerations"] = out
    return "tolerations:" + "+".join(sorted(set(kinds)))


OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def expression(rng: random.Random, world: Draft, operator: str) -> dict[str, Any]:
    labels = world.labels()
    if operator in ("Gt", "Lt"):
        return {"key": GENERATION, "operator": operator, "values": [str(rng.randint(0, 6))]}
    key = rng.choice([*sorted(labels), "muster.dev/absent"])
    if operator in ("Exists", "DoesNotExist"):
        return {"key": key, "operator": operator}
    values = rng.sample(labels.get(key, ["x"]), min(len(labels.get(key, ["x"])), rng.choice((1, 2))))
    if rng.random() < 0.2:
        values.append("nobody")
    return {"key": key, "operator": operator, "values": values}


def node_affinity(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    """Required node affinity: one or two terms (OR) of one or two expressions (AND) over every operator."""
    terms: list[dict[str, Any]] = []
    used: list[str] = []
    for _ in range(rng.choice((1, 1, 2))):
        ops = [rng.choice(OPERATORS) for _ in range(rng.choice((1, 2)))]
        terms.append({"matchExpressions": [expression(rng, world, op) for op in ops]})
        used += ops
    _required(spec).extend(terms)
    return "affinity:" + "+".join(sorted(set(used)))


def _required(spec: dict[str, Any]) -> list[dict[str, Any]]:
    node_aff = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    terms: list[dict[str, Any]] = node_aff.setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {}).setdefault("nodeSelectorTerms", [])
    return terms


def empty_term(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    """A node selector term with no requirement: it matches no node (alone, the pod fits nowhere)."""
    _required(spec).append({})
    return "affinity:empty-term"


def match_fields(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    """A term on the node's name (``matchFields: metadata.name``), as a DaemonSet's pods carry."""
    name = rng.choice(world.nodes)["metadata"]["name"]
    _required(spec).append({"matchFields": [{"key": "metadata.name", "operator": rng.choice(("In", "NotIn")),
                                             "values": [name]}]})
    return "affinity:matchFields"


Trait = Callable[[random.Random, Draft, dict[str, Any]], str]

POD_TRAITS: tuple[tuple[float, Trait], ...] = (
    (0.25, init_containers),
    (0.2, sidecars),
    (0.1, limits_only),
    (0.1, micro_cpu),
    (0.15, overhead),
    (0.15, gpus),
    (0.1, extended),
    (0.1, ephemeral),
    (0.03, huge),
    (0.08, pod_level),
    (0.3, node_selector),
    (0.45, tolerations),
    (0.35, node_affinity),
    (0.03, empty_term),
    (0.03, match_fields),
)
"""(probability, trait), applied in this order to each case (the order matters where one reads another's
work: pod-level requests last of the requests, which they must cover)."""


def runtime_class(name: str, overhead_: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name, "labels": {LABEL: "rc"}},
            "handler": "runc", "overhead": {"podFixed": dict(overhead_)}}


def world(seed: int, *, cases: int = CASES, nodes: int = 20, residents: int = 8) -> World:
    """The world of ``seed``: see the module docstring."""
    rng = random.Random(seed)
    draft = Draft(nodes=[node(rng, i) for i in range(nodes)])
    draft.objects = [runtime_class(name, o) for name, o in sorted(RUNTIME_CLASSES.items())]
    draft.residents = [resident(rng, i, draft) for i in range(residents)]
    made: list[Case] = []
    for i in range(cases):
        spec, traits = base(rng, draft)
        for probability, trait in POD_TRAITS:
            if rng.random() < probability:
                name = trait(rng, draft, spec)
                if name:
                    traits.append(name)
        made.append(Case(f"case-{i:03d}", pod(f"case-{i:03d}", spec, {LABEL: "case"}), tuple(traits)))
    return World(seed=seed, nodes=tuple(draft.nodes), objects=tuple(draft.objects), residents=tuple(draft.residents),
                 cases=tuple(made))
