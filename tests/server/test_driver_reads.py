"""The hot lookup's SELECT on the driver's own connection (server/storage/driver.py), on SQLite
and PostgreSQL: the same row SQLAlchemy returns for the same statement, None for a miss, and a
connection that fails is dropped, never handed out again (the next read opens a new one)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator

import psycopg
import pytest

from neffcache.server.services import catalog
from neffcache.server.services.records import EntryIn
from neffcache.server.storage.db import Database, migrate
from tests.server.factories import entry


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url, pool_size=2)
    migrate(database.engine)
    records = [EntryIn.model_validate(entry(i, tags={"team": f"t{i}", "model": "ünï ✓"})) for i in range(3)]
    database.transact(lambda s: catalog.register_entries(s, records, time.time()))
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
    broken = read._idle[-1]
    broken.close()  # the connection dies behind the reader's back (a database restart)
    with pytest.raises((sqlite3.Error, psycopg.Error)):  # the driver's own error, to the caller
        read.first(path)
    assert broken not in read._idle
    assert read.first(path) is not None
