"""/v1/stats: hit rate over a window, grouped, plus sizes, states, problems and top misses."""

from __future__ import annotations

import re
import time
from typing import Annotated

from fastapi import APIRouter, Query

from neffcache.index.records import WINDOW_PATTERN
from neffcache.server.api.deps import ReadAccess
from neffcache.server.api.routes.common import AUTH_ERRORS, QText
from neffcache.server.services.prices import prices_of
from neffcache.server.services.stats import GroupBy, StatsOut, StatsQuery, compute_stats

router = APIRouter(prefix="/v1/stats", tags=["stats"])
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_WINDOW = 400 * 86400


# The window of the read endpoints (/v1/stats, /v1/failures): how far back, and where it ends.
Window = Annotated[str, Query(pattern=WINDOW_PATTERN, description="e.g. 24h, 7d, 2w, or seconds")]
WindowEnd = Annotated[float | None, Query(ge=946684800, le=7258118400, allow_inf_nan=False,
                                          description="window end, epoch seconds (default now)")]


def window_seconds(text: str) -> float:
    """'90m', '24h', '7d', '2w' or plain seconds; capped at 400 days."""
    match = re.fullmatch(r"([0-9]+)([smhdw]?)", text)
    if match is None:
        raise ValueError(f"bad window {text!r}")
    return float(min(MAX_WINDOW, int(match.group(1)) * _UNITS[match.group(2) or "s"]))


def build_query(window: str, end: float | None, group_by: GroupBy, team: str | None, model: str | None,
                instance_type: str | None, toolchain: str | None, top: int = 10) -> StatsQuery:
    stop = end if end is not None else time.time()
    return StatsQuery(start=stop - window_seconds(window), end=stop, group_by=group_by, team=team or None,
                      model=model or None, instance_type=instance_type or None, toolchain=toolchain or None,
                      top=top)


@router.get("", name="stats.get", summary="Cache statistics", responses=AUTH_ERRORS)
def get_stats(
    access: ReadAccess,
    window: Window = "7d",
    end: WindowEnd = None,
    group_by: GroupBy = "team",
    team: QText = None,
    model: QText = None,
    instance_type: QText = None,
    toolchain: QText = None,
    top: Annotated[int, Query(ge=1, le=100, description="how many top misses")] = 10,
) -> StatsOut:
    """Hit rate (hits / (hits + misses)) over time and by group, compile hours spent and saved,
    cache size by toolchain, entries by state, failed/locked entries and the most missed graphs.
    Counts have hour resolution."""
    query = build_query(window, end, group_by, team, model, instance_type, toolchain, top)
    with access.db.read() as session:
        return compute_stats(session, query, prices_of(access.state.settings))
