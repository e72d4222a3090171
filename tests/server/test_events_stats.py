"""/v1/events and /v1/stats: idempotent batches, rollups, hit stamps, grouped stats, top misses."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from neffcache.server.services import events as event_log
from tests.server.conftest import LiveServer, make_tokens
from tests.server.factories import TOOLCHAIN_LABEL, entry, event


def test_resending_a_batch_counts_nothing_twice(writer: httpx.Client) -> None:
    batch = [event("hit"), event("miss"), event("compile", compile_seconds=30.0)]
    assert writer.post("/v1/events", json=batch).json() == {"accepted": 3, "duplicates": 0, "expired": 0}
    assert writer.post("/v1/events", json=batch).json() == {"accepted": 0, "duplicates": 3, "expired": 0}
    mixed = [*batch[:1], event("hit")]
    assert writer.post("/v1/events", json=mixed).json() == {"accepted": 1, "duplicates": 1, "expired": 0}
    totals = writer.get("/v1/stats", params={"window": "1d"}).json()["totals"]
    assert (totals["hits"], totals["misses"], totals["compiles"]) == (2, 1, 1)


def test_same_id_twice_in_one_batch_is_one_event(writer: httpx.Client) -> None:
    one = event("miss")
    assert writer.post("/v1/events", json=[one, one]).json() == {"accepted": 1, "duplicates": 1, "expired": 0}


def test_hit_stamps_the_entry_and_saves_its_compile_time(writer: httpx.Client) -> None:
    record = entry(1, compile_seconds=1800.0)
    writer.post("/v1/entries", json=[record]).raise_for_status()
    now = time.time()
    writer.post("/v1/events", json=[event("hit", path=record["path"], ts=now - 10),
                                    event("hit", path=record["path"], ts=now - 100)]).raise_for_status()
    got = writer.get(f"/v1/entries/{record['path']}").json()
    assert got["hit_count"] == 2
    assert got["last_used"] == pytest.approx(now - 10)
    totals = writer.get("/v1/stats", params={"window": "1d"}).json()["totals"]
    assert totals["saved_hours"] == pytest.approx(1.0)  # 2 hits x 1800 s, taken from the entry


def test_stats_group_filter_series_and_top_misses(writer: httpx.Client) -> None:
    now = time.time()
    events = []
    for i in range(30):
        team = "search" if i % 3 else "ads"
        events.append(event("hit" if i % 2 else "miss", team=team, model=f"model-{i % 2}", ts=now - i * 600,
                            key=f"MODULE_{i % 4}+abcd0000", compile_seconds=60.0 if i % 2 else None))
    events.append(event("compile", team="ads", model="model-0", compile_seconds=7200.0, ts=now - 60))
    events.append(event("hit", team="ads", ts=now - 10 * 86400))  # outside a 7-day window
    writer.post("/v1/events", json=events).raise_for_status()

    stats = writer.get("/v1/stats", params={"window": "7d", "group_by": "team"}).json()
    assert stats["totals"]["hits"] == 15 and stats["totals"]["misses"] == 15
    assert stats["totals"]["hit_rate"] == pytest.approx(0.5)
    assert stats["totals"]["compile_hours"] == pytest.approx(2.0)
    assert stats["totals"]["saved_hours"] == pytest.approx(15 * 60 / 3600)
    groups = {g["name"]: g for g in stats["groups"]}
    assert groups["search"]["hits"] + groups["search"]["misses"] == 20
    assert groups["ads"]["hits"] + groups["ads"]["misses"] == 10
    assert sum(p["hits"] for p in stats["series"]) == 15
    assert stats["window"]["bucket_seconds"] == 3600
    misses = stats["top_misses"]
    assert misses[0]["misses"] >= misses[-1]["misses"]
    assert sum(m["misses"] for m in misses) == 15
    assert stats["teams"] == ["ads", "search"]

    ads = writer.get("/v1/stats", params={"window": "7d", "team": "ads", "group_by": "model"}).json()
    assert ads["filters"] == {"team": "ads"}
    assert ads["totals"]["hits"] + ads["totals"]["misses"] == 10
    assert {g["name"] for g in ads["groups"]} == {"model-0", "model-1"}


def test_the_hit_rate_is_the_jobs_and_warm_ups_are_shown_apart(writer: httpx.Client) -> None:
    """Warm 3 graphs (3 misses, 3 compiles), then a job hits 3/3: the hit rate is 1.0, not 0.5;
    the warm-up's compiles are work ahead of demand, its misses are no job's top misses."""
    now = time.time()
    warm = [event(kind, job="warm", key=f"MODULE_{i}+abcd0000", ts=now - 60, compile_seconds=seconds)
            for i in range(3) for kind, seconds in (("miss", None), ("compile", 600.0))]
    rewarm = [event(kind, job="rewarm", key=f"MODULE_{i}+abcd0001", ts=now - 50, compile_seconds=seconds)
              for i in range(2) for kind, seconds in (("miss", None), ("compile", 900.0))]
    run = [event("hit", job="run", key=f"MODULE_{i}+abcd0000", ts=now - 30, compile_seconds=600.0) for i in range(3)]
    writer.post("/v1/events", json=[*warm, *rewarm, *run]).raise_for_status()
    stats = writer.get("/v1/stats", params={"window": "1h"}).json()
    assert stats["hit_rate"] == 1.0 == stats["totals"]["hit_rate"]
    assert (stats["totals"]["hits"], stats["totals"]["misses"], stats["totals"]["compiles"]) == (3, 0, 0)
    assert stats["totals"]["saved_hours"] == pytest.approx(0.5)
    ahead = stats["warm_ups"]
    assert (ahead["compiles"], ahead["misses"]) == (5, 5)
    assert ahead["compile_hours"] == pytest.approx((3 * 600 + 2 * 900) / 3600)
    by_source = stats["by_source"]
    assert {s: by_source[s]["compiles"] for s in ("job", "warm", "rewarm")} == {"job": 0, "warm": 3, "rewarm": 2}
    assert stats["top_misses"] == []
    assert sum(p["ahead_compiles"] for p in stats["series"]) == 5
    assert sum(p["misses"] for p in stats["series"]) == 0
    (group,) = stats["groups"]
    assert (group["hit_rate"], group["ahead_compiles"]) == (1.0, 5)

    writer.post("/v1/events", json=[event("miss", job="run", key="MODULE_9+abcd0000", ts=now - 20)])
    stats = writer.get("/v1/stats", params={"window": "1h"}).json()
    assert stats["hit_rate"] == pytest.approx(0.75)
    assert [m["graph"] for m in stats["top_misses"]] == ["MODULE_9+abcd0000"]


def test_stats_sizes_states_and_problems(writer: httpx.Client) -> None:
    writer.post("/v1/entries", json=[entry(1, size=100), entry(2, size=300), entry(3, state="FAILED", size=5),
                                     entry(4, state="LOCKED", size=0)]).raise_for_status()
    stats = writer.get("/v1/stats").json()
    assert stats["size_by_toolchain"] == [{"toolchain": TOOLCHAIN_LABEL, "entries": 4, "bytes": 405}]
    assert stats["entries_by_state"]["SUCCESS"] == 2
    assert stats["entries_by_state"]["FAILED"] == 1
    assert {p["state"] for p in stats["problem_entries"]} == {"FAILED", "LOCKED"}
    narrowed = writer.get("/v1/stats", params={"team": "nobody"}).json()
    assert narrowed["size_by_toolchain"] == []


def test_stats_on_an_empty_index(reader: httpx.Client) -> None:
    stats = reader.get("/v1/stats", params={"window": "24h"}).json()
    assert stats["totals"]["hit_rate"] is None
    assert stats["groups"] == [] and stats["top_misses"] == []
    assert len(stats["series"]) in (24, 25)


def test_retention_refuses_expired_events_and_sweeps_old_rows(db_url: str,
                                                              start_server: Callable[..., LiveServer]) -> None:
    server = start_server(db_url, event_retention_days=30)
    tokens = make_tokens(server.db)
    now = time.time()
    with server.client(tokens.write) as writer:
        result = writer.post("/v1/events", json=[event("hit", ts=now - 40 * 86400), event("hit", ts=now - 20 * 86400),
                                                 event("miss")]).json()
        assert result == {"accepted": 2, "duplicates": 0, "expired": 1}
        with server.db.write() as session:
            assert event_log.sweep_events(session, before=now - 10 * 86400) == 1
        totals = writer.get("/v1/stats", params={"window": "60d"}).json()["totals"]
    assert (totals["hits"], totals["misses"]) == (1, 1)  # the rollups keep what the raw rows said
