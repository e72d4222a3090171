"""entries keep the graph's inputs: HLO digest (indexed) and size, user flags

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02

Plain ``ALTER TABLE ... ADD/DROP COLUMN`` on both databases (SQLite has both since 3.35), never a
batch table copy: on SQLite a copy drops and recreates ``entries``, and with foreign keys on,
dropping it cascades to every location and tag.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("entries", sa.Column("hlo_sha256", sa.String(64), nullable=True))
    op.add_column("entries", sa.Column("hlo_size", sa.BigInteger(), nullable=True))
    op.add_column("entries", sa.Column("flags", sa.Text(), nullable=True))
    op.create_index("ix_entries_hlo_sha256", "entries", ["hlo_sha256"])


def downgrade() -> None:
    op.drop_index("ix_entries_hlo_sha256", table_name="entries")
    for column in ("flags", "hlo_size", "hlo_sha256"):
        op.drop_column("entries", column)
