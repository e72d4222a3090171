"""Event ingestion: store a batch once, roll it up by hour, stamp entry usage.

Idempotence is the database's job, not the client's: the insert skips event ids that exist
(``ON CONFLICT DO NOTHING ... RETURNING``) and only the rows it really inserted feed the rollups
and the hit counters, so a spool resending a batch (or two replicas receiving the same batch)
counts each event exactly once.

Lock order inside the transaction is events (sorted by id) -> rollups (sorted) -> entries
(sorted by path). Every writer takes rows in that one order, so concurrent batches wait for each
other instead of deadlocking.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Double, bindparam, case, delete, func, select, update
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import BindParameter

from neffcache.server.services.records import EventIn, toolchain_label
from neffcache.server.storage.db import chunks, upsert
from neffcache.server.storage.models import Entry, EntryLocation, EntryTag, Event, EventRollup, table_of


@dataclass(frozen=True)
class IngestOutcome:
    accepted: int
    duplicates: int
    expired: int = 0


def hour_of(ts: float) -> int:
    return int(ts // 3600) * 3600


def ingest_events(session: Session, events: Sequence[EventIn], now: float,
                  keep_after: float | None = None) -> IngestOutcome:
    """Store new events; ``keep_after`` is the retention horizon (older events are refused)."""
    expired = [e for e in events if keep_after is not None and e.ts < keep_after]
    if expired:
        events = [e for e in events if keep_after is None or e.ts >= keep_after]
    unique = {event.id: event for event in events}
    ordered = [unique[event_id] for event_id in sorted(unique)]
    saved = _recorded_compile_seconds(session, ordered)
    rows = [_event_row(event, now, saved) for event in ordered]
    inserted: set[str] = set()
    if rows:
        # executemany: SQLAlchemy batches it into multi-row INSERTs ("insertmanyvalues") with one
        # compiled statement, instead of compiling a fresh VALUES list for every batch.
        table = table_of(Event)
        stmt = upsert(session, table).on_conflict_do_nothing(index_elements=[table.c.event_id])
        inserted.update(session.connection().execute(stmt.returning(table.c.event_id), rows).scalars())
    fresh = [row for row in rows if row["event_id"] in inserted]
    _roll_up(session, fresh)
    _stamp_entries(session, fresh)
    _apply_evictions(session, fresh)
    return IngestOutcome(accepted=len(fresh), duplicates=len(events) - len(fresh), expired=len(expired))


def sweep_events(session: Session, before: float, limit: int = 5000) -> int:
    """Delete up to ``limit`` raw events older than ``before`` (bounded, so a sweep never holds
    the write lock for long; it runs again with later batches)."""
    oldest = select(Event.id).where(Event.ts < before).order_by(Event.ts).limit(limit)
    result = session.execute(delete(Event).where(Event.id.in_(oldest.scalar_subquery())))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def _recorded_compile_seconds(session: Session, events: Sequence[EventIn]) -> dict[str, float]:
    """For hits that do not say what they saved: the compile time recorded with the entry."""
    paths = sorted({e.path for e in events if e.kind == "hit" and e.compile_seconds is None and e.path})
    found: dict[str, float] = {}
    for chunk in chunks(paths, 1):
        for path, seconds in session.execute(
            select(Entry.path, Entry.compile_seconds)
            .where(Entry.path.in_(chunk), Entry.compile_seconds.is_not(None))
        ):
            found[path] = float(seconds or 0.0)
    return found


def _event_row(event: EventIn, now: float, saved: dict[str, float]) -> dict[str, object]:
    seconds = event.compile_seconds
    if seconds is None and event.kind == "hit" and event.path:
        seconds = saved.get(event.path)
    return {
        "event_id": event.id, "kind": event.kind, "ts": event.ts, "path": event.path, "key": event.key,
        "namespace": event.namespace, "toolchain": toolchain_label(event.toolchain), "job": event.job,
        "model": event.model, "team": event.team, "host": event.host,
        "instance_type": event.instance_type, "compile_seconds": seconds, "store": event.store,
        "message": event.message, "received": now,
    }


def _roll_up(session: Session, rows: list[dict[str, object]]) -> None:
    sums: dict[tuple[int, str, str, str, str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for row in rows:
        dims = (hour_of(float(row["ts"])), str(row["kind"]), str(row["team"]), str(row["model"]),  # type: ignore[arg-type]
                str(row["instance_type"]), str(row["toolchain"]))
        acc = sums[dims]
        acc[0] += 1
        acc[1] += float(row["compile_seconds"] or 0.0)  # type: ignore[arg-type]
    values = [
        {"hour": d[0], "kind": d[1], "team": d[2], "model": d[3], "instance_type": d[4], "toolchain": d[5],
         "count": int(acc[0]), "seconds": acc[1]}
        for d, acc in sorted(sums.items())
    ]
    if not values:
        return
    table = table_of(EventRollup)
    stmt = upsert(session, table)
    # count = count + new count: atomic under the row lock ON CONFLICT takes, on both databases.
    session.connection().execute(stmt.on_conflict_do_update(
        index_elements=[table.c.hour, table.c.kind, table.c.team, table.c.model, table.c.instance_type,
                        table.c.toolchain],
        set_={"count": table.c.count + stmt.excluded.count, "seconds": table.c.seconds + stmt.excluded.seconds},
    ), values)


def _stamp_entries(session: Session, rows: list[dict[str, object]]) -> None:
    hits: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        if row["kind"] == "hit" and row["path"]:
            hits[str(row["path"])].append(float(row["ts"]))  # type: ignore[arg-type]
    if not hits:
        return
    table = table_of(Entry)
    latest: BindParameter[float] = bindparam("latest", type_=Double())
    stmt = update(table).where(table.c.path == bindparam("p")).values(
        hit_count=table.c.hit_count + bindparam("n"),
        # Events arrive out of order (spools drain late): keep the newest use.
        last_used=case((func.coalesce(table.c.last_used, 0.0) < latest, latest), else_=table.c.last_used),
    )
    session.connection().execute(stmt, [{"p": path, "n": len(hits[path]), "latest": max(hits[path])}
                                        for path in sorted(hits)])


def _apply_evictions(session: Session, rows: list[dict[str, object]]) -> None:
    """An evict event with a store removes that location; the last location takes the entry."""
    pairs = sorted({(str(r["path"]), str(r["store"])) for r in rows if r["kind"] == "evict" and r["path"]
                    and r["store"]})
    for path, store in pairs:
        entry_id = session.scalar(select(Entry.id).where(Entry.path == path))
        if entry_id is None:
            continue
        session.execute(delete(EntryLocation).where(EntryLocation.entry_id == entry_id,
                                                    EntryLocation.store == store))
        if not session.scalar(select(func.count()).where(EntryLocation.entry_id == entry_id)):
            session.execute(delete(EntryTag).where(EntryTag.entry_id == entry_id))
            session.execute(delete(Entry).where(Entry.id == entry_id))
