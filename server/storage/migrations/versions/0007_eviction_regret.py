"""budget evictions are remembered by path, and the misses that regret them rolled up by hour

Revision ID: 0007
Revises: 0006
Create Date: 2027-02-01

Two new tables (server/services/regret.py fills them at ingest): ``evictions``, the newest
budget eviction of each path with its policy and compile seconds, and ``regret_rollups``, per
hour and policy the budget evictions, the regretted ones and the compile seconds they cost.
Nothing existing changes; the events of before are not replayed (an eviction whose miss already
arrived is history the stats of the window never showed), so both start empty.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("evictions",
                    sa.Column("path", sa.String(1024), primary_key=True),
                    sa.Column("store", sa.String(1024), nullable=True),
                    sa.Column("policy", sa.String(16), nullable=False),
                    sa.Column("compile_seconds", sa.Double(), nullable=False),
                    sa.Column("evicted_at", sa.Double(), nullable=False),
                    sa.Column("recreated", sa.Double(), nullable=True),
                    sa.Column("regretted", sa.Double(), nullable=True))
    op.create_index("ix_evictions_evicted_at", "evictions", ["evicted_at"])
    op.create_table("regret_rollups",
                    sa.Column("hour", sa.BigInteger(), primary_key=True),
                    sa.Column("policy", sa.String(16), primary_key=True),
                    sa.Column("evictions", sa.BigInteger(), nullable=False),
                    sa.Column("regretted", sa.BigInteger(), nullable=False),
                    sa.Column("seconds", sa.Double(), nullable=False))


def downgrade() -> None:
    op.drop_table("regret_rollups")
    op.drop_index("ix_evictions_evicted_at", table_name="evictions")
    op.drop_table("evictions")
