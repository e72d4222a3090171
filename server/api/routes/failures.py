"""/v1/failures: failed graphs of a window grouped by the signature of their error."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query

from neffcache.server.api.deps import ReadAccess
from neffcache.server.api.routes.common import AUTH_ERRORS
from neffcache.server.api.routes.stats import Window, WindowEnd, window_seconds
from neffcache.server.services.failures import FailuresOut, FailuresQuery, failure_groups

router = APIRouter(prefix="/v1/failures", tags=["failures"])


@router.get("", name="failures.get", summary="Failed graphs grouped by error signature", responses=AUTH_ERRORS)
def get_failures(
    access: ReadAccess,
    window: Window = "7d",
    end: WindowEnd = None,
    top: Annotated[int, Query(ge=1, le=1000, description="how many groups, largest first")] = 100,
) -> FailuresOut:
    """The error events of the window grouped by the normalised signature of their message
    (paths, numbers, hashes and temp names stripped): per signature its class (compiler or
    environment), how many graphs and events, first and last seen, compiler versions, models
    and teams, and one sample. At most the newest 10,000 events are grouped (``truncated``)."""
    stop = end if end is not None else time.time()
    query = FailuresQuery(start=stop - window_seconds(window), end=stop, top=top)
    with access.db.read() as session:
        return failure_groups(session, query)
