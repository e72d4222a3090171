"""/v1/upgrades: how ready a compiler upgrade is, per toolchain pair (server/services/readiness.py)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from pydantic import BaseModel

from neffcache.index.records import WINDOW_PATTERN
from neffcache.server.api.deps import ReadAccess
from neffcache.server.api.routes.common import AUTH_ERRORS
from neffcache.server.api.routes.stats import window_seconds
from neffcache.server.services.readiness import ReadinessOut, pair_readiness, upgrade_pairs

router = APIRouter(prefix="/v1/upgrades", tags=["upgrades"])
Label = Annotated[str | None, Query(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$",
                                    description="toolchain label, e.g. trn2-lnc2/neuronxcc-2.27.5334.0+f702b353")]


class ReadinessList(BaseModel):
    pairs: list[ReadinessOut]


@router.get("/readiness", name="upgrades.readiness", summary="Upgrade readiness per toolchain pair",
            responses=AUTH_ERRORS)
def get_readiness(
    access: ReadAccess,
    from_toolchain: Label = None,
    to_toolchain: Label = None,
    window: Annotated[str, Query(pattern=WINDOW_PATTERN, description="e.g. 7d, 30d, or seconds")] = "30d",
    top: Annotated[int, Query(ge=0, le=100, description="how many missing graphs, most hit first")] = 10,
) -> ReadinessList:
    """The hit-weighted share of the old toolchain's graphs (SUCCESS entries) that the new one
    holds: weight = hits in the window + 0.1. Name both labels for one pair; name neither for
    the default pairs (per target, the newest compiler in the catalog against the one before).
    ``neffcache upgrade-report`` computes the same from the stores and is the one to gate on."""
    if (from_toolchain is None) != (to_toolchain is None):
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            "name both from_toolchain and to_toolchain, or neither")
    until = time.time()
    since = until - window_seconds(window)
    with access.db.read() as session:
        pairs = [(from_toolchain, to_toolchain)] if from_toolchain and to_toolchain else upgrade_pairs(session)
        return ReadinessList(pairs=[pair_readiness(session, old, new, since, until, top=top) for old, new in pairs])
