"""``muster explain``: why a workload is not running (or was preempted) at a time, with numbers.

Everything comes from the log: the result view's phases and reasons (``fold.AuditFold``), the queue
core fed its own inbox up to that time (its ``status()``: positions, who is ahead, backoffs), the
queue tree's guarantees and limits and the usage of the workloads holding quota (the numbers
``muster queues`` shows), placement's last refusal (kube-scheduler's node histogram, in its own
words), and the preemptions with the decisions that made them. Nothing is decided again here.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Iterable

from shared.audit.fold import AuditFold
from shared.audit.header import window_note
from shared.audit.replay import Router
from shared.kernel import quantity as q
from shared.kernel.events import Envelope
from shared.kernel.eventtime import SCENARIO, TimeFormat
from shared.kernel.model import UNLIMITED
from shared.kernel.policy import Policy
from shared.kernel.reasons import gang_line
from shared.runtime.cores import CORE_CLASSES
from shared.runtime.service import Service

WAITING = ("Queued", "Preempted", None)


class UnknownWorkload(LookupError):
    """The log names no such workload (up to the time asked about); ``similar`` are names that come close."""

    def __init__(self, key: str, similar: list[str], at: float | None = None) -> None:
        super().__init__(key)
        self.key, self.similar, self.at = key, similar, at


class UnknownQueue(UnknownWorkload):
    """The log neither defines a queue of that name nor puts a workload in it (up to the time asked about)."""


def _close(name: str, names: Iterable[str]) -> list[str]:
    """Up to five of ``names`` that contain ``name`` or are spelled nearly like it (a typo)."""
    names = sorted(set(names))
    return sorted(dict.fromkeys([n for n in names if name and name in n][:5]
                                + difflib.get_close_matches(name, names, n=5, cutoff=0.6)))[:5]


@dataclass
class Moment:
    """The log folded up to a time: the result view, and the queue core's own state (if its policy is known).
    ``since``/``before``: the log is a window of a history (``log export --since/--until``)."""

    history: AuditFold
    queue: Any | None
    at: float
    since: float | None = None
    before: float | None = None
    last: float | None = None
    """The latest event time in the whole log, folded or not (None: an empty log)."""

    @property
    def window(self) -> dict[str, float | None] | None:
        """The window as the JSON documents give it (``until`` as ``--until`` says it); None for a whole log."""
        if self.since is None and self.before is None:
            return None
        return {"since": self.since, "until": self.before}


def fold_until(envelopes: Iterable[Envelope], at: float | None, policy: Policy | None, *,
               since: float | None = None, before: float | None = None) -> Moment:
    """Fold the log up to event time ``at`` (default: its end); feed the queue core its inbox alongside.
    ``since``/``before``: the window the log is (its header's), which the explanation says first."""
    history = AuditFold()
    service = Service(CORE_CLASSES["queue"](policy)) if policy is not None else None
    router = Router()
    last: float | None = None
    for env in envelopes:
        if last is None or env.occurred_at > last:
            last = env.occurred_at
        if at is not None and env.occurred_at > at:
            continue
        history.apply(env)
        if service is not None and "queue" in (router.targets(env) or ()):
            service.handle(env)
    history.close()
    return Moment(history, service.core if service is not None else None, history.now if at is None else at,
                  since, before, last)


def _amount(resource: str, value: int | None) -> str | None:
    if value is None:
        return None
    return "unlimited" if value == UNLIMITED else q.human(resource, value)


def queue_lines(m: Moment, queue: str) -> list[dict[str, Any]]:
    """The queue's waiting workloads in order: position, priority, how long, why (one line each);
    ``UnknownQueue`` when the log never defined nor used that queue."""
    h = m.history
    known = {*h.queues, *(view.queue for view in h.workloads.values() if view.queue),
             m.queue.policy.default_queue if m.queue is not None else "default"}
    if queue not in known:
        raise UnknownQueue(queue, _close(queue, known), m.at)
    order = _waiting_order(m, queue)
    out = []
    for i, (key, until) in enumerate(order, 1):
        view = h.workloads[key]
        since = _phase_since(view, m.at)
        out.append({"position": i, "workload": key, "priority": view.priority, "phase": view.phase,
                    "waiting_seconds": round(m.at - since, 6) if since is not None else None,
                    "backoff_until": until, "reason": view.reason})
    return out


def _waiting_order(m: Moment, queue: str) -> list[tuple[str, float | None]]:
    """(workload, backoff until) in the queue's order: the queue core's (ready ones, then those
    backing off), else the result view's positions when the log's policy is unknown."""
    if m.queue is not None:
        status = m.queue.status().get(queue)
        if status is None:
            return []
        return ([(p["workload"], None) for p in status["pending"]]
                + [(b["workload"], b["requeue_at"]) for b in status["backoff"]])
    queues = m.history.result()["queues"].get(queue, {})
    backing = {k: m.history.workloads[k].requeue_at for k in queues.get("backoff", [])}
    return [(p["workload"], None) for p in queues.get("pending", [])] + list(backing.items())


def _phase_since(view: Any, at: float) -> float | None:
    """When the workload entered the phase it is in at ``at``."""
    since = None
    phase = None
    for tr in view.transitions:
        if tr["t"] > at:
            break
        if tr["phase"] != phase:
            phase, since = tr["phase"], tr["t"]
    return since


def _quota(m: Moment, view: Any) -> list[dict[str, Any]]:
    """Per resource the workload asks for, at its queue and every ancestor: used, requested, guarantee, limit.

    In a window from T (``m.since``) the state before T is not in the log: a queue the window does not
    define is said to be defined before it (one entry, ``before_window``), never "unlimited"; a queue it
    does define has its usage counted from the window only, a lower bound, so "over" stands but "fits"
    cannot be told (``fits`` None)."""
    h = m.history
    usage = h.queue_usage()
    default = m.queue.policy.default_queue if m.queue is not None else "default"
    lines = []
    name: str | None = view.queue
    seen: list[str] = []
    demand = {r: v for r, v in sorted(view.demand.items()) if v}
    while name is not None and name not in seen:
        seen.append(name)
        spec = h.queues.get(name)
        used = usage.get(name, {})
        if spec is None and m.since is not None:
            lines.append({"queue": name, "defined": False, "before_window": True})
            break
        for resource, wanted in demand.items():
            limit = spec.limit_of(resource) if spec is not None else None
            guarantee = spec.guarantee.get(resource) if spec is not None else None
            mine = wanted if view.holds_quota else 0  # a holder's own share is in the usage already
            fits: bool | None = limit is None or used.get(resource, 0) - mine + wanted <= limit
            if fits and m.since is not None:
                fits = None  # the usage from before the window may fill it
            lines.append({
                "queue": name, "resource": resource, "used": q.human(resource, used.get(resource, 0) - mine),
                "requested": q.human(resource, wanted), "guarantee": _amount(resource, guarantee),
                "limit": _amount(resource, limit) or "unlimited",
                "limit_word": spec.limit_word if spec is not None else "limit",
                "guarantee_word": spec.guarantee_word if spec is not None else "guarantee",
                "fits": fits, "defined": spec is not None or name == default,
                "in_window": m.since is not None,
            })
        name = spec.parent if spec is not None else None
    return lines


def explain(m: Moment, key: str, clock: TimeFormat = SCENARIO) -> dict[str, Any]:
    """The explanation document of ``key`` at ``m.at`` (``UnknownWorkload`` if the log never named it);
    its ``lines`` show times as ``clock`` does (the document's own fields stay event-time seconds)."""
    h = m.history
    view = h.workloads.get(key)
    if view is None:
        raise UnknownWorkload(key, _close(key, h.workloads), m.at)
    phase, reason = view.phase_at(m.at)
    since = _phase_since(view, m.at)
    doc: dict[str, Any] = {
        "workload": key, "at": m.at, "kind": view.kind, "queue": view.queue, "priority": view.priority,
        "phase": phase, "since": since, "for_seconds": round(m.at - since, 6) if since is not None else None,
        "reason": reason, "window": m.window,
    }
    spec = h.specs.get(key)
    pods = h.pods_of(key)
    bound = sum(1 for p in pods if p.bound_at(m.at))
    doc["gang"] = {"min_member": view.min_member, "pods": spec.gang.pod_count if spec else None, "bound": bound,
                   "resources": q.format_resources(view.resources),
                   "line": gang_line(spec.gang).rstrip("; ") if spec is not None and phase in WAITING else None}
    if view.queue is not None and phase in WAITING:
        order = _waiting_order(m, view.queue)
        keys = [k for k, _ in order]
        if key in keys:
            i = keys.index(key)
            doc["position"] = {"queue": view.queue, "position": i + 1, "of": len(keys),
                               "ahead": [_ahead(m, k, until) for k, until in order[:i]]}
        doc["quota"] = _quota(m, view)
        said = h.placement.get(key)
        doc["nodes"] = None if said is None or said.t > m.at else {"t": said.t, "reason": said.reason,
                                                                   "decision": said.event_id}
        backoff = h.backoff.get(key)
        if backoff is not None and view.queue_state == "backoff" and backoff[1] > m.at:
            said, until, attempts = backoff
            doc["backoff"] = {"until": until, "attempts": attempts, "decision": said.event_id, "reason": said.reason}
    doc["preempted"] = [{"t": p.t, "by": p.preemptor, "priority": p.preemptor_priority,
                         "rule": "reclaim" if p.reclaim else "priority preemption", "reason": p.reason,
                         "decision": p.event_id, "preemptor_decision": p.cause_id}
                        for p in h.preemptions if p.victim == key and p.t <= m.at]
    doc["lines"] = lines(doc, clock)
    return doc


def _ahead(m: Moment, key: str, until: float | None) -> dict[str, Any]:
    view = m.history.workloads[key]
    since = _phase_since(view, m.at)
    return {"workload": key, "priority": view.priority, "backoff_until": until,
            "waiting_seconds": round(m.at - since, 6) if since is not None else None}


def lines(doc: dict[str, Any], clock: TimeFormat = SCENARIO) -> list[str]:
    """The explanation as a person reads it: instants as ``clock`` shows them (ISO 8601 in a deployment's
    log), lengths of time in seconds."""
    at, span = clock.at, clock.duration
    queue = f"queue {doc['queue']}" if doc["queue"] is not None else "no queue"
    window = doc.get("window")
    note = window_note(window["since"], window["until"], clock) if window else None
    out = [note] if note else []
    out += [f"{doc['workload']} ({doc['kind']}, {queue}, priority {doc['priority']}) at "
           f"{at(doc['at'])}: {doc['phase'] or 'not seen yet'}"
           + (f" for {span(doc['for_seconds'])} (since {at(doc['since'])})" if doc["since"] is not None else "")]
    if doc["reason"]:
        out.append(f"  why: {doc['reason']}")
    gang = doc["gang"]
    out.append(f"  gang: {gang['pods'] if gang['pods'] is not None else '?'} pods, minMember {gang['min_member']}, "
               f"{gang['bound']} bound; requests {', '.join(f'{k} {v}' for k, v in gang['resources'].items()) or '-'}")
    if gang.get("line"):
        out.append(f"  {gang['line']}")
    position = doc.get("position")
    if position:
        ahead = position["ahead"]
        out.append(f"  queue {position['queue']}: position {position['position']} of {position['of']}"
                   + (", behind " + ", ".join(
                       f"{a['workload']} (priority {a['priority']}"
                       + (f", waiting {span(a['waiting_seconds'])}" if a["waiting_seconds"] is not None else "")
                       + (f", backing off until {at(a['backoff_until'])}" if a["backoff_until"] else "") + ")"
                       for a in ahead) if ahead else ", first in line"))
    for line in doc.get("quota") or []:
        if line.get("before_window"):
            out.append(f"  quota: queue {line['queue']}'s definition is before the window (if it has one): its "
                       "limits are unknown")
            continue
        guarantee = f", {line['guarantee_word']} {line['guarantee']}" if line["guarantee"] is not None else ""
        verdict = ("fits" if line["fits"] else "over") if line["fits"] is not None else \
            "unknown (usage from before the window is not in it)"
        where = line["queue"] if line["defined"] else f"{line['queue']} (not defined)"
        used = f"{line['used']} in the window" if line.get("in_window") else line["used"]
        out.append(f"  quota {where} {line['resource']}: used {used} + requested {line['requested']} "
                   f"against {line['limit_word']} {line['limit']}{guarantee}: {verdict}")
    nodes = doc.get("nodes")
    if nodes:
        out.append(f"  nodes (placement at {at(nodes['t'])}, decision {nodes['decision']}): {nodes['reason']}")
    elif "nodes" in doc:
        out.append("  nodes: placement has not tried it yet (the queue has not reserved its quota)")
    backoff = doc.get("backoff")
    if backoff:
        out.append(f"  backoff: attempt {backoff['attempts']}, retries at {at(backoff['until'])} or when capacity "
                   f"frees (decision {backoff['decision']})")
    for p in doc["preempted"]:
        out.append(f"  preempted at {at(p['t'])} by {p['by']} (priority {p['priority']}), {p['rule']}: "
                   f"{p['reason']} (decision {p['decision']}, answering {p['preemptor_decision']})")
    return out
