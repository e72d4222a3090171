"""The entry catalog: register on publish, look up, list with filters, forget a location.

An entry is identified by its store-relative path; each store that holds it adds a location.
Registering again (another tier, a state change after verify) updates the record in place and
never resets neffcache's own usage stamps (hit count, last use).
"""

from __future__ import annotations

import json
import operator
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import ColumnElement, Connection, Select, bindparam, delete, exists, func, select, update
from sqlalchemy.orm import Session

from neffcache.server.services import rendering
from neffcache.server.services.identity import Forbidden, Refusal, Writer, refuse
from neffcache.server.services.records import EntryIn, EntryOut, EntryPage, ForgetResult, toolchain_label
from neffcache.server.storage.db import Database, string_list, upsert
from neffcache.server.storage.models import Entry, EntryLocation, EntryTag, table_of

_MUTABLE = ("layout", "key", "namespace", "compiler_version", "target", "lnc", "toolchain", "state",
            "size", "neff_sha256", "updated", "producer", "compile_seconds", "writer")
# The graph's inputs: a registration that does not know them (an older client, a store without
# manifests) keeps what an earlier one said, since the same path is the same graph.
_KEPT_WHEN_UNKNOWN = ("hlo_sha256", "hlo_size", "flags")
RENDER_BATCH = 1000  # entries rendered per SELECT (and per transaction, when rendering what is missing)


@dataclass(frozen=True)
class EntryFilter:
    key: str | None = None
    namespace: str | None = None
    toolchain: str | None = None
    compiler_version: str | None = None
    target: str | None = None
    lnc: int | None = None
    states: Sequence[str] = ()
    store: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    unused_since: float | None = None
    writer: str | None = None  # the token that registered the record (services/identity.py)

    def apply(self, stmt: Select[Entry]) -> Select[Entry]:
        for column, value in ((Entry.key, self.key), (Entry.namespace, self.namespace),
                              (Entry.toolchain, self.toolchain),
                              (Entry.compiler_version, self.compiler_version),
                              (Entry.target, self.target), (Entry.lnc, self.lnc), (Entry.writer, self.writer)):
            if value is not None:
                stmt = stmt.where(column == value)
        if self.states:
            stmt = stmt.where(Entry.state.in_(list(self.states)))
        if self.store is not None:
            stmt = stmt.where(exists().where(EntryLocation.entry_id == Entry.id,
                                             EntryLocation.store == self.store))
        for name, value in sorted(self.tags.items()):
            stmt = stmt.where(exists().where(EntryTag.entry_id == Entry.id, EntryTag.name == name,
                                             EntryTag.value == value))
        if self.unused_since is not None:
            # "Not used since T": never hit and registered before T, or last hit before T.
            stmt = stmt.where(func.coalesce(Entry.last_used, Entry.registered) < self.unused_since)
        return stmt


def register_entries(session: Session, records: Sequence[EntryIn], now: float, writer: Writer) -> int:
    """Register ``records`` as ``writer``'s: its records and locations, or (for an entry another
    token registered) only its location, when it claims the same bytes. Anything else it may not
    write refuses the whole batch (Forbidden, naming the items; services/identity.py)."""
    refuse("registration outside the token's prefixes", [
        refusal for i, r in enumerate(records) for refusal in writer.scope_refusals(i, r.path, r.namespace, r.store)])
    by_path = {record.path: record for record in records}  # last registration in a batch wins
    index_of = {record.path: i for i, record in enumerate(records)}
    # Sorted so concurrent batches lock entry rows in one order and cannot deadlock.
    ordered = [by_path[path] for path in sorted(by_path)]
    if not ordered:
        return 0
    conn = session.connection()
    ids = _joined(conn, ordered, writer, index_of, _owners(conn, sorted(by_path)))
    mine = [r for r in ordered if r.path not in ids]
    ids.update(_upsert(session, conn, mine, now, writer))
    # A row another token inserted between our look and our upsert (PostgreSQL): the upsert's
    # WHERE left it alone under its row lock; judged now like the rows we saw.
    late = [r for r in mine if r.path not in ids]
    if late:
        ids.update(_joined(conn, late, writer, index_of, _owners(conn, [r.path for r in late])))
        mine = [r for r in mine if r.path not in {x.path for x in late}]
    # Every (path, store) pair of the batch is a location, even when one entry came from two stores.
    pairs = sorted({(r.path, r.store) for r in records})
    conn.execute(upsert(session, table_of(EntryLocation)).on_conflict_do_nothing(),
                 [{"entry_id": ids[path], "store": store, "added": now, "writer": writer.name}
                  for path, store in pairs])
    tags = [{"entry_id": ids[r.path], "name": name, "value": value}
            for r in mine for name, value in sorted(r.tags.items())]
    if tags:
        table = table_of(EntryTag)
        tag_stmt = upsert(session, table)
        conn.execute(tag_stmt.on_conflict_do_update(index_elements=[table.c.entry_id, table.c.name],
                                                    set_={"value": tag_stmt.excluded.value}), tags)
    render_entries(conn, sorted(ids.values()))
    return len(ordered)


_Owner = tuple[int, str, str, int, str | None]  # id, writer, state, size, neff_sha256


def _owners(conn: Connection, paths: Sequence[str]) -> dict[str, _Owner]:
    """The existing rows of ``paths``, locked (FOR UPDATE on PostgreSQL; SQLite has one writer)."""
    entries = table_of(Entry)
    found: dict[str, _Owner] = {}
    for start in range(0, len(paths), RENDER_BATCH):
        stmt = (select(entries.c.path, entries.c.id, entries.c.writer, entries.c.state, entries.c.size,
                       entries.c.neff_sha256).where(entries.c.path.in_(paths[start:start + RENDER_BATCH]))
                .order_by(entries.c.path).with_for_update())
        found.update({path: (entry_id, owner, state, size, digest)
                      for path, entry_id, owner, state, size, digest in conn.execute(stmt)})
    return found


def _joined(conn: Connection, records: Sequence[EntryIn], writer: Writer, index_of: dict[str, int],
            owners: dict[str, _Owner]) -> dict[str, int]:
    """The ids of the records registered by another token that ``writer`` may only add a location
    to: they claim the same bytes. A claim of other bytes refuses the batch."""
    joined: dict[str, int] = {}
    refusals = []
    for record in records:
        found = owners.get(record.path)
        if found is None or writer.owns(found[1]):
            continue
        entry_id, owner, state, size, digest = found
        if (state, size, digest) == (record.state, record.size, record.neff_sha256):
            joined[record.path] = entry_id
            continue
        refusals.append(Refusal(index_of[record.path], "neff_sha256",
                                f"entry {record.path!r} is registered by token {owner!r} as other bytes "
                                f"({state}, {size} bytes, sha256 {digest}); only it or an admin may change it"))
    refuse("registration of another token's entry", refusals)
    return joined


def _upsert(session: Session, conn: Connection, records: Sequence[EntryIn], now: float,
            writer: Writer) -> dict[str, int]:
    """Insert or update the records ``writer`` may write; the ids of the rows it wrote."""
    if not records:
        return {}
    # executemany (batched by SQLAlchemy into multi-row statements, compiled once).
    entries = table_of(Entry)
    stmt = upsert(session, entries)
    changes = {name: stmt.excluded[name] for name in _MUTABLE}
    changes.update({name: func.coalesce(stmt.excluded[name], entries.c[name]) for name in _KEPT_WHEN_UNKNOWN})
    guard = None if writer.admin else (entries.c.writer == "") | (entries.c.writer == writer.name)
    if writer.admin:  # an admin repairs a record on its owner's behalf: it stays the owner's
        changes["writer"] = func.coalesce(func.nullif(entries.c.writer, ""), stmt.excluded.writer)
    stmt = stmt.on_conflict_do_update(index_elements=[entries.c.path], set_=changes, where=guard).returning(
        entries.c.id, entries.c.path)
    rows = [{**_entry_row(r, now), "writer": writer.name} for r in records]
    return {path: entry_id for entry_id, path in conn.execute(stmt, rows)}


def render_entries(conn: Connection, ids: Sequence[int]) -> None:
    """Store the API form of the entries ``ids`` (services/rendering.py), read in this
    transaction after its own changes. The caller holds their rows (the upsert's or a FOR
    UPDATE's locks on PostgreSQL; SQLite has one writer), so no other writer's change can land
    between this read and the UPDATE: a change after it clears the text again (migration 0004)."""
    for start in range(0, len(ids), RENDER_BATCH):
        part = ids[start:start + RENDER_BATCH]
        forms = [{"entry": row[_ID], "form": rendering.form(row_json(row))}
                 for row in conn.execute(_BY_IDS, {"ids": part})]
        if forms:
            conn.execute(_STORE_FORM, forms)


def render_unrendered(db: Database, *, batch: int = RENDER_BATCH,
                      progress: Callable[[int], None] | None = None) -> int:
    """Render every entry whose text is missing (all of them after migration 0004; those an
    older server changed since), a batch per transaction, in id order so the pass ends even
    while an older writer keeps clearing rows behind it (the next pass takes those). The count
    rendered."""
    entries, done, after = table_of(Entry), 0, 0
    pick = (select(entries.c.id).where(entries.c.rendered.is_(None), entries.c.id > bindparam("after"))
            .order_by(entries.c.id).limit(batch).with_for_update(skip_locked=True))
    while True:
        with db.write() as session:
            conn = session.connection()
            ids = list(conn.scalars(pick, {"after": after}))
            render_entries(conn, ids)
        if not ids:
            return done
        done, after = done + len(ids), ids[-1]
        if progress is not None:
            progress(done)


def _entry_row(record: EntryIn, now: float) -> dict[str, object]:
    tc = record.toolchain
    return {
        "path": record.path, "layout": record.layout, "key": record.key, "namespace": record.namespace,
        "compiler_version": tc.compiler_version if tc else None, "target": tc.target if tc else None,
        "lnc": tc.lnc if tc else None, "toolchain": toolchain_label(tc), "state": record.state,
        "size": record.size, "neff_sha256": record.neff_sha256, "created": record.created,
        "registered": now, "updated": now, "producer": record.producer,
        "compile_seconds": record.compile_seconds, "hit_count": 0, "last_used": None,
        "hlo_sha256": record.hlo_sha256, "hlo_size": record.hlo_size,
        "flags": json.dumps(record.flags) if record.flags is not None else None,
    }


def rows_statement(where: ColumnElement[bool]) -> Select[Any]:
    """Entries matching ``where`` with their stores and tags aggregated in subqueries: one SELECT
    answers a lookup, a batch of them, or any other question that returns whole entries."""
    entries, locations, tags = table_of(Entry), table_of(EntryLocation), table_of(EntryTag)
    stores = select(string_list(locations.c.store)).where(locations.c.entry_id == entries.c.id)
    pairs = select(string_list(tags.c.name + "=" + tags.c.value)).where(tags.c.entry_id == entries.c.id)
    columns = [column for column in entries.c if column.key not in _RENDERING]
    return select(*columns, stores.scalar_subquery().label("stores_"), pairs.scalar_subquery().label("tags_")
                  ).where(where)


_RENDERING = ("rendered", "rendered_format")  # kept from the rest: services/rendering.py


# Built once: constructing the statement costs more than SQLite takes to run it. The hot path
# runs the same statement on the driver's connection (storage/driver.py, api/hot.py).
LOOKUP = rows_statement(table_of(Entry).c.path == bindparam("path"))
_BY_IDS = rows_statement(table_of(Entry).c.id.in_(bindparam("ids", expanding=True)))
_STORE_FORM = (update(table_of(Entry)).where(table_of(Entry).c.id == bindparam("entry"))
               .values(rendered=bindparam("form"), rendered_format=rendering.FORMAT))


def lookup_entry(conn: Connection, path: str) -> dict[str, Any] | None:
    """One entry as the API returns it, in a single SELECT (stores and tags aggregated in
    subqueries): this is the hot path every cache lookup of every host goes through."""
    row = conn.execute(LOOKUP, {"path": path}).first()
    return row_json(row) if row is not None else None


_ROW_NAMES: tuple[str, ...] = tuple(str(column.key) for column in LOOKUP.selected_columns)
_ID = _ROW_NAMES.index("id")


_FIELDS = ("path", "layout", "key", "namespace", "compiler_version", "target", "lnc", "toolchain", "state", "size",
           "neff_sha256", "created", "registered", "updated", "producer", "compile_seconds", "hit_count",
           "last_used", "hlo_sha256", "hlo_size", "flags", "stores_", "tags_")
# One C call picks every value a row's API form needs, in that order: a batch lookup renders a
# thousand rows, and reading them by name (a Row's attributes, or a namespace built per row)
# had been a fifth of its server time (docs/index-server.md#performance).
_PICK = operator.itemgetter(*(_ROW_NAMES.index(name) for name in _FIELDS))


def row_json(row: Sequence[Any]) -> dict[str, Any]:
    """The API form of a row of :func:`rows_statement` (a Row or a driver's tuple): the same
    dict :func:`entry_json` makes, key for key and in the same order, the usage stamps last
    (what services/rendering.py leaves out of the stored text)."""
    if len(row) != len(_ROW_NAMES):
        raise ValueError(f"a row of {len(row)} columns, not {len(_ROW_NAMES)}")
    (path, layout, key, namespace, compiler_version, target, lnc, label, state, size, neff_sha256, created,
     registered, updated, producer, compile_seconds, hit_count, last_used, hlo_sha256, hlo_size, flags,
     stores_text, tags_text) = _PICK(row)
    return {
        "path": path, "layout": layout, "key": key, "namespace": namespace,
        "toolchain": ({"compiler_version": compiler_version, "target": target, "lnc": lnc}
                      if compiler_version is not None else None),
        "toolchain_label": label, "state": state, "size": size, "neff_sha256": neff_sha256,
        "stores": sorted(stores_text.split("\n")) if stores_text else [],
        "tags": dict(sorted(item.split("=", 1) for item in tags_text.split("\n"))) if tags_text else {},
        "created": created, "registered": registered, "updated": updated, "producer": producer,
        "compile_seconds": compile_seconds, "hlo_sha256": hlo_sha256, "hlo_size": hlo_size,
        "flags": _flags(flags), "hit_count": hit_count, "last_used": last_used,
    }


def entry_json(row: Any, stores: list[str], tags: dict[str, str]) -> dict[str, Any]:
    """The API form of an entry row (an ORM ``Entry`` or a Core row with the same columns)."""
    return {
        "path": row.path, "layout": row.layout, "key": row.key, "namespace": row.namespace,
        "toolchain": ({"compiler_version": row.compiler_version, "target": row.target, "lnc": row.lnc}
                      if row.compiler_version is not None else None),
        "toolchain_label": row.toolchain, "state": row.state, "size": row.size, "neff_sha256": row.neff_sha256,
        "stores": sorted(stores), "tags": dict(sorted(tags.items())), "created": row.created,
        "registered": row.registered, "updated": row.updated, "producer": row.producer,
        "compile_seconds": row.compile_seconds, "hlo_sha256": row.hlo_sha256, "hlo_size": row.hlo_size,
        "flags": _flags(row.flags), "hit_count": row.hit_count, "last_used": row.last_used,
    }


def _flags(stored: str | None) -> list[str] | None:
    """The stored JSON text of an entry's flags, parsed: by orjson (a third of json's time, on
    every row a lookup renders), or by json where orjson refuses. Every path into the column
    was validated (no lone surrogates: those are a 422 at the door, tests/server/test_bad_input.py),
    but a row written another way must still render."""
    if stored is None:
        return None
    try:
        flags: list[str] = orjson.loads(stored)
    except orjson.JSONDecodeError:
        flags = json.loads(stored)
    return flags


def list_entries(session: Session, where: EntryFilter, *, limit: int, cursor: int | None) -> EntryPage:
    stmt = where.apply(select(Entry))
    if cursor is not None:
        stmt = stmt.where(Entry.id > cursor)
    # Keyset pagination on the primary key: stable while entries are added, O(page) per request.
    rows = list(session.scalars(stmt.order_by(Entry.id).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return EntryPage(entries=_render(session, rows), next_cursor=rows[-1].id if more else None)


def forget_entry(session: Session, path: str, store: str | None, writer: Writer) -> ForgetResult | None:
    """Remove one store's location (or all); the entry goes when no store holds it any more.
    Forbidden when a location to remove is another token's (services/identity.py)."""
    entry_id = session.scalar(select(Entry.id).where(Entry.path == path).with_for_update())
    if entry_id is None:
        return None
    stmt = delete(EntryLocation).where(EntryLocation.entry_id == entry_id)
    if store is not None:
        stmt = stmt.where(EntryLocation.store == store)
    foreign = foreign_locations(session, [(path, store)], writer)
    if foreign:
        (_, held), owner = next(iter(foreign.items()))
        raise Forbidden(f"store {held!r} of entry {path!r} was added by token {owner!r}; "
                        "only it or an admin may forget it")
    removed = session.execute(stmt).rowcount  # type: ignore[attr-defined]
    left = session.scalar(select(func.count()).where(EntryLocation.entry_id == entry_id))
    gone = not left
    if gone:
        session.execute(delete(EntryTag).where(EntryTag.entry_id == entry_id))
        session.execute(delete(Entry).where(Entry.id == entry_id))
    elif removed:
        render_entries(session.connection(), [entry_id])
    return ForgetResult(path=path, removed_stores=int(removed or 0), entry_removed=gone)


def _render(session: Session, rows: Sequence[Entry]) -> list[EntryOut]:
    ids = [row.id for row in rows]
    stores: dict[int, list[str]] = defaultdict(list)
    tags: dict[int, dict[str, str]] = defaultdict(dict)
    if ids:
        for entry_id, store in session.execute(
            select(EntryLocation.entry_id, EntryLocation.store)
            .where(EntryLocation.entry_id.in_(ids))
        ):
            stores[entry_id].append(store)
        for entry_id, name, value in session.execute(
            select(EntryTag.entry_id, EntryTag.name, EntryTag.value).where(EntryTag.entry_id.in_(ids))
        ):
            tags[entry_id][name] = value
    return [EntryOut.model_validate(entry_json(row, stores[row.id], tags[row.id])) for row in rows]


def foreign_locations(session: Session, pairs: Sequence[tuple[str, str | None]],
                      writer: Writer) -> dict[tuple[str, str], str]:
    """Of the locations ``pairs`` name ((path, store); store None: all of the entry's), those
    ``writer`` may not remove, with the token that added each. One SELECT per thousand paths
    (prune reports its evictions in batches of thousands), only of locations not the writer's."""
    if writer.admin or not pairs:
        return {}
    wanted: dict[str, set[str | None]] = defaultdict(set)
    for path, store in pairs:
        wanted[path].add(store)
    paths = sorted(wanted)
    found: dict[tuple[str, str], str] = {}
    for start in range(0, len(paths), RENDER_BATCH):
        stmt = (select(Entry.path, EntryLocation.store, EntryLocation.writer)
                .join(Entry, Entry.id == EntryLocation.entry_id)
                .where(Entry.path.in_(paths[start:start + RENDER_BATCH]),
                       EntryLocation.writer.not_in(["", writer.name])))
        found.update({(path, store): owner for path, store, owner in session.execute(stmt)
                      if None in wanted[path] or store in wanted[path]})
    return found
