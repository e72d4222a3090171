"""The catalog's questions for ``plan`` and ``why-miss``: many entries at once, the entries
near a graph, and the compiles a forecast fits on. Read-only; each is a few SELECTs, never one
per key.

Many entries at once run on the driver's connections (server/storage/driver.py): a batch of a
thousand keys spent as long in SQLAlchemy's execution and row wrapping as in SQLite running
the SELECT (docs/index-server.md#performance).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Select, bindparam, select

from neffcache.server.services.catalog import row_json, rows_statement
from neffcache.server.storage.db import Database
from neffcache.server.storage.models import Entry, EntryTag, table_of

MAX_SIMILAR = 500
MAX_SAMPLES = 10_000

_entries = table_of(Entry)
_NEWEST_FIRST = (_entries.c.created.desc(), _entries.c.id.desc())
_BY_PATHS = rows_statement(_entries.c.path.in_(bindparam("paths", expanding=True)))


def lookup_many(db: Database, paths: Sequence[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The entries at ``paths`` (repeats answered once) and the paths the index has no entry
    for, both in the order asked. One SELECT per 2,000 paths, all in one snapshot of the
    catalog (:class:`~neffcache.server.storage.driver.DriverBatchRead`)."""
    unique = list(dict.fromkeys(paths))
    entries = map(row_json, db.driver_batch_read(_BY_PATHS, "paths").rows(unique))
    rows = {entry["path"]: entry for entry in entries}
    found = [rows[path] for path in unique if path in rows]
    missing = [path for path in unique if path not in rows]
    return found, missing


def similar(conn: Connection, *, hlo_sha256: str | None, model: str | None, limit: int) -> list[dict[str, Any]]:
    """Entries whose HLO digest is ``hlo_sha256`` or whose ``model`` tag is ``model``, newest
    first, at most ``limit``. Two indexed SELECTs (digest; tag name and value), merged here:
    an OR across the two would defeat both indexes."""
    tags = table_of(EntryTag)
    questions: list[Select[Any]] = []
    if hlo_sha256 is not None:
        questions.append(rows_statement(_entries.c.hlo_sha256 == hlo_sha256))
    if model is not None:
        tagged = select(tags.c.entry_id).where(tags.c.name == "model", tags.c.value == model)
        questions.append(rows_statement(_entries.c.id.in_(tagged)))
    picked: dict[int, Any] = {}
    for question in questions:
        for row in conn.execute(question.order_by(*_NEWEST_FIRST).limit(limit)):
            picked[row.id] = row
    newest = sorted(picked.values(), key=lambda row: (row.created, row.id), reverse=True)[:limit]
    return [row_json(row) for row in newest]


def compile_samples(conn: Connection, target: str, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` SUCCESS entries of ``target`` that know both their HLO size and
    their compile time: the points a compile-time forecast fits on."""
    c = _entries.c
    stmt = (select(c.hlo_size, c.compile_seconds, c.compiler_version, c.hlo_sha256)
            .where(c.target == target, c.state == "SUCCESS", c.hlo_size.is_not(None),
                   c.compile_seconds.is_not(None))
            .order_by(*_NEWEST_FIRST).limit(limit))
    return [{"hlo_size": row.hlo_size, "compile_seconds": row.compile_seconds,
             "compiler_version": row.compiler_version, "hlo_sha256": row.hlo_sha256}
            for row in conn.execute(stmt)]
