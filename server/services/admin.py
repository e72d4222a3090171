"""The index database as the CLI's ``serve``, ``token`` and ``db`` commands use it, without a
running server: tokens (``token create`` is how a fresh server gets its first one) and the schema.

Callers get values (:class:`TokenInfo`, :class:`SchemaState`), never sessions or engines, and
library errors, never SQLAlchemy's: a malformed database URL is a :class:`ConfigError`, a
database that cannot be reached or used an :class:`IndexServerError` (one line each).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import ParamSpec, TypeVar

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from neffcache.errors import ConfigError, IndexServerError
from neffcache.server.config import ServerSettings
from neffcache.server.services import catalog, tokens
from neffcache.server.services.tokens import TokenInfo
from neffcache.server.storage.db import Database, current_revision, head_revision, migrate

P = ParamSpec("P")
log = logging.getLogger(__name__)
T = TypeVar("T")


@contextmanager
def database_errors() -> Iterator[None]:
    """Turn a bad database URL or an unreachable database into a one-line library error."""
    try:
        yield
    except sa_exc.ArgumentError as exc:
        raise ConfigError(f"bad database URL: {exc}") from None
    except sa_exc.DBAPIError as exc:
        first = str(exc.orig or exc).strip().splitlines()[0]
        raise IndexServerError(f"cannot use the database: {first}") from None


def _plain_errors(method: Callable[P, T]) -> Callable[P, T]:
    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        with database_errors():
            return method(*args, **kwargs)

    return wrapper


def redacted_url(url: str) -> str:
    """``url`` with its password hidden, for output."""
    with database_errors():
        return make_url(url).render_as_string(hide_password=True)


@dataclass(frozen=True)
class SchemaState:
    database: str  # the URL the engine uses, password hidden
    current: str | None  # None: an empty database
    head: str  # the revision this neffcache needs

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head

    def to_json(self) -> dict[str, object]:
        return {"database": self.database, "current": self.current, "head": self.head,
                "up_to_date": self.up_to_date}


class IndexAdmin:
    """One short-lived connection pool to the index database of ``settings``; close it (or use
    ``with``). ``upgrade`` migrates the schema to head first, as every token command needs."""

    @_plain_errors
    def __init__(self, settings: ServerSettings, *, upgrade: bool = True) -> None:
        self._db = Database(settings.resolved_database_url(), pool_size=2)
        try:
            if upgrade:
                self._upgrade()
        except BaseException:
            self._db.dispose()
            raise

    def close(self) -> None:
        self._db.dispose()

    def __enter__(self) -> IndexAdmin:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @_plain_errors
    def schema(self) -> SchemaState:
        engine = self._db.engine
        return SchemaState(engine.url.render_as_string(hide_password=True), current_revision(engine),
                           head_revision())

    @_plain_errors
    def upgrade(self) -> str | None:
        """Upgrade the schema to head; returns the revision it was at (None: empty database).
        Safe while replicas run or start: upgrades take turns (PostgreSQL advisory lock)."""
        before: str | None = current_revision(self._db.engine)
        self._upgrade()
        return before

    def _upgrade(self) -> None:
        """Migrate, then render the entries that have no stored form (all of them after the
        migration that added it; none, found through a partial index, on every later start)."""
        migrate(self._db.engine)

        def progress(done: int) -> None:
            if done % 50_000 < catalog.RENDER_BATCH:
                log.info("rendering the entries' API form: %d done", done)

        rendered = catalog.render_unrendered(self._db, progress=progress)
        if rendered:
            log.info("rendered the API form of %d entries", rendered)

    @_plain_errors
    def has_tokens(self) -> bool:
        """Whether any token that is not revoked exists."""
        with self._db.read() as session:
            return bool(tokens.list_tokens(session, include_revoked=False))

    @_plain_errors
    def create_token(self, name: str, scope: str, *, team: str = "",
                     prefixes: tuple[str, ...] = ()) -> tuple[TokenInfo, str]:
        """The new token and its secret (only its hash is stored); ``team`` and ``prefixes``
        bound what it may write (server/services/identity.py)."""
        with self._db.write() as session:
            created: tuple[TokenInfo, str] = tokens.create_token(session, name, scope, team=team, prefixes=prefixes)
        return created

    @_plain_errors
    def list_tokens(self) -> list[TokenInfo]:
        """Every token, revoked ones included; never their secrets."""
        with self._db.read() as session:
            found: list[TokenInfo] = tokens.list_tokens(session)
        return found

    @_plain_errors
    def revoke_token(self, id_or_name: str) -> TokenInfo | None:
        """Revoke a token by name or id; None when there is no such token."""
        with self._db.write() as session:
            return tokens.revoke_token(session, id_or_name)
