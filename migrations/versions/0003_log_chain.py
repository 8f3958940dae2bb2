"""The event log's hash chain and its signed records (issue 33).

``event_log`` gains each envelope's place in its partition's chain and its link; ``log_signed`` holds
what the signer signed: keys, the header, checkpoints (``shared.history.integrity``). Rows written
before this migration have no link: a store exported with them is unchained. Written by hand;
tests/integration/test_migrations.py checks it against shared/history/models.py.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("event_log") as batch:
        batch.add_column(sa.Column("chain_offset", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("chain", sa.String(64), nullable=True))
    op.create_table(
        "log_signed",
        sa.Column("seq", SEQ, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=True),
        sa.Column("offset", sa.BigInteger(), nullable=True),
        sa.Column("record", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_log_signed"),
    )


def downgrade() -> None:
    op.drop_table("log_signed")
    with op.batch_alter_table("event_log") as batch:
        batch.drop_column("chain")
        batch.drop_column("chain_offset")
