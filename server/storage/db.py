"""Engines, sessions and schema migrations for SQLite and PostgreSQL.

SQLite runs in WAL mode so readers never block the writer, and write transactions start with
``BEGIN IMMEDIATE``: a deferred transaction that reads first and writes later can fail at once
with SQLITE_BUSY (no busy-timeout retry) when another writer committed in between.
PostgreSQL write transactions that deadlock or fail serialisation are retried a few times.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import FunctionElement
from sqlalchemy.types import Double, String

from neffcache.errors import ConfigError
from neffcache.server.storage.driver import DriverBatchRead, DriverRead
from neffcache.server.storage.write_turn import WriteTurn

log = logging.getLogger(__name__)

T = TypeVar("T")
MIGRATIONS_DIR = Path(__file__).with_name("migrations")
# Arbitrary constant: the PostgreSQL advisory lock replicas take while upgrading the schema.
_MIGRATION_LOCK = 0x6E6566_66
_WRITE_OPTION = "neffcache_write"
_SINGLE_READ_OPTION = "neffcache_single_read"
# Address space, not memory: only the pages a query touches are mapped in, and they are the
# page cache's (a 1M-entry index is about 1.1 GB).
SQLITE_MMAP_BYTES = 4 << 30
SQLITE_CHECKPOINT_PAGES = 10_000


class db_now(FunctionElement[float]):  # noqa: N801 - reads like the SQL function it renders
    """The database clock as epoch seconds. Leases compare against this one clock, so replicas
    whose clocks drift apart still agree on who holds a lease."""

    type = Double()
    inherit_cache = True


@compiles(db_now, "postgresql")
def _now_pg(element: db_now, compiler: Any, **kw: Any) -> str:
    # clock_timestamp(), not now(): now() is frozen at transaction start.
    return "EXTRACT(EPOCH FROM clock_timestamp())::float8"


@compiles(db_now, "sqlite")
def _now_sqlite(element: db_now, compiler: Any, **kw: Any) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"


class string_list(FunctionElement[str]):  # noqa: N801 - reads like the SQL aggregate it renders
    """Aggregate strings into one newline-separated string (values never contain control characters)."""

    type = String()
    inherit_cache = True


@compiles(string_list, "postgresql")
def _string_list_pg(element: string_list, compiler: Any, **kw: Any) -> str:
    return f"string_agg({compiler.process(element.clauses, **kw)}, E'\\n')"


@compiles(string_list, "sqlite")
def _string_list_sqlite(element: string_list, compiler: Any, **kw: Any) -> str:
    return f"group_concat({compiler.process(element.clauses, **kw)}, char(10))"


def is_sqlite(engine: Engine | Connection) -> bool:
    return engine.dialect.name == "sqlite"


def make_engine(url: str, *, pool_size: int = 10) -> Engine:
    parsed = make_url(url)
    if parsed.drivername == "postgres":
        # Heroku, many PaaS and psql itself write postgres://; SQLAlchemy dropped the alias.
        parsed = parsed.set(drivername="postgresql")
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise ConfigError(f"the index supports SQLite and PostgreSQL databases, not {backend!r} "
                          f"(e.g. postgresql+psycopg://user@host:5432/neffcache)")
    if parsed.drivername == "postgresql":
        # `postgresql://` means psycopg2 to SQLAlchemy; neffcache ships psycopg 3.
        parsed = parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            parsed, connect_args={"timeout": 30, "check_same_thread": False},
            pool_size=pool_size, max_overflow=pool_size * 2,
        )
        _configure_sqlite(engine)
        return engine
    # No pool_pre_ping: it costs a round trip per request; a connection that died with a database
    # restart is invalidated on its first error (503 to that one client, which retries).
    return create_engine(parsed, pool_size=pool_size, max_overflow=pool_size * 2, pool_recycle=1800)


def _use_wal(cursor: Any, *, seconds: float = 30.0) -> None:
    """Put the database file in WAL mode (it stays there: later connections only check).

    Switching needs an exclusive lock, and SQLite answers "database is locked" at once, without
    its busy handler, when two connections that both read the file ask for it together (it
    would otherwise deadlock). Replicas starting on a new file do exactly that
    (tests/server/test_migrations.py), so the switch is retried for ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module so BEGIN IMMEDIATE is ours to issue.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        _use_wal(cursor)
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        # Reads through a memory map of the file: pages come from the OS page cache, shared by
        # every connection and worker, instead of a read() into each connection's 2 MiB cache;
        # a batch lookup's SELECT ran 1.3x faster (docs/index-server.md#performance).
        cursor.execute(f"PRAGMA mmap_size={SQLITE_MMAP_BYTES}")
        # Checkpoint the WAL every ~40 MB instead of every 4 MB: a batch of 500 events with random
        # ids dirtied ~1,500 index pages, so at the default every commit paid for a checkpoint;
        # ingest CPU fell 64 -> 50 us an event (docs/index-server.md#performance).
        cursor.execute(f"PRAGMA wal_autocheckpoint={SQLITE_CHECKPOINT_PAGES}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        options = conn.get_execution_options()
        if options.get(_SINGLE_READ_OPTION):
            return  # one SELECT is consistent on its own; skip the BEGIN round of a transaction
        conn.exec_driver_sql("BEGIN IMMEDIATE" if options.get(_WRITE_OPTION) else "BEGIN")


class Database:
    """One engine plus the two kinds of session the server needs."""

    def __init__(self, url: str, *, pool_size: int = 10) -> None:
        self.url = url
        self.engine = make_engine(url, pool_size=pool_size)
        self._write_engine = self.engine.execution_options(**{_WRITE_OPTION: True})
        self._write_turn: WriteTurn | None = (
            WriteTurn(self.engine.url.database) if self.engine.dialect.name == "sqlite" else None)
        self._driver_reads: list[DriverRead | DriverBatchRead] = []
        self._batch_reads: dict[tuple[int, str], tuple[Any, DriverBatchRead]] = {}
        self._readers_lock = threading.Lock()
        single: dict[str, Any] = {_SINGLE_READ_OPTION: True}
        if self.inline_reads:
            # Its own small pool: inline reads run on the event loop, which must never wait for a
            # connection that a batch write in the thread pool is holding.
            self._single_read_engine = make_engine(url, pool_size=1).execution_options(**single)
        else:
            single["isolation_level"] = "AUTOCOMMIT"  # no BEGIN/ROLLBACK round trips around one SELECT
            self._single_read_engine = self.engine.execution_options(**single)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @property
    def inline_reads(self) -> bool:
        """Whether a single indexed read may run on the event loop. SQLite: yes, it is an
        in-process call of microseconds that never waits for a lock in WAL mode, cheaper than a
        thread-pool hop. PostgreSQL: no, it waits for a network round trip, during which the
        loop must keep serving other requests."""
        return self.engine.dialect.name == "sqlite"

    @contextmanager
    def read(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            yield session

    @contextmanager
    def single_read(self) -> Iterator[Connection]:
        """A connection for exactly one SELECT (the lookup hot path): no transaction around it."""
        with self._single_read_engine.connect() as conn:
            yield conn

    @property
    def _driver_engine(self) -> Engine:
        """The engine driver reads detach their connections from: on SQLite the inline reads'
        own, elsewhere the main one (one home for that choice, for both kinds of driver read)."""
        return self._single_read_engine.engine if self.inline_reads else self.engine

    def driver_read(self, statement: Any, name: str) -> DriverRead:
        """``statement`` (one SELECT, bind parameter ``name``) run on DB-API connections of
        its own, as :meth:`single_read` would run it: the lookup hot path (storage/driver.py)."""
        read = DriverRead(self._driver_engine, statement, name, autocommit=not self.inline_reads)
        self._driver_reads.append(read)
        return read

    def driver_batch_read(self, statement: Any, name: str) -> DriverBatchRead:
        """``statement`` (one SELECT, ``name`` an expanding IN list) run on DB-API connections
        of its own, one per batch at a time (storage/driver.py). One reader per statement object
        (the services build theirs once, at import), made on first use."""
        with self._readers_lock:
            known = self._batch_reads.get((id(statement), name))
            if known is not None and known[0] is statement:  # kept alive by the entry: its id is its own
                return known[1]
            read = DriverBatchRead(self._driver_engine, statement, name, autocommit=not self.inline_reads)
            self._batch_reads[(id(statement), name)] = (statement, read)
            self._driver_reads.append(read)
        return read

    @contextmanager
    def write(self) -> Iterator[Session]:
        # SQLite has one writer at a time and its busy handler polls without a queue: threads and
        # worker processes queue for their turn instead (storage/write_turn.py).
        turn = self._write_turn if self._write_turn is not None else contextlib.nullcontext()
        with turn, Session(self._write_engine, expire_on_commit=False) as session, session.begin():
            yield session

    def transact(self, work: Callable[[Session], T], *, attempts: int = 4) -> T:
        """Run ``work`` in a write transaction, retrying deadlocks and serialisation failures."""
        for attempt in range(1, attempts + 1):
            try:
                with self.write() as session:
                    return work(session)
            except (OperationalError, DBAPIError) as exc:
                if attempt == attempts or not _retryable(exc):
                    raise
                log.info("retrying write transaction after %s", type(exc.orig).__name__)
                time.sleep(0.01 * 2**attempt)
        raise AssertionError("unreachable")

    def dispose(self) -> None:
        for read in self._driver_reads:
            read.close()
        self.engine.dispose()
        if self._write_turn is not None:
            self._write_turn.close()
        if self.inline_reads:
            self._single_read_engine.engine.dispose()


def _retryable(exc: DBAPIError) -> bool:
    sqlstate = getattr(exc.orig, "sqlstate", None)
    return sqlstate in ("40001", "40P01")


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


# Alembic runs env.py through a process-global ``context`` proxy: two upgrades in threads of one
# process would trample each other, so they take turns here. Across processes the database
# serialises them (PostgreSQL advisory lock; SQLite BEGIN IMMEDIATE on the migration connection).
_MIGRATE_IN_PROCESS = threading.Lock()


def migrate(engine: Engine, revision: str = "head") -> None:
    """Upgrade the schema to ``revision``; safe to call from several replicas at once."""
    with _MIGRATE_IN_PROCESS:
        _migrate(engine, revision)


def _migrate(engine: Engine, revision: str) -> None:
    cfg = alembic_config()
    with engine.execution_options(**{_WRITE_OPTION: True}).connect() as conn:
        if conn.dialect.name == "postgresql":
            # Session-level lock held across Alembic's own transaction: replicas upgrade one by one.
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _MIGRATION_LOCK})
            conn.commit()
        try:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            conn.commit()
        finally:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _MIGRATION_LOCK})
                conn.commit()


def upsert(session: Session, model: Any) -> Any:
    """The dialect's INSERT that has ``on_conflict_do_nothing/do_update`` (both speak the
    PostgreSQL ON CONFLICT syntax; SQLite since 3.24, with RETURNING since 3.35)."""
    if session.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(model)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(model)
