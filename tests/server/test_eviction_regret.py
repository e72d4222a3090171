"""Eviction regret on the index server (issue 40): a size budget's evict event, then a miss of the
same path, is one regretted eviction with the compile seconds the eviction weighed, per policy,
in /v1/stats, `neffcache stats --json` and /metrics; a miss of a path never evicted, or of one a
hit or compile re-created in between, regrets nothing."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import select

from neffcache.cli.index import stats_cmd
from neffcache.index.records import budget_policy, eviction_message
from neffcache.prune.value import Retention
from neffcache.server.services import events as event_log
from neffcache.server.storage.models import Eviction
from tests.server.conftest import LiveServer, Tokens
from tests.server.factories import entry, event
from tests.server.test_metrics_health import _samples

STORE = "s3://bucket/prefix"


def _evict(path: str, ts: float, policy: str = "value", seconds: float = 600.0) -> dict[str, object]:
    return event("evict", path=path, ts=ts, store=STORE, compile_seconds=seconds, job="prune",
                 message=eviction_message("size", policy, "over the 1000 B budget, lowest value: 1 s/MiB"))


def _regret(client: httpx.Client) -> dict[str, dict[str, float]]:
    got: dict[str, dict[str, float]] = client.get("/v1/stats", params={"window": "1d"}).json()["eviction_regret"]
    return got


def _metric(client: httpx.Client, name: str, policy: str) -> float:
    return _samples(client.get("/metrics").text)[(name, (("policy", policy),))]


def test_a_miss_of_an_evicted_path_is_one_regretted_eviction(server: LiveServer, tokens: Tokens,
                                                             writer: httpx.Client, reader: httpx.Client) -> None:
    evicted, other = entry(1), entry(2)
    writer.post("/v1/entries", json=[evicted, other]).raise_for_status()
    now = time.time()
    assert _metric(reader, "neffcache_regretted_evictions_total", "value") == 0  # exported before any eviction
    writer.post("/v1/events", json=[_evict(evicted["path"], now - 300)]).raise_for_status()
    assert _regret(writer) == {"value": {"evictions": 1, "regretted": 0, "seconds": 0.0}}
    # Two misses of the evicted path (one eviction regretted once) and one of a path never evicted.
    writer.post("/v1/events", json=[event("miss", path=evicted["path"], ts=now - 200),
                                    event("miss", path=evicted["path"], ts=now - 100),
                                    event("miss", path=other["path"], ts=now - 100)]).raise_for_status()
    assert _regret(writer) == {"value": {"evictions": 1, "regretted": 1, "seconds": 600.0}}
    assert _metric(reader, "neffcache_regretted_evictions_total", "value") == 1
    assert _metric(reader, "neffcache_eviction_regret_seconds_total", "value") == 600.0
    assert _metric(reader, "neffcache_budget_evictions_total", "value") == 1
    assert _metric(reader, "neffcache_regretted_evictions_total", "lru") == 0
    # A resent batch is no new miss: the regret stays counted once.
    args = ["--index-url", server.url, "--token", tokens.read, "--window", "24h"]
    data = json.loads(CliRunner().invoke(stats_cmd, [*args, "--json"], catch_exceptions=False).stdout)
    assert data["eviction_regret"] == {"value": {"evictions": 1, "regretted": 1, "seconds": 600.0}}
    text = CliRunner().invoke(stats_cmd, args, catch_exceptions=False).stdout
    assert "regretted       value 1 of 1 (10 min of compile time to recompile)" in text


def test_a_hit_or_compile_between_eviction_and_miss_regrets_nothing(writer: httpx.Client) -> None:
    now = time.time()
    hit, compiled, late = (entry(i)["path"] for i in (1, 2, 3))
    # One batch, in any order: the ingest goes by the events' times, not by their places in it.
    writer.post("/v1/events", json=[event("miss", path=hit, ts=now - 100), event("hit", path=hit, ts=now - 200),
                                    _evict(hit, now - 300, policy="lru"),
                                    _evict(compiled, now - 300, policy="lru"),
                                    event("compile", path=compiled, ts=now - 250, compile_seconds=600.0),
                                    _evict(late, now - 300, policy="lru"),
                                    event("miss", path=late, ts=now - 400)]).raise_for_status()
    writer.post("/v1/events", json=[event("miss", path=compiled, ts=now - 100)]).raise_for_status()
    assert _regret(writer) == {"lru": {"evictions": 3, "regretted": 0, "seconds": 0.0}}
    # Evicted again later: a new story, and this miss regrets it.
    writer.post("/v1/events", json=[_evict(compiled, now - 50, policy="lru", seconds=30.0),
                                    event("miss", path=compiled, ts=now - 10)]).raise_for_status()
    assert _regret(writer) == {"lru": {"evictions": 4, "regretted": 1, "seconds": 30.0}}


def test_only_a_budget_eviction_can_be_regretted(writer: httpx.Client) -> None:
    now = time.time()
    aged, manual = entry(1)["path"], entry(2)["path"]
    writer.post("/v1/events", json=[
        event("evict", path=aged, ts=now - 300, message=eviction_message("age", None, "unused for 30 days")),
        event("evict", path=manual, ts=now - 300, message="removed by hand"),
        event("miss", path=aged, ts=now - 100), event("miss", path=manual, ts=now - 100)]).raise_for_status()
    assert _regret(writer) == {}


def test_evictions_age_out_with_the_events(server: LiveServer, writer: httpx.Client) -> None:
    now = time.time()
    writer.post("/v1/events", json=[_evict(entry(1)["path"], now - 20 * 86400),
                                    _evict(entry(2)["path"], now - 60)]).raise_for_status()
    server.db.transact(lambda s: event_log.sweep_events(s, now - 10 * 86400))
    with server.db.read() as session:
        assert list(session.scalars(select(Eviction.path))) == [entry(2)["path"]]


def test_the_message_names_the_policy_from_a_fixed_set() -> None:
    assert {p.value for p in Retention} == {"value", "lru"}
    for policy in Retention:
        assert budget_policy(eviction_message("size", policy.value, "over the budget")) == policy.value
    assert budget_policy(eviction_message("size", "made-up", "x")) == "other"
    # What a client of before the policy field sent.
    assert budget_policy("prune (size): over the 1 B budget, least recently used; last used 3 d ago") == "lru"
    assert budget_policy("prune (size): over the 1 B budget, lowest value: 2 s/MiB") == "value"
    assert budget_policy("prune (age): unused") is None and budget_policy(None) is None


@pytest.mark.parametrize("kind", ["hit", "compile"])
def test_a_use_after_the_miss_keeps_the_regret(writer: httpx.Client, kind: str) -> None:
    now = time.time()
    path = entry(1)["path"]
    writer.post("/v1/events", json=[_evict(path, now - 300), event("miss", path=path, ts=now - 200),
                                    event(kind, path=path, ts=now - 100, compile_seconds=600.0)]).raise_for_status()
    assert _regret(writer)["value"]["regretted"] == 1
