"""A deployment's what-if: the log's recorded inputs played to fresh cores at their recorded times.

A simulated run's log becomes a scenario the simulator runs again (``shared.audit.derive``): its
cluster was the simulator's, so under another policy the cluster answers the changed decisions as it
would have. A deployment's cluster was a real one — the API server, KubeRay, kubelets — whose answers
the simulator cannot re-time to the millisecond, so deriving a scenario from its log never gives the
log's decisions back. Here instead the watch events the cluster sent (source ``ingest``) are played,
as they were recorded and when, to the four cores, once under the recorded policy and once under the
new one; what the cores ask of the cluster is kept, not performed (``RecordedCluster``). Each side is
a fold over the same inputs, so the two compare decision for decision.

What this cannot model is how the cluster would have answered a changed decision: a workload the new
policy admits earlier gets its pods only when KubeRay created them in the recording, one it admits
that was never admitted gets none, and one it no longer admits still sees the pods KubeRay made for
it. ``unmodeled`` names each such workload, with both times, so a reader knows which figures are
bounds rather than predictions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from services.reconciler.ingest import observe
from shared.audit.metrics import WorkloadFigures
from shared.kernel.events import Envelope, KubeEffect, ObjectChanged, wrap
from shared.kernel.kube import meta
from shared.kernel.policy import Policy
from shared.runtime.embedded import EmbeddedRuntime
from shared.sim.cluster import SimCluster

INGEST = "ingest"
"""The source of the cluster's watch events in every runtime (``services.reconciler.ingest``)."""

Ref = tuple[str, str, str]


class RecordedCluster(SimCluster):
    """A cluster whose every answer is already in the log: it sends nothing of its own, and keeps the
    effects the cores ask of it (with their times) instead of performing them."""

    def __init__(self) -> None:
        super().__init__(annotation_history=False)
        self.asked: list[tuple[float, KubeEffect]] = []

    def perform(self, effect: KubeEffect, now: float) -> None:
        self.asked.append((now, effect))


def inputs(log: Iterable[Envelope]) -> list[Envelope]:
    """The envelopes of a log that came from the cluster, in log order."""
    return [env for env in log if env.source == INGEST]


def replay_inputs(recorded: Sequence[Envelope], policy: Policy, *, until: float,
                  given: dict[Ref, dict[str, Any]] | None = None,
                  ref_of: Callable[[dict[str, Any]], Ref] | None = None) -> EmbeddedRuntime:
    """Fresh cores under ``policy`` fed ``recorded`` (the log's inputs) at their times, to ``until``;
    ``given`` manifests stand in for the recorded objects of the same (kind, namespace, name), and
    those the log never saw are added at its first instant. The runtime holds the new log."""
    runtime = EmbeddedRuntime(policy, RecordedCluster())
    given = given or {}
    start = recorded[0].occurred_at if recorded else 0.0
    steps: list[tuple[float, Callable[[float], None]]] = []
    seen: set[Ref] = set()
    for env in recorded:
        p = env.payload
        if isinstance(p, ObjectChanged) and ref_of is not None:
            ref = ref_of(p.object)
            seen.add(ref)
            if ref in given and p.change != "Deleted":
                env = _standing_in(env, given[ref])
        steps.append((env.occurred_at, lambda now, env=env: runtime.publish(env)))
    for index, (ref, obj) in enumerate(given.items(), 1):
        if ref not in seen:
            added = wrap(observe("Added", obj), source=INGEST, cause=None, index=index, at=start)
            steps.insert(0, (start, lambda now, env=added: runtime.publish(env)))

    def announce(now: float) -> None:
        runtime.announce()

    steps.insert(0, (start, announce))
    runtime.run(steps, until)
    return runtime


def _standing_in(env: Envelope, manifest: dict[str, Any]) -> Envelope:
    """``env``'s watch event carrying ``manifest`` instead of the recorded object, under the recorded
    object's identity (uid, resourceVersion): the same event of another version of it."""
    p: ObjectChanged = env.payload  # type: ignore[assignment]
    obj = {**manifest, "metadata": {**meta(p.object), **meta(manifest)}}
    return env.model_copy(update={"payload": observe(p.change, obj)})


@dataclass(frozen=True)
class Unmodeled:
    """A workload whose admission the new policy moved, where the recording cannot say what the
    cluster would have done in answer."""

    key: str
    recorded: float | None
    """When it was first admitted in the recording (None: never)."""
    new: float | None

    def words(self, at: Callable[[float], str]) -> str:
        if self.recorded is None:
            return (f"{self.key}: admitted at {at(self.new or 0.0)} under the new policy, never in the recording: "
                    "KubeRay created no pods for it there, so it never runs here")
        if self.new is None:
            return (f"{self.key}: not admitted under the new policy, admitted at {at(self.recorded)} in the "
                    "recording: the pods KubeRay made for it then still appear here")
        return (f"{self.key}: admitted at {at(self.new)} under the new policy, at {at(self.recorded)} in the "
                "recording: its pods appear when KubeRay created them in the recording, not "
                f"{abs(self.recorded - self.new):.3f}s {'earlier' if self.new < self.recorded else 'later'}")


def unmodeled(before: dict[str, WorkloadFigures], after: dict[str, WorkloadFigures]) -> list[Unmodeled]:
    """The workloads whose first admission differs between the two sides (see the module docstring)."""
    out: list[Unmodeled] = []
    for key in sorted(set(before) | set(after)):
        a = before[key].first_admitted if key in before else None
        b = after[key].first_admitted if key in after else None
        if a != b:
            out.append(Unmodeled(key, a, b))
    return out
