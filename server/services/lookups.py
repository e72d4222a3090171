"""The catalog's questions for ``plan`` and ``why-miss``: many entries at once, the entries
near a graph, and the compiles a forecast fits on. Read-only; each is a few SELECTs, never one
per key.

Many entries at once run on the driver's connections (server/storage/driver.py): a batch of a
thousand keys spent as long in SQLAlchemy's execution and row wrapping as in SQLite running
the SELECT (docs/index-server.md#performance).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import Connection, Select, bindparam, select

from neffcache.server.services import rendering
from neffcache.server.services.catalog import row_json, rows_statement
from neffcache.server.storage.db import Database
from neffcache.server.storage.models import Entry, EntryTag, table_of

MAX_SIMILAR = 500
MAX_SAMPLES = 10_000

_entries = table_of(Entry)
_NEWEST_FIRST = (_entries.c.created.desc(), _entries.c.id.desc())
_BY_PATHS = rows_statement(_entries.c.path.in_(bindparam("paths", expanding=True)))
_FORMS_BY_PATHS = select(_entries.c.path, _entries.c.rendered, _entries.c.rendered_format, _entries.c.hit_count,
                         _entries.c.last_used).where(_entries.c.path.in_(bindparam("paths", expanding=True)))


@dataclass(frozen=True)
class Answer:
    """A batch lookup's answer: each entry found as its JSON object, and the paths not found,
    both in the order asked."""

    found: list[bytes]
    missing: list[str]

    def body(self) -> bytes:
        """The response: ``{"found": [...], "missing": [...]}``, as orjson writes the dict."""
        return b'{"found":[%b],"missing":%b}' % (b",".join(self.found), orjson.dumps(self.missing))


def lookup_many(db: Database, paths: Sequence[str]) -> Answer:
    """The entries at ``paths`` (repeats answered once) and the paths the index has no entry
    for. Each entry is its stored text with its usage stamps (services/rendering.py); the few
    whose text is missing or another server's rendering are read from their rows instead. One
    SELECT per 2,000 paths, all in one snapshot of the catalog
    (:meth:`~neffcache.server.storage.driver.DriverBatchRead.snapshot`)."""
    unique = list(dict.fromkeys(paths))
    forms = db.driver_batch_read(_FORMS_BY_PATHS, "paths")
    rows: dict[str, bytes] = {}
    with forms.snapshot() as cursor:
        unrendered = []
        for path, stored, form_of, hit_count, last_used in forms.run(cursor, unique):
            if stored is not None and form_of == rendering.FORMAT:
                rows[path] = rendering.with_stamps(bytes(stored), hit_count, last_used)
            else:
                unrendered.append(path)
        if unrendered:
            for row in db.driver_batch_read(_BY_PATHS, "paths").run(cursor, unrendered):
                entry = row_json(row)
                rows[entry["path"]] = orjson.dumps(entry)
    return Answer([rows[path] for path in unique if path in rows], [path for path in unique if path not in rows])


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
