"""The store's schema through Alembic: ``muster db upgrade|downgrade`` and creating a fresh store.

The migrations live in ``migrations/`` at the top of the source tree (``alembic upgrade head`` with
``MUSTER_STORE`` set does the same from the command line). Both PostgreSQL and SQLite get their
tables from the same migrations, never from ``metadata.create_all``, so every store carries an
``alembic_version`` and can be upgraded later.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from shared.history.engine import StoreError, display, errors_explained, opened, parse_url, table_names
from shared.history.models import TABLE_NAMES

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(url: str | Engine) -> Config:
    if not (MIGRATIONS / "env.py").is_file():
        raise StoreError(f"the Alembic migrations are not at {MIGRATIONS}: install muster from its source tree "
                         "(pip install -e .)")
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["url"] = url if isinstance(url, str) else url.url.render_as_string(hide_password=False)
    return cfg


def head() -> str:
    head_rev = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head_rev is not None
    return head_rev


def current(url: str | Engine) -> str | None:
    """The revision the store is at (None: no muster schema)."""
    with errors_explained(url), opened(url) as engine, engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def parse(url: str | Engine) -> None:
    if isinstance(url, str):
        parse_url(url)


def upgrade(url: str | Engine, revision: str = "head") -> None:
    parse(url)  # a bad URL is a StoreError before Alembic sees it
    with errors_explained(url):
        command.upgrade(alembic_config(url), revision)


def downgrade(url: str | Engine, revision: str = "base") -> None:
    parse(url)
    with errors_explained(url):
        command.downgrade(alembic_config(url), revision)


def ensure(url: str | Engine) -> None:
    """Create the tables in an empty store; refuse a store whose schema is not the current one."""
    with opened(url) as engine:
        tables = table_names(engine)
        if not tables & (TABLE_NAMES | {"alembic_version"}):
            upgrade(engine)
            return
        at, want = current(engine), head()
    if at != want:
        raise StoreError(f"the store at {display(url)} is at schema revision {at or 'none'}, this muster "
                         f"writes {want}: run `muster db upgrade --store URL`")
