"""hourly rollups keep the events' source (job, warm, rewarm): a hit rate is the jobs'

Revision ID: 0005
Revises: 0004
Create Date: 2027-01-10

``event_rollups`` gets ``source`` in its key. The table is rebuilt (a new key on SQLite is a
new table anyway), and the rollups of every hour whose raw events are all still kept are
computed again from those events, so the hit rate of the past is the jobs' too, not only from
now on. Which hours those are is exact: an hour's rollups count every event stored in it (the
ingest writes both in one transaction, and only a sweep of old events deletes any), so an hour
whose events count as many as its rollups still holds all of them. Older hours, whose events
were swept, keep their counts under "job": their source is no longer known.

The source is the event's ``job`` as the commands send it; the mapping is written out here, as
of this revision (neffcache.index.records.WARM_UP_JOBS may grow, a migration must not move).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_DIMENSIONS = ("hour", "kind", "team", "model", "instance_type", "toolchain")
_SOURCE = "CASE WHEN job IN ('warm', 'plan') THEN 'warm' WHEN job = 'rewarm' THEN 'rewarm' ELSE 'job' END"


def _create(name: str, *, with_source: bool) -> None:
    columns: list[sa.Column[object]] = [sa.Column("hour", sa.BigInteger(), primary_key=True),
               sa.Column("kind", sa.String(16), primary_key=True)]
    if with_source:
        columns.append(sa.Column("source", sa.String(16), primary_key=True))
    columns += [sa.Column("team", sa.String(256), primary_key=True),
                sa.Column("model", sa.String(256), primary_key=True),
                sa.Column("instance_type", sa.String(64), primary_key=True),
                sa.Column("toolchain", sa.String(200), primary_key=True),
                sa.Column("count", sa.BigInteger(), nullable=False),
                sa.Column("seconds", sa.Double(), nullable=False)]
    op.create_table(name, *columns)


def _replace(new: str) -> None:
    op.drop_table("event_rollups")
    op.rename_table(new, "event_rollups")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE event_rollups RENAME CONSTRAINT {new}_pkey TO event_rollups_pkey")


def _hour(bind: sa.Connection) -> str:
    # The hour of an event as the ingest computes it (int(ts // 3600) * 3600; ts is positive).
    if bind.dialect.name == "postgresql":
        return "CAST(floor(ts / 3600) AS BIGINT) * 3600"
    return "CAST(ts / 3600 AS INTEGER) * 3600"


def upgrade() -> None:
    bind = op.get_bind()
    hour = _hour(bind)
    rolled: dict[int, int] = {int(h): int(n) for h, n in bind.execute(
        sa.text("SELECT hour, SUM(count) FROM event_rollups GROUP BY hour"))}
    stored = bind.execute(sa.text(f"SELECT {hour} AS h, COUNT(*) FROM events GROUP BY h")).all()  # noqa: S608
    whole = sorted(int(h) for h, n in stored if rolled.get(int(h)) == int(n))
    op.create_table("rollup_hours_0005", sa.Column("hour", sa.BigInteger(), primary_key=True))
    if whole:
        bind.execute(sa.text("INSERT INTO rollup_hours_0005 (hour) VALUES (:hour)"), [{"hour": h} for h in whole])
    _create("event_rollups_0005", with_source=True)
    names = ", ".join(_DIMENSIONS[2:])
    # The SQL below is built from this file's own constants only (S608 is about values from outside).
    op.execute(f"INSERT INTO event_rollups_0005 (hour, kind, source, {names}, count, seconds) "  # noqa: S608
               f"SELECT hour, kind, 'job', {names}, count, seconds FROM event_rollups "
               "WHERE hour NOT IN (SELECT hour FROM rollup_hours_0005)")
    op.execute(f"INSERT INTO event_rollups_0005 (hour, kind, source, {names}, count, seconds) "  # noqa: S608
               f"SELECT {hour}, kind, {_SOURCE}, {names}, COUNT(*), SUM(COALESCE(compile_seconds, 0.0)) "
               f"FROM events WHERE {hour} IN (SELECT hour FROM rollup_hours_0005) "
               f"GROUP BY {hour}, kind, {_SOURCE}, {names}")
    op.drop_table("rollup_hours_0005")
    _replace("event_rollups_0005")


def downgrade() -> None:
    _create("event_rollups_0004", with_source=False)
    names = ", ".join(_DIMENSIONS)
    op.execute(f"INSERT INTO event_rollups_0004 ({names}, count, seconds) "  # noqa: S608
               f"SELECT {names}, SUM(count), SUM(seconds) FROM event_rollups GROUP BY {names}")
    _replace("event_rollups_0004")
