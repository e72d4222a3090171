"""/v1/usage: how often each entry was hit in a window (what ``upgrade-report`` weighs graphs by),
and missed (what ``prune --regret`` matches with eviction tombstones)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status

from neffcache.server.api.deps import ReadAccess
from neffcache.server.api.routes.common import AUTH_ERRORS
from neffcache.server.services.usage import MAX_PAGE, HitsPage, MissesPage, hits_by_path, misses_by_path

router = APIRouter(prefix="/v1/usage", tags=["usage"])
_PRINTABLE = r"^[^\x00-\x1f\x7f]+$"
EpochQuery = Annotated[float | None, Query(ge=946684800, le=7258118400, allow_inf_nan=False)]


@router.get("/hits", name="usage.hits", summary="Hits per entry in a window", responses=AUTH_ERRORS)
def get_hits(
    access: ReadAccess,
    toolchain: Annotated[str, Query(min_length=1, max_length=256, pattern=_PRINTABLE,
                                    description="label, e.g. trn2-lnc2/neuronxcc-2.27.5334.0+f702b353")],
    since: EpochQuery = None,
    until: EpochQuery = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 1000,
    cursor: Annotated[str | None, Query(min_length=1, max_length=1024, pattern=_PRINTABLE,
                                        description="the next_cursor of the previous page")] = None,
) -> HitsPage:
    """Hit events per entry path reported for one toolchain from ``since`` (default: 30 days
    before ``until``) to ``until`` (default now), in path order, one page at a time (follow
    ``next_cursor``). Only events within the server's retention are counted."""
    start, stop = _window(since, until)
    with access.db.read() as session:
        return hits_by_path(session, toolchain, start, stop, limit=limit, cursor=cursor)


def _window(since: float | None, until: float | None) -> tuple[float, float]:
    """The window ``since`` to ``until``: ``until`` defaults to now, ``since`` to 30 days before
    it; an empty or reversed window is the client's error (422), not an empty page."""
    stop = until if until is not None else time.time()
    start = since if since is not None else stop - 30 * 86400
    if start >= stop:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, "since must be before until")
    return start, stop


@router.get("/misses", name="usage.misses", summary="Misses per entry in a window", responses=AUTH_ERRORS)
def get_misses(
    access: ReadAccess,
    toolchain: Annotated[str | None, Query(min_length=1, max_length=256, pattern=_PRINTABLE,
                                           description="only this toolchain's misses (a label)")] = None,
    since: EpochQuery = None,
    until: EpochQuery = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 1000,
    cursor: Annotated[str | None, Query(min_length=1, max_length=1024, pattern=_PRINTABLE,
                                        description="the next_cursor of the previous page")] = None,
) -> MissesPage:
    """Miss events per entry path from ``since`` (default: 30 days before ``until``) to
    ``until`` (default now), with each path's last miss, in path order, one page at a time
    (follow ``next_cursor``). Only events within the server's retention are counted."""
    start, stop = _window(since, until)
    with access.db.read() as session:
        return misses_by_path(session, toolchain, start, stop, limit=limit, cursor=cursor)
