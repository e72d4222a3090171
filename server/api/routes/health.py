"""/healthz (the process answers), /readyz (the database answers at the expected schema), /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from neffcache.server.api.deps import ReadAccess, StateDep
from neffcache.server.api.routes.common import AUTH_ERRORS
from neffcache.server.storage.db import current_revision, head_revision

router = APIRouter(tags=["health"])


@router.get("/healthz", name="health.live", summary="Liveness")
async def healthz() -> dict[str, str]:
    """Liveness: the process serves HTTP. Never touches the database (a database outage must not
    make an orchestrator restart every replica)."""
    return {"status": "ok"}


@router.get("/readyz", name="health.ready", summary="Readiness",
            responses={503: {"description": "database down or schema behind"}})
def readyz(state: StateDep) -> JSONResponse:
    """Readiness: the database answers and its schema is at this server's head revision."""
    try:
        revision = current_revision(state.db.engine)
    except Exception as exc:  # any database failure means "not ready", with the reason
        return JSONResponse({"status": "unavailable", "detail": f"database: {type(exc).__name__}"},
                            status_code=status.HTTP_503_SERVICE_UNAVAILABLE)
    head = head_revision()
    if revision != head:
        return JSONResponse({"status": "unavailable", "detail": f"schema at {revision}, server needs {head}"},
                            status_code=status.HTTP_503_SERVICE_UNAVAILABLE)
    return JSONResponse({"status": "ok", "database": state.db.dialect, "schema": revision})


@router.get("/metrics", name="metrics", summary="Prometheus metrics",
            responses={**AUTH_ERRORS, 200: {"content": {"text/plain": {}}}})
async def metrics(access: ReadAccess) -> Response:
    """Prometheus exposition. Request counters are this replica's; cache facts come from the database."""
    body = await run_in_threadpool(access.state.metrics.render)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
