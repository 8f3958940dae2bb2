"""The ``muster simulate`` scenario format: a cluster, timed steps of Kubernetes YAML, expectations.

Loading is strict: unknown keys, malformed YAML and bad durations are ``ScenarioError`` with the
place named, never a traceback.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from shared.kernel.duration import DurationError, parse_duration
from shared.kernel.kube import DEFAULT_SCHEDULER
from shared.kernel.policy import Policy
from shared.kernel.quantity import QuantityError, parse_resources
from shared.sim import kinds
from shared.sim.batchscheduler import Setting, implied, plugin


class ScenarioError(ValueError):
    """A scenario that cannot be run as written."""


_Loader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser where PyYAML was built with it: a large scenario's steps are a lot of YAML, and
the pure-Python parser took a large part of ``muster simulate``'s time reading them. Same safe
constructor, so the same documents."""


MAX_ALIASES = 100
"""Most YAML aliases (``*name``) taken in one text. Manifests rarely use any; a billion-laughs document
needs few aliases to expand into billions of values, and ``tree_problem`` stops that expansion too."""

MAX_NODE_COUNT = 20_000
"""Most simulated nodes a scenario may declare (its ``count`` entries and named nodes together): four
times the 5,000 nodes Kubernetes supports in one cluster, so a typo (``count: 1e9``) is an error, not
minutes of building nodes."""


class _YamlBound(ValueError):
    """A YAML text beyond a bound (aliases, nesting): refused before or while it is built."""


def _aliases_within_bound(text: str) -> None:
    if "*" not in text:  # no alias without an asterisk: the common case costs one scan of the text
        return
    count = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.AliasEvent):
            count += 1
            if count > MAX_ALIASES:
                mark = event.start_mark
                raise _YamlBound(f"{mark.line + 1}:{mark.column + 1}: more than {MAX_ALIASES} YAML aliases")


def _load(text: str, *, many: bool) -> Any:
    """PyYAML, bounded: aliases counted first, nesting deeper than the interpreter's stack refused."""
    _aliases_within_bound(text)
    try:
        return list(yaml.load_all(text, Loader=_Loader)) if many else yaml.load(text, Loader=_Loader)
    except RecursionError:
        raise _YamlBound("nested too deeply to read") from None
    except ValueError as exc:  # an integer of more than 4,300 digits (int's own bound) is no number
        raise _YamlBound(" ".join(str(exc).split())) from None


def _load_all(text: str) -> list[Any]:
    return _load(text, many=True)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _seconds(value: Any) -> float:
    try:
        return parse_duration(value)
    except DurationError as exc:
        raise ValueError(str(exc)) from None


class NodeSpec(_Strict):
    name: str | None = Field(default=None, min_length=1)
    count: int | None = Field(default=None, ge=1, le=MAX_NODE_COUNT)
    name_prefix: str = "node-"
    capacity: dict[str, str | int | float]
    labels: dict[str, str] = {}
    taints: list[dict[str, str]] = []

    @model_validator(mode="after")
    def _named(self) -> "NodeSpec":
        if (self.name is None) == (self.count is None):
            raise ValueError("a node entry needs exactly one of 'name' or 'count'")
        last = self.name or f"{self.name_prefix}{self.count}"
        problem = object_problem({"metadata": {"name": last, "labels": self.labels}})
        if problem:
            raise ValueError(problem.replace("metadata.", "", 1) if self.name or "labels" in problem
                             else f"name_prefix: {problem.removeprefix('metadata.name: ')}")
        try:
            parse_resources(self.capacity, where="capacity")
        except QuantityError as exc:
            raise ValueError(str(exc)) from None
        return self

    def manifests(self) -> list[dict[str, Any]]:
        names = [self.name] if self.name else [f"{self.name_prefix}{i + 1}" for i in range(self.count or 0)]
        capacity = {k: str(v) for k, v in self.capacity.items()}
        return [{
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": n, "labels": dict(self.labels)},
            "spec": {"taints": [dict(t) for t in self.taints]} if self.taints else {},
            "status": {"capacity": dict(capacity), "allocatable": dict(capacity)},
        } for n in names]


class KubeRaySpec(_Strict):
    batch_scheduler: Setting | None = None
    """KubeRay's ``--batch-scheduler`` (none, volcano, kai-scheduler, scheduler-plugins); unset: the
    one the manifests imply (``batchscheduler.implied``)."""


class ClusterSpec(_Strict):
    nodes: list[NodeSpec] = []
    pod_startup: float | None = None
    kuberay: KubeRaySpec = KubeRaySpec()

    _startup = field_validator("pod_startup", mode="before")(lambda v: None if v is None else _seconds(v))


class ObjectRef(_Strict):
    kind: str
    name: str
    namespace: str | None = None


class Step(_Strict):
    at: float
    apply: str | None = None
    delete: ObjectRef | None = None
    _docs: list[dict[str, Any]] | None = PrivateAttr(default=None)
    """The ``apply`` documents, parsed on first use and kept: loading checks them, running applies them."""

    _at = field_validator("at", mode="before")(lambda v: _seconds(v))

    @model_validator(mode="after")
    def _one_action(self) -> "Step":
        if (self.apply is None) == (self.delete is None):
            raise ValueError("a step needs exactly one of 'apply' or 'delete'")
        return self

    def objects(self, index: int) -> list[dict[str, Any]]:
        """The documents of an ``apply`` step; empty documents are skipped. A kind the simulated API
        server does not have in a group it serves (a typo) is an error (``shared.sim.kinds``).
        Parsed once: callers copy before they change one (``SimCluster.apply`` does)."""
        if self._docs is not None:
            return self._docs
        where = f"steps[{index}].apply"
        try:
            docs = [d for d in _load_all(self.apply or "") if d is not None]
        except yaml.YAMLError as exc:
            raise ScenarioError(yaml_error(exc, "", within=where).removeprefix(": ")) from None
        except _YamlBound as exc:
            raise ScenarioError(f"{where}: {exc}") from None
        for n, doc in enumerate(docs):
            if not isinstance(doc, dict):
                raise ScenarioError(f"steps[{index}].apply document {n + 1}: expected a mapping, got {type(doc).__name__}")
            problem = document_problem(doc)
            if problem:  # what the API server refuses, the simulated one refuses (kubectl apply fails)
                raise ScenarioError(f"steps[{index}].apply document {n + 1} ({_named(doc)}): {problem}")
        self._docs = docs
        return docs

    def notes(self, index: int) -> list[str]:
        """What is worth telling about the step's documents: kinds the simulated cluster ignores."""
        out = []
        for n, doc in enumerate(self.objects(index)):
            note = kinds.check(doc)
            if note:
                out.append(f"steps[{index}].apply document {n + 1} ({_named(doc)}): {note}")
        return out


def document_problem(doc: dict[str, Any], *, require_name: bool = False) -> str | None:
    """Why the (simulated) API server refuses one manifest, a typo of a served kind included; None if
    it takes it. Also what ``muster replay --what-if --apply`` checks its files with."""
    problem = tree_problem(doc) or object_problem(doc, require_name=require_name)
    if problem:
        return problem
    try:
        kinds.check(doc)
    except kinds.UnknownKind as exc:
        return str(exc)
    return None


def _named(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"{doc.get('kind')} {name}" if isinstance(name, str) else str(doc.get("kind"))


class Expectation(_Strict):
    at: float
    workload: str
    phase: str | None = None
    reason_contains: str | None = None
    elastic_reason_contains: str | None = None
    """Why its elastic pods wait at ``at`` ("" expects that none does)."""
    warning_contains: str | None = None
    """Part of a warning told of its object at or before ``at`` (``WorkloadWarned``; "" expects none)."""
    pods_bound: int | None = None
    same_node: list[str] | None = None
    same_gpu: list[str] | None = None
    distinct_nodes: list[str] | None = None
    """Pod sets whose bound pods are each on a node of its own (no two share one)."""
    pods_per_node: dict[str, int] | None = None
    """How many of its bound pods each node holds (nodes not named hold none)."""
    on_node: dict[str, str] | None = None
    """Pod set -> the node every bound pod of it is on at ``at``."""
    min_member: int | None = None
    resources: dict[str, str | int | float] | None = None
    annotations_present: list[str] | dict[str, str] | None = None

    _at = field_validator("at", mode="before")(lambda v: _seconds(v))


class Scenario(_Strict):
    name: str
    cluster: ClusterSpec = ClusterSpec()
    steps: list[Step] = []
    until: float = 600.0
    pod_startup: float | None = None
    policy: dict[str, Any] | None = None
    expect: list[Expectation] = []
    description: str | None = None

    _until = field_validator("until", mode="before")(lambda v: _seconds(v))
    _startup = field_validator("pod_startup", mode="before")(lambda v: None if v is None else _seconds(v))

    @property
    def startup_seconds(self) -> float:
        for value in (self.pod_startup, self.cluster.pod_startup):
            if value is not None:
                return value
        return 2.0

    def notes(self) -> list[str]:
        """Things a reader of the scenario should know that do not stop it (``Step.notes``)."""
        return [note for i, step in enumerate(self.steps) if step.apply is not None for note in step.notes(i)]

    @cached_property
    def documents(self) -> tuple[tuple[dict[str, Any], ...], ...]:
        """Each step's ``apply`` documents, parsed once (empty for a ``delete``); read them, do not change them."""
        return tuple(tuple(step.objects(i)) if step.apply is not None else () for i, step in enumerate(self.steps))

    @cached_property
    def batch_scheduler(self) -> Setting:
        """The simulated KubeRay's ``--batch-scheduler``: as the scenario says, else as its manifests imply."""
        if self.cluster.kuberay.batch_scheduler is not None:
            return self.cluster.kuberay.batch_scheduler
        return implied([doc for docs in self.documents for doc in docs if doc.get("kind") in ("RayCluster", "RayJob")])

    def under(self, setting: Setting) -> "Scenario":
        """This scenario with KubeRay run with another ``--batch-scheduler``: a file is run under each
        setting it applies to (tests/realcluster/test_scenario_parity.py)."""
        kuberay = self.cluster.kuberay.model_copy(update={"batch_scheduler": setting})
        other = self.model_copy(update={"cluster": self.cluster.model_copy(update={"kuberay": kuberay})})
        other.__dict__.pop("batch_scheduler", None)  # a cached_property, which model_copy copies
        return other

    def effective_policy(self, base: Policy | None = None) -> Policy:
        """The scenario's ``policy:`` block layered over ``base`` (``--policy FILE``) or the defaults.

        The simulated cluster has no scheduler but muster: unless the scenario or ``base`` names the
        scheduler names muster answers to, it also answers to the one the simulated KubeRay gives its
        pods and to ``default-scheduler`` (pods that name none), so the manifests mean what they did
        before KubeRay's setting was simulated. Naming them shows pods left to another scheduler."""
        override = dict(self.policy or {})
        merged = (base or Policy()).layered_dump(override)
        if "scheduler_names" not in override and (base is None or "scheduler_names" not in base.model_fields_set):
            names = Policy().scheduler_names + (plugin(self.batch_scheduler).pod_scheduler, DEFAULT_SCHEDULER)
            merged["scheduler_names"] = list(dict.fromkeys(names))
        try:
            return Policy.from_mapping(merged)
        except ValidationError as exc:
            raise ScenarioError(f"{self.name}: invalid policy: {_first_error(exc)}") from None


from shared.kernel.validation import first_errors as _first_error  # noqa: E402 - kept where its callers read it
from shared.kernel.validation import object_problem, read_text, tree_problem, yaml_error  # noqa: E402


def load_scenario(source: str | Path) -> Scenario:
    """Read and validate a scenario file."""
    path = Path(source)
    return parse_scenario(read_text(path, "scenario", ScenarioError), origin=str(path))


def parse_scenario(text: str, origin: str = "<scenario>") -> Scenario:
    """Validate a scenario's text; every error is one line naming ``origin`` (and the line, for YAML)."""
    try:
        data = _load(text, many=False)
    except yaml.YAMLError as exc:
        raise ScenarioError(yaml_error(exc, origin)) from None
    except _YamlBound as exc:
        raise ScenarioError(f"{origin}: {exc}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{origin}: a scenario is a mapping with name, cluster, steps, until")
    problem = tree_problem(data)
    if problem:
        raise ScenarioError(f"{origin}: {problem}")
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(f"{origin}: {_first_error(exc)}") from None
    nodes = sum(spec.count or 1 for spec in scenario.cluster.nodes)
    if nodes > MAX_NODE_COUNT:
        raise ScenarioError(f"{origin}: cluster.nodes: {nodes} nodes, more than the {MAX_NODE_COUNT} muster simulates")
    try:
        scenario.documents  # noqa: B018 - surface malformed YAML and unknown kinds before anything runs
    except ScenarioError as exc:
        raise ScenarioError(f"{origin}: {exc}") from None
    return scenario
