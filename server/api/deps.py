"""What routes depend on: the per-app state, the database, and authentication by scope.

Authentication: ``Authorization: Bearer <token>``. No token -> 401 (unless the route needs only
read and anonymous reads are enabled); an unknown, malformed or revoked token -> 401; a valid
token without the scope -> 403; an address that failed too many token checks lately -> 429 for
tokens not verified already (server/api/auth_limits.py). :func:`_identify` is the one place
a presented token becomes an identity. The dashboard may also carry the token in a SameSite=Strict
cookie, accepted for read scope only, so a cross-site form can never write with it.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated

import jinja2
from fastapi import Depends, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from neffcache.server.api.auth_limits import FailedTokens
from neffcache.server.config import ServerSettings
from neffcache.server.observability.metrics import Metrics
from neffcache.server.services import tokens
from neffcache.server.services.identity import Writer
from neffcache.server.storage.db import Database

log = logging.getLogger(__name__)
TOKEN_COOKIE = "neffcache_token"  # noqa: S105 - a cookie name
_TOUCH_EVERY = 60.0  # last_used is a hint for operators; one write a minute per token is plenty


@dataclass(frozen=True)
class Principal:
    name: str
    scope: str
    anonymous: bool = False
    team: str = ""  # what the token may write: services/identity.py
    prefixes: tuple[str, ...] = ()

    @property
    def writer(self) -> Writer:
        """The identity a write of this principal is recorded under and held to."""
        return Writer(name=self.name, team=self.team, prefixes=self.prefixes, admin=self.scope == "admin")


@dataclass
class TokenCache:
    """Verified tokens for a few seconds, so lookups do not pay a token query each. A revocation
    reaches other replicas within ``ttl`` seconds; the replica that revokes drops its copy at once."""

    ttl: float
    _items: dict[str, tuple[tokens.TokenInfo, float]] = field(default_factory=dict)
    _touched: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, presented: str) -> tokens.TokenInfo | None:
        with self._lock:
            item = self._items.get(presented)
        if item is None or item[1] < time.monotonic():
            return None
        return item[0]

    def put(self, presented: str, info: tokens.TokenInfo) -> None:
        if self.ttl <= 0:
            return
        with self._lock:
            if len(self._items) > 4096:
                self._items.clear()
            self._items[presented] = (info, time.monotonic() + self.ttl)

    def forget(self, token_id: str) -> None:
        with self._lock:
            self._items = {k: v for k, v in self._items.items() if v[0].id != token_id}

    def settled(self, presented: str) -> bool:
        """Cached and stamped recently: checking it needs no database at all."""
        info = self.get(presented)
        if info is None:
            return False
        with self._lock:
            return time.monotonic() - self._touched.get(info.id, -_TOUCH_EVERY) < _TOUCH_EVERY

    def due_for_touch(self, token_id: str) -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self._touched.get(token_id, -_TOUCH_EVERY) < _TOUCH_EVERY:
                return False
            self._touched[token_id] = now
            return True


@dataclass
class AppState:
    settings: ServerSettings
    db: Database
    metrics: Metrics
    token_cache: TokenCache
    templates: jinja2.Environment
    failed_tokens: FailedTokens


# Dependencies are async on purpose: FastAPI runs a sync dependency in the thread pool, and a
# thread hop per dependency per request costs more than the database lookup the request is for.
async def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.neffcache
    return state


StateDep = Annotated[AppState, Depends(get_state)]
_bearer = HTTPBearer(auto_error=False, description="a neffcache token: `neffcache token create NAME --scope read`")
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"})


def is_admin(state: AppState, presented: str) -> bool:
    admin = state.settings.admin_token
    return admin is not None and hmac.compare_digest(presented.encode(), admin.get_secret_value().encode())


def _identify(state: AppState, presented: str, client: str | None) -> Principal | None:
    """Who ``presented`` is, or None; raises 429 when ``client`` (an address) must wait before
    a token it presents is checked (server/api/auth_limits.py)."""
    info = state.token_cache.get(presented)
    if info is None:
        # Before the bootstrap admin comparison too: guesses at that secret are guesses as well.
        state.failed_tokens.check(client)
        if is_admin(state, presented):
            return Principal(name="bootstrap-admin", scope="admin")
        with state.db.read() as session:
            info = tokens.verify_token(session, presented)
        if info is None:
            state.failed_tokens.failed(client)
            return None
        state.token_cache.put(presented, info)
    if state.token_cache.due_for_touch(info.id):
        try:
            with state.db.write() as session:
                tokens.touch_token(session, info.id, time.time())
        except Exception:  # a busy database must not fail the request this stamp rides on
            log.debug("could not stamp last_used of token %s", info.id, exc_info=True)
    return Principal(name=info.name, scope=info.scope, team=info.team, prefixes=info.prefixes)


def check_access(state: AppState, presented: str | None, scope: str, client: str | None = None) -> Principal:
    """The principal ``presented`` stands for, if it may act with ``scope``; else 401/403, or
    429 when ``client``, the request's address, failed too many token checks lately."""
    if presented is None:
        if scope == "read" and state.settings.anonymous_read:
            return Principal(name="anonymous", scope="read", anonymous=True)
        raise _unauthorized("authentication required: send 'Authorization: Bearer <token>'")
    principal = _identify(state, presented, client)
    if principal is None:
        raise _unauthorized("invalid or revoked token")
    if not tokens.scope_allows(principal.scope, scope):
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"token {principal.name!r} has scope {principal.scope!r}; this needs {scope!r}")
    return principal


def presented_token(request: Request, credentials: HTTPAuthorizationCredentials | None, scope: str) -> str | None:
    if credentials is not None:
        return credentials.credentials
    return request.cookies.get(TOKEN_COOKIE) if scope == "read" else None


@dataclass(frozen=True)
class Access:
    """What an authorised route gets: who is asking, and the app's state (database, metrics...)."""

    principal: Principal
    state: AppState

    @property
    def db(self) -> Database:
        return self.state.db

    @property
    def writer(self) -> Writer:
        return self.principal.writer


def require(scope: str) -> Callable[..., Awaitable[Access]]:
    # One dependency (plus HTTPBearer, which documents the scheme in OpenAPI) per route: FastAPI's
    # dependency solving costs more per request than the database lookup it guards.
    async def dependency(request: Request, credentials: BearerDep) -> Access:
        state: AppState = request.app.state.neffcache
        presented = presented_token(request, credentials, scope)
        client = request.client.host if request.client else None
        if presented is None or state.token_cache.settled(presented) or is_admin(state, presented):
            return Access(check_access(state, presented, scope, client), state)  # no database: stay on the loop
        return Access(await run_in_threadpool(check_access, state, presented, scope, client), state)

    dependency.__name__ = f"require_{scope}"
    return dependency


ReadAccess = Annotated[Access, Depends(require("read"))]
WriteAccess = Annotated[Access, Depends(require("write"))]
AdminAccess = Annotated[Access, Depends(require("admin"))]
