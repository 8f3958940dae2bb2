"""Alembic environment: the URL comes from MUSTER_STORE, never from a file in the repo.

``muster db upgrade|downgrade`` (``shared.history.schema``) passes the URL of ``--store`` in
``config.attributes["url"]``; ``alembic upgrade head`` reads ``MUSTER_STORE``.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine, pool

from shared.history.models import Base

config = context.config
url = config.attributes.get("url") or os.environ.get("MUSTER_STORE") or config.get_main_option("sqlalchemy.url")
if not url:
    raise SystemExit("set MUSTER_STORE to the database URL, e.g. postgresql+psycopg://postgres@127.0.0.1/muster")
if url.startswith(("postgresql://", "postgres://")):
    url = "postgresql+psycopg://" + url.split("://", 1)[1]   # psycopg 3 is the driver muster installs
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = create_engine(url, poolclass=pool.NullPool)
    with connectable.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata,
                          render_as_batch=connection.dialect.name == "sqlite")
        with context.begin_transaction():
            context.run_migrations()
    connectable.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
