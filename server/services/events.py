"""Event ingestion: store a batch once, roll it up by hour, stamp entry usage.

Idempotence is the database's job, not the client's: the insert skips event ids that exist
(``ON CONFLICT DO NOTHING ... RETURNING``) and only the rows it really inserted feed the rollups
and the hit counters, so a spool resending a batch (or two replicas receiving the same batch)
counts each event exactly once.

Lock order inside the transaction is events (sorted by id) -> rollups (sorted) -> entries
(sorted by path) -> evictions and their rollups (services/regret.py, each sorted). Every writer
takes rows in that one order, so concurrent batches wait for each other instead of deadlocking.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import Double, delete, select
from sqlalchemy.orm import Session

from neffcache.events import EventKind
from neffcache.index.records import event_source
from neffcache.server.services import catalog, regret, tokens
from neffcache.server.services.identity import Refusal, Writer, refuse
from neffcache.server.services.records import EventIn, toolchain_label
from neffcache.server.storage.driver_sql import DriverSQL, marks, slices, values
from neffcache.server.storage.models import Entry, Event, EventRollup


@dataclass(frozen=True)
class IngestOutcome:
    accepted: int
    duplicates: int
    expired: int = 0


def hour_of(ts: float) -> int:
    return int(ts // 3600) * 3600


# The columns of an event row, in the order of the tuples below (storage/models.py: Event).
EVENT_COLUMNS = ("event_id", "kind", "ts", "path", "key", "namespace", "toolchain", "job", "model", "team",
                 "host", "instance_type", "compile_seconds", "store", "message", "received", "writer")
_ID, _KIND, _TS, _PATH, _JOB, _MODEL, _TEAM, _INSTANCE, _TOOLCHAIN, _SECONDS, _STORE, _MESSAGE, _WRITER = map(
    EVENT_COLUMNS.index, ("event_id", "kind", "ts", "path", "job", "model", "team", "instance_type", "toolchain",
                          "compile_seconds", "store", "message", "writer"))
_EVENTS = Event.__tablename__
_ROLLUPS = EventRollup.__tablename__
_ROLLUP_DIMENSIONS = ("hour", "kind", "source", "team", "model", "instance_type", "toolchain", "writer")
_ENTRIES = Entry.__tablename__

EventRow = tuple[Any, ...]


def ingest_events(session: Session, events: Sequence[EventIn], now: float, writer: Writer,
                  keep_after: float | None = None) -> IngestOutcome:
    """Store new events as ``writer``'s; ``keep_after`` is the retention horizon (older events
    are refused). An event the writer may not report (services/identity.py: outside its
    prefixes, another team's, evicting another token's location) refuses the batch (Forbidden).

    The statements are SQL text on the transaction's connection (storage/driver_sql.py): the
    same SQL SQLAlchemy rendered, without its per-row parameter processing."""
    refuse("events the token may not report", _refusals(session, events, writer))
    kept = [e for e in events if keep_after is None or e.ts >= keep_after]
    unique = {event.id: event for event in kept}
    ordered = [unique[event_id] for event_id in sorted(unique)]
    sql = DriverSQL(session)
    saved = _recorded_compile_seconds(sql, ordered)
    rows = [_event_row(event, now, saved, writer) for event in ordered]
    inserted = _insert_new(sql, rows)
    fresh = [row for row in rows if row[_ID] in inserted]
    _roll_up(sql, fresh)
    _stamp_entries(sql, fresh)
    _apply_evictions(session, fresh, writer)
    regret.record(sql, [(r[_KIND], r[_TS], r[_PATH], r[_SECONDS], r[_MESSAGE], r[_STORE]) for r in fresh
                        if r[_KIND] in regret.KINDS and r[_PATH]])
    return IngestOutcome(accepted=len(fresh), duplicates=len(kept) - len(fresh), expired=len(events) - len(kept))


def sweep_events(session: Session, before: float, limit: int = 5000) -> int:
    """Delete up to ``limit`` raw events older than ``before`` (bounded, so a sweep never holds
    the write lock for long; it runs again with later batches)."""
    oldest = select(Event.id).where(Event.ts < before).order_by(Event.ts).limit(limit)
    result = session.execute(delete(Event).where(Event.id.in_(oldest.scalar_subquery())))
    regret.sweep(session, before, limit)  # the evictions a miss may still regret age out with the events
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def _recorded_compile_seconds(sql: DriverSQL, events: Sequence[EventIn]) -> dict[str, float]:
    """For hits that do not say what they saved: the compile time recorded with the entry."""
    paths = sorted({e.path for e in events if e.kind is EventKind.HIT and e.compile_seconds is None and e.path})
    if not paths:
        return {}
    if sql.postgresql:
        rows = sql.rows(_compile_seconds_sql(sql.mark, 0), [paths])
    else:
        rows = [row for chunk in slices(paths, 1)
                for row in sql.rows(_compile_seconds_sql(sql.mark, len(chunk)), chunk)]
    return {path: float(seconds or 0.0) for path, seconds in rows}


def _refusals(session: Session, events: Sequence[EventIn], writer: Writer) -> list[Refusal]:
    if writer.admin:
        return []
    found = [refusal for i, e in enumerate(events)
             for refusal in writer.scope_refusals(i, e.path, e.namespace, e.store)]
    if writer.team or any(e.team for e in events):
        # Only a token without a team needs the bound teams (services/identity.py).
        bound = frozenset() if writer.team else tokens.bound_teams(session)
        found += [refusal for i, e in enumerate(events) if (refusal := writer.team_for(i, e.team, bound)[1])]
    evicts: dict[int, tuple[str, str]] = {i: (e.path, e.store) for i, e in enumerate(events)
                                          if e.kind is EventKind.EVICT and e.path is not None and e.store is not None}
    foreign = catalog.foreign_locations(session, sorted(set(evicts.values())), writer)
    found += [Refusal(i, "store", f"store {pair[1]!r} of entry {pair[0]!r} was added by token {foreign[pair]!r}")
              for i, pair in evicts.items() if pair in foreign]
    return sorted(found, key=lambda refusal: refusal.index)


def _event_row(event: EventIn, now: float, saved: dict[str, float], writer: Writer) -> EventRow:
    seconds = event.compile_seconds
    if seconds is None and event.kind is EventKind.HIT and event.path:
        seconds = saved.get(event.path)
    # The team is the token's (an event naming another was refused above); an admin's is as sent.
    team = writer.team if writer.team and not writer.admin else event.team
    return (event.id, event.kind, event.ts, event.path, event.key, event.namespace, toolchain_label(event.toolchain),
            event.job, event.model, team, event.host, event.instance_type, seconds, event.store,
            event.message, now, writer.name)


def _insert_new(sql: DriverSQL, rows: list[EventRow]) -> set[str]:
    """Insert the rows whose event id is new; the ids really inserted (RETURNING), so a resent
    event is counted once even when two transactions race to insert it."""
    inserted: set[str] = set()
    if sql.postgresql and rows:
        # One array per column: a short statement psycopg parses once and caches. A VALUES list
        # of 8,000 placeholders was parsed again on every batch, half the ingest's CPU.
        columns = [list(column) for column in zip(*rows, strict=True)]
        inserted.update(event_id for (event_id,) in sql.rows(_insert_unnest_sql(), columns))
        return inserted
    width = len(EVENT_COLUMNS)
    for chunk in slices(rows, width):
        statement = _insert_sql(sql.mark, len(chunk))
        inserted.update(event_id for (event_id,) in sql.rows(statement, [v for row in chunk for v in row]))
    return inserted


def _roll_up(sql: DriverSQL, rows: list[EventRow]) -> None:
    sums: dict[tuple[Any, ...], list[float]] = defaultdict(lambda: [0, 0.0])
    for row in rows:
        acc = sums[(hour_of(row[_TS]), row[_KIND], event_source(row[_JOB]), row[_TEAM], row[_MODEL], row[_INSTANCE],
                    row[_TOOLCHAIN], row[_WRITER])]
        acc[0] += 1
        acc[1] += row[_SECONDS] or 0.0
    if not sums:
        return
    sql.run_many(_rollup_sql(sql.mark), [(*dims, int(acc[0]), float(acc[1])) for dims, acc in sorted(sums.items())])


def _stamp_entries(sql: DriverSQL, rows: list[EventRow]) -> None:
    hits: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        if row[_KIND] == EventKind.HIT and row[_PATH]:
            hits[row[_PATH]].append(row[_TS])
    sql.run_many(_stamp_sql(sql.mark), [(len(hits[path]), max(hits[path]), max(hits[path]), path)
                                        for path in sorted(hits)])


# The statements, per placeholder style and row count. S608: only names from storage/models.py
# and placeholders are formatted in; every value is bound by the driver.

@lru_cache(maxsize=64)
def _compile_seconds_sql(mark: str, count: int) -> str:
    """count 0: PostgreSQL's ``= ANY(array)``, one parameter; else an IN list of ``count``."""
    where = f"path = ANY({mark})" if count == 0 else f"path IN ({marks(mark, count)})"
    return (f"SELECT path, compile_seconds FROM {_ENTRIES} "  # noqa: S608 - see above
            f"WHERE {where} AND compile_seconds IS NOT NULL")


@lru_cache(maxsize=1)
def _insert_unnest_sql() -> str:
    # Each column's array type from the model: doubles as float8, the strings as text (which a
    # VARCHAR column takes by assignment).
    table = Event.__table__
    arrays = ", ".join(f"%s::{'float8' if isinstance(table.c[name].type, Double) else 'text'}[]"
                       for name in EVENT_COLUMNS)
    return (f"INSERT INTO {_EVENTS} ({', '.join(EVENT_COLUMNS)}) "  # noqa: S608 - see above
            f"SELECT * FROM unnest({arrays}) ON CONFLICT (event_id) DO NOTHING RETURNING event_id")


@lru_cache(maxsize=64)
def _insert_sql(mark: str, count: int) -> str:
    return (f"INSERT INTO {_EVENTS} ({', '.join(EVENT_COLUMNS)}) "  # noqa: S608 - see above
            f"VALUES {values(mark, len(EVENT_COLUMNS), count)} ON CONFLICT (event_id) DO NOTHING RETURNING event_id")


@lru_cache(maxsize=2)
def _rollup_sql(mark: str) -> str:
    names = ", ".join(_ROLLUP_DIMENSIONS)
    # count = count + new count: atomic under the row lock ON CONFLICT takes, on both databases.
    return (f"INSERT INTO {_ROLLUPS} ({names}, count, seconds) "  # noqa: S608 - see above
            f"VALUES ({marks(mark, len(_ROLLUP_DIMENSIONS) + 2)}) ON CONFLICT ({names}) DO UPDATE SET "
            f"count = {_ROLLUPS}.count + excluded.count, seconds = {_ROLLUPS}.seconds + excluded.seconds")


@lru_cache(maxsize=2)
def _stamp_sql(m: str) -> str:
    # Events arrive out of order (spools drain late): keep the newest use.
    return (f"UPDATE {_ENTRIES} SET hit_count = hit_count + {m}, "  # noqa: S608 - see above
            f"last_used = CASE WHEN COALESCE(last_used, 0.0) < {m} THEN {m} ELSE last_used END WHERE path = {m}")


def _apply_evictions(session: Session, rows: list[EventRow], writer: Writer) -> None:
    """An evict event with a store removes that location; the last location takes the entry
    (the catalog's own forget, as ``DELETE /v1/entries/...`` does)."""
    evicted = {(r[_PATH], r[_STORE]) for r in rows if r[_KIND] == EventKind.EVICT and r[_PATH] and r[_STORE]}
    for path, store in sorted(evicted):
        catalog.forget_entry(session, path, store, writer)
