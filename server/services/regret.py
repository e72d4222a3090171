"""Eviction regret: a miss of a graph a size budget evicted, counted with the compile seconds the
eviction weighed, per policy (issue 40; the client-side twin is ``prune --regret``).

At ingest, in the batch's transaction: a budget's evict event (its message names the policy,
neffcache.index.records.budget_policy) becomes the path's row in ``evictions``; a hit or compile
of the path after it marks it re-created; the first miss after the eviction and before any
re-creation regrets it, once. Every step compares event times, not arrival order, so a batch
that holds the eviction, the miss and the recompile together counts as the same events sent one
by one would. The one exception: a miss that arrives before its eviction does (a spool drained
late) is not counted, because the ingest never looks back at stored misses.

Cost per batch: one upsert per budget eviction, one primary-key read of the batch's hit, compile
and miss paths, and an update per row that changed. Lock order: after the events, rollups and
entries of services/events.py, ``evictions`` (by path) then ``regret_rollups`` (by key).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from pydantic import BaseModel
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from neffcache.events import EventKind
from neffcache.index.records import budget_policy
from neffcache.server.storage.driver_sql import DriverSQL, marks, slices
from neffcache.server.storage.models import Eviction, RegretRollup

# (kind, ts, path, compile_seconds, message, store): what an event row tells this module.
Seen = tuple[str, float, str, float | None, str | None, str | None]
KINDS = frozenset({EventKind.EVICT, EventKind.MISS, EventKind.HIT, EventKind.COMPILE})
_EVICTIONS = Eviction.__tablename__
_ROLLUPS = RegretRollup.__tablename__
_REGRET_COLUMNS = ("path", "evicted_at", "recreated", "regretted", "policy", "compile_seconds")


class RegretCounts(BaseModel):
    """One policy's budget evictions of a window, and how many a later miss regretted, with the
    compile seconds those misses cost."""

    evictions: int = 0
    regretted: int = 0
    seconds: float = 0.0


def _hour(ts: float) -> int:
    return int(ts // 3600) * 3600


def record(sql: DriverSQL, events: Sequence[Seen]) -> None:
    """Remember the budget evictions among ``events`` and count the misses that regret one."""
    rollup: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0, 0, 0.0])
    newest: dict[str, tuple[float, str | None, str, float]] = {}
    for kind, ts, path, seconds, message, store in events:
        policy = budget_policy(message) if kind == EventKind.EVICT else None
        if policy is not None:
            rollup[(_hour(ts), policy)][0] += 1
            if path not in newest or ts > newest[path][0]:
                newest[path] = (ts, store, policy, seconds or 0.0)
    if newest:
        sql.run_many(_remember_sql(sql.mark), [(path, store, policy, seconds, ts)
                                               for path, (ts, store, policy, seconds) in sorted(newest.items())])
    used: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for kind, ts, path, _, _, _ in events:
        if kind in (EventKind.MISS, EventKind.HIT, EventKind.COMPILE):
            used[path].append((kind, ts))
    for row in _rows(sql, sorted(used)):
        _judge(sql, dict(zip(_REGRET_COLUMNS, row, strict=True)), used[row[0]], rollup)
    if rollup:
        sql.run_many(_rollup_sql(sql.mark), [(hour, policy, int(n), int(r), float(s))
                                             for (hour, policy), (n, r, s) in sorted(rollup.items())])


def _rows(sql: DriverSQL, paths: list[str]) -> list[tuple[Any, ...]]:
    if not paths:
        return []
    if sql.postgresql:
        return sql.rows(_select_sql(sql.mark, 0), [paths])
    return [row for chunk in slices(paths, 1) for row in sql.rows(_select_sql(sql.mark, len(chunk)), chunk)]


def _judge(sql: DriverSQL, row: dict[str, Any], used: list[tuple[str, float]],
           rollup: dict[tuple[int, str], list[float]]) -> None:
    """One evicted path and this batch's uses of it: re-created, regretted, or neither yet."""
    evicted, recreated = row["evicted_at"], row["recreated"]
    again = [ts for kind, ts in used if kind != EventKind.MISS and ts > evicted]
    first = min([*again, *([recreated] if recreated is not None else [])], default=None)
    if first is not None and first != recreated:
        sql.run_many(_recreated_sql(sql.mark), [(first, row["path"], evicted)])
    if row["regretted"] is not None:
        return
    misses = [ts for kind, ts in used if kind == EventKind.MISS and ts > evicted and (first is None or ts < first)]
    if not misses:
        return
    # RETURNING: of two batches racing to regret one eviction, only the one that set it counts.
    if sql.rows(_regret_sql(sql.mark), [min(misses), row["path"], evicted]):
        slot = rollup[(_hour(min(misses)), row["policy"])]
        slot[1] += 1
        slot[2] += row["compile_seconds"]


def regret_by_policy(session: Session, start: float | None = None, end: float | None = None
                     ) -> dict[str, RegretCounts]:
    """Per policy, the budget evictions and regrets of the hours from ``start`` to ``end``
    (all time without them): stats' ``eviction_regret`` and the Prometheus counters."""
    r = RegretRollup
    stmt = select(r.policy, func.sum(r.evictions), func.sum(r.regretted), func.sum(r.seconds)).group_by(r.policy)
    if start is not None:
        stmt = stmt.where(r.hour >= _hour(start))
    if end is not None:
        stmt = stmt.where(r.hour < end)
    return {policy: RegretCounts(evictions=int(n or 0), regretted=int(k or 0), seconds=float(s or 0.0))
            for policy, n, k, s in session.execute(stmt.order_by(r.policy))}


def sweep(session: Session, before: float, limit: int = 5000) -> int:
    """Forget up to ``limit`` evictions older than ``before`` (the events' retention): a miss
    that late says more about demand than about the policy."""
    oldest = select(Eviction.path).where(Eviction.evicted_at < before).order_by(Eviction.evicted_at).limit(limit)
    result = session.execute(delete(Eviction).where(Eviction.path.in_(oldest.scalar_subquery())))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


# The statements (S608: only this module's table and column names are formatted in).

@lru_cache(maxsize=2)
def _remember_sql(m: str) -> str:
    # A newer eviction of the path starts its story again; an older one, arriving late, changes nothing.
    return (f"INSERT INTO {_EVICTIONS} (path, store, policy, compile_seconds, evicted_at) "  # noqa: S608
            f"VALUES ({marks(m, 5)}) ON CONFLICT (path) DO UPDATE SET store = excluded.store, "
            "policy = excluded.policy, compile_seconds = excluded.compile_seconds, "
            "evicted_at = excluded.evicted_at, recreated = NULL, regretted = NULL "
            f"WHERE excluded.evicted_at > {_EVICTIONS}.evicted_at")


@lru_cache(maxsize=64)
def _select_sql(m: str, count: int) -> str:
    where = f"path = ANY({m})" if count == 0 else f"path IN ({marks(m, count)})"
    return f"SELECT {', '.join(_REGRET_COLUMNS)} FROM {_EVICTIONS} WHERE {where} ORDER BY path"  # noqa: S608


@lru_cache(maxsize=2)
def _recreated_sql(m: str) -> str:
    return f"UPDATE {_EVICTIONS} SET recreated = {m} WHERE path = {m} AND evicted_at = {m}"  # noqa: S608


@lru_cache(maxsize=2)
def _regret_sql(m: str) -> str:
    return (f"UPDATE {_EVICTIONS} SET regretted = {m} "  # noqa: S608
            f"WHERE path = {m} AND evicted_at = {m} AND regretted IS NULL RETURNING path")


@lru_cache(maxsize=2)
def _rollup_sql(m: str) -> str:
    return (f"INSERT INTO {_ROLLUPS} (hour, policy, evictions, regretted, seconds) "  # noqa: S608
            f"VALUES ({marks(m, 5)}) ON CONFLICT (hour, policy) DO UPDATE SET "
            f"evictions = {_ROLLUPS}.evictions + excluded.evictions, "
            f"regretted = {_ROLLUPS}.regretted + excluded.regretted, seconds = {_ROLLUPS}.seconds + excluded.seconds")
