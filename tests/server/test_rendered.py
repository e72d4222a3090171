"""The entries' stored API form (server/services/rendering.py, migration 0004), on SQLite and
PostgreSQL: a batch lookup answers from it byte for byte what rendering the row answers, after
every write the server makes; any change another writer makes (an older replica, an operator's
SQL) clears it, so the lookup falls back to the row and stays right; usage stamps never clear
it; another server's rendering is never served; and a rendering pass fills what is missing."""

from __future__ import annotations

import time
from collections.abc import Iterator

import orjson
import pytest
from sqlalchemy import text

from neffcache.server.services import catalog, lookups, rendering
from neffcache.server.services.records import EntryIn
from neffcache.server.storage.db import Database, migrate
from neffcache.server.storage.models import Entry, table_of
from tests.server.factories import WRITER, entry

PATHS = [str(entry(i)["path"]) for i in range(4)]


def _register(db: Database, *records: dict[str, object]) -> None:
    parsed = [EntryIn.model_validate(record) for record in records]
    db.transact(lambda s: catalog.register_entries(s, parsed, time.time(), WRITER))


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url, pool_size=2)
    migrate(database.engine)
    _register(database, entry(0, tags={"model": "ünï ✓", "team": "a"}, flags=["--lnc=2", "-O1"]),
              entry(1, toolchain=None, compile_seconds=None), entry(2, store="s3://b/c"), entry(3))
    yield database
    database.dispose()


def _from_rows(db: Database, paths: list[str]) -> list[bytes]:
    """What the batch would answer if it rendered every row (the slow path, and the contract)."""
    statement = catalog.rows_statement(table_of(Entry).c.path.in_(paths))
    with db.read() as session:
        by_path = {row.path: orjson.dumps(catalog.row_json(row)) for row in session.connection().execute(statement)}
    return [by_path[path] for path in paths if path in by_path]


def _unrendered(db: Database) -> set[str]:
    with db.read() as session:
        return set(session.scalars(text("SELECT path FROM entries WHERE rendered IS NULL")))


def _sql(db: Database, statement: str, **params: object) -> None:
    with db.write() as session:
        session.execute(text(statement), params)


def _assert_answers_as_rows(db: Database) -> None:
    answer = lookups.lookup_many(db, [*PATHS, "trn2-lnc2/neuronxcc-2.27.5334.0+f702b353/MODULE_9+none"])
    assert answer.found == _from_rows(db, PATHS)
    assert orjson.loads(answer.body())["found"] == [orjson.loads(found) for found in answer.found]


def test_every_write_of_the_server_leaves_the_stored_form_equal_to_the_row(db: Database) -> None:
    assert _unrendered(db) == set()
    _assert_answers_as_rows(db)
    _register(db, entry(0, store="s3://second/tier", tags={"team": "b"}))  # a second location, a changed tag
    _register(db, entry(1, state="FAILED", hlo_sha256="c" * 64))  # a state change, inputs learnt later
    assert _unrendered(db) == set()
    _assert_answers_as_rows(db)
    found = orjson.loads(lookups.lookup_many(db, [PATHS[0]]).found[0])
    assert found["stores"] == sorted([entry(0)["store"], "s3://second/tier"]) and found["tags"]["team"] == "b"
    db.transact(lambda s: catalog.forget_entry(s, PATHS[0], "s3://second/tier", WRITER))  # one store forgets it
    db.transact(lambda s: catalog.forget_entry(s, PATHS[3], None, WRITER))  # the entry goes
    assert _unrendered(db) == set()
    _assert_answers_as_rows(db)
    assert orjson.loads(lookups.lookup_many(db, [PATHS[0]]).found[0])["stores"] == [entry(0)["store"]]
    assert lookups.lookup_many(db, [PATHS[3]]).missing == [PATHS[3]]


def test_usage_stamps_are_read_from_the_row_and_never_clear_the_form(db: Database) -> None:
    # The events path's own statement shape (services/events.py): hit count and last use only.
    _sql(db, "UPDATE entries SET hit_count = hit_count + 3, last_used = 1.5e9 + 0.25 WHERE path = :p", p=PATHS[2])
    assert _unrendered(db) == set()
    found = orjson.loads(lookups.lookup_many(db, [PATHS[2]]).found[0])
    assert (found["hit_count"], found["last_used"]) == (3, 1.5e9 + 0.25)
    _assert_answers_as_rows(db)


@pytest.mark.parametrize("change", [
    "INSERT INTO entry_locations (entry_id, store, added) "
    "SELECT id, 's3://old/replica', 1.0 FROM entries WHERE path = :p",
    "DELETE FROM entry_locations WHERE entry_id = (SELECT id FROM entries WHERE path = :p)",
    "UPDATE entry_locations SET store = 's3://renamed' WHERE entry_id = (SELECT id FROM entries WHERE path = :p)",
    "UPDATE entry_tags SET value = 'changed' WHERE entry_id = (SELECT id FROM entries WHERE path = :p)",
    "DELETE FROM entry_tags WHERE entry_id = (SELECT id FROM entries WHERE path = :p)",
    "INSERT INTO entry_tags (entry_id, name, value) SELECT id, 'new', 'tag' FROM entries WHERE path = :p",
    "UPDATE entries SET state = 'FAILED' WHERE path = :p",
    "UPDATE entries SET flags = '[\"-O3\"]', size = size + 1 WHERE path = :p",
])
def test_a_change_by_a_writer_that_does_not_render_clears_the_form(db: Database, change: str) -> None:
    """An older replica (or an operator's SQL) writes the row, its stores or its tags without
    knowing the column: the database clears it, and the lookup answers from the row."""
    _sql(db, change, p=PATHS[0])
    assert _unrendered(db) == {PATHS[0]}
    _assert_answers_as_rows(db)
    assert catalog.render_unrendered(db) == 1
    assert _unrendered(db) == set()
    _assert_answers_as_rows(db)


# Every column of the entries' table but the id, the usage stamps and the rendering itself is
# part of the API form: a column added to the model without being added to the triggers'
# list (migration 0004's ``_FORM``) would let a writer that does not render leave a stale text.
# ``writer`` (migration 0006) is provenance the server judges writes by, not part of the form.
_NOT_FORM = {"id", *rendering.STAMPS, "rendered", "rendered_format", "writer"}
FORM_COLUMNS = sorted(str(c.key) for c in table_of(Entry).c if c.key not in _NOT_FORM)


@pytest.mark.parametrize("column", FORM_COLUMNS)
def test_an_update_naming_any_column_of_the_form_clears_it(db: Database, column: str) -> None:
    # Named in SET, even to its own value: both databases fire an UPDATE OF trigger on that.
    _sql(db, f"UPDATE entries SET {column} = {column} WHERE path = :p", p=PATHS[0])
    assert _unrendered(db) == {PATHS[0]}
    _assert_answers_as_rows(db)


def test_another_servers_rendering_is_not_served(db: Database) -> None:
    _sql(db, "UPDATE entries SET rendered = :junk, rendered_format = :other WHERE path = :p",
         junk=b'{"path":"not this"', other=rendering.FORMAT + 1, p=PATHS[1])
    _assert_answers_as_rows(db)


def test_the_rendering_pass_fills_every_missing_form_in_batches(db: Database) -> None:
    _register(db, *(entry(i, tags={"n": str(i)}) for i in range(4, 40)))
    _sql(db, "UPDATE entries SET rendered = NULL")
    assert len(_unrendered(db)) == 40  # the fixture's 4 and 36 more
    _assert_answers_as_rows(db)  # answered from the rows meanwhile
    assert catalog.render_unrendered(db, batch=7) == 40
    assert _unrendered(db) == set() and catalog.render_unrendered(db) == 0
    _assert_answers_as_rows(db)


def test_the_form_is_the_rows_json_less_its_stamps() -> None:
    form = {"path": "a", "tags": {"ü": "✓"}, "hit_count": 2, "last_used": None}
    assert rendering.with_stamps(rendering.form(form), 2, None) == orjson.dumps(form)
    assert rendering.with_stamps(rendering.form(form), 7, 1.25) == orjson.dumps({**form, "hit_count": 7,
                                                                                "last_used": 1.25})
    with pytest.raises(ValueError, match="ends with"):
        rendering.form({"hit_count": 1, "last_used": None, "path": "a"})
