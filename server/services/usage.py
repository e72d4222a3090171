"""How often each entry was hit, or missed: the raw events of a window, counted per entry path.

The hourly rollups have no path (they would grow with every graph), so this reads the events
(``ix_events_kind_ts`` narrows them to the window's hits or misses) and is bounded twice: a page holds at
most :data:`MAX_PAGE` paths, and the events themselves are kept ``event_retention_days``, so a
window reaching further back counts only what is left. Pages are keyset-paginated on the path
(``cursor``: the last path of the previous page), so a page costs the same wherever it starts
and no path is counted twice while events keep arriving.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from neffcache.events import EventKind
from neffcache.server.storage.models import Event

MAX_PAGE = 10_000


class PathHits(BaseModel):
    path: str
    hits: int
    last_hit: float


class HitsPage(BaseModel):
    toolchain: str
    since: float
    until: float
    hits: list[PathHits]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null on the last")


def _counts_by_path(session: Session, kind: EventKind, toolchain: str | None, since: float, until: float,
                    limit: int, cursor: str | None) -> tuple[list[tuple[str, int, float]], str | None]:
    """``kind`` events per entry path in ``[since, until)`` (of ``toolchain`` only, when given):
    (path, count, last event's time) in path order, at most ``limit`` after ``cursor``, and the
    cursor of the next page (None on the last). One query a page: it reads one row past the
    page to know whether there is a next one."""
    limit = max(1, min(limit, MAX_PAGE))
    stmt = (select(Event.path, func.count(), func.max(Event.ts))
            .where(Event.kind == kind, Event.ts >= since, Event.ts < until, Event.path.is_not(None)))
    if toolchain is not None:
        stmt = stmt.where(Event.toolchain == toolchain)
    if cursor is not None:
        stmt = stmt.where(Event.path > cursor)
    rows = session.execute(stmt.group_by(Event.path).order_by(Event.path).limit(limit + 1)).all()
    page = [(str(path), int(n), float(last)) for path, n, last in rows[:limit]]
    return page, page[-1][0] if len(rows) > limit and page else None


def hits_by_path(session: Session, toolchain: str, since: float, until: float, *, limit: int = 1000,
                 cursor: str | None = None) -> HitsPage:
    """Hit events per entry path reported for ``toolchain`` (a label) in ``[since, until)``,
    paths in order, at most ``limit`` of them after ``cursor``."""
    page, next_cursor = _counts_by_path(session, EventKind.HIT, toolchain, since, until, limit, cursor)
    return HitsPage(toolchain=toolchain, since=since, until=until,
                    hits=[PathHits(path=p, hits=n, last_hit=last) for p, n, last in page], next_cursor=next_cursor)


class PathMisses(BaseModel):
    path: str
    misses: int
    last_miss: float


class MissesPage(BaseModel):
    toolchain: str | None
    since: float
    until: float
    misses: list[PathMisses]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null on the last")


def misses_by_path(session: Session, toolchain: str | None, since: float, until: float, *, limit: int = 1000,
                   cursor: str | None = None) -> MissesPage:
    """Miss events per entry path in ``[since, until)`` (of ``toolchain`` only, when given),
    paths in order, at most ``limit`` of them after ``cursor``: what a client matches against
    its stores' eviction tombstones (``prune --regret``). Warm-ups' misses count too: their
    compiles are paid all the same."""
    page, next_cursor = _counts_by_path(session, EventKind.MISS, toolchain, since, until, limit, cursor)
    return MissesPage(toolchain=toolchain, since=since, until=until,
                      misses=[PathMisses(path=p, misses=n, last_miss=last) for p, n, last in page],
                      next_cursor=next_cursor)
