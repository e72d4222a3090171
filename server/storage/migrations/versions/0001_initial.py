"""initial schema: entries, locations, tags, events, hourly rollups, leases, tokens

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "entries",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("path", sa.String(1024), nullable=False),
        sa.Column("layout", sa.String(32), nullable=False),
        sa.Column("key", sa.String(256), nullable=False),
        sa.Column("namespace", sa.String(512), nullable=False),
        sa.Column("compiler_version", sa.String(128), nullable=True),
        sa.Column("target", sa.String(16), nullable=True),
        sa.Column("lnc", sa.Integer(), nullable=True),
        sa.Column("toolchain", sa.String(200), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("neff_sha256", sa.String(64), nullable=True),
        sa.Column("created", sa.Double(), nullable=False),
        sa.Column("registered", sa.Double(), nullable=False),
        sa.Column("updated", sa.Double(), nullable=False),
        sa.Column("producer", sa.String(256), nullable=False),
        sa.Column("compile_seconds", sa.Double(), nullable=True),
        sa.Column("hit_count", sa.BigInteger(), nullable=False),
        sa.Column("last_used", sa.Double(), nullable=True),
        sa.UniqueConstraint("path", name="uq_entries_path"),
    )
    op.create_index("ix_entries_key", "entries", ["key"])
    op.create_index("ix_entries_namespace", "entries", ["namespace"])
    op.create_index("ix_entries_toolchain", "entries", ["toolchain"])
    op.create_index("ix_entries_state", "entries", ["state"])

    op.create_table(
        "entry_locations",
        sa.Column("entry_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  sa.ForeignKey("entries.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("store", sa.String(1024), primary_key=True),
        sa.Column("added", sa.Double(), nullable=False),
    )
    op.create_table(
        "entry_tags",
        sa.Column("entry_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  sa.ForeignKey("entries.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(256), nullable=False),
    )
    op.create_index("ix_entry_tags_name_value", "entry_tags", ["name", "value"])

    op.create_table(
        "events",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("ts", sa.Double(), nullable=False),
        sa.Column("path", sa.String(1024), nullable=True),
        sa.Column("key", sa.String(256), nullable=True),
        sa.Column("namespace", sa.String(512), nullable=False),
        sa.Column("toolchain", sa.String(200), nullable=False),
        sa.Column("job", sa.String(256), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("team", sa.String(256), nullable=False),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("instance_type", sa.String(64), nullable=False),
        sa.Column("compile_seconds", sa.Double(), nullable=True),
        sa.Column("store", sa.String(1024), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("received", sa.Double(), nullable=False),
        sa.UniqueConstraint("event_id", name="uq_events_event_id"),
    )
    op.create_index("ix_events_ts", "events", ["ts"])
    op.create_index("ix_events_kind_ts", "events", ["kind", "ts"])

    op.create_table(
        "event_rollups",
        sa.Column("hour", sa.BigInteger(), primary_key=True),
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("team", sa.String(256), primary_key=True),
        sa.Column("model", sa.String(256), primary_key=True),
        sa.Column("instance_type", sa.String(64), primary_key=True),
        sa.Column("toolchain", sa.String(200), primary_key=True),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("seconds", sa.Double(), nullable=False),
    )

    op.create_table(
        "leases",
        sa.Column("name", sa.String(1024), primary_key=True),
        sa.Column("owner", sa.String(256), nullable=False),
        sa.Column("acquired", sa.Double(), nullable=False),
        sa.Column("expires", sa.Double(), nullable=False),
        sa.Column("renewals", sa.Integer(), nullable=False),
    )
    op.create_index("ix_leases_expires", "leases", ["expires"])

    op.create_table(
        "tokens",
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("scope", sa.String(8), nullable=False),
        sa.Column("secret_sha256", sa.String(64), nullable=False),
        sa.Column("created", sa.Double(), nullable=False),
        sa.Column("last_used", sa.Double(), nullable=True),
        sa.Column("revoked", sa.Double(), nullable=True),
        sa.UniqueConstraint("name", name="uq_tokens_name"),
    )


def downgrade() -> None:
    for table in ("tokens", "leases", "event_rollups", "events", "entry_tags", "entry_locations", "entries"):
        op.drop_table(table)
