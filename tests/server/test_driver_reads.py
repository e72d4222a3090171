"""The lookups' SELECTs on the driver's own connections (server/storage/driver.py), on SQLite
and PostgreSQL: the same rows SQLAlchemy returns for the same statement (one key, and a batch
at every IN-list size and across slices), None or nothing for a miss, one snapshot for every
slice of a batch, and a connection that fails is dropped, never handed out again (the next
read opens a new one)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence

import psycopg
import pytest
from sqlalchemy.exc import DBAPIError

from neffcache.server.services import catalog, lookups
from neffcache.server.services.records import EntryIn
from neffcache.server.storage.db import Database, migrate
from neffcache.server.storage.driver import IN_LIST_SIZES
from neffcache.server.storage.models import Entry, table_of
from tests.server.factories import WRITER, entry


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url, pool_size=2)
    migrate(database.engine)
    records = [EntryIn.model_validate(entry(i, tags={"team": f"t{i}", "model": "ünï ✓"})) for i in range(3)]
    database.transact(lambda s: catalog.register_entries(s, records, time.time(), WRITER))
    yield database
    database.dispose()


def test_the_driver_read_answers_what_sqlalchemy_answers(db: Database) -> None:
    read = db.driver_read(catalog.LOOKUP, "path")
    for i in range(3):
        path = str(entry(i)["path"])
        with db.single_read() as conn:
            expected = catalog.lookup_entry(conn, path)
        row = read.first(path)
        assert row is not None and expected is not None
        assert catalog.row_json(row) == expected
        assert list(catalog.row_json(row)) == list(expected)  # the same keys in the same order
    assert read.first("trn2-lnc2/neuronxcc-2.27.5334.0+f702b353/MODULE_1+nowhere") is None


def test_a_failed_connection_is_dropped_and_the_next_read_opens_another(db: Database) -> None:
    read = db.driver_read(catalog.LOOKUP, "path")
    path = str(entry(1)["path"])
    assert read.first(path) is not None
    broken = read.connections._idle[-1]
    broken.close()  # the connection dies behind the reader's back (a database restart)
    with pytest.raises((sqlite3.Error, psycopg.Error)):  # the driver's own error, to the caller
        read.first(path)
    assert broken not in read.connections._idle
    assert read.first(path) is not None


@pytest.fixture
def many(db: Database) -> list[str]:
    """4,100 more entries (3 are there already): a batch of all of them spans three IN lists."""
    records = [EntryIn.model_validate(entry(i, tags={"bucket": str(i % 5)})) for i in range(3, 4103)]
    db.transact(lambda s: catalog.register_entries(s, records, time.time(), WRITER))
    return [str(entry(i)["path"]) for i in range(4103)]


def _through_sqlalchemy(db: Database, paths: list[str]) -> list[dict[str, object]]:
    statement = catalog.rows_statement(table_of(Entry).c.path.in_(paths))
    with db.read() as session:
        return sorted((catalog.row_json(row) for row in session.connection().execute(statement)),
                      key=lambda found: str(found["path"]))


@pytest.mark.parametrize("count", [1, 15, 16, 17, 1024, 2000, 2001, 4103])
def test_a_batch_read_answers_what_sqlalchemy_answers_at_every_in_list_size(
        db: Database, many: list[str], count: int) -> None:
    asked = many[:count] + [f"{many[0].rsplit('/', 1)[0]}/MODULE_9{i}+nowhere" for i in range(3)]  # misses
    read = db.driver_batch_read(lookups._BY_PATHS, "paths")
    rows = read.rows(asked)
    assert sorted((catalog.row_json(row) for row in rows), key=lambda found: str(found["path"])) \
        == _through_sqlalchemy(db, asked)
    assert len(rows) == count  # each found once, the padding and the misses add nothing
    assert db.driver_batch_read(lookups._BY_PATHS, "paths") is read  # one reader per statement
    assert read.rows([]) == []


def test_the_slices_of_a_batch_see_one_snapshot(db: Database, many: list[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry forgotten while the batch reads its first slice is still in its second: one
    snapshot (on PostgreSQL, READ COMMITTED would have shown each SELECT a fresh one)."""
    read = db.driver_batch_read(lookups._BY_PATHS, "paths")
    last = many[-1]  # in the third slice
    bind = read._bind[IN_LIST_SIZES[-1]]
    calls: list[int] = []

    def forget_after_the_first_slice(values: Sequence[object]) -> object:
        calls.append(1)
        if len(calls) == 2:  # the first SELECT has run: its snapshot is fixed
            db.transact(lambda s: catalog.forget_entry(s, last, None, WRITER))
        return bind(values)

    monkeypatch.setitem(read._bind, IN_LIST_SIZES[-1], forget_after_the_first_slice)
    found = {row[catalog._ROW_NAMES.index("path")] for row in read.rows(many)}
    assert last in found and len(found) == len(many)
    with db.single_read() as conn:
        assert catalog.lookup_entry(conn, last) is None  # it really is gone now
    assert {row[catalog._ROW_NAMES.index("path")] for row in read.rows(many)} == set(many) - {last}


def test_a_failed_batch_raises_sqlalchemys_error_and_drops_its_connection(db: Database, many: list[str]) -> None:
    read = db.driver_batch_read(lookups._BY_PATHS, "paths")
    assert len(read.rows(many[:10])) == 10
    broken = read.connections._idle[-1]
    broken.close()
    with pytest.raises(DBAPIError):  # what the app's 503 handler and the retrying client expect
        read.rows(many[:10])
    assert broken not in read.connections._idle
    assert len(read.rows(many[:10])) == 10


def test_flags_stored_another_way_still_render(db: Database) -> None:
    """orjson parses the stored flags; text it refuses (a lone surrogate's escape, which no API
    path stores) falls back to json instead of failing the lookup."""
    path = str(entry(0)["path"])
    with db.write() as session:
        session.execute(table_of(Entry).update().where(table_of(Entry).c.path == path)
                        .values(flags='["--a", "\\ud800"]'))
    with db.single_read() as conn:
        found = catalog.lookup_entry(conn, path)
    assert found is not None and found["flags"] == ["--a", "\ud800"]


def test_the_stored_forms_arrive_as_sqlalchemy_reads_them(db: Database) -> None:
    """The batch lookup's columns (the stored form, its format, the usage stamps), which the
    driver reads in PostgreSQL's binary format: the same values of the same types as through
    SQLAlchemy, a bytea as bytes and a double as a float, stamps set or not."""
    paths = [str(entry(i)["path"]) for i in range(3)]
    with db.write() as session:  # usage stamps, which leave the stored form in place
        session.execute(table_of(Entry).update().where(table_of(Entry).c.path == paths[1])
                        .values(hit_count=2**40 + 3, last_used=1764950000.123456))
    read = db.driver_batch_read(lookups._FORMS_BY_PATHS, "paths")
    with db.read() as session:
        expected = sorted(tuple(row) for row in session.connection().execute(lookups._FORMS_BY_PATHS,
                                                                              {"paths": paths}))
    found = sorted(read.rows(paths))
    assert found == expected and len(found) == 3
    for got, want in zip(found, expected, strict=True):
        assert [type(value) for value in got] == [type(value) for value in want]
        assert type(got[1]) is bytes and got[1].startswith(b"{")  # rendered, not hex text
    assert {row[4] for row in found} == {None, 1764950000.123456}
