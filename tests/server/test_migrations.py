"""Alembic upgrades an empty database to head on SQLite and PostgreSQL, matching the models."""

from __future__ import annotations

import subprocess
import sys

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

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
