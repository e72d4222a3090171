"""The FastAPI application factory.

``create_app(settings)`` builds everything an app needs (engine, metrics registry, templates)
and keeps it on ``app.state``; nothing lives at module level, so ``uvicorn --factory
neffcache.server.app:create_app`` and tests can build as many independent apps as they like.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import jinja2
from fastapi import FastAPI, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import OperationalError

from neffcache import __version__
from neffcache.server.config import Settings
from neffcache.server.db import Database, migrate
from neffcache.server.deps import AppState, TokenCache
from neffcache.server.metrics import Metrics
from neffcache.server.middleware import BodyLimit, RequestMetrics
from neffcache.server.routes import dashboard, entries, events, health, leases, stats, tokens

log = logging.getLogger(__name__)
HERE = Path(__file__).parent

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

    @app.exception_handler(OperationalError)
    async def _database_down(request: Request, exc: OperationalError) -> JSONResponse:
        log.warning("database unavailable: %s", exc.orig)
        return JSONResponse({"detail": "database unavailable, retry shortly"},
                            status_code=status.HTTP_503_SERVICE_UNAVAILABLE, headers={"Retry-After": "1"})


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build an index server app. ``settings`` default to the ``NEFFCACHE_SERVER_*`` environment."""
    settings = settings if settings is not None else Settings()
    db = Database(settings.resolved_database_url(), pool_size=settings.pool_size)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.auto_migrate:
            await run_in_threadpool(migrate, db.engine)
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
                      top_n=settings.metrics_top_n)
    templates = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined)
    app.state.neffcache = AppState(settings=settings, db=db, metrics=metrics,
                                   token_cache=TokenCache(ttl=settings.token_cache_seconds), templates=templates)
    for module in (entries, events, leases, stats, tokens, health, dashboard):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    _install_handlers(app)
    # Added last = outermost: the body limit runs before routing, metrics see every response.
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(RequestMetrics, metrics=metrics)
    return app
