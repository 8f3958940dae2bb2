"""log_header: what the history was made under (muster and schema version, the policy in force).

``muster replay --verify`` rebuilds the cores from the policy a log was made with; an exported log
names it in its header line and a store keeps it here. Written by hand; tests/integration/
test_migrations.py checks it against shared/history/models.py.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "log_header",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("muster_version", sa.Text(), nullable=False),
        sa.Column("schema_version", sa.Integer(), nullable=False),
        sa.Column("policy", JSON_DOC, nullable=True),
        sa.Column("origin", sa.String(32), nullable=False),
        sa.Column("scenario", sa.Text(), nullable=True),
        sa.Column("until", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_log_header"),
    )


def downgrade() -> None:
    op.drop_table("log_header")
