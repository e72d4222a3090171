"""Event ingestion as SQL text on the transaction's connection (server/services/events.py,
server/storage/driver_sql.py), on SQLite and PostgreSQL: a full batch across every slice keeps
each field exactly (free text with quotes, braces, backslashes and the word NULL included, which
PostgreSQL's array literals must not reinterpret), a resend counts nothing twice, and rollups and
hit stamps match what the events say."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest
from sqlalchemy import select

from neffcache.server.api.schemas import MAX_BATCH
from neffcache.server.services import catalog
from neffcache.server.services import events as event_log
from neffcache.server.services.records import EntryIn, EventIn, toolchain_label
from neffcache.server.storage.db import Database, migrate
from neffcache.server.storage.models import Entry, Event, EventRollup
from tests.server.factories import WRITER, entry, event

_TEXTS = ['a "quoted" {brace}, comma', "back\\slash \\\\ and \\N", "NULL", "", "ünï ✓ 🦙", "tab\tless'quote'",
          None]


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url, pool_size=2)
    migrate(database.engine)
    records = [EntryIn.model_validate(entry(i, compile_seconds=100.0 * (i + 1))) for i in range(4)]
    database.transact(lambda s: catalog.register_entries(s, records, time.time(), WRITER))
    yield database
    database.dispose()


def _batch(count: int, now: float) -> list[EventIn]:
    kinds = ("hit", "miss", "compile", "error")
    out = []
    for i in range(count):
        kind = kinds[i % 4]
        out.append(EventIn.model_validate(event(
            kind, ts=now - i, path=str(entry(i % 4)["path"]) if kind == "hit" else None,
            key=f"MODULE_{i}+abcd0000" if kind == "miss" else None, team=f"team-{i % 3}",
            compile_seconds=float(i) if kind == "compile" else None,
            message=_TEXTS[i % len(_TEXTS)] if kind == "error" else None)))
    return out


def test_a_full_batch_keeps_every_field_and_a_resend_counts_nothing_twice(db: Database) -> None:
    now = time.time()
    batch = _batch(MAX_BATCH, now)  # SQLite: five INSERTs of 1,000 rows; PostgreSQL: one of arrays
    outcome = db.transact(lambda s: event_log.ingest_events(s, batch, now, WRITER))
    assert (outcome.accepted, outcome.duplicates) == (MAX_BATCH, 0)
    with db.read() as session:
        stored = {row.event_id: row for row in session.scalars(select(Event))}
    assert len(stored) == MAX_BATCH
    for sent in batch:
        row = stored[sent.id]
        assert (row.kind, row.ts, row.path, row.key, row.namespace, row.team, row.message) == (
            sent.kind, sent.ts, sent.path, sent.key, sent.namespace, sent.team, sent.message)
        assert row.toolchain == toolchain_label(sent.toolchain) and row.received == now
        # Hits (all of entry 0 here) do not say what they saved: they take its compile time.
        assert row.compile_seconds == (100.0 if sent.kind == "hit" else sent.compile_seconds)

    again = [*batch[:100], *_batch(10, now - 1000)]
    outcome = db.transact(lambda s: event_log.ingest_events(s, again, now, WRITER))
    assert (outcome.accepted, outcome.duplicates) == (10, 100)


def test_hits_stamp_their_entries_and_take_the_recorded_compile_time(db: Database) -> None:
    now = time.time()
    paths = [str(entry(i)["path"]) for i in range(4)]
    batch = [EventIn.model_validate(event("hit", path=paths[i % 4], ts=now - i)) for i in range(40)]
    db.transact(lambda s: event_log.ingest_events(s, batch, now, WRITER))
    with db.read() as session:
        entries = {e.path: e for e in session.scalars(select(Entry))}
        saved = {e.event_id: e.compile_seconds for e in session.scalars(select(Event))}
    for i, path in enumerate(paths):
        assert entries[path].hit_count == 10
        assert entries[path].last_used == pytest.approx(now - i)  # the newest of its hits
    for sent in batch:
        assert saved[sent.id] == entries[str(sent.path)].compile_seconds


def test_rollups_count_each_event_once(db: Database) -> None:
    now = time.time()
    batch = _batch(600, now)
    db.transact(lambda s: event_log.ingest_events(s, batch, now, WRITER))
    db.transact(lambda s: event_log.ingest_events(s, batch[:300], now, WRITER))  # a resend adds nothing
    expected = Counter((event_log.hour_of(e.ts), e.kind, e.team) for e in batch)
    with db.read() as session:
        got = Counter()
        for rollup in session.scalars(select(EventRollup)):
            got[(rollup.hour, rollup.kind, rollup.team)] += rollup.count
    assert got == expected
