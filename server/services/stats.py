"""Statistics for the API, the dashboard and the CLI, all computed from one database.

Event counts come from the hourly rollups (cheap at any volume); sizes and states from the
catalog; top misses from the raw events of the window. Nothing is kept in a replica's memory,
so every replica answers the same.

Job traffic and warm-ups are apart (neffcache.index.records.event_source): ``totals``, the
series, the groups and ``hit_rate`` count the jobs' events only, so a warm-up's compiles are
never a job's misses; ``warm_ups`` and ``by_source`` show what warm-ups compiled ahead of demand,
and top misses are the graphs jobs missed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field
from sqlalchemy import ColumnElement, Select, exists, func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from neffcache.events import EventKind
from neffcache.index.records import EVENT_SOURCES, WARM_UP_JOBS
from neffcache.server.services import leases, regret
from neffcache.server.services.events import hour_of
from neffcache.server.services.prices import NO_PRICES, Prices
from neffcache.server.services.records import STATES
from neffcache.server.storage.models import Entry, EntryTag, Event, EventRollup

S = TypeVar("S", bound="Select[*tuple[Any, ...]]")
# producer: the token that reported the events (server/services/identity.py), not a name they carry.
GroupBy = Literal["team", "model", "instance_type", "toolchain", "producer"]
_GROUP_COLUMNS = {"producer": "writer"}
_MAX_POINTS = 200


class Counts(BaseModel):
    hits: int = 0
    misses: int = 0
    compiles: int = 0
    errors: int = 0
    evictions: int = 0
    hit_rate: float | None = None
    compile_hours: float = 0.0
    saved_hours: float = 0.0
    # With prices configured: what the compiles cost and what the hits saved, in StatsOut.currency
    # (server/services/prices.py); the hours of instance types without a price stay hours, in
    # unpriced_compile_hours and unpriced_saved_hours, never priced at zero.
    compile_cost: float | None = None
    saved_cost: float | None = None
    unpriced_compile_hours: float = 0.0
    unpriced_saved_hours: float = 0.0


class Ahead(BaseModel):
    """What warm-ups compiled ahead of demand (besides a point's or a group's job traffic)."""

    ahead_compiles: int = 0
    ahead_hours: float = 0.0


class SeriesPoint(Counts, Ahead):
    start: float


class GroupRow(Counts, Ahead):
    name: str


class ToolchainSize(BaseModel):
    toolchain: str
    entries: int
    bytes: int


class ProblemEntry(BaseModel):
    path: str
    state: str
    toolchain: str
    producer: str
    updated: float


class MissRow(BaseModel):
    graph: str
    namespace: str
    toolchain: str
    misses: int
    last_seen: float


class Window(BaseModel):
    start: float
    end: float
    bucket_seconds: int


class StatsOut(BaseModel):
    window: Window
    filters: dict[str, str]
    group_by: str
    hit_rate: float | None = Field(description="the jobs' hit rate: hits / (hits + misses) of job traffic")
    totals: Counts = Field(description="job traffic: every event that is not a warm-up's")
    warm_ups: Counts = Field(description="warm and rewarm: compiles ahead of demand, and their own hits")
    by_source: dict[str, Counts] = Field(description="job, warm and rewarm apart")
    series: list[SeriesPoint]
    groups: list[GroupRow]
    size_by_toolchain: list[ToolchainSize]
    entries_by_state: dict[str, int]
    problem_entries: list[ProblemEntry]
    top_misses: list[MissRow]
    leases_active: int
    currency: str | None = None
    teams: list[str]
    models: list[str]
    eviction_regret: dict[str, regret.RegretCounts] = Field(
        default_factory=dict, description="per policy, the window's size-budget evictions and how many a later "
        "miss regretted, with the compile seconds those misses cost (fleet-wide: the filters do not apply)")


@dataclass(frozen=True)
class StatsQuery:
    start: float
    end: float
    group_by: GroupBy = "team"
    team: str | None = None
    model: str | None = None
    instance_type: str | None = None
    toolchain: str | None = None
    top: int = 10

    @property
    def bucket(self) -> int:
        hours = max(1, math.ceil((self.end - self.start) / 3600 / _MAX_POINTS))
        return hours * 3600

    def filters(self) -> dict[str, str]:
        pairs = {"team": self.team, "model": self.model, "instance_type": self.instance_type,
                 "toolchain": self.toolchain}
        return {k: v for k, v in pairs.items() if v is not None}


_KIND_FIELD: dict[str, str] = {EventKind.HIT: "hits", EventKind.MISS: "misses", EventKind.COMPILE: "compiles",
                               EventKind.ERROR: "errors", EventKind.EVICT: "evictions"}


def _add(counts: Counts, kind: str, count: int, seconds: float, instance_type: str, prices: Prices) -> None:
    field = _KIND_FIELD.get(kind)
    if field is None:
        return
    setattr(counts, field, getattr(counts, field) + int(count))
    if kind not in (EventKind.COMPILE, EventKind.HIT):
        return
    if kind == EventKind.COMPILE:
        counts.compile_hours += seconds / 3600
    else:
        counts.saved_hours += seconds / 3600
    if not prices.configured:
        return
    cost = prices.cost(seconds, instance_type)
    if cost is None and kind == EventKind.COMPILE:
        counts.unpriced_compile_hours += seconds / 3600
    elif cost is None:
        counts.unpriced_saved_hours += seconds / 3600
    elif kind == EventKind.COMPILE:
        counts.compile_cost = (counts.compile_cost or 0.0) + cost
    else:
        counts.saved_cost = (counts.saved_cost or 0.0) + cost


def _finish(counts: Counts, prices: Prices) -> None:
    lookups = counts.hits + counts.misses
    counts.hit_rate = counts.hits / lookups if lookups else None
    if prices.configured:  # a window that spent nothing shows 0, not "no price"
        counts.compile_cost = counts.compile_cost or 0.0
        counts.saved_cost = counts.saved_cost or 0.0


def _rollup_filters(q: StatsQuery) -> list[ColumnElement[bool]]:
    conds = [EventRollup.hour >= hour_of(q.start), EventRollup.hour < q.end]
    for column, value in ((EventRollup.team, q.team), (EventRollup.model, q.model),
                          (EventRollup.instance_type, q.instance_type), (EventRollup.toolchain, q.toolchain)):
        if value is not None:
            conds.append(column == value)
    return conds


def _entry_filter(stmt: S, q: StatsQuery) -> S:
    # Entries carry team/model as tags: the dashboard's filters narrow the sizes too.
    for name, value in (("team", q.team), ("model", q.model)):
        if value is not None:
            stmt = stmt.where(exists().where(EntryTag.entry_id == Entry.id, EntryTag.name == name,
                                             EntryTag.value == value))
    if q.toolchain is not None:
        stmt = stmt.where(Entry.toolchain == q.toolchain)
    return stmt


def _by_source(session: Session, conds: list[ColumnElement[bool]], prices: Prices) -> dict[str, Counts]:
    itype = EventRollup.instance_type
    out: dict[str, Counts] = {source: Counts() for source in EVENT_SOURCES}
    for source, kind, instance_type, count, seconds in session.execute(
        select(EventRollup.source, EventRollup.kind, itype, func.sum(EventRollup.count), func.sum(EventRollup.seconds))
        .where(*conds).group_by(EventRollup.source, EventRollup.kind, itype)
    ):
        _add(out.setdefault(source, Counts()), kind, count, seconds or 0.0, instance_type, prices)
    for counts in out.values():
        _finish(counts, prices)
    return out


def _warm_ups(by_source: dict[str, Counts], prices: Prices) -> Counts:
    ahead = Counts()
    for source, counts in by_source.items():
        if source == "job":
            continue
        for name in ("hits", "misses", "compiles", "errors", "evictions", "compile_hours", "saved_hours",
                     "unpriced_compile_hours", "unpriced_saved_hours"):
            setattr(ahead, name, getattr(ahead, name) + getattr(counts, name))
        for name in ("compile_cost", "saved_cost"):
            if getattr(counts, name) is not None:
                setattr(ahead, name, (getattr(ahead, name) or 0.0) + getattr(counts, name))
    _finish(ahead, prices)
    return ahead


def _add_sourced(row: SeriesPoint | GroupRow, source: str, kind: str, count: int, seconds: float,
                 instance_type: str, prices: Prices) -> None:
    """Job traffic into the row's counts; a warm-up's compiles into its ``ahead`` figures."""
    if source == "job":
        _add(row, kind, count, seconds, instance_type, prices)
    elif kind == EventKind.COMPILE:
        row.ahead_compiles += int(count)
        row.ahead_hours += seconds / 3600


def _series(session: Session, q: StatsQuery, conds: list[ColumnElement[bool]], prices: Prices) -> list[SeriesPoint]:
    bucket = q.bucket
    first = hour_of(q.start) // bucket * bucket
    series = {start: SeriesPoint(start=start) for start in range(first, int(q.end) + 1, bucket)}
    slot = (EventRollup.hour // bucket) * bucket
    for start, source, kind, instance_type, count, seconds in session.execute(
        select(slot, EventRollup.source, EventRollup.kind, EventRollup.instance_type, func.sum(EventRollup.count),
               func.sum(EventRollup.seconds))
        .where(*conds).group_by(slot, EventRollup.source, EventRollup.kind, EventRollup.instance_type)
    ):
        point = series.setdefault(int(start), SeriesPoint(start=int(start)))
        _add_sourced(point, source, kind, count, seconds or 0.0, instance_type, prices)
    for point in series.values():
        _finish(point, prices)
    return [series[k] for k in sorted(series)]


def _groups(session: Session, q: StatsQuery, conds: list[ColumnElement[bool]], prices: Prices) -> list[GroupRow]:
    dim = getattr(EventRollup, _GROUP_COLUMNS.get(q.group_by, q.group_by))
    groups: dict[str, GroupRow] = {}
    itype = EventRollup.instance_type
    priced_as = itype.label("priced_as")  # a label: grouping by instance type selects it twice
    for name, source, kind, instance_type, count, seconds in session.execute(
        select(dim, EventRollup.source, EventRollup.kind, priced_as, func.sum(EventRollup.count),
               func.sum(EventRollup.seconds))
        .where(*conds).group_by(dim, EventRollup.source, EventRollup.kind, itype)
    ):
        row = groups.setdefault(name, GroupRow(name=name or "(none)"))
        _add_sourced(row, source, kind, count, seconds or 0.0, instance_type, prices)
    for row in groups.values():
        _finish(row, prices)
    return sorted(groups.values(), key=lambda g: (-(g.hits + g.misses), -g.ahead_compiles, g.name))


def compute_stats(session: Session, q: StatsQuery, prices: Prices = NO_PRICES) -> StatsOut:
    """Every figure of the window; money too when ``prices`` are configured. Each sum is grouped
    by instance type as well, because a price is per instance type, and by source, because a
    hit rate is the jobs' (see the module docstring)."""
    conds = _rollup_filters(q)
    by_source = _by_source(session, conds, prices)
    totals = by_source["job"]
    sizes = [
        ToolchainSize(toolchain=tc, entries=int(n), bytes=int(b or 0))
        for tc, n, b in session.execute(_entry_filter(
            select(Entry.toolchain, func.count(), func.sum(Entry.size)).group_by(Entry.toolchain), q))
    ]
    by_state = dict.fromkeys(STATES, 0)
    for state, n in session.execute(_entry_filter(select(Entry.state, func.count()).group_by(Entry.state), q)):
        by_state[state] = int(n)

    return StatsOut(
        window=Window(start=q.start, end=q.end, bucket_seconds=q.bucket),
        filters=q.filters(), group_by=q.group_by, hit_rate=totals.hit_rate, totals=totals,
        warm_ups=_warm_ups(by_source, prices), by_source=by_source,
        series=_series(session, q, conds, prices),
        groups=_groups(session, q, conds, prices),
        size_by_toolchain=sorted(sizes, key=lambda s: -s.bytes),
        entries_by_state=by_state,
        problem_entries=_problems(session, q),
        top_misses=_top_misses(session, q),
        leases_active=len(leases.active(session)),
        currency=prices.currency if prices.configured else None,
        teams=_distinct(session, EventRollup.team), models=_distinct(session, EventRollup.model),
        eviction_regret=regret.regret_by_policy(session, q.start, q.end),
    )


def _problems(session: Session, q: StatsQuery, limit: int = 25) -> list[ProblemEntry]:
    stmt = select(Entry.path, Entry.state, Entry.toolchain, Entry.producer, Entry.updated).where(
        Entry.state.in_(["FAILED", "LOCKED", "CORRUPT"]))
    rows = session.execute(_entry_filter(stmt, q).order_by(Entry.updated.desc()).limit(limit))
    return [ProblemEntry(path=p, state=s, toolchain=t, producer=pr, updated=u) for p, s, t, pr, u in rows]


def _top_misses(session: Session, q: StatsQuery) -> list[MissRow]:
    graph = func.coalesce(Event.path, Event.key, "")
    stmt = (
        select(graph, Event.namespace, Event.toolchain, func.count(), func.max(Event.ts))
        # The jobs' misses: a warm-up's are the graphs it was asked to compile ahead of demand.
        .where(Event.kind == EventKind.MISS, Event.ts >= q.start, Event.ts < q.end,
               Event.job.not_in(sorted(WARM_UP_JOBS)))
        .group_by(graph, Event.namespace, Event.toolchain)
        .order_by(func.count().desc(), graph).limit(q.top)
    )
    for column, value in ((Event.team, q.team), (Event.model, q.model),
                          (Event.instance_type, q.instance_type), (Event.toolchain, q.toolchain)):
        if value is not None:
            stmt = stmt.where(column == value)
    return [MissRow(graph=g or "(unknown)", namespace=ns, toolchain=tc, misses=int(n), last_seen=float(last))
            for g, ns, tc, n, last in session.execute(stmt)]


def _distinct(session: Session, column: InstrumentedAttribute[str]) -> list[str]:
    return sorted(v for v in session.scalars(select(column).distinct().limit(500)) if v)


def kind_totals(session: Session) -> dict[tuple[str, str, str, str, str], tuple[int, float]]:
    """All-time (kind, source, toolchain, team, instance type) -> (count, seconds): the
    Prometheus counters (the instance type prices the seconds)."""
    out: dict[tuple[str, str, str, str, str], tuple[int, float]] = {}
    r = EventRollup
    for kind, source, toolchain, team, instance_type, count, seconds in session.execute(
        select(r.kind, r.source, r.toolchain, r.team, r.instance_type, func.sum(r.count), func.sum(r.seconds))
        .group_by(r.kind, r.source, r.toolchain, r.team, r.instance_type)
    ):
        out[(kind, source, toolchain, team, instance_type)] = (int(count), float(seconds or 0.0))
    return out
