"""``muster replay LOG --what-if POLICY.yaml [--apply EXTRA.yaml]``: the same history under another policy.

The log becomes a scenario (``derive``), which the simulator runs twice: under the policy the log
was made with — whose decisions must be the log's, service by service, byte for byte (that is the
check that the scenario was derived faithfully; a log whose cluster the simulator does not behave
like, a real one, is refused unless ``approximate``) — and under the new one: the policy file
layered over the recorded policy (the rule ``muster simulate`` uses for a scenario's ``policy:``
block), with ``--apply`` manifests standing in for the objects of the same kind and name (each
apply of that object uses the given version; new objects are applied first, at 0s). A manifest
given that way is taken whole or not at all: one the API server would refuse, or that admission (or
the queue) refuses in the new run and never takes afterwards — a queue with a bad quantity, a gang
larger than muster accepts, a PriorityClass without a valid value — stops the what-if
(``ApplyRefused``, with admission's own reason) before anything is compared.

Compared per queue and overall: admission wait p50/p95/max, preemptions, GPU-hours, jobs finished
(``metrics``); and per workload what changed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence

import yaml
from pydantic import ValidationError

from services.admission.priority import PriorityBook
from shared.audit.derive import derive
from shared.audit.errors import ApplyRefused, CannotReproduce
from shared.audit.fold import fold
from shared.audit.metrics import AT_LEAST, WorkloadFigures, cell, per_queue, workload_figures
from shared.audit.recorded import Unmodeled, inputs, replay_inputs, unmodeled
from shared.kernel import kube
from shared.kernel.events import Envelope, to_json
from shared.kernel.eventtime import SCENARIO, TimeFormat
from shared.kernel.policy import Policy
from shared.kernel.topology import SERVICES
from shared.kernel.validation import first_errors
from shared.runtime.simulate import Run, simulate
from shared.sim.cluster import describe, namespace_of
from shared.sim.scenario import Scenario, ScenarioError, document_problem, parse_scenario
from shared.kernel.display import html_text


@dataclass(frozen=True)
class Side:
    """One run of a what-if: the policy it decided with and the log it made."""

    policy: Policy
    log: list[Envelope]

    @classmethod
    def of(cls, run: Run) -> "Side":
        return cls(run.policy, run.runtime.log)


@dataclass
class Outcome:
    scenario: dict[str, Any]
    recorded: Side
    new: Side
    faithful: bool
    difference: str
    """Where the recorded side first differs from the log ('' when it does not)."""
    end: float
    replayed: int | None = None
    """A deployment's log: how many recorded watch events both sides were fed (``shared.audit.recorded``);
    None: the log was derived into a scenario the simulator ran."""
    unmodeled: list[Unmodeled] = field(default_factory=list)
    """Changed admissions whose answer from the cluster the recording cannot give (a deployment's log)."""

    def figures(self) -> tuple[dict[str, WorkloadFigures], dict[str, WorkloadFigures]]:
        return (workload_figures(fold(self.recorded.log), self.end), workload_figures(fold(self.new.log), self.end))


def decisions(log: Iterable[Envelope]) -> list[Envelope]:
    """What the services decided, in log order (not what they were told: ``PolicyApplied``)."""
    return [env for env in log if env.source in SERVICES and env.type != "PolicyApplied"]


def decisions_by_service(log: Iterable[Envelope]) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {s: [] for s in SERVICES}
    for env in decisions(log):
        out[env.source].append(to_json(env))
    return out


def shared_decisions(log: Iterable[Envelope], replayed: Iterable[Envelope]) -> str:
    """'' when a replay made exactly the log's decisions, else how many of them it made again: the same
    service deciding the same kind of thing about the same subject, and how many of those byte for byte
    (a deployment's inputs replayed: its services read them in an order, and its clock fired timers at
    moments, the replay does not follow, so times and what they stamp differ)."""
    recorded, again = decisions(log), decisions(replayed)
    again_bytes = {to_json(e) for e in again}
    exact = sum(1 for e in recorded if to_json(e) in again_bytes)
    if exact == len(recorded) == len(again):
        return ""

    def kinds(envs: list[Envelope]) -> Counter[tuple[str, str, str]]:
        return Counter((e.source, e.type, e.subject) for e in envs)

    alike = sum((kinds(recorded) & kinds(again)).values())
    return (f"{alike} of the log's {len(recorded)} decisions made again by the same service about the same "
            f"subject ({exact} byte for byte; {len(again)} made in all)")


def first_difference(recorded: dict[str, list[bytes]], simulated: dict[str, list[bytes]]) -> str:
    """'' when every service made the same decisions in the same order, else where they part."""
    for service in SERVICES:
        a, b = recorded[service], simulated[service]
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"{service}'s decision {i + 1}: the log has {x[:160].decode(errors='replace')}..., the simulation " \
                       f"{y[:160].decode(errors='replace')}..."
        if len(a) != len(b):
            return f"{service} made {len(a)} decisions in the log, {len(b)} in the simulation"
    return ""


Ref = tuple[str, str, str]
"""(kind, namespace, name) of an object, as the API server keys it."""


def ref_of(obj: dict[str, Any]) -> Ref:
    """``obj``'s key: a namespaced object that names no namespace is in ``default``, as kubectl puts it."""
    meta = kube.meta(obj)
    kind = str(obj.get("kind"))
    namespace = meta.get("namespace")
    return (kind, namespace_of(kind, namespace if isinstance(namespace, str) else None),
            str(meta.get("name") or "<unnamed>"))


def with_extra(doc: dict[str, Any], extra: list[dict[str, Any]]) -> dict[str, Any]:
    """The derived scenario with ``extra`` manifests standing in for theirs (see the module docstring)."""
    given = {ref_of(d): d for d in extra}
    used: set[tuple[str, str, str]] = set()
    steps = []
    for step in doc["steps"]:
        if "apply" in step:
            docs = []
            for d in yaml.safe_load_all(step["apply"]):
                r = ref_of(d)
                if r in given:
                    used.add(r)
                    d = given[r]
                docs.append(d)
            step = {**step, "apply": yaml.safe_dump_all(docs, sort_keys=False)}
        steps.append(step)
    fresh = [d for r, d in given.items() if r not in used]
    if fresh:
        steps.insert(0, {"at": 0.0, "apply": yaml.safe_dump_all(fresh, sort_keys=False)})
    return {**doc, "steps": steps}


def _refusal(origin: dict[Ref, str], ref: Ref, reason: str) -> ApplyRefused:
    return ApplyRefused(f"--apply {origin.get(ref, 'EXTRA')}: {describe(*ref)}: {reason}")


def check_given(extra: list[dict[str, Any]], origin: dict[Ref, str]) -> None:
    """``ApplyRefused`` for the first manifest the API server would refuse, or a PriorityClass admission
    cannot use (no event says so: the workloads naming it are refused instead)."""
    priorities = PriorityBook()
    for obj in extra:
        problem = document_problem(obj, require_name=True)
        ref = ref_of(obj)
        if problem is None and ref[0] == "PriorityClass":
            priorities.apply(ref[2], obj)
            problem = priorities.problem(ref[2])
        if problem:
            raise _refusal(origin, ref, problem)


def refusals(log: Iterable[Envelope]) -> dict[Ref, str]:
    """The objects admission (or the queue) refused in a run and did not take afterwards, with the reason:
    a queue object by every queue it defines, a workload by its kind and key."""
    queues: dict[str, tuple[Ref, str | None]] = {}
    workloads: dict[Ref, str | None] = {}
    for env in log:
        p: Any = env.payload
        if env.type == "QueueDefined":
            source = p.queue.source
            queues[p.queue.name] = ((source.kind, source.namespace, source.name) if source is not None
                                    else (p.queue.kind, "", p.queue.name), None)
        elif env.type == "QueueRejected":  # admission names the object; the queue core, the queue it defined
            ref = ((p.kind, p.object_namespace, p.object_name) if p.object_name
                   else queues.get(p.name, ((p.kind, "", p.name), None))[0])
            queues[p.name] = (ref, p.reason)
        elif env.type in ("WorkloadSubmitted", "WorkloadUpdated"):
            namespace, _, name = p.workload.key.partition("/")
            workloads[(p.workload.kind, namespace, name)] = None
        elif env.type == "WorkloadRejected":
            namespace, _, name = p.key.partition("/")
            workloads[(p.kind, namespace, name)] = p.reason
    out = {ref: reason for ref, reason in workloads.items() if reason}
    for ref, reason in queues.values():
        if reason:
            out.setdefault(ref, reason)
    return out


def _scenario(doc: dict[str, Any]) -> Scenario:
    return parse_scenario(yaml.safe_dump(doc, sort_keys=False), origin="the scenario derived from the log")


def what_if(log: list[Envelope], *, name: str, until: float | None, recorded_policy: Policy,
            change: dict[str, Any] | None, extra: list[dict[str, Any]], approximate: bool = False,
            origins: Sequence[str] = (), deployed: bool = False) -> Outcome:
    """Run the derived scenario under the recorded policy and under ``change`` (a policy mapping
    layered over it) with ``extra`` manifests (``origins``: the file each came from, for the error
    naming it); ``CannotReproduce`` when the recorded side does not give the log's decisions back
    (unless ``approximate``), ``ApplyRefused`` for a manifest of ``extra`` the new run refuses.
    ``deployed`` (a deployment's log): replay its recorded inputs instead (``shared.audit.recorded``)."""
    origin = {ref_of(obj): (origins[i] if i < len(origins) else "EXTRA") for i, obj in enumerate(extra)}
    check_given(extra, origin)
    if deployed:
        return _replayed(log, name, recorded_policy, change, extra, origin)
    doc = derive(log, name=name, until=until)
    try:
        recorded = simulate(_scenario(doc), recorded_policy)
        difference = first_difference(decisions_by_service(log), decisions_by_service(recorded.runtime.log))
        if difference and not approximate:
            raise CannotReproduce("the scenario derived from the log does not give its decisions back under the "
                                  f"recorded policy: {difference} (a real cluster's timing the simulator cannot "
                                  "follow? --approximate compares against the simulated recording instead)")
        new_doc = with_extra(doc, extra)
        if change:
            new_doc = {**new_doc, "policy": change}
    except ScenarioError as exc:
        raise CannotReproduce(f"the scenario derived from the log does not run: {exc}") from None
    try:
        new = simulate(_scenario(new_doc), recorded_policy)
    except ScenarioError as exc:  # the recorded side ran: what differs is the new side's
        if not extra:
            raise CannotReproduce(f"the scenario derived from the log does not run: {exc}") from None
        raise ApplyRefused(f"--apply {', '.join(dict.fromkeys(origin.values()))}: {exc}") from None
    _refused_given(new.runtime.log, origin)
    end = max(doc["until"], recorded.runtime.now)
    return Outcome(doc, Side.of(recorded), Side.of(new), not difference, difference, end)


def _refused_given(log: list[Envelope], origin: dict[Ref, str]) -> None:
    """``ApplyRefused`` for the first ``--apply`` manifest the new run refused and never took."""
    refused = refusals(log)
    for ref in origin:
        if ref in refused:
            raise _refusal(origin, ref, refused[ref])


def _replayed(log: list[Envelope], name: str, recorded_policy: Policy, change: dict[str, Any] | None,
              extra: list[dict[str, Any]], origin: dict[Ref, str]) -> Outcome:
    """A deployment's what-if: both sides fed the log's watch events at their recorded times."""
    feed = inputs(log)
    if not feed:
        raise CannotReproduce("the log holds no watch events from a cluster to replay")
    try:
        new_policy = recorded_policy.layered(change)
    except ValidationError as exc:
        raise CannotReproduce(f"the what-if policy over the recorded one: {first_errors(exc, 1)}") from None
    end = max(env.occurred_at for env in log)
    recorded = replay_inputs(feed, recorded_policy, until=end)
    new = replay_inputs(feed, new_policy, until=end, given={ref_of(d): d for d in extra}, ref_of=ref_of)
    _refused_given(new.log, origin)
    difference = shared_decisions(log, recorded.log)
    outcome = Outcome({"name": name, "until": end}, Side(recorded_policy, recorded.log), Side(new_policy, new.log),
                      not difference, difference, end, replayed=len(feed))
    outcome.unmodeled = unmodeled(*outcome.figures())
    return outcome


# --------------------------------------------------------------------------- the comparison
def verdict(doc: dict[str, Any]) -> list[str]:
    """What a reader must know before the figures: how both sides were run, and how near the recorded
    side came to the log."""
    replayed = doc.get("replayed_inputs")
    if replayed is None:
        return ["the recorded side reproduces the log's decisions exactly" if doc["faithful"]
                else f"approximate: the recorded side differs from the log ({doc['difference']})"]
    lines = [f"a deployment's log: both sides replay its {replayed} recorded watch events at their recorded times "
             "(the cluster's answers cannot be re-timed), the recorded side under the log's policy"]
    lines.append("the recorded side gives back the log's decisions exactly" if doc["faithful"] else
                 f"the recorded side is near the log, not equal: {doc['difference']} (the services read their "
                 "inboxes in an order and at moments the replay does not follow)")
    return lines


def comparison(outcome: Outcome, policy: Policy) -> dict[str, Any]:
    """The ``--json`` document: per queue both sides, per workload what changed."""
    before, after = outcome.figures()
    workloads: dict[str, Any] = {}
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        change = _change(a, b)
        workloads[key] = {"recorded": a.as_json() if a else None, "new": b.as_json() if b else None,
                          "change": change}
    return {
        "scenario": outcome.scenario["name"], "until": outcome.end, "faithful": outcome.faithful,
        "difference": outcome.difference or None, "replayed_inputs": outcome.replayed,
        "unmodeled": [{"workload": u.key, "recorded_admitted": u.recorded, "new_admitted": u.new}
                      for u in outcome.unmodeled],
        "policy": {"recorded": outcome.recorded.policy.model_dump(mode="json"),
                   "new": outcome.new.policy.model_dump(mode="json")},
        "queues": {"recorded": per_queue(_in_queues(before, after)), "new": per_queue(_in_queues(after, before))},
        "workloads": workloads,
        "changed": sorted(k for k, w in workloads.items() if w["change"]),
    }


def _in_queues(side: dict[str, WorkloadFigures], other: dict[str, WorkloadFigures]) -> dict[str, WorkloadFigures]:
    """``side`` with a workload refused before it had a queue counted in the queue the other run gave it
    (so a rejection shows in that queue's row, not in a ``(none)`` one)."""
    return {key: replace(f, queue=other[key].queue) if f.queue is None and key in other else f
            for key, f in side.items()}


def _change(a: WorkloadFigures | None, b: WorkloadFigures | None) -> list[str]:
    """What changed for one workload, in words."""
    if a is None or b is None:
        return ["only in the new run" if a is None else "only in the recorded run"]
    if b.rejected and b.rejected != a.rejected:  # nothing else follows for it: it never waited, ran or finished
        return [f"rejected under the new policy: {b.rejected}" if not a.rejected else
                f"rejected for another reason under the new policy: {b.rejected} (was: {a.rejected})"]
    out = [f"no longer rejected (was: {a.rejected})"] if a.rejected and not b.rejected else []
    delta = round(b.waited - a.waited, 6)
    if delta:
        out.append(f"waited {'longer' if delta > 0 else 'shorter'} by {abs(delta):g}s ({a.waited:g}s -> {b.waited:g}s)")
    if (a.first_admitted is None) != (b.first_admitted is None):  # its wait is then a lower bound on one side
        out.append("never admitted" if b.first_admitted is None else "admitted (never was in the recorded run)")
    if a.preempted != b.preempted:
        out.append("preempted" if not a.preempted else ("no longer preempted" if not b.preempted else
                                                         f"preempted {a.preempted} -> {b.preempted} times"))
    if a.finished != b.finished:
        out.append("finished" if b.finished else "no longer finished by the end")
    if a.phase != b.phase:
        out.append(f"ends {b.phase} (was {a.phase})")
    return out


COLUMNS = (("wait_p50", "wait p50 (s)"), ("wait_p95", "wait p95 (s)"), ("wait_max", "wait max (s)"),
           ("preemptions", "preemptions"), ("gpu_hours", "GPU-hours"), ("finished", "finished"))


def table_rows(doc: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """Per queue (and ``(all)``): each figure as ``recorded -> new``."""
    rec, new = doc["queues"]["recorded"], doc["queues"]["new"]
    rows = []
    for name in sorted(set(rec) | set(new), key=lambda n: (n == "(all)", n)):
        a, b = rec.get(name, {}), new.get(name, {})
        rows.append((name, [f"{cell(a.get(k), k in a.get('wait_lower_bounds', ()))} -> "
                            f"{cell(b.get(k), k in b.get('wait_lower_bounds', ()))}" for k, _ in COLUMNS]))
    return rows


def has_lower_bounds(doc: dict[str, Any]) -> bool:
    """Whether a wait figure of the comparison is a lower bound (the table then needs ``AT_LEAST``)."""
    return any(s.get("wait_lower_bounds") for side in doc["queues"].values() for s in side.values())


def render_html(doc: dict[str, Any], title: str, clock: TimeFormat = SCENARIO) -> str:
    """The comparison as a page: the table, the waits and totals charts, the workloads that changed
    (the end both ran to as ``clock`` shows it)."""
    import plotly.graph_objects as go

    from shared.audit.report import chart, page

    rec, new = doc["queues"]["recorded"], doc["queues"]["new"]
    names = sorted(set(rec) | set(new), key=lambda n: (n == "(all)", n))
    waits = go.Figure()
    for side, data, colour in (("recorded", rec, "#7f8c8d"), ("new", new, "#2e86de")):
        for stat, pattern in (("wait_p50", ""), ("wait_p95", "/"), ("wait_max", "x")):
            waits.add_trace(go.Bar(name=f"{side} {stat[5:]}", x=[html_text(n) for n in names], y=[data.get(n, {}).get(stat) or 0 for n in names],
                                   marker_color=colour, marker_pattern_shape=pattern, offsetgroup=f"{side}{stat}"))
    waits.update_layout(title="Admission wait per queue: recorded against new", yaxis_title="seconds", height=420)
    totals = go.Figure()
    for side, data, colour in (("recorded", rec, "#7f8c8d"), ("new", new, "#2e86de")):
        totals.add_trace(go.Bar(name=side, x=[html_text(f"{n} {k}") for n in names for k in ("preemptions", "finished")],
                                y=[data.get(n, {}).get(k) or 0 for n in names for k in ("preemptions", "finished")],
                                marker_color=colour))
    totals.update_layout(title="Preemptions and finished jobs per queue", barmode="group", height=380)
    head = "<tr><th>queue</th>" + "".join(f"<th>{html_text(label)}</th>" for _, label in COLUMNS) + "</tr>"
    body = "".join(f"<tr><td>{html_text(n)}</td>" + "".join(f"<td>{html_text(c)}</td>" for c in cells) + "</tr>"
                   for n, cells in table_rows(doc))
    changes = "".join(f"<tr><td>{html_text(k)}</td><td>{html_text('; '.join(doc['workloads'][k]['change']))}</td></tr>"
                      for k in doc["changed"]) or '<tr><td colspan="2">no workload changed</td></tr>'
    notes = "".join(f'<p class="note">{html_text(line)}</p>' for line in verdict(doc))
    return page(title, f"""{notes}<p class="note">both runs to {html_text(clock.at(doc['until']))}.</p>
<h2>Per queue (recorded -> new)</h2><table id="queues">{head}{body}</table>
{f'<p class="note">{html_text(AT_LEAST)}</p>' if has_lower_bounds(doc) else ""}
{chart("chart-whatif-waits", waits)}{chart("chart-whatif-totals", totals)}
<h2>Workloads that changed</h2><table id="changes"><tr><th>workload</th><th>change</th></tr>{changes}</table>""")
