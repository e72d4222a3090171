"""SQL text run on a session's own connection, for the write paths hot enough to pay for it.

Building a statement with SQLAlchemy Core costs its compile-cache lookup and, per row, a pass
over every bind parameter (``construct_params``) before the driver sees a value: for a batch of
500 events that was most of the ingest's Python time (docs/index-server.md#performance). The
statements here are fixed strings of the one SQL both databases speak (``INSERT ... ON CONFLICT``,
``RETURNING``, ``UPDATE``), with positional parameters bound by the driver itself, so rows go to
it as the tuples they already are.

Only names written in this repository's code ever reach the SQL text (tables and columns from
storage/models.py); every value is a bound parameter.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

# SQLite's bound-parameter limit is 32,766 (since 3.32), PostgreSQL's 65,535: a statement
# carries at most this many, whatever the width of its rows.
MAX_PARAMETERS = 16_000


class DriverSQL:
    """The connection of ``session``'s transaction, spoken to in the driver's own placeholders
    (``?`` for sqlite3, ``%s`` for psycopg)."""

    def __init__(self, session: Session) -> None:
        self.connection: Connection = session.connection()
        self.postgresql = self.connection.dialect.name == "postgresql"
        self.mark = "%s" if self.postgresql else "?"

    def rows(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """One statement, its result rows (RETURNING or SELECT)."""
        return [tuple(row) for row in self.connection.exec_driver_sql(sql, tuple(params))]

    def run_many(self, sql: str, params: Sequence[Sequence[Any]]) -> None:
        """One statement for each parameter row (the driver's executemany)."""
        if params:
            self.connection.exec_driver_sql(sql, [tuple(row) for row in params])


def slices(rows: Sequence[Any], width: int) -> Iterator[Sequence[Any]]:
    """Slices of ``rows`` whose parameters (``width`` each) stay within :data:`MAX_PARAMETERS`."""
    size = max(1, MAX_PARAMETERS // max(1, width))
    for start in range(0, len(rows), size):
        yield rows[start:start + size]


def marks(mark: str, count: int) -> str:
    """``?, ?, ?``: ``count`` placeholders, for an IN list or one row of VALUES."""
    return ", ".join([mark] * count)


def values(mark: str, width: int, count: int) -> str:
    """``(?, ?), (?, ?)``: ``count`` rows of ``width`` placeholders."""
    return ", ".join([f"({marks(mark, width)})"] * count)
