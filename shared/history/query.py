"""Reading the history store back: a workload's timeline, queue usage, the event log itself.

``workload_history`` returns the same document ``muster simulate --json`` has per workload (plus
its key), so a timeline read from the store and one computed in memory compare equal.
"""

from __future__ import annotations

from typing import Any, Iterator

from sqlalchemy import Engine, and_, func, select

from shared.history.engine import errors_explained, opened
from shared.history.models import EventLog, LogSigned, Placement, Queue, QueueUsage, Workload, WorkloadTransition
from shared.kernel import quantity as q
from shared.kernel.events import Envelope
from shared.kernel.model import UNLIMITED


def workload_history(url: str | Engine, key: str) -> dict[str, Any] | None:
    """The workload's phases, reasons and pods as stored; None when the store never heard of it."""
    w, tr, p = Workload.__table__, WorkloadTransition.__table__, Placement.__table__
    with errors_explained(url), opened(url, existing=True) as engine, engine.connect() as conn:
        row = conn.execute(select(w).where(w.c.key == key)).mappings().first()
        if row is None:
            return None
        transitions = [{"t": t, "phase": phase, "reason": reason} for t, phase, reason in conn.execute(
            select(tr.c.t, tr.c.phase, tr.c.reason).where(tr.c.workload_key == key).order_by(tr.c.seq))]
        pods: dict[str, dict[str, Any]] = {}
        for prow in conn.execute(select(p).where(p.c.workload_key == key)
                                 .order_by(p.c.pod_ordinal, p.c.seq)).mappings():
            gpu = None if prow["gpu_devices"] is None else {"devices": list(prow["gpu_devices"]),
                                                             "fraction": prow["gpu_fraction"]}
            pod = pods.setdefault(prow["pod"], {"name": prow["pod"], "bound": []})
            pod.update(pod_set=prow["pod_set"], node=prow["node"], gpu=gpu)
            if prow["bound_at"] is not None:
                pod["bound"].append([prow["bound_at"], prow["unbound_at"]])
    return {
        "workload": key,
        "kind": row["kind"],
        "queue": row["queue"],
        "priority": row["priority"],
        "gang": {"min_member": row["min_member"], "resources": q.format_resources(row["resources"])},
        "phase": row["phase"],
        "transitions": transitions,
        "pods": [{k: pod[k] for k in ("name", "pod_set", "node", "gpu", "bound")} for pod in pods.values()],
    }


def similar_workloads(url: str | Engine, key: str, limit: int = 5) -> list[str]:
    """Stored workload keys whose name contains the name part of ``key`` (for "did you mean")."""
    w = Workload.__table__
    name = key.rpartition("/")[2]
    pattern = "%" + name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    with errors_explained(url), opened(url, existing=True) as engine, engine.connect() as conn:
        return list(conn.execute(select(w.c.key).where(w.c.key.like(pattern, escape="\\"))
                                 .order_by(w.c.key).limit(limit)).scalars())


def event_count(url: str | Engine) -> int:
    with errors_explained(url), opened(url, existing=True) as engine, engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(EventLog.__table__)).scalar_one()


def first_event_time(url: str | Engine) -> float | None:
    """The first event's time in the log, as read back in order (None: an empty store): what tells a
    deployment's wall clock from a simulated run's seconds, and what ``+90s`` counts from (as in a file)."""
    e = EventLog.__table__
    with errors_explained(url), opened(url, existing=True) as engine, engine.connect() as conn:
        return conn.execute(select(e.c.occurred_at).order_by(e.c.seq).limit(1)).scalar()


def workload_count(url: str | Engine) -> int:
    with errors_explained(url), opened(url, existing=True) as engine, engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(Workload.__table__)).scalar_one()


def _amounts(resources: dict[str, int]) -> dict[str, str]:
    return {name: "unlimited" if value == UNLIMITED else q.format_quantity(name, value)
            for name, value in sorted(resources.items())}


def queue_report(url: str | Engine, at: float | None = None) -> dict[str, dict[str, Any]]:
    """Per queue: parent, usage (now, or at scenario time ``at``) against guarantee and limit.

    Guarantee and limit are the queue's last definition; ``active`` and ``waiting`` (workloads
    holding its quota, workloads Queued in it) are given for the present only.
    """
    qt, w, u = Queue.__table__, Workload.__table__, QueueUsage.__table__
    with errors_explained(url), opened(url, existing=True) as engine, engine.connect() as conn:
        rows = {r["name"]: r for r in conn.execute(select(qt)).mappings()}
        members = conn.execute(select(w.c.queue, w.c.key, w.c.holds_quota, w.c.phase)
                               .where(w.c.queue.is_not(None)).order_by(w.c.ordinal)).all()
        if at is not None:
            latest = (select(u.c.queue, u.c.resource, func.max(u.c.t).label("t"))
                      .where(u.c.t <= at).group_by(u.c.queue, u.c.resource).subquery())
            usage_at: dict[str, dict[str, int]] = {}
            for name, resource, used in conn.execute(
                    select(u.c.queue, u.c.resource, u.c.used).join(latest, and_(
                        u.c.queue == latest.c.queue, u.c.resource == latest.c.resource, u.c.t == latest.c.t))):
                if used:
                    usage_at.setdefault(name, {})[resource] = used
    names = sorted(set(rows) | {m.queue for m in members})
    report: dict[str, dict[str, Any]] = {}
    for name in names:
        row = rows.get(name)
        spec = (row or {}).get("spec") or None
        usage = usage_at.get(name, {}) if at is not None else dict((row or {}).get("usage") or {})
        entry: dict[str, Any] = {
            "parent": row["parent"] if row else None,
            "defined": bool(spec) and row is not None and row["removed_at"] is None,
            "state": spec.get("state", "Open") if spec else None,
            "usage": _amounts(usage),
            "guarantee": _amounts(row["guarantee"]) if row else {},
            "limit": _amounts(row["limit"]) if row else {},
        }
        if row is not None and row["rejected"]:
            entry["rejected"] = row["rejected"]
        if at is None:
            entry["active"] = [m.key for m in members if m.queue == name and m.holds_quota]
            entry["waiting"] = [m.key for m in members if m.queue == name and m.phase == "Queued"]
        report[name] = entry
    return report


def chained(url: str | Engine) -> bool:
    """Whether every stored envelope has its link in the chain (none written before migration 0003)."""
    e = EventLog.__table__
    with errors_explained(url), opened(url, existing=True) as engine, engine.connect() as conn:
        return conn.execute(select(e.c.seq).where(e.c.chain.is_(None)).limit(1)).first() is None


def read_chain(url: str | Engine) -> Iterator[tuple[Envelope, int, int, str]]:
    """Every stored envelope in the order written, with its partition, offset and link in the chain."""
    e = EventLog.__table__
    with errors_explained(url), opened(url, existing=True) as engine, engine.connect() as conn:
        for row in conn.execution_options(yield_per=5_000).execute(select(e).order_by(e.c.seq)).mappings():
            yield (_envelope(row), row["partition"] or 0, row["chain_offset"], row["chain"])


def chain_starts(url: str | Engine) -> dict[int, int]:
    """Each partition's first stored offset in the chain: above 0 once records were archived and pruned."""
    e = EventLog.__table__
    part = func.coalesce(e.c.partition, 0)
    with errors_explained(url), opened(url, existing=True) as engine, engine.connect() as conn:
        return {p: o for p, o in conn.execute(select(part, func.min(e.c.chain_offset)).group_by(part)).all()
                if o is not None}


def prune(url: str | Engine, through: dict[int, int]) -> int:
    """Delete the stored envelopes up to and including offset ``through[p]`` of each partition's chain
    (what ``muster log archive --prune`` archived); the number deleted. The views (workloads,
    transitions, placements, queues, decisions) keep their rows: they are the history's state, not its log."""
    from shared.history.writer import LOCK_ID

    e = EventLog.__table__
    part = func.coalesce(e.c.partition, 0)
    deleted = 0
    with errors_explained(url), opened(url, existing=True) as engine, engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({LOCK_ID})")
        for p, offset in through.items():
            deleted += conn.execute(e.delete().where(part == p, e.c.chain_offset <= offset)).rowcount or 0
    return deleted


def read_signed(url: str | Engine, kinds: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The signed records (``shared.history.integrity``) in the order they were written."""
    import json

    s = LogSigned.__table__
    stmt = select(s.c.record).order_by(s.c.seq)
    if kinds is not None:
        stmt = stmt.where(s.c.kind.in_(kinds))
    with errors_explained(url), opened(url, existing=True) as engine, engine.connect() as conn:
        return [json.loads(text) for text in conn.execute(stmt).scalars()]


def _envelope(row: Any) -> Envelope:
    return Envelope.model_validate({
        "id": row["event_id"], "type": row["type"], "subject": row["subject"], "source": row["source"],
        "occurred_at": row["occurred_at"], "causation_id": row["causation_id"],
        "correlation_id": row["correlation_id"], "schema_version": row["schema_version"],
        "trace": row["trace"], "payload": row["payload"]})


def read_log(url: str | Engine, workload: str | None = None) -> Iterator[Envelope]:
    """The stored envelopes in the order they were written (one workload's, or all), read a few
    thousand rows at a time (``muster replay --store`` reads millions)."""
    e = EventLog.__table__
    stmt = select(e).order_by(e.c.seq)
    if workload is not None:
        stmt = stmt.where(e.c.workload_key == workload)
    with errors_explained(url), opened(url, existing=True) as engine, engine.connect() as conn:
        for row in conn.execution_options(yield_per=5_000).execute(stmt).mappings():  # streamed, not all at once
            yield Envelope.model_validate({
                "id": row["event_id"], "type": row["type"], "subject": row["subject"], "source": row["source"],
                "occurred_at": row["occurred_at"], "causation_id": row["causation_id"],
                "correlation_id": row["correlation_id"], "schema_version": row["schema_version"],
                "trace": row["trace"], "payload": row["payload"]})
