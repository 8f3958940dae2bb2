"""Alembic environment: the URL comes from MUSTER_STORE, never from a file in the repo."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import engine_from_config, pool

config = context.config
url = os.environ.get("MUSTER_STORE") or config.get_main_option("sqlalchemy.url")
if not url:
    raise SystemExit("set MUSTER_STORE to the database URL, e.g. postgresql+psycopg://postgres@127.0.0.1/muster")
config.set_main_option("sqlalchemy.url", url)
target_metadata = None  # the projection models register here once they exist


def run_migrations_offline() -> None:
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = engine_from_config(config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.",
                                     poolclass=pool.NullPool)
    with connectable.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
