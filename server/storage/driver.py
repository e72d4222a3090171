"""SELECTs on the driver's own connections, without SQLAlchemy's execution machinery.

For the lookup hot paths: one key (server/api/hot.py) and many (``POST /v1/entries/lookup``,
server/services/lookups.py). A profile of a hot lookup under load
(docs/index-server.md#performance) spent a third of the server's CPU in SQLAlchemy around the
query (a pool checkout and return, the execution context, the result wrapper) and a quarter
of that in sqlite3 running it. :class:`DriverRead` and :class:`DriverBatchRead` keep the
statement's SQL text, compiled once for the engine's dialect, and run it on DB-API
connections of their own.

Why the answer cannot change:
- the same SQL text SQLAlchemy would send for the same statement and parameters, so the same
  rows; every column the lookups select is a plain string, integer, float or byte string,
  which neither dialect converts on the way out (server/storage/models.py), and which
  psycopg loads to the same value from PostgreSQL's binary format as from its text format;
- no transaction around one SELECT, as :meth:`.db.Database.single_read`: SQLite in
  autocommit mode (``isolation_level=None``, set by the engine's ``connect`` hook this
  connection went through), PostgreSQL with ``autocommit``. A batch that needs several
  SELECTs runs them in one read-only snapshot (SQLite: a deferred transaction, whose first
  read fixes what it sees in WAL mode; PostgreSQL: REPEATABLE READ, where READ COMMITTED would
  give each SELECT a snapshot of its own);
- the connections come from the engine (``raw_connection().detach()``), so they carry its
  URL, connect arguments and per-connection pragmas; a connection that fails is closed and
  never reused, and the error goes to the caller (the hot path hands the request to the app,
  answered through SQLAlchemy as before; a batch answers 503 if the database is down).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Select

# The IN-list lengths a batch is run with: a slice is padded (with a repeat of one of its own
# values, which an IN list ignores) to the next of these, so each dialect sees at most four
# statement texts, each prepared once per connection. 2,000 stays far below SQLite's 32,766
# bound variables (999 before 3.32, which Python's own builds have long passed) and
# PostgreSQL's 65,535.
IN_LIST_SIZES = (16, 128, 1024, 2000)
_SNAPSHOT = {"sqlite": "BEGIN", "postgresql": "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"}
# Rows in PostgreSQL's binary format: an entry's stored API form (a bytea of ~800 bytes) then
# crosses as its bytes, where the text format doubles it in hex for the server to encode and
# psycopg to decode; a batch of 1,000 keys on one connection went from 63-75k to 94-97k keys/s
# (docs/index-server.md#performance). psycopg loads each column type the lookups read (text,
# integer, double, bytea) to the same Python value from either format.
_CURSOR_OPTIONS: dict[str, dict[str, Any]] = {"sqlite": {}, "postgresql": {"binary": True}}


class _Connections:
    """DB-API connections detached from ``engine``, reused newest first; one that failed is
    closed by the caller's ``with`` and never handed out again."""

    def __init__(self, engine: Engine, *, autocommit: bool) -> None:
        self._engine = engine
        self._autocommit = autocommit
        self._cursor_options = _CURSOR_OPTIONS[engine.dialect.name]
        self._idle: list[Any] = []  # not in use, newest last
        self._lock = threading.Lock()

    @contextmanager
    def one(self) -> Iterator[Any]:
        conn = self._checkout()
        try:
            yield conn
        except BaseException:
            conn.close()  # its state is unknown: never handed out again
            raise
        with self._lock:
            self._idle.append(conn)

    def cursor(self, conn: Any) -> Any:
        """A cursor of ``conn`` (one of :meth:`one`'s), in the dialect's row format."""
        return conn.cursor(**self._cursor_options)

    def _checkout(self) -> Any:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        proxied = self._engine.raw_connection()
        conn: Any = proxied.driver_connection
        proxied.detach()  # ours from now on; the pool opens another in its place when it needs one
        if self._autocommit:
            conn.rollback()  # no transaction may be open when autocommit is switched on
            conn.autocommit = True
        return conn

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class DriverRead:
    """``first(value)``: the first row of ``statement`` with its bind parameter ``name`` set to
    ``value`` (any other parameter keeps the value the statement gave it, such as a literal
    SQLAlchemy bound), as a tuple in the statement's column order, or None."""

    def __init__(self, engine: Engine, statement: Select[Any], name: str, *, autocommit: bool) -> None:
        compiled = statement.compile(dialect=engine.dialect)
        if name not in compiled.binds:
            raise ValueError(f"the statement has no bind parameter {name!r}")
        defaults = compiled.construct_params({name: None})
        self.sql = str(compiled)
        self.connections = _Connections(engine, autocommit=autocommit)
        self._name = name
        self._positions: tuple[str, ...] | None = tuple(compiled.positiontup or ()) if compiled.positional else None
        self._defaults = defaults

    def _parameters(self, value: object) -> Any:
        if self._positions is None:
            return {**self._defaults, self._name: value}
        return tuple(value if n == self._name else self._defaults[n] for n in self._positions)

    def first(self, value: object) -> Sequence[Any] | None:
        with self.connections.one() as conn:
            cursor = self.connections.cursor(conn)
            cursor.execute(self.sql, self._parameters(value))
            row = cursor.fetchone()
            cursor.close()
        return tuple(row) if row is not None else None

    def close(self) -> None:
        self.connections.close()


class DriverBatchRead:
    """``rows(values)``: every row of ``statement``, whose bind parameter ``name`` is an
    expanding IN list (``bindparam(name, expanding=True)``), for ``values``; one SELECT per
    :data:`IN_LIST_SIZES` slice, all in one snapshot. Rows are tuples in the statement's
    column order; a value matched by no row has none, a repeated value matches once."""

    def __init__(self, engine: Engine, statement: Select[Any], name: str, *, autocommit: bool) -> None:
        compiled = statement.compile(dialect=engine.dialect)
        if name not in compiled.binds or not compiled.binds[name].expanding:
            raise ValueError(f"the statement has no expanding bind parameter {name!r}")
        self._bind: dict[int, Callable[[Sequence[object]], Any]] = {}
        self._sql: dict[int, str] = {}
        for size in IN_LIST_SIZES:
            self._sql[size], self._bind[size] = _expanded(compiled, name, size)
        self._begin = _SNAPSHOT[engine.dialect.name]
        self._driver_error: type[Exception] = engine.dialect.loaded_dbapi.Error
        self.connections = _Connections(engine, autocommit=autocommit)

    def rows(self, values: Sequence[object]) -> list[tuple[Any, ...]]:
        if not values:
            return []
        if len(values) <= IN_LIST_SIZES[-1]:  # one SELECT is consistent on its own: no BEGIN round
            with self._errors(), self.connections.one() as conn:
                cursor = self.connections.cursor(conn)
                found = self.run(cursor, values)
                cursor.close()
            return found
        with self.snapshot() as cursor:
            return self.run(cursor, values)

    @contextmanager
    def snapshot(self) -> Iterator[Any]:
        """A cursor in one read-only snapshot, for :meth:`run` of this reader and of others
        made on the same engine: what they return is the catalog at one moment."""
        with self._errors(), self.connections.one() as conn:  # a failure closes it, and its transaction
            cursor = self.connections.cursor(conn)
            cursor.execute(self._begin)
            yield cursor
            cursor.execute("COMMIT")
            cursor.close()

    def run(self, cursor: Any, values: Sequence[object]) -> list[tuple[Any, ...]]:
        """The rows for ``values`` on ``cursor`` (one of :meth:`snapshot`'s): a SELECT per slice."""
        largest = IN_LIST_SIZES[-1]
        found: list[tuple[Any, ...]] = []
        with self._errors():
            for start in range(0, len(values), largest):
                part = values[start:start + largest]
                size = next(s for s in IN_LIST_SIZES if s >= len(part))
                padded = [*part, *[part[-1]] * (size - len(part))]
                cursor.execute(self._sql[size], self._bind[size](padded))
                found.extend(map(tuple, cursor.fetchall()))
        return found

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except self._driver_error as exc:  # as SQLAlchemy raises it: a dead database is the app's 503
            raise DBAPIError.instance(self._sql[IN_LIST_SIZES[-1]], None, exc, self._driver_error) from exc

    def close(self) -> None:
        self.connections.close()


def _expanded(compiled: Any, name: str, size: int) -> tuple[str, Callable[[Sequence[object]], Any]]:
    """The SQL text of ``compiled`` with ``name`` expanded to ``size`` placeholders, and how to
    make its parameters from ``size`` values (the statement's other binds keep their values)."""
    marks = [f"\x00{i}" for i in range(size)]  # values no real parameter has
    marked = set(marks)
    state = compiled.construct_expanded_state({name: marks})
    if compiled.positional:
        template = list(state.positional_parameters)
        slots = [i for i, value in enumerate(template) if value in marked]
        first, last = slots[0], slots[-1] + 1
        if slots != list(range(first, last)):
            raise ValueError(f"the placeholders of {name!r} are not contiguous")
        head, tail = tuple(template[:first]), tuple(template[last:])
        return state.statement, lambda values: (*head, *values, *tail)
    defaults = {key: value for key, value in state.parameters.items() if value not in marked}
    names = [key for key, value in state.parameters.items() if value in marked]
    return state.statement, lambda values: {**defaults, **dict(zip(names, values, strict=True))}
