"""The FastAPI application factory.

``create_app(settings)`` builds everything an app needs (engine, metrics registry, templates)
and keeps it on ``app.state``; nothing lives at module level, so ``uvicorn --factory
neffcache.server.app:create_app`` and tests can build as many independent apps as they like.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import jinja2
from fastapi import FastAPI, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from neffcache import __version__
from neffcache.server.api.auth_limits import FailedTokens
from neffcache.server.api.deps import AppState, TokenCache
from neffcache.server.api.hot import HotLookups
from neffcache.server.api.routes import entries, events, failures, health, leases, stats, tokens, upgrades, usage
from neffcache.server.config import ServerSettings
from neffcache.server.connections import GuardedConfig, Limits, connection_cap
from neffcache.server.observability.metrics import Metrics
from neffcache.server.observability.middleware import BodyLimit, RequestMetrics
from neffcache.server.services.identity import Forbidden
from neffcache.server.services.prices import prices_of
from neffcache.server.storage.db import Database, migrate
from neffcache.server.ui import dashboard
from neffcache.server.workers import Workers, listening_sockets

__all__ = ["FACTORY", "create_app", "listening_sockets", "serve", "worker_environment"]

log = logging.getLogger(__name__)

DESCRIPTION = """\
The neffcache index: which compiled graphs (NEFFs) exist in which stores, every cache hit, miss
and compile reported by clients, single-flight compile leases, and the statistics built on them.

Authenticate with `Authorization: Bearer <token>` (`neffcache token create NAME --scope read|write|admin`).
"""


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors()[:10]:
        where = ".".join(str(p) for p in error.get("loc", ()))
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # One readable sentence first, the structured errors after (without echoing the input back).
        errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
                  for e in exc.errors()[:50]]
        return JSONResponse({"detail": _validation_message(exc), "errors": errors},
                            status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # FastAPI answers 400 for a body json.loads raised on with anything but a JSONDecodeError
        # (invalid UTF-8, nesting deeper than the parser's recursion limit), 422 for every other
        # malformed body. One status for "this is not the JSON the route takes": 422, as
        # docs/index-server.md says and as clients set the batch aside on.
        if exc.status_code == status.HTTP_400_BAD_REQUEST and isinstance(exc.__cause__, (ValueError, RecursionError)):
            why = "nested too deeply" if isinstance(exc.__cause__, RecursionError) else "not UTF-8 JSON"
            return JSONResponse({"detail": f"body: {why}", "errors": [
                {"loc": ["body"], "msg": why, "type": "json_invalid"}]},
                status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)
        return await http_exception_handler(request, exc)

    @app.exception_handler(Forbidden)
    async def _forbidden(request: Request, exc: Forbidden) -> JSONResponse:
        # A write the token's identity may not make (services/identity.py). The refused items of a
        # batch are named as a 422 names invalid ones, so a client sets them aside and sends the rest.
        errors = [{"loc": ["body", item.index, item.field], "msg": item.reason, "type": "forbidden"}
                  for item in exc.items]  # at most a batch (MAX_BATCH): every one, so one resend suffices
        return JSONResponse({"detail": str(exc), "errors": errors}, status_code=status.HTTP_403_FORBIDDEN)

    @app.exception_handler(OperationalError)
    async def _database_down(request: Request, exc: OperationalError) -> JSONResponse:
        log.warning("database unavailable: %s", exc.orig)
        return JSONResponse({"detail": "database unavailable, retry shortly"},
                            status_code=status.HTTP_503_SERVICE_UNAVAILABLE, headers={"Retry-After": "1"})


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    """Build an index server app. ``settings`` default to the ``NEFFCACHE_SERVER_*`` environment."""
    settings = settings if settings is not None else ServerSettings()
    db = Database(settings.resolved_database_url(), pool_size=settings.pool_size)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.auto_migrate:
            await run_in_threadpool(migrate, db.engine)
        # What exists now (modules, the app, its routes and schemas) lives as long as the process:
        # out of the collector's generations, a full collection no longer walks it, and a batch
        # lookup's thousand rendered rows set one off again and again.
        gc.freeze()
        try:
            yield
        finally:
            db.dispose()

    # FastAPI's own OpenTelemetry instrumentation is off unless asked for: Prometheus covers the
    # server's metrics, and a host process with global OTel providers would otherwise start
    # exporting a span and metrics for every cache lookup without anyone deciding to.
    otel = settings.opentelemetry
    app = FastAPI(title="neffcache index", version=__version__, description=DESCRIPTION, lifespan=lifespan,
                  telemetry={"tracing": otel, "metrics": otel, "logs": otel, "operation_spans": otel})
    metrics = Metrics(db, teams=settings.metrics_teams, toolchains=settings.metrics_toolchains,
                      top_n=settings.metrics_top_n, prices=prices_of(settings),
                      readiness_window=settings.readiness_window_days * 86400)
    templates = jinja2.Environment(
        loader=jinja2.FileSystemLoader(dashboard.TEMPLATES_DIR), autoescape=True, undefined=jinja2.StrictUndefined)
    app.state.neffcache = AppState(settings=settings, db=db, metrics=metrics,
                                   token_cache=TokenCache(ttl=settings.token_cache_seconds), templates=templates,
                                   failed_tokens=FailedTokens(settings.auth_failures_per_minute))
    for module in (entries, events, failures, leases, stats, tokens, usage, upgrades, health, dashboard):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=dashboard.STATIC_DIR), name="static")
    _install_handlers(app)
    # Added last = outermost: the body limit runs before routing, metrics see every response;
    # the hot lookups innermost, so both still apply to them (server/api/hot.py).
    app.add_middleware(HotLookups, state=app.state.neffcache, routes=entries.router.routes)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(RequestMetrics, metrics=metrics)
    metrics.declare_ops(name for route in app.routes if (name := getattr(route, "name", None)))
    return app


FACTORY = "neffcache.server.app:create_app"


def worker_environment(settings: ServerSettings) -> dict[str, str]:
    """What a uvicorn worker needs in its environment to build the app ``settings`` describe:
    workers are separate processes that call :func:`create_app` with no arguments (``--factory``),
    so the settings reach them as ``NEFFCACHE_SERVER_*`` variables. The schema was upgraded
    before they start, so they skip it."""
    env = {"NEFFCACHE_SERVER_DATABASE_URL": settings.resolved_database_url(), "NEFFCACHE_SERVER_AUTO_MIGRATE": "0"}
    if settings.anonymous_read:
        env["NEFFCACHE_SERVER_ANONYMOUS_READ"] = "1"
    env["NEFFCACHE_SERVER_AUTH_FAILURES_PER_MINUTE"] = str(settings.auth_failures_per_minute)
    if settings.prices:
        env["NEFFCACHE_SERVER_PRICES"] = json.dumps(settings.prices)
        env["NEFFCACHE_SERVER_CURRENCY"] = settings.currency
    return env


def serve(settings: ServerSettings, sockets: list[socket.socket], *, host: str, port: int,
          log_level: str = "info") -> None:
    """Serve the index on ``sockets`` (bound to ``host``:``port`` by
    server/workers.py:listening_sockets) until interrupted: in this process for one socket, else
    in one worker process per socket; the schema must be at head."""
    import uvicorn

    os.environ.update(worker_environment(settings))
    limits = Limits(header_timeout=settings.header_timeout_seconds, body_timeout=settings.body_timeout_seconds,
                    max_connections=settings.max_connections)
    cap = connection_cap(limits.max_connections)
    if cap < limits.max_connections:
        log.warning("at most %d connections per worker, not %d: the descriptor limit (ulimit -n) leaves no more",
                    cap, limits.max_connections)
    # The access log is off unless asked for (--access-log): one formatted line per request cost a
    # third of a worker's lookups (docs/performance.md). Above INFO its lines are dropped anyway,
    # but uvicorn would still format each one's arguments.
    access_log = settings.access_log and log_level.lower() in ("trace", "debug", "info")
    config = GuardedConfig(FACTORY, factory=True, host=host, port=port, workers=len(sockets), limits=limits,
                           log_level=log_level, proxy_headers=True, access_log=access_log)
    if len(sockets) == 1:
        uvicorn.Server(config).run(sockets=sockets)
        return
    workers = Workers(config, sockets)
    workers.run()
    if workers.failed:
        raise SystemExit(1)
