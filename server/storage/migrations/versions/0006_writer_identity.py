"""rows keep the token that wrote them; tokens get a team and write prefixes

Revision ID: 0006
Revises: 0005
Create Date: 2027-01-20

``writer`` (the token's name) on entries, entry_locations, events and leases, and in the key of
event_rollups, so stats can group by producer; ``team`` and ``prefixes`` on tokens
(server/services/identity.py holds the rules they feed). Every existing row gets writer "": it
was written before identities existed, and belongs to nobody until a writer claims it.

The columns are plain ``ALTER TABLE ... ADD/DROP COLUMN`` (no table copy: on SQLite copying
``entries`` would cascade to its locations and tags, see 0002). event_rollups gets a new key,
which is a new table on SQLite anyway: it is rebuilt as 0005 rebuilt it, its rows kept under
writer "".
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_WRITTEN = ("entries", "entry_locations", "events", "leases")
_DIMENSIONS = ("hour", "kind", "source", "team", "model", "instance_type", "toolchain")


def _rollups(name: str, *, with_writer: bool) -> None:
    columns: list[sa.Column[object]] = [
        sa.Column("hour", sa.BigInteger(), primary_key=True), sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("source", sa.String(16), primary_key=True), sa.Column("team", sa.String(256), primary_key=True),
        sa.Column("model", sa.String(256), primary_key=True),
        sa.Column("instance_type", sa.String(64), primary_key=True),
        sa.Column("toolchain", sa.String(200), primary_key=True)]
    if with_writer:
        columns.append(sa.Column("writer", sa.String(64), primary_key=True, server_default=""))
    columns += [sa.Column("count", sa.BigInteger(), nullable=False), sa.Column("seconds", sa.Double(), nullable=False)]
    op.create_table(name, *columns)


def _replace(new: str) -> None:
    op.drop_table("event_rollups")
    op.rename_table(new, "event_rollups")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE event_rollups RENAME CONSTRAINT {new}_pkey TO event_rollups_pkey")


def upgrade() -> None:
    for table in _WRITTEN:
        op.add_column(table, sa.Column("writer", sa.String(64), nullable=False, server_default=""))
    op.add_column("tokens", sa.Column("team", sa.String(256), nullable=False, server_default=""))
    op.add_column("tokens", sa.Column("prefixes", sa.Text(), nullable=False, server_default="[]"))
    _rollups("event_rollups_0006", with_writer=True)
    names = ", ".join(_DIMENSIONS)
    # Built from this file's constants only (S608 is about values from outside).
    op.execute(f"INSERT INTO event_rollups_0006 ({names}, writer, count, seconds) "  # noqa: S608
               f"SELECT {names}, '', count, seconds FROM event_rollups")
    _replace("event_rollups_0006")


def downgrade() -> None:
    _rollups("event_rollups_0005", with_writer=False)
    names = ", ".join(_DIMENSIONS)
    op.execute(f"INSERT INTO event_rollups_0005 ({names}, count, seconds) "  # noqa: S608
               f"SELECT {names}, SUM(count), SUM(seconds) FROM event_rollups GROUP BY {names}")
    _replace("event_rollups_0005")
    op.drop_column("tokens", "prefixes")
    op.drop_column("tokens", "team")
    for table in reversed(_WRITTEN):
        op.drop_column(table, "writer")
