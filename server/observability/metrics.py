"""Prometheus metrics, one registry per app (no process-global registry shared between apps).

Two kinds, on purpose:
- request counters and latencies are per replica: Prometheus scrapes each replica and sums;
- cache facts (hit/miss/compile counts, compile time saved, entries and bytes by toolchain,
  active leases) are read from the database at scrape time, so every replica reports the same
  fleet-wide numbers and a replica restart never resets a counter. Aggregate those with max()
  (or scrape one replica), not sum().

Label values that clients choose (team, toolchain) are bounded: anyone with a write token can
report events for 40,000 made-up teams, and every one would be a series on every scrape (11.5 MB,
and a Prometheus that pays for each series). A scrape exports by name the values an operator
configured (``metrics_teams``, ``metrics_toolchains``) plus the ``metrics_top_n`` biggest of each
by count, and sums the rest into ``other``: totals stay exact, the series count stays bounded
by (configured + top N + 1) per label. The event families also carry ``source`` (job, warm,
rewarm: neffcache.index.records.EVENT_SOURCES, a fixed set the server derives, never a client's
free text): the jobs' hit rate is ``source="job"``, a warm-up's compiles are work ahead of demand.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from neffcache.events import EventKind
from neffcache.index.records import BUDGET_POLICIES
from neffcache.server.services import leases, readiness, regret, stats
from neffcache.server.services.prices import NO_PRICES, Prices
from neffcache.server.storage.models import Entry

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from neffcache.server.storage.db import Database

log = logging.getLogger(__name__)
OTHER = "other"
DEFAULT_TOP_N = 20
MAX_LABEL_CHARS = 128  # a longer value is no name anybody configured: it goes to "other"


def result_of(status: int) -> str:
    if status < 400:
        return "ok"
    return {401: "unauthorized", 403: "forbidden", 404: "not_found", 409: "conflict", 413: "too_large",
            400: "invalid", 422: "invalid"}.get(status, "client_error" if status < 500 else "error")


class LabelBound:
    """Which values of one label a scrape exports by name; the rest become ``other``."""

    def __init__(self, configured: Iterable[str], top_n: int) -> None:
        self.configured = frozenset(configured)
        self.top_n = top_n

    def allowed(self, weights: Mapping[str, float]) -> frozenset[str]:
        ranked = sorted((v for v in weights if v not in self.configured and len(v) <= MAX_LABEL_CHARS),
                        key=lambda v: (-weights[v], v))
        return self.configured | frozenset(ranked[:self.top_n])


def _fold(value: str, allowed: frozenset[str]) -> str:
    return value if value in allowed else OTHER


DEFAULT_READINESS_WINDOW = 30 * 86400.0


class DatabaseCollector(Collector):
    def __init__(self, db: Database, *, teams: LabelBound | None = None,
                 toolchains: LabelBound | None = None, prices: Prices = NO_PRICES,
                 readiness_window: float = DEFAULT_READINESS_WINDOW) -> None:
        self._db = db
        self._prices = prices
        self._readiness_window = readiness_window
        self._teams = teams or LabelBound((), DEFAULT_TOP_N)
        self._toolchains = toolchains or LabelBound((), DEFAULT_TOP_N)

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        up = GaugeMetricFamily("neffcache_index_database_up", "1 when the last scrape could read the database")
        try:
            families = list(self._families())
        except Exception:  # the scrape must still answer (with database_up 0) while the database is down
            log.warning("metrics scrape could not read the database", exc_info=True)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families
        took = GaugeMetricFamily("neffcache_index_scrape_seconds", "time spent reading the database for this scrape")
        took.add_metric([], time.perf_counter() - started)
        yield took

    def _families(self) -> Iterable[Metric]:
        events = CounterMetricFamily("neffcache_cache_events", "cache events reported by clients, all replicas; "
                                     "source job is job traffic, warm and rewarm are warm-ups",
                                     labels=["kind", "source", "toolchain", "team"])
        saved = CounterMetricFamily("neffcache_compile_time_saved_seconds",
                                    "compile seconds that cache hits avoided", labels=["source", "toolchain", "team"])
        spent = CounterMetricFamily("neffcache_compile_seconds", "seconds spent compiling on cache misses (source "
                                    "job) and ahead of demand (warm, rewarm)", labels=["source", "toolchain", "team"])
        entries = GaugeMetricFamily("neffcache_entries", "entries in the catalog", labels=["toolchain", "state"])
        size = GaugeMetricFamily("neffcache_entry_bytes", "bytes of catalogued entries", labels=["toolchain"])
        held = GaugeMetricFamily("neffcache_leases_active", "compile leases currently held")
        with self._db.read() as session:
            totals = stats.kind_totals(session)
            rows = session.execute(select(Entry.toolchain, Entry.state, func.count(), func.sum(Entry.size))
                                   .group_by(Entry.toolchain, Entry.state))
            catalog = [(str(tc), str(state), int(count), int(total or 0)) for tc, state, count, total in rows]
            active = len(leases.active(session))
            upgrades = self._readiness(session)
            regrets = self._regret(session)
        team_weight: dict[str, float] = defaultdict(float)
        toolchain_weight: dict[str, float] = defaultdict(float)
        for (_, _, toolchain, team, _), (count, _) in totals.items():
            team_weight[team] += count
            toolchain_weight[toolchain] += count
        for toolchain, _, count, _ in catalog:
            toolchain_weight[toolchain] += count
        teams = self._teams.allowed(team_weight)
        toolchains = self._toolchains.allowed(toolchain_weight)
        # (count, seconds, cost, unpriced seconds) per folded (kind, source, toolchain, team)
        by_kind: dict[tuple[str, str, str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
        for (kind, source, toolchain, team, instance_type), (count, seconds) in totals.items():
            slot = by_kind[(kind, source, _fold(toolchain, toolchains), _fold(team, teams))]
            slot[0] += count
            slot[1] += seconds
            cost = self._prices.cost(seconds, instance_type)
            slot[2] += cost or 0.0
            slot[3] += seconds if cost is None else 0.0
        money = self._money_families()
        for (kind, source, toolchain, team), (n, seconds, cost, unpriced) in sorted(by_kind.items()):
            events.add_metric([kind, source, toolchain, team], n)
            if kind in (EventKind.HIT, EventKind.COMPILE):
                (saved if kind == EventKind.HIT else spent).add_metric([source, toolchain, team], seconds)
                if money:
                    money[kind].add_metric([source, toolchain, team, self._prices.currency], cost)
                    money["unpriced"].add_metric([kind, source, toolchain, team], unpriced)
        by_state: dict[tuple[str, str], int] = defaultdict(int)
        per_toolchain: dict[str, int] = defaultdict(int)
        for toolchain, state, count, total in catalog:
            folded = _fold(toolchain, toolchains)
            by_state[(folded, state)] += count
            per_toolchain[folded] += total
        for (toolchain, state), count in sorted(by_state.items()):
            entries.add_metric([toolchain, state], count)
        for toolchain, total in sorted(per_toolchain.items()):
            size.add_metric([toolchain], total)
        held.add_metric([], active)
        return [events, saved, spent, entries, size, held, *money.values(), upgrades, *regrets]

    def _regret(self, session: Session) -> list[CounterMetricFamily]:
        """Size-budget evictions per policy, the ones a later miss regretted and the compile
        seconds those cost (server/services/regret.py; the policy is a fixed set, or "other")."""
        evicted = CounterMetricFamily("neffcache_budget_evictions", "entries size budgets evicted, by policy",
                                      labels=["policy"])
        regretted = CounterMetricFamily("neffcache_regretted_evictions", "budget evictions a later miss of the "
                                        "graph regretted, by policy", labels=["policy"])
        seconds = CounterMetricFamily("neffcache_eviction_regret_seconds", "compile seconds the regretted "
                                      "evictions cost (what the policy weighed for each)", labels=["policy"])
        # Every policy's series from the start, at 0: an alert on a rate() is blind to its first event.
        for policy, counts in {**dict.fromkeys(BUDGET_POLICIES, regret.RegretCounts()),
                               **regret.regret_by_policy(session)}.items():
            evicted.add_metric([policy], counts.evictions)
            regretted.add_metric([policy], counts.regretted)
            seconds.add_metric([policy], counts.seconds)
        return [evicted, regretted, seconds]

    def _readiness(self, session: Session) -> GaugeMetricFamily:
        """Upgrade readiness of the default toolchain pairs (per target, the newest compiler in the
        catalog against the one before it; server/services/readiness.py), hits of the window."""
        family = GaugeMetricFamily("neffcache_upgrade_readiness", "hit-weighted share of the older toolchain's "
                                   "graphs the newer one holds", labels=["from_toolchain", "to_toolchain"])
        until = time.time()
        for old, new in readiness.upgrade_pairs(session):
            value = readiness.pair_readiness(session, old, new, until - self._readiness_window, until, top=0).readiness
            if value is not None:
                family.add_metric([old, new], value)
        return family

    def _money_families(self) -> dict[str, CounterMetricFamily]:
        """With prices configured: the compile seconds of misses and of hits saved, priced by the
        instance type each event reported (server/services/prices.py); none without prices."""
        if not self._prices.configured:
            return {}
        labels = ["source", "toolchain", "team", "currency"]
        return {EventKind.COMPILE: CounterMetricFamily("neffcache_compile_cost", "money spent compiling on cache "
                                               "misses, at the operator's prices", labels=labels),
                EventKind.HIT: CounterMetricFamily("neffcache_compile_cost_saved", "money cache hits saved, at the "
                                           "operator's prices", labels=labels),
                # Never priced at zero: the seconds of instance types without a price, beside the money.
                "unpriced": CounterMetricFamily("neffcache_unpriced_seconds", "compile seconds (kind compile) "
                                                "and seconds saved (kind hit) of instance types with no price",
                                                labels=["kind", "source", "toolchain", "team"])}


class Metrics:
    def __init__(self, db: Database, *, teams: Iterable[str] = (), toolchains: Iterable[str] = (),
                 top_n: int = DEFAULT_TOP_N, prices: Prices = NO_PRICES,
                 readiness_window: float = DEFAULT_READINESS_WINDOW) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("neffcache_index_requests", "HTTP requests served by this replica",
                                ["op", "result"], registry=self.registry)
        self.latency = Histogram(
            "neffcache_index_request_seconds", "request latency on this replica", ["op"], registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
        )
        self._counted: dict[tuple[str, int], Counter] = {}  # (op, status) -> its child; bounded by routes x statuses
        self._timed: dict[str, Histogram] = {}
        self.ingested = Counter("neffcache_index_events_ingested", "events received by this replica",
                                ["result"], registry=self.registry)
        for result in ("accepted", "duplicate", "expired"):
            # Export both series at 0 from the start: a rate() over a series that appears only
            # with the first event is blind to that event, and dashboards show "no data".
            self.ingested.labels(result)
        self.registry.register(DatabaseCollector(db, teams=LabelBound(teams, top_n),
                                                 toolchains=LabelBound(toolchains, top_n), prices=prices,
                                                 readiness_window=readiness_window))

    def declare_ops(self, ops: Iterable[str]) -> None:
        """Export every route's request series at 0 from the start. Each worker process has its
        own registry and a scrape reaches one of them: a worker that has not served a request
        yet would otherwise export no request series at all, and the dashboard's panels and
        alerts would go blank depending on which worker answered."""
        for op in ops:
            self.requests.labels(op, "ok")
            self.latency.labels(op)

    def observe(self, op: str, status: int, seconds: float) -> None:
        # The labelled children, found once per (op, result): ``labels()`` validates and locks
        # on every call, a few microseconds a request on the hot path (docs/index-server.md#performance).
        counter = self._counted.get((op, status))
        if counter is None:
            counter = self._counted[(op, status)] = self.requests.labels(op, result_of(status))
        timer = self._timed.get(op)
        if timer is None:
            timer = self._timed[op] = self.latency.labels(op)
        counter.inc()
        timer.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)

