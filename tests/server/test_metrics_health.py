"""/metrics, /healthz, /readyz."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from neffcache.index.records import EVENT_SOURCES
from neffcache.server.storage.db import head_revision
from tests.server.conftest import LiveServer, Tokens, make_tokens
from tests.server.factories import TOOLCHAIN, TOOLCHAIN_LABEL, entry, event


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_reflect_the_database(server: LiveServer, writer: httpx.Client, reader: httpx.Client) -> None:
    writer.post("/v1/entries", json=[entry(1, size=1000), entry(2, size=2000, state="FAILED")]).raise_for_status()
    writer.post("/v1/events", json=[event("hit", compile_seconds=90.0), event("hit", compile_seconds=30.0),
                                    event("miss"), event("compile", compile_seconds=45.0)]).raise_for_status()
    writer.post("/v1/leases/acquire", json={"name": "l", "owner": "o", "ttl": 60}).raise_for_status()
    reader.get("/v1/entries/ns/MODULE_404+00000000")
    response = reader.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    samples = _samples(response.text)
    team = ("team", "search")
    tc = ("toolchain", TOOLCHAIN_LABEL)
    job = ("source", "job")
    assert samples[("neffcache_cache_events_total", (("kind", "hit"), job, team, tc))] == 2
    assert samples[("neffcache_cache_events_total", (("kind", "miss"), job, team, tc))] == 1
    assert samples[("neffcache_compile_time_saved_seconds_total", (job, team, tc))] == 120.0
    assert samples[("neffcache_compile_seconds_total", (job, team, tc))] == 45.0
    assert samples[("neffcache_entries", (("state", "FAILED"), tc))] == 1
    assert samples[("neffcache_entry_bytes", (tc,))] == 3000
    assert samples[("neffcache_leases_active", ())] == 1
    assert samples[("neffcache_index_database_up", ())] == 1
    assert samples[("neffcache_index_requests_total", (("op", "events.ingest"), ("result", "ok")))] == 1
    assert samples[("neffcache_index_requests_total", (("op", "entries.lookup"), ("result", "not_found")))] == 1


def test_health_and_readiness(server: LiveServer) -> None:
    with server.client() as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        ready = client.get("/readyz").json()
    assert ready["status"] == "ok" and ready["schema"] == head_revision()


def test_not_ready_when_the_database_is_gone(tmp_path, start_server: Callable[..., LiveServer],
                                             tokens: Tokens) -> None:
    broken = start_server(f"sqlite:///{tmp_path / 'missing-dir' / 'sub' / 'x.db'}", auto_migrate=False)
    with broken.client() as client:
        assert client.get("/healthz").status_code == 200
        ready = client.get("/readyz")
    assert ready.status_code == 503 and "schema" in ready.json()["detail"]


def test_metrics_label_values_are_bounded(db_url: str, start_server: Callable[..., LiveServer]) -> None:
    """A write token reporting events for hundreds of made-up teams and toolchains adds at most
    (configured + top N + "other") series per label; the totals stay exact."""
    server = start_server(db_url, metrics_top_n=3, metrics_teams=["platform"])
    tokens = make_tokens(server.db)
    many = 400
    events = [event("miss", team=f"team-{i:04d}",
                    toolchain={**TOOLCHAIN, "compiler_version": f"2.{i % 60}.1.0+f702b353"}) for i in range(many)]
    events += [event("hit", team="big", compile_seconds=10.0) for _ in range(20)]
    events += [event("hit", team="platform", compile_seconds=1.0)]  # small, but configured
    # Warm-ups by every command that warms, and job names nobody configured: the source label
    # takes its values from a fixed set, whatever ``job`` a client sends.
    events += [event("compile", team="big", job=job, compile_seconds=5.0)
               for job in ("warm", "plan", "rewarm", "run", "my-own-job-name", "")]
    entries = [entry(i, toolchain={**TOOLCHAIN, "compiler_version": f"2.{i}.7.0+f702b353"}) for i in range(40)]
    with server.client(tokens.write) as writer:
        for start in range(0, len(events), 200):
            writer.post("/v1/events", json=events[start:start + 200]).raise_for_status()
        writer.post("/v1/entries", json=entries).raise_for_status()
    with server.client(tokens.read) as reader:
        text = reader.get("/metrics").text
    samples = _samples(text)
    counted = {k: v for k, v in samples.items() if k[0] == "neffcache_cache_events_total"}
    teams = {dict(labels)["team"] for _, labels in counted}
    toolchains = {dict(labels)["toolchain"] for _, labels in counted}
    assert "platform" in teams and "big" in teams and "other" in teams
    assert {dict(labels)["source"] for _, labels in counted} == set(EVENT_SOURCES)
    spent = {dict(labels)["source"]: v for (name, labels), v in samples.items()
             if name == "neffcache_compile_seconds_total" and dict(labels)["team"] == "big"}
    assert spent == {"job": 15.0, "warm": 10.0, "rewarm": 5.0}
    assert len(teams) <= 1 + 3 + 1, teams
    assert len(toolchains) <= 3 + 1, toolchains
    assert sum(counted.values()) == len(events)
    saved = sum(v for k, v in samples.items() if k[0] == "neffcache_compile_time_saved_seconds_total")
    assert saved == 20 * 10.0 + 1.0
    catalog = {dict(labels)["toolchain"] for name, labels in samples if name == "neffcache_entries"}
    assert len(catalog) <= 3 + 1 and "other" in catalog
    assert sum(v for k, v in samples.items() if k[0] == "neffcache_entries") == len(entries)
    assert len(text) < 20_000
