"""The store's ``log_header`` row: what its history was made under (see ``models.LogHeader``).

Plain dicts in and out (``muster_version``, ``schema_version``, ``policy``, ``origin``, ``scenario``,
``until``): the audit commands give them their meaning (``shared.audit.header``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, delete, insert, select

from shared.history.engine import errors_explained, opened
from shared.history.models import LogHeader
from shared.kernel.eventtime import TimeFormat

FIELDS = ("muster_version", "schema_version", "policy", "origin", "scenario", "until")


def read_header(url: str | Engine) -> dict[str, Any] | None:
    """The stored header, or None when nothing recorded one."""
    table = LogHeader.__table__
    with errors_explained(url), opened(url, existing=True) as engine, engine.connect() as conn:
        row = conn.execute(select(table).where(table.c.id == 1)).mappings().first()
    return None if row is None else {name: row[name] for name in FIELDS}


def write_header(url: str | Engine, header: dict[str, Any]) -> None:
    """Record (or replace) the header: a store holds one history, so one header."""
    table = LogHeader.__table__
    values = {name: header.get(name) for name in FIELDS}
    with errors_explained(url), opened(url) as engine, engine.begin() as conn:
        conn.execute(delete(table))
        conn.execute(insert(table).values(id=1, **values))


def time_format(url: str | Engine, *, local: bool = False) -> TimeFormat:
    """How this store's times read (``shared.kernel.eventtime``): from its header's origin (a projector without
    ``--policy`` records none) and its first event time."""
    from shared.history.query import first_event_time

    header = read_header(url)
    return TimeFormat.of(header["origin"] if header else None, first_event_time(url), local=local)
