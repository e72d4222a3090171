"""Every metric the Grafana dashboard and the alert rules query is one the index server really
exports, with the labels and label values they use: read from a live /metrics of the compose
stack after two warm runs (so every family has samples), never from a list kept by hand."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import neffcache.server
from neffcache.entry import EntryState
from neffcache.events import EventKind
from neffcache.index.records import EVENT_SOURCES
from neffcache.server.observability.metrics import result_of
from tests.deploy.conftest import ComposeStack
from tests.deploy.files import GRAFANA_DASHBOARD, PROMETHEUS

DASHBOARD: dict[str, Any] = json.loads(GRAFANA_DASHBOARD.read_text())
ALERTS: dict[str, Any] = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())

FUNCTIONS = {"sum", "max", "min", "avg", "count", "rate", "irate", "increase", "delta", "histogram_quantile",
             "sort_desc", "sort", "topk", "bottomk", "label_values", "abs", "clamp_min", "clamp_max", "vector",
             "scalar", "time", "absent", "max_over_time", "min_over_time", "avg_over_time"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
# Series Prometheus makes itself for every scrape target (not exported by the server).
SYNTHETIC = {"up"}
# The label values the code can produce, for the labels queries filter on.
LABEL_VALUES = {
    "kind": {k.value for k in EventKind},
    "source": set(EVENT_SOURCES),
    "state": {s.value for s in EntryState},
    "result": {result_of(s) for s in range(100, 600)} | set(re.findall(
        r'ingested\.labels\("(\w+)"\)',
        (Path(neffcache.server.__file__).parent / "api" / "routes" / "events.py").read_text())),
}


@dataclass
class Query:
    where: str
    expr: str
    metrics: set[str] = field(default_factory=set)
    labels: set[str] = field(default_factory=set)
    matchers: list[tuple[str, str]] = field(default_factory=list)


def parse_query(where: str, expr: str) -> Query:
    query = Query(where, expr)
    text = re.sub(r"\$__\w+|\$\{?\w+\}?", "", expr)  # Grafana variables
    for block in re.findall(r"\{([^}]*)\}", text):
        for name, _op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', block):
            query.labels.add(name)
            query.matchers.append((name, value))
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    for clause in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", text):
        query.labels.update(label.strip() for label in clause.split(",") if label.strip())
    text = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", text)
    if m := re.match(r"\s*label_values\((\w+),\s*(\w+)\)\s*$", text):
        query.metrics.add(m.group(1))
        query.labels.add(m.group(2))
        return query
    for name in re.findall(r"(?<![\w.])([A-Za-z_:][\w:]*)(?![\w(])(?!\s*\()", text):
        if name not in KEYWORDS and name not in FUNCTIONS and not re.fullmatch(r"e\d*|inf|nan", name, re.I):
            query.metrics.add(name)
    return query


def dashboard_queries() -> list[Query]:
    queries = []
    for panel in DASHBOARD["panels"]:
        for target in panel.get("targets", []):
            queries.append(parse_query(f"panel {panel['title']!r}", target["expr"]))
    for var in DASHBOARD["templating"]["list"]:
        if var["type"] == "query":
            queries.append(parse_query(f"variable {var['name']}", var["query"]["query"]))
    return queries


def alert_queries() -> list[Query]:
    rules = [rule for group in ALERTS["groups"] for rule in group["rules"]]
    return [parse_query(f"alert {rule['alert']}", rule["expr"]) for rule in rules]


QUERIES = dashboard_queries() + alert_queries()


@dataclass
class Exported:
    labels: dict[str, set[str]]  # sample name -> label names

    @classmethod
    def parse(cls, text: str) -> Exported:
        labels: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels.setdefault(sample.name, set()).update(sample.labels)
        return cls(labels)


@pytest.fixture(scope="module")
def exported(compose_stack: ComposeStack) -> Exported:
    return Exported.parse(compose_stack.metrics())


def test_the_parser_finds_metrics_in_every_query() -> None:
    assert len(QUERIES) > 20
    for query in QUERIES:
        assert query.metrics, f"{query.where}: no metric found in {query.expr}"
    q = parse_query("x", 'histogram_quantile(0.99, sum by (le, op) (rate(neffcache_index_request_seconds_bucket'
                         '{op="x"}[$__rate_interval])))')
    assert q.metrics == {"neffcache_index_request_seconds_bucket"} and q.labels == {"le", "op"}


@pytest.mark.parametrize("query", QUERIES, ids=[q.where for q in QUERIES])
def test_query_uses_only_exported_metrics_and_labels(query: Query, exported: Exported) -> None:
    for metric in query.metrics - SYNTHETIC:
        assert metric in exported.labels, (f"{query.where} queries {metric}, which the server does not export; "
                                           f"it exports {sorted(exported.labels)}")
    available = set().union(*(exported.labels.get(m, set()) for m in query.metrics))
    if query.metrics & SYNTHETIC:
        available |= {"job", "instance"}
    for label in query.labels:
        assert label in available, (f"{query.where} uses label {label!r}; "
                                    f"{sorted(query.metrics)} have {sorted(available)}")
    for label, pattern in query.matchers:
        if label in LABEL_VALUES:
            for value in pattern.split("|"):
                assert value in LABEL_VALUES[label], f"{query.where}: {label}={value!r} never occurs"


def test_dashboard_covers_what_operators_ask_for() -> None:
    titles = " / ".join(p["title"].lower() for p in DASHBOARD["panels"])
    for needed in ("hit rate by team", "hit rate by toolchain", "compile hours saved", "size by toolchain",
                   "failed entries", "locked entries", "latency"):
        assert needed in titles, needed
    # Cache facts are read from the database by every replica: collapse replicas with max, never sum them.
    for query in dashboard_queries():
        for metric in query.metrics & {"neffcache_cache_events_total", "neffcache_compile_time_saved_seconds_total",
                                       "neffcache_compile_seconds_total", "neffcache_entries", "neffcache_entry_bytes"}:
            if not query.where.startswith("variable"):
                assert re.search(rf"max by \([^)]*\) \((?:\w+\()?{metric}", query.expr), (query.where, query.expr)


def test_event_queries_keep_sources_apart_and_hit_rates_are_the_jobs() -> None:
    """The event counters have one series per source (job, warm, rewarm): a ``max by`` that
    leaves ``source`` out would take the largest source instead of their sum, and a hit rate
    that does not filter source="job" counts a warm-up's compiles as misses."""
    sourced = {"neffcache_cache_events_total", "neffcache_compile_time_saved_seconds_total",
               "neffcache_compile_seconds_total", "neffcache_compile_cost_total", "neffcache_compile_cost_saved_total",
               "neffcache_unpriced_seconds_total"}
    for query in QUERIES:
        if query.metrics & sourced and not query.where.startswith("variable"):
            for clause in re.findall(r"max by \(([^)]*)\)", query.expr):
                assert "source" in clause, (query.where, query.expr)
        if 'kind="hit"' in query.expr:
            assert query.expr.count('source="job"') == query.expr.count("neffcache_cache_events_total"), query.where


def test_panel_ids_and_layout_are_sound() -> None:
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    for panel in DASHBOARD["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"
