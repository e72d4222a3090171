"""One SELECT on the driver's own connection, without SQLAlchemy's execution machinery.

For the single-key lookup hot path (server/api/hot.py). A profile of a hot lookup under load
(docs/index-server.md#performance) spent a third of the server's CPU in SQLAlchemy around the
query (a pool checkout and return, the execution context, the result wrapper) and a quarter
of that in sqlite3 running it. :class:`DriverRead` keeps the statement's SQL text, compiled
once for the engine's dialect, and runs it on a DB-API connection of its own.

Why the answer cannot change:
- the same SQL text SQLAlchemy would send for the same statement and parameter, so the same
  row; every column the lookup selects is a plain string, integer or float, which neither
  dialect converts on the way out (server/storage/models.py);
- no transaction around the one SELECT, as :meth:`.db.Database.single_read`: SQLite in
  autocommit mode (``isolation_level=None``, set by the engine's ``connect`` hook this
  connection went through), PostgreSQL with ``autocommit``;
- the connections come from the engine (``raw_connection().detach()``), so they carry its
  URL, connect arguments and per-connection pragmas; a connection that fails is closed and
  never reused, and the error goes to the caller, which hands the request to the app
  (answered through SQLAlchemy as before, a 503 if the database is down).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.sql import Select


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
        self._engine = engine
        self._autocommit = autocommit
        self._name = name
        self._positions: tuple[str, ...] | None = tuple(compiled.positiontup or ()) if compiled.positional else None
        self._defaults = defaults
        self._idle: list[Any] = []  # DB-API connections not in use, newest last
        self._lock = threading.Lock()

    def _parameters(self, value: object) -> Any:
        if self._positions is None:
            return {**self._defaults, self._name: value}
        return tuple(value if n == self._name else self._defaults[n] for n in self._positions)

    def first(self, value: object) -> Sequence[Any] | None:
        conn = self._checkout()
        try:
            cursor = conn.cursor()
            cursor.execute(self.sql, self._parameters(value))
            row = cursor.fetchone()
            cursor.close()
        except BaseException:
            conn.close()  # its state is unknown: never handed out again
            raise
        with self._lock:
            self._idle.append(conn)
        return tuple(row) if row is not None else None

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
