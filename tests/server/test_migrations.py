"""Alembic upgrades an empty database to head on SQLite and PostgreSQL, matching the models."""

from __future__ import annotations

import subprocess
import sys

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from neffcache.server.storage.db import Database, alembic_config, current_revision, head_revision, migrate
from neffcache.server.storage.models import Base


def test_upgrade_empty_database_to_head(db_url: str) -> None:
    db = Database(db_url, pool_size=2)
    try:
        assert current_revision(db.engine) is None
        migrate(db.engine)
        assert current_revision(db.engine) == head_revision()
        tables = set(inspect(db.engine).get_table_names())
        assert {"entries", "entry_locations", "entry_tags", "events", "event_rollups", "leases", "tokens"} <= tables
        with db.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
        assert diff == [], "models and migrations disagree; write a migration"
        migrate(db.engine)  # idempotent
        assert current_revision(db.engine) == head_revision()
    finally:
        db.dispose()


def test_downgrade_and_upgrade_again(db_url: str) -> None:
    db = Database(db_url, pool_size=2)
    try:
        migrate(db.engine)
        with db.engine.connect() as conn:
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "base")
            conn.commit()
        assert "entries" not in inspect(db.engine).get_table_names()
        migrate(db.engine)
        assert current_revision(db.engine) == head_revision()
    finally:
        db.dispose()


def test_replicas_migrating_at_once(db_url: str) -> None:
    """Several replicas start together: one upgrades, the others wait and find the schema at head."""
    code = ("import sys; from neffcache.server.storage.db import Database, migrate; "
            "migrate(Database(sys.argv[1]).engine)")
    procs = [subprocess.Popen([sys.executable, "-c", code, db_url], stderr=subprocess.PIPE) for _ in range(3)]
    failures = [p.stderr.read().decode() for p in procs if p.wait(timeout=120) != 0]  # type: ignore[union-attr]
    for p in procs:
        p.stderr.close()  # type: ignore[union-attr]
    assert failures == []
    db = Database(db_url, pool_size=1)
    try:
        assert current_revision(db.engine) == head_revision()
    finally:
        db.dispose()


def _downgrade(db: Database, revision: str) -> None:
    with db.engine.connect() as conn:
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)
        conn.commit()


def test_0002_adds_the_graph_inputs_and_its_downgrade_keeps_every_entry(db_url: str) -> None:
    """0002 alters ``entries`` in place: neither way copies the table, so no location or tag is
    lost (on SQLite a table copy drops ``entries``, and the drop cascades to both)."""
    db = Database(db_url, pool_size=2)
    try:
        migrate(db.engine, "0001")
        with db.engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO entries (id, path, layout, key, namespace, toolchain, state, size, created, registered,"
                " updated, producer, hit_count) VALUES (1, 'ns/k', 'neuronxcc', 'k', 'ns', 'unknown', 'SUCCESS',"
                " 1, 0, 0, 0, '', 0)"))
            conn.execute(text("INSERT INTO entry_locations (entry_id, store, added) VALUES (1, 's3://b', 0)"))
            conn.execute(text("INSERT INTO entry_tags (entry_id, name, value) VALUES (1, 'model', 'm')"))
        migrate(db.engine)
        columns = {c["name"] for c in inspect(db.engine).get_columns("entries")}
        assert {"hlo_sha256", "hlo_size", "flags"} <= columns
        assert {"ix_entries_hlo_sha256", "ix_entries_target_created"} <= {
            i["name"] for i in inspect(db.engine).get_indexes("entries")}
        with db.engine.begin() as conn:
            assert conn.execute(text("SELECT hlo_sha256, hlo_size, flags FROM entries")).all() == [(None, None, None)]
            conn.execute(text("UPDATE entries SET hlo_sha256 = :d, flags = '[]'"), {"d": "ab" * 32})

        _downgrade(db, "0001")
        assert current_revision(db.engine) == "0001"
        assert "hlo_sha256" not in {c["name"] for c in inspect(db.engine).get_columns("entries")}
        with db.engine.connect() as conn:
            assert conn.execute(text("SELECT path FROM entries")).scalars().all() == ["ns/k"]
            assert conn.execute(text("SELECT store FROM entry_locations")).scalars().all() == ["s3://b"]
            assert conn.execute(text("SELECT value FROM entry_tags")).scalars().all() == ["m"]
        migrate(db.engine)
        assert current_revision(db.engine) == head_revision()
    finally:
        db.dispose()


def test_0004_keeps_every_entry_both_ways_and_the_upgrade_renders_them(db_url: str) -> None:
    """A database at 0003 with an entry: ``neffcache db upgrade`` (IndexAdmin) migrates, then
    renders its stored form, which a batch lookup serves; the downgrade keeps every row."""
    from neffcache.server.config import ServerSettings
    from neffcache.server.services import lookups
    from neffcache.server.services.admin import IndexAdmin

    db = Database(db_url, pool_size=2)
    try:
        migrate(db.engine, "0003")
        with db.engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO entries (id, path, layout, key, namespace, toolchain, state, size, created, registered,"
                " updated, producer, hit_count) VALUES (1, 'ns/k', 'neuronxcc', 'k', 'ns', 'unknown', 'SUCCESS',"
                " 1, 0, 0, 0, '', 4)"))
            conn.execute(text("INSERT INTO entry_locations (entry_id, store, added) VALUES (1, 's3://b', 0)"))
            conn.execute(text("INSERT INTO entry_tags (entry_id, name, value) VALUES (1, 'model', 'm')"))
        with IndexAdmin(ServerSettings(database_url=db_url)) as admin:
            assert admin.upgrade() == head_revision()
        with db.engine.connect() as conn:
            assert conn.execute(text("SELECT rendered IS NOT NULL FROM entries")).scalar_one()
        found = lookups.lookup_many(db, ["ns/k"]).found
        assert [f.count(b'"stores":["s3://b"]') + f.count(b'"tags":{"model":"m"}') for f in found] == [2]
        assert found[0].endswith(b'"hit_count":4,"last_used":null}')

        _downgrade(db, "0003")
        assert "rendered" not in {c["name"] for c in inspect(db.engine).get_columns("entries")}
        with db.engine.connect() as conn:
            assert conn.execute(text("SELECT store FROM entry_locations")).scalars().all() == ["s3://b"]
            assert conn.execute(text("SELECT value FROM entry_tags")).scalars().all() == ["m"]
            conn.execute(text("INSERT INTO entry_tags (entry_id, name, value) VALUES (1, 'team', 't')"))  # no trigger
            conn.commit()
        migrate(db.engine)
        assert current_revision(db.engine) == head_revision()
    finally:
        db.dispose()


def _old_event(conn: object, n: int, ts: float, kind: str, job: str, seconds: float | None = None) -> None:
    conn.execute(text(  # type: ignore[attr-defined]
        "INSERT INTO events (event_id, kind, ts, namespace, toolchain, job, model, team, host, instance_type,"
        " compile_seconds, received) VALUES (:id, :kind, :ts, 'ns', 'tc', :job, 'm', 't', 'h', 'trn2', :s, :ts)"),
        {"id": f"e{n}", "kind": kind, "ts": ts, "job": job, "s": seconds})


def test_0005_splits_the_hours_whose_events_are_all_kept_by_source(db_url: str) -> None:
    """At 0004 an hour whose events are all kept (a warm-up's 2 misses and compiles, a job's hit)
    and an older hour the sweep thinned (rollups of 5 events, 1 kept): the upgrade gives the
    first its sources from the events, keeps the second's counts as "job", and the downgrade
    sums the sources back."""
    whole, swept = 1_800_000_000 // 3600 * 3600, 1_800_000_000 // 3600 * 3600 - 7200
    db = Database(db_url, pool_size=2)
    try:
        migrate(db.engine, "0004")
        with db.engine.begin() as conn:
            for n, (kind, job, seconds) in enumerate([("miss", "warm", None), ("compile", "warm", 60.0),
                                                      ("miss", "plan", None), ("compile", "plan", 30.0),
                                                      ("hit", "run", 60.0)]):
                _old_event(conn, n, whole + 10 + n, kind, job, seconds)
            _old_event(conn, 9, swept + 3500, "miss", "warm")
            for hour, kind, count, seconds in ((whole, "miss", 2, 0.0), (whole, "compile", 2, 90.0),
                                               (whole, "hit", 1, 60.0), (swept, "miss", 5, 0.0)):
                conn.execute(text("INSERT INTO event_rollups (hour, kind, team, model, instance_type, toolchain,"
                                  " count, seconds) VALUES (:h, :k, 't', 'm', 'trn2', 'tc', :n, :s)"),
                             {"h": hour, "k": kind, "n": count, "s": seconds})
        migrate(db.engine)
        with db.engine.connect() as conn:
            rows = set(conn.execute(text("SELECT hour, kind, source, count, seconds FROM event_rollups")).all())
        assert rows == {(whole, "miss", "warm", 2, 0.0), (whole, "compile", "warm", 2, 90.0),
                        (whole, "hit", "job", 1, 60.0), (swept, "miss", "job", 5, 0.0)}
        _downgrade(db, "0004")
        with db.engine.connect() as conn:
            rows = set(conn.execute(text("SELECT hour, kind, count, seconds FROM event_rollups")).all())
        assert rows == {(whole, "miss", 2, 0.0), (whole, "compile", 2, 90.0), (whole, "hit", 1, 60.0),
                        (swept, "miss", 5, 0.0)}
        migrate(db.engine)
        assert current_revision(db.engine) == head_revision()
    finally:
        db.dispose()


def test_0006_binds_nothing_old_and_its_downgrade_keeps_every_row(db_url: str) -> None:
    """At 0005 an entry with a location, a rollup and a token: the upgrade gives them writer ""
    (nobody's: the next writer claims the entry, then it is that writer's), keeps the rollup
    under producer "", and the downgrade drops the columns without losing a row."""
    import time

    import pytest

    from neffcache.server.services import catalog
    from neffcache.server.services.identity import Forbidden, Writer
    from neffcache.server.services.records import EntryIn
    from tests.server.factories import entry

    db = Database(db_url, pool_size=2)
    try:
        migrate(db.engine, "0005")
        old = entry(1)
        with db.engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO entries (id, path, layout, key, namespace, toolchain, state, size, neff_sha256, created,"
                " registered, updated, producer, hit_count) VALUES (1, :p, 'neuronxcc', :k, :ns, 'unknown',"
                " 'SUCCESS', 1, :d, 0, 0, 0, '', 4)"), {"p": old["path"], "k": old["key"], "ns": old["namespace"],
                                                      "d": old["neff_sha256"]})
            conn.execute(text("INSERT INTO entry_locations (entry_id, store, added) VALUES (1, 's3://b', 0)"))
            conn.execute(text("INSERT INTO event_rollups (hour, kind, source, team, model, instance_type, toolchain,"
                              " count, seconds) VALUES (3600, 'hit', 'job', 't', 'm', 'trn2', 'tc', 3, 9.0)"))
            conn.execute(text("INSERT INTO tokens (id, name, scope, secret_sha256, created) "
                              "VALUES ('abcdefabcdef', 'old', 'write', :s, 0)"), {"s": "0" * 64})
        migrate(db.engine)
        with db.engine.connect() as conn:
            assert conn.execute(text("SELECT writer FROM entries")).scalar_one() == ""
            assert conn.execute(text("SELECT writer FROM entry_locations")).scalar_one() == ""
            assert conn.execute(text("SELECT writer, count FROM event_rollups")).one() == ("", 3)
            assert conn.execute(text("SELECT team, prefixes FROM tokens")).one() == ("", "[]")
        claim = [EntryIn.model_validate({**old, "size": 2})]
        db.transact(lambda s: catalog.register_entries(s, claim, time.time(), Writer("alice")))
        with pytest.raises(Forbidden, match="alice"):
            db.transact(lambda s: catalog.register_entries(s, [EntryIn.model_validate({**old, "size": 3})],
                                                           time.time(), Writer("mallory")))
        _downgrade(db, "0005")
        assert "writer" not in {c["name"] for c in inspect(db.engine).get_columns("entries")}
        with db.engine.connect() as conn:
            assert conn.execute(text("SELECT size FROM entries")).scalar_one() == 2
            assert sorted(conn.execute(text("SELECT store FROM entry_locations")).scalars()) == [
                "s3://b", "s3://bucket/prefix"]
            assert conn.execute(text("SELECT count, seconds FROM event_rollups")).one() == (3, 9.0)
        migrate(db.engine)
        assert current_revision(db.engine) == head_revision()
    finally:
        db.dispose()


def test_0007_adds_the_eviction_tables_and_its_downgrade_drops_only_them(db_url: str) -> None:
    """0007 adds ``evictions`` and ``regret_rollups`` and changes nothing else; its downgrade
    drops them and keeps every event."""
    db = Database(db_url, pool_size=2)
    try:
        migrate(db.engine, "0006")
        assert "evictions" not in inspect(db.engine).get_table_names()
        with db.engine.begin() as conn:
            conn.execute(text("INSERT INTO events (event_id, kind, ts, namespace, toolchain, job, model, team, host,"
                              " instance_type, received, writer) VALUES ('e1', 'evict', 1, '', '', '', '', '', '',"
                              " '', 1, '')"))
        migrate(db.engine)
        assert {"evictions", "regret_rollups"} <= set(inspect(db.engine).get_table_names())
        with db.engine.begin() as conn:
            conn.execute(text("INSERT INTO evictions (path, policy, compile_seconds, evicted_at) "
                              "VALUES ('ns/MODULE_1+ab', 'value', 600, 1)"))
            conn.execute(text("INSERT INTO regret_rollups (hour, policy, evictions, regretted, seconds) "
                              "VALUES (0, 'value', 1, 1, 600)"))
        _downgrade(db, "0006")
        tables = set(inspect(db.engine).get_table_names())
        assert "evictions" not in tables and "regret_rollups" not in tables
        with db.engine.connect() as conn:
            assert conn.execute(text("SELECT event_id FROM events")).scalar_one() == "e1"
        migrate(db.engine)
        assert current_revision(db.engine) == head_revision()
    finally:
        db.dispose()
