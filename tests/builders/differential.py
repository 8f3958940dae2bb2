"""Seeded worlds for the differential test against kube-scheduler (tests/realcluster/test_kube_scheduler_differential.py).

A ``World`` is made from one seed, with nothing but ``random.Random(seed)``: the same seed gives the
same objects, byte for byte (where kube-scheduler puts the residents may still vary: it breaks ties
between equally scored nodes at random, and the test's table says where they went). It holds

- ``nodes``: KWOK nodes (``shared.parts.kwok.node``) of varied ``cpu``/``memory``/``pods``/``nvidia.com/gpu``/
  ``example.com/fpga``/``ephemeral-storage`` capacity, labels (zone, pool, arch, team, a numeric
  ``muster.dev/generation`` for ``Gt``/``Lt``, sometimes not a number a label may still hold: ``3_0``,
  ``v2``, beyond int64), taints of every effect, some cordoned (``spec.unschedulable``); the first
  ``len(GUARANTEED)`` nodes carry one feature each, so every seed has them all;
- ``objects``: the objects the pods need before they are created, in order (RuntimeClasses with
  ``overhead.podFixed``: the API server sets a pod's ``spec.overhead`` from its RuntimeClass and refuses
  one that sets it itself; StorageClasses, PersistentVolumes with node affinity and the claims pods
  mount: ``volume_objects``). An object with a ``status`` gets it written through the status
  subresource after it is created: the dev cluster runs no PV controller, so a bound pair is written
  as that controller leaves it (``spec.volumeName``, ``claimRef``, ``pv.kubernetes.io/bind-completed``,
  phase Bound);
- ``residents``: a few pods kube-scheduler binds first and that stay for the whole run, so that every
  case meets used nodes as well as empty ones (and muster counts pods of another scheduler); they carry
  the labels inter-pod affinity and spread select (``app``, ``tier``), some hold host ports, one holds
  required anti-affinity against pods labelled ``role: shy`` (a case may carry that label:
  ``own_labels``);
- ``cases``: single pods, each made of a base (containers sized against a node's allocatable: well
  below, exactly, just above, far above) and the traits drawn for it, each trait a function of
  ``POD_TRAITS`` applied with its probability. A case names its traits (``Case.traits``), which the test's
  table shows and its allow-list matches.

A trait is a function ``def trait(rng: random.Random, world: Draft, spec: dict) -> str`` that edits a
case's pod ``spec`` (and may add to ``Draft.case_labels``) and returns the trait's name ("" when it added
nothing), with a row ``(probability, trait)`` in ``POD_TRAITS``. What a trait needs of the world is in
``Draft`` and made in ``world``: the residents' labels and host ports (``resident``) for inter-pod
affinity, spread and host ports (``own_labels``, ``pod_affinity``, ``spread``, ``host_ports``); the
StorageClasses, volumes and claims (``volume_objects``) that ``volumes`` mounts.

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
FOCUSED = 160
"""Cases of one inter-pod, spread, host port or volume trait each on a small pod that tolerates every taint
(``focused``), made besides ``CASES``: stacked on a drawn pod, such a constraint seldom decides (the pod
fits few nodes already), so a rule read wrongly there (``minDomains``, say) showed in no case."""
NAMESPACE = "default"
LABEL = "muster.dev/differential"
"""On every node and pod the world makes (``node``, ``resident``, ``case``): what the test deletes afterwards."""
GENERATION = "muster.dev/generation"
ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"
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
    case_labels: dict[str, str] = field(default_factory=dict)
    """The labels of the case being made (beside ``LABEL``): a trait may add some, which others' selectors
    then see (a spread constraint counts the pod itself when it matches)."""

    def claims(self) -> list[str]:
        """Names of the claims the world made, in order."""
        return [o["metadata"]["name"] for o in self.objects if o["kind"] == "PersistentVolumeClaim"]

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


HOST_PORTS = (8080, 9090, 7000)
"""The host ports residents hold and cases ask for."""
PROTOCOLS = ("TCP", "UDP", "SCTP")
HOST_IPS = ("", "0.0.0.0", "127.0.0.1", "10.0.0.1")
"""``hostIP`` values ("" is the API server's 0.0.0.0 default: any address, which conflicts with every one)."""
SHY = {"role": "shy"}
"""The labels one resident's required anti-affinity keeps off its node (``resident``)."""


def _port(rng: random.Random, number: int, used: set[tuple[str, str, int]]) -> dict[str, Any] | None:
    """A ``ports`` entry binding host port ``number`` (protocol and host IP drawn), None when the pod holds
    that key already (the API server refuses a duplicate protocol/hostIP/port)."""
    protocol, ip = rng.choice(PROTOCOLS[:2] if rng.random() < 0.8 else PROTOCOLS), rng.choice(HOST_IPS)
    key = (protocol, ip or "0.0.0.0", number)
    if key in used:
        return None
    used.add(key)
    entry: dict[str, Any] = {"containerPort": 10000 + len(used), "hostPort": number, "protocol": protocol}
    if ip:
        entry["hostIP"] = ip
    return entry


def resident(rng: random.Random, index: int, world: Draft) -> dict[str, Any]:
    """A pod bound before the cases and left running: cpu and memory a node's fraction, tolerating every
    taint half the time (so some land on tainted and cordoned-later nodes too); labels others select
    (``app``, ``tier``), sometimes host ports; the second holds required anti-affinity against ``SHY`` pods
    (by hostname, or zone), which kube-scheduler checks for every pod (existing pods' anti-affinity)."""
    size = rng.choice(world.nodes)
    requests = {"cpu": cpu(max(100, int(world.alloc(size, "cpu") * rng.choice((0.25, 0.5))))),
                "memory": memory(world.alloc(size, "memory") // rng.choice((4, 2)), rng)}
    main = container("main", requests)
    if rng.random() < 0.4:
        used: set[tuple[str, str, int]] = set()
        main["ports"] = [p for p in (_port(rng, n, used) for n in rng.sample(HOST_PORTS, rng.choice((1, 2)))) if p]
    spec: dict[str, Any] = {"containers": [main]}
    if rng.random() < 0.5:
        spec["tolerations"] = [{"operator": "Exists"}]
    if index == 1:
        spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": dict(SHY)}, "topologyKey": rng.choice((HOSTNAME, ZONE))}]}}
    return pod(f"resident-{index}", spec, {LABEL: "resident", "app": f"resident-{index % 3}",
                                           "tier": rng.choice(("a", "b"))})


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


def own_labels(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    """Labels of the case itself: a resident's ``app`` (a spread constraint selecting it counts the case
    too; an affinity term selecting it lets the first of a group go anywhere), or ``SHY`` (the one
    resident's anti-affinity keeps it off that resident's node or zone)."""
    if rng.random() < 0.4:
        world.case_labels.update(SHY)
        return "labels:shy"
    world.case_labels["app"] = f"resident-{rng.randint(0, 2)}"
    return "labels:app"


def _pod_selector(rng: random.Random, world: Draft) -> dict[str, Any]:
    """A label selector over the residents' labels: one resident's (one label or two), a set of ``app``
    values, ``tier NotIn``, ``role Exists``, a value none has, or (rarely) ``{}``, which selects every pod."""
    labels = rng.choice(world.residents)["metadata"]["labels"] if world.residents else {"app": "resident-0"}
    kind = rng.choice(("one", "one", "two", "in", "notin", "exists", "none", "all"))
    if kind == "one":
        return {"matchLabels": {"app": labels["app"]}}
    if kind == "two":
        return {"matchLabels": {k: labels[k] for k in ("app", "tier") if k in labels}}
    if kind == "in":
        return {"matchExpressions": [{"key": "app", "operator": "In",
                                      "values": sorted({labels["app"], f"resident-{rng.randint(0, 2)}"})}]}
    if kind == "notin":
        return {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": [rng.choice("ab")]}]}
    if kind == "exists":
        return {"matchExpressions": [{"key": "role", "operator": "Exists"}]}
    if kind == "none":
        return {"matchLabels": {"app": "nobody"}}
    return {}


TOPOLOGY_KEYS = (HOSTNAME, HOSTNAME, ZONE, ZONE, "team")
"""What inter-pod terms and spread constraints group nodes by (``team`` is on some nodes only)."""


def pod_affinity(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    """Required pod affinity and anti-affinity: one or two terms, each over the residents' labels by
    hostname, zone or a key some nodes lack; the term's namespaces its own (unset), listed (``default``,
    or one no pod is in), or every one (``namespaceSelector: {}``)."""
    affinity = spec.setdefault("affinity", {})
    used: list[str] = []
    for _ in range(rng.choice((1, 1, 2))):
        anti = rng.random() < 0.5
        key = rng.choice(TOPOLOGY_KEYS)
        term: dict[str, Any] = {"labelSelector": _pod_selector(rng, world), "topologyKey": key}
        scope = rng.choice(("own", "own", "listed", "elsewhere", "all"))
        if scope == "listed":
            term["namespaces"] = [NAMESPACE]
        elif scope == "elsewhere":
            term["namespaces"] = ["muster-elsewhere"]
        elif scope == "all":
            term["namespaceSelector"] = {}
        block = affinity.setdefault("podAntiAffinity" if anti else "podAffinity", {})
        block.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(term)
        used.append(f"{'anti' if anti else 'aff'}-{key.rsplit('/', 1)[-1]}-{scope}")
    return "pod-affinity:" + "+".join(sorted(set(used)))


def spread(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    """Topology spread constraints counting the residents its selector matches (and the case, when its own
    labels match; often every pod, so that every domain holds some and the global minimum is above 0):
    ``DoNotSchedule`` with ``maxSkew`` 1 or 2, sometimes ``minDomains`` (above the domains there are, too,
    which makes that minimum 0), ``nodeAffinityPolicy`` and ``nodeTaintsPolicy`` either way; now and then a
    ``ScheduleAnyway`` one (a score only: it must not change the verdict)."""
    out: list[dict[str, Any]] = []
    used: list[str] = []
    for key in dict.fromkeys(rng.sample(TOPOLOGY_KEYS[1:], rng.choice((1, 1, 2)))):  # one constraint per key
        hard = rng.random() < 0.85
        c: dict[str, Any] = {"maxSkew": rng.choice((1, 1, 2)), "topologyKey": key,
                             "whenUnsatisfiable": "DoNotSchedule" if hard else "ScheduleAnyway",
                             "labelSelector": {} if rng.random() < 0.3 else _pod_selector(rng, world)}
        name = key.rsplit("/", 1)[-1] + ("" if hard else "-soft")
        if hard and rng.random() < 0.4:
            c["minDomains"] = rng.choice((2, 3, 4, 25))
            name += "-min"
            if rng.random() < 0.5:  # every resident: each domain holds some, so the minimum is above 0 unless minDomains
                c["labelSelector"] = {"matchExpressions": [{"key": "app", "operator": "Exists"}]}
        for policy in ("nodeAffinityPolicy", "nodeTaintsPolicy"):
            if rng.random() < 0.35:
                c[policy] = rng.choice(("Honor", "Ignore"))
                name += f"-{policy[4:-6].lower()}{c[policy][0]}"
        out.append(c)
        used.append(name)
    spec["topologySpreadConstraints"] = out
    return "spread:" + "+".join(used)


def host_ports(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    """One or two host ports, the residents' mostly (protocol and host IP drawn: another protocol, or two
    distinct specific addresses, do not conflict), on the first container or a sidecar (which holds its
    ports as long as the pod runs)."""
    used: set[tuple[str, str, int]] = set()
    holders = [c for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    holder = rng.choice(holders) if holders and rng.random() < 0.4 else spec["containers"][0]
    for _ in range(rng.choice((1, 1, 2))):
        entry = _port(rng, rng.choice(HOST_PORTS) if rng.random() < 0.85 else 6000, used)
        if entry:
            holder.setdefault("ports", []).append(entry)
    return "host-ports" + (":sidecar" if holder is not spec["containers"][0] else "")


def volumes(rng: random.Random, world: Draft, spec: dict[str, Any]) -> str:
    """One or two claims mounted: bound to a volume with node affinity, unbound of a ``WaitForFirstConsumer``
    class (with ``allowedTopologies`` or without), unbound and immediate, of no class, pre-bound to a
    volume not bound yet, bound to a volume that does not exist, or one no claim is named (``volume_objects``)."""
    claims = world.claims() + ["absent"]
    chosen = rng.sample(claims, rng.choice((1, 1, 2)))
    spec["volumes"] = [{"name": f"v{i}", "persistentVolumeClaim": {"claimName": name}} for i, name in enumerate(chosen)]
    return "volume:" + "+".join(sorted(name.rstrip("0123456789-") for name in chosen))


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
    (0.3, own_labels),
    (0.25, pod_affinity),
    (0.25, spread),
    (0.15, host_ports),
    (0.15, volumes),
)
"""(probability, trait), applied in this order to each case (the order matters where one reads another's
work: pod-level requests last of the requests, which they must cover)."""
FOCUS: tuple[Trait, ...] = (pod_affinity, spread, host_ports, volumes)
"""The traits a ``focused`` case carries alone, in turn."""


def runtime_class(name: str, overhead_: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name, "labels": {LABEL: "rc"}},
            "handler": "runc", "overhead": {"podFixed": dict(overhead_)}}


BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
"""What the PV controller writes on a claim it bound: kube-scheduler takes a claim as bound only with it."""


def _meta(kind: str, name: str, namespaced: bool = False) -> dict[str, Any]:
    api = {"StorageClass": "storage.k8s.io/v1"}.get(kind, "v1")
    meta: dict[str, Any] = {"name": name, "labels": {LABEL: "volume"}}
    if namespaced:
        meta["namespace"] = NAMESPACE
    return {"apiVersion": api, "kind": kind, "metadata": meta}


def _claim(name: str, storage_class: str, volume: str = "", bound: bool = False) -> dict[str, Any]:
    obj = _meta("PersistentVolumeClaim", name, namespaced=True)
    obj["spec"] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                   "storageClassName": storage_class}
    if volume:
        obj["spec"]["volumeName"] = volume
    if bound:
        obj["metadata"]["annotations"] = {BIND_COMPLETED: "yes"}
        obj["status"] = {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}
    return obj


def volume_objects(rng: random.Random, world: Draft) -> list[dict[str, Any]]:
    """StorageClasses, PersistentVolumes and claims (in the order they must be created): ``bound-<i>``
    bound to a volume whose node affinity is drawn over the nodes' labels (a zone, a node, a pool it is
    not, a team label it has, two terms); ``wffc``, ``wffc-zone`` (``allowedTopologies``: two zones),
    ``wffc-pool`` (two terms) unbound of ``WaitForFirstConsumer`` classes; ``immediate`` unbound of an
    Immediate class; ``no-class``; ``prebound`` naming an Available volume the claim is not bound to yet;
    ``gone`` bound to a volume that does not exist."""
    zones = world.labels()[ZONE]
    out: list[dict[str, Any]] = []
    for name, mode, topologies in (
            ("diff-wffc", "WaitForFirstConsumer", []),
            ("diff-wffc-zone", "WaitForFirstConsumer", [[{"key": ZONE, "values": sorted(rng.sample(zones, min(2, len(zones))))}]]),
            ("diff-wffc-pool", "WaitForFirstConsumer", [[{"key": "pool", "values": ["gpu"]}],
                                                        [{"key": "team", "values": ["ml"]}, {"key": ARCH, "values": ["amd64"]}]]),
            ("diff-immediate", "Immediate", [])):
        sc = _meta("StorageClass", name)
        sc.update({"provisioner": "example.com/disk", "volumeBindingMode": mode, "reclaimPolicy": "Delete"})
        if topologies:
            sc["allowedTopologies"] = [{"matchLabelExpressions": term} for term in topologies]
        out.append(sc)
    affinities = [
        [{"matchExpressions": [{"key": ZONE, "operator": "In", "values": [rng.choice(zones)]}]}],
        [{"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": [rng.choice(world.nodes)["metadata"]["name"]]}]}],
        [{"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["gpu"]}]}],
        [{"matchExpressions": [{"key": "team", "operator": "Exists"}, {"key": ZONE, "operator": "In", "values": [rng.choice(zones)]}]}],
        [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["mem"]}]},
         {"matchExpressions": [{"key": ARCH, "operator": "In", "values": ["arm64"]}]}],
    ]
    claims: list[dict[str, Any]] = []
    for i, terms in enumerate(affinities):
        pv = _meta("PersistentVolume", f"diff-pv-{i}")
        pv["spec"] = {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                      "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": f"/tmp/diff-pv-{i}"},
                      "nodeAffinity": {"required": {"nodeSelectorTerms": terms}},
                      "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": NAMESPACE,
                                   "name": f"bound-{i}"}}
        pv["status"] = {"phase": "Bound"}
        out.append(pv)
        claims.append(_claim(f"bound-{i}", "", f"diff-pv-{i}", bound=True))
    free = _meta("PersistentVolume", "diff-pv-free")
    free["spec"] = {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                    "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": "/tmp/diff-pv-free"}}
    out.append(free)
    claims += [_claim("wffc", "diff-wffc"), _claim("wffc-zone", "diff-wffc-zone"), _claim("wffc-pool", "diff-wffc-pool"),
               _claim("immediate", "diff-immediate"), _claim("no-class", ""), _claim("prebound", "", "diff-pv-free"),
               _claim("gone", "", "diff-pv-gone", bound=True)]
    return out + claims


def world(seed: int, *, cases: int = CASES, focused: int = FOCUSED, nodes: int = 20, residents: int = 8) -> World:
    """The world of ``seed``: see the module docstring."""
    rng = random.Random(seed)
    draft = Draft(nodes=[node(rng, i) for i in range(nodes)])
    draft.objects = [runtime_class(name, o) for name, o in sorted(RUNTIME_CLASSES.items())]
    draft.residents = [resident(rng, i, draft) for i in range(residents)]
    draft.objects += volume_objects(rng, draft)
    made: list[Case] = []
    for i in range(cases):
        spec, traits = base(rng, draft)
        draft.case_labels = {}
        for probability, trait in POD_TRAITS:
            if rng.random() < probability:
                name = trait(rng, draft, spec)
                if name:
                    traits.append(name)
        made.append(Case(f"case-{i:03d}", pod(f"case-{i:03d}", spec, {LABEL: "case", **draft.case_labels}),
                         tuple(traits)))
    for i in range(focused):
        spec = {"containers": [container("c0", {"cpu": "100m", "memory": "64Mi"})], "tolerations": [{"operator": "Exists"}]}
        draft.case_labels = {}
        traits = ["focused"]
        for trait in ((own_labels,) if rng.random() < 0.5 else ()) + (FOCUS[i % len(FOCUS)],):
            traits.append(trait(rng, draft, spec))
        made.append(Case(f"focus-{i:03d}", pod(f"focus-{i:03d}", spec, {LABEL: "case", **draft.case_labels}),
                         tuple(traits)))
    return World(seed=seed, nodes=tuple(draft.nodes), objects=tuple(draft.objects), residents=tuple(draft.residents),
                 cases=tuple(made))
