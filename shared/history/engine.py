"""Opening a store from a URL, and turning database failures into messages a person can act on.

Supported: PostgreSQL through psycopg 3 (``postgresql+psycopg://user@host:5432/db``; a bare
``postgresql://`` means the same) and SQLite (``sqlite:///history.db``).
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import Any, Iterator

import psycopg
from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DataError, DBAPIError, IntegrityError, NoSuchModuleError

from shared.history.rows import JsonText

ENV = "MUSTER_STORE"
SSLMODE_ENV = "MUSTER_STORE_SSLMODE"
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
"""libpq's ``sslmode`` values. Production: ``verify-full`` (TLS, the server's certificate checked against
``sslrootcert`` and its name against the host), docs/operations.md, Exposure."""
EXAMPLES = "sqlite:///history.db or postgresql+psycopg://postgres@127.0.0.1:5432/muster"


class StoreError(Exception):
    """The store cannot be used: a bad URL, an unreachable server, tables missing or out of date."""


class OtherHistory(StoreError):
    """The store holds a history other than the one being written (a store holds one run)."""


class Unstorable(StoreError):
    """The store refuses what was written, not the writer: a value it cannot hold (a NUL character
    in text, an integer out of range) or a row at odds with its constraints. Writing the same again
    fails the same way."""


def dump_json(value: Any) -> str:
    """The store's JSON serialiser: compact, and ``JsonText`` passes through as it is."""
    if isinstance(value, JsonText):
        return value
    return json.dumps(value, separators=(",", ":"))


def resolve_url(url: str | None) -> str:
    """``url``, else ``$MUSTER_STORE``; a clear error when neither says where the store is."""
    url = url or os.environ.get(ENV)
    if not url:
        raise StoreError(f"no store given: pass --store URL or set {ENV} (e.g. {EXAMPLES})")
    return url


def parse_url(url: str) -> URL:
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreError(f"{url!r} is not a database URL (e.g. {EXAMPLES})") from None
    backend = parsed.get_backend_name()
    if backend not in ("postgresql", "sqlite"):
        raise StoreError(f"{parsed.render_as_string(hide_password=True)}: muster stores history in PostgreSQL "
                         f"or SQLite, not {backend!r} (e.g. {EXAMPLES})")
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if backend == "postgresql":
        parsed = _with_sslmode(parsed, os.environ.get(SSLMODE_ENV))
    return parsed


def _with_sslmode(url: URL, default: str | None) -> URL:
    """``url`` with ``sslmode`` from ``$MUSTER_STORE_SSLMODE`` when the URL names none (the URL's own
    ``?sslmode=`` wins); a value libpq does not know is a ``StoreError`` here, not at the first connection."""
    mode = url.query.get("sslmode")
    if mode is None and default:
        url = url.update_query_dict({"sslmode": default})
        mode = default
    if mode is not None and mode not in SSLMODES:
        source = "sslmode in the URL" if default is None or url.query.get("sslmode") != default else SSLMODE_ENV
        raise StoreError(f"{url.render_as_string(hide_password=True)}: {source} {mode!r} is not one of "
                         f"{', '.join(SSLMODES)}")
    return url


def display(url: str | URL | Engine) -> str:
    """The URL without its password, for messages."""
    if isinstance(url, Engine):
        url = url.url
    if isinstance(url, str):
        try:
            url = make_url(url)
        except ArgumentError:
            return url
    return url.render_as_string(hide_password=True)


def connect(url: str | Engine, *, existing: bool = False) -> Engine:
    """An engine for ``url`` (nothing is contacted until it is used). ``existing``: a SQLite file
    must be there already (reading must not leave an empty database behind)."""
    if isinstance(url, Engine):
        return url
    parsed = parse_url(url)
    if existing and parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        if not os.path.exists(parsed.database):
            raise StoreError(f"{display(parsed)}: there is no database file {parsed.database!r}")
    try:
        if parsed.get_backend_name() == "sqlite":
            engine = create_engine(parsed, json_serializer=dump_json)
            event.listen(engine, "connect", _sqlite_pragmas)
        else:
            engine = create_engine(parsed, json_serializer=dump_json, pool_pre_ping=True,
                                   connect_args={"connect_timeout": 10})
    except (NoSuchModuleError, ImportError) as exc:
        raise StoreError(f"{display(parsed)}: no driver for {parsed.drivername!r} ({exc})") from None
    return engine


@contextmanager
def opened(url: str | Engine, *, existing: bool = False) -> Iterator[Engine]:
    """An engine for the duration of a ``with``: disposed afterwards unless the caller passed one."""
    if isinstance(url, Engine):
        yield url
        return
    engine = connect(url, existing=existing)
    try:
        yield engine
    finally:
        engine.dispose()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys = ON")   # cascade like Postgres
    cursor.execute("PRAGMA journal_mode = WAL")  # readers (muster history) do not block the writer
    cursor.execute("PRAGMA synchronous = NORMAL")
    cursor.close()


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return text[0] if text else type(orig).__name__


def refuses_data(exc: BaseException) -> bool:
    """Whether the store refused what was written rather than the writer: SQLSTATE classes 22 (data
    exception) and 23 (integrity), 54000 (a value too large to index), and a Python integer too
    large for the driver. SQLAlchemy wraps the driver's errors; COPY raises psycopg's own."""
    orig = getattr(exc, "orig", None) if isinstance(exc, DBAPIError) else exc
    return isinstance(exc, (DataError, IntegrityError, OverflowError)) or isinstance(
        orig, (psycopg.DataError, psycopg.IntegrityError, psycopg.errors.ProgramLimitExceeded))


@contextmanager
def errors_explained(url: str | URL | Engine) -> Iterator[None]:
    """Re-raise database errors as ``StoreError`` naming the store and what to do (``Unstorable``
    when it is the data the store refuses)."""
    where = display(url)
    try:
        yield
    except StoreError:
        raise
    except (DBAPIError, psycopg.Error, OverflowError) as exc:
        text = _first_line(exc)
        if refuses_data(exc):
            raise Unstorable(f"the store at {where} refused the data: {text}") from None
        if "no such table" in text or ("relation" in text and "does not exist" in text):
            raise StoreError(f"{where} holds no muster history tables ({text}); run `muster db upgrade`") from None
        raise StoreError(f"cannot use the store at {where}: {text}") from None


def table_names(engine: Engine) -> set[str]:
    with errors_explained(engine):
        return set(inspect(engine).get_table_names())
