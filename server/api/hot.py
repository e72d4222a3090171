"""The hot path: ``GET /v1/entries/{path}`` answered without FastAPI's routing and dependencies.

A single-key lookup is the request a fleet sends most, and a profile of one (py-spy, 8 clients,
SQLite; docs/index-server.md#performance) spent about two thirds of the server's CPU in the
framework: route matching over every route, dependency solving, the exception and exit-stack
middlewares, against a sixth in the query. :class:`HotLookups` sits just inside the body-limit
and metrics middlewares and answers the cases that dominate, a lookup by a token already
verified that finds its entry (200) or does not (404: a fleet's misses are as frequent as its
hits while a cache fills), with the very pieces the route uses (:func:`~.deps.check_access`,
:func:`~.routes.common.checked_path`, the route's SELECT ``catalog.LOOKUP`` and
``catalog.row_json``, :func:`~.routes.common.not_found`) and the same response classes: a hit
rendered as the route renders it, a miss as FastAPI's handler renders the route's 404. The
SELECT runs on the driver's own connection (server/storage/driver.py): SQLAlchemy's execution
around it had cost twice the query (docs/index-server.md#performance).

Why the contract cannot change: the hot path answers only a 200 or a 404 it is sure of, after
the same checks in the same order. Every other case (no bearer token, a token not verified in
the last minute or that is the wrong scope, a path the route would refuse, any error at all) is
handed to the app untouched, which answers it exactly as before.
The route it stands in for is looked up by name when the app is built, so the metrics label it
the same, and the paths of the routes declared before it (``similar``, ``compile-samples``) are
handed on, as the router would match them first.
"""

from __future__ import annotations

import logging

from fastapi.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from neffcache.server.api.deps import AppState, check_access, is_admin
from neffcache.server.api.responses import FastJSONResponse
from neffcache.server.services import catalog

log = logging.getLogger(__name__)

PREFIX = "/v1/entries/"
ROUTE_NAME = "entries.lookup"


class HotLookups:
    def __init__(self, app: ASGIApp, state: AppState, routes: list[BaseRoute]) -> None:
        self.app = app
        self.state = state
        # The route's SELECT on the driver's own connections (server/storage/driver.py).
        self.read = state.db.driver_read(catalog.LOOKUP, "path")
        self.route = next(r for r in routes if getattr(r, "name", None) == ROUTE_NAME)
        # Paths under the prefix that other GET routes take before the lookup's catch-all.
        self.taken = frozenset(
            path.removeprefix(PREFIX) for r in routes
            if (path := getattr(r, "path", "")).startswith(PREFIX) and path != f"{PREFIX}{{path:path}}"
            and "GET" in (getattr(r, "methods", None) or ()))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = await self._answer(scope) if scope["type"] == "http" and scope["method"] == "GET" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        scope["route"] = self.route  # what RequestMetrics labels the request by
        await found(scope, receive, send)

    async def _answer(self, scope: Scope) -> Response | None:
        """The answer, when this is a lookup the hot path may answer; None hands it to the app."""
        path: str = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        if not path.startswith(PREFIX):
            return None
        rest = path[len(PREFIX):]
        if not rest or rest in self.taken:
            return None
        presented = _bearer(scope)
        state = self.state
        if presented is None or not (state.token_cache.settled(presented) or is_admin(state, presented)):
            return None  # verifying or stamping a token touches the database: the app does it
        # Imported here: the routes import this package's deps, and app.py imports both.
        from neffcache.server.api.routes.common import checked_path, not_found

        try:
            client = scope.get("client")
            check_access(state, presented, "read", client[0] if client else None)
            clean = checked_path(rest)
            read = self.read.first
            row = read(clean) if state.db.inline_reads else await run_in_threadpool(read, clean)
            if row is None:
                # What FastAPI's handler answers for the route's HTTPException, byte for byte.
                missing = not_found(f"entry {clean!r}")
                return JSONResponse({"detail": missing.detail}, status_code=missing.status_code)
            return FastJSONResponse(catalog.row_json(row))
        except Exception:  # refused (HTTPException) or failed: the app answers it, with its own status and body
            log.debug("hot lookup handed to the app", exc_info=True)
            return None


def _bearer(scope: Scope) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, as HTTPBearer reads it."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            text: str = value.decode("latin-1")
            scheme, _, credentials = text.partition(" ")
            if scheme.lower() == "bearer" and credentials:
                return credentials
            return None
    return None
