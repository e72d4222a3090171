"""Alembic environment: uses the connection handed over by ``neffcache.server.storage.db.migrate``, or
builds one from ``sqlalchemy.url`` / ``NEFFCACHE_SERVER_DATABASE_URL`` when run as ``alembic -c``.

No ``fileConfig`` logging setup: the server (or the alembic CLI) owns logging handlers.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from neffcache.server.config import ServerSettings
from neffcache.server.storage.db import make_engine
from neffcache.server.storage.models import Base


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds tables in future migrations.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = context.config.get_main_option("sqlalchemy.url") or ServerSettings().resolved_database_url()
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
run_migrations_online()
