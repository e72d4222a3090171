"""Two uvicorn server processes on one PostgreSQL, many concurrent clients.

Events are counted exactly once however often and to whichever replica a batch is resent;
a lease is never held by two owners at once, and an expired lease goes to exactly one of the
clients racing for it.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import ServerProcess, Tokens, free_port, prepare_database
from tests.server.factories import entry, event

CLIENTS = 16
BATCHES = 12
BATCH_SIZE = 25
LEASE_ROUNDS = 15
LEASE_NAMES = ("graph/A", "graph/B", "graph/C")

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def replicas(pg_url: str, tmp_path: Path) -> Iterator[tuple[list[ServerProcess], Tokens]]:
    logs = tmp_path
    tokens = prepare_database(pg_url)
    servers = [ServerProcess(pg_url, free_port(), logs / f"replica-{i}.log") for i in range(2)]
    try:
        for server in servers:
            server.wait_ready()
        yield servers, tokens
    finally:
        for server in servers:
            server.stop()


def test_two_replicas_many_clients(replicas: tuple[list[ServerProcess], Tokens]) -> None:
    """One test, two phases: starting two replicas is the slow part, so they are started once."""
    _counts_exact_and_no_lease_held_twice(*replicas)
    _expired_lease_goes_to_exactly_one_racer(*replicas)


def _counts_exact_and_no_lease_held_twice(servers: list[ServerProcess], tokens: Tokens) -> None:
    headers = {"Authorization": f"Bearer {tokens.write}"}
    entries = [entry(i, store=f"s3://bucket-{i % 3}/p") for i in range(20)]
    inside: dict[str, str] = {}
    inside_lock = threading.Lock()
    violations: list[str] = []
    held_count = 0

    def client_work(n: int) -> tuple[int, int]:
        nonlocal held_count
        rng = random.Random(n)
        clients = [httpx.Client(base_url=s.url, headers=headers, timeout=60) for s in servers]
        sent_hits = 0
        try:
            # Every client registers the same entries from its own store: concurrent upserts.
            mine = [{**e, "store": f"fsx://client-{n}"} for e in entries]
            clients[n % 2].post("/v1/entries", json=mine).raise_for_status()
            for b in range(BATCHES):
                batch = [event("hit", path=rng.choice(entries)["path"]) if i % 2
                         else event("miss", key=f"MODULE_{n}+{b}") for i in range(BATCH_SIZE)]
                sent_hits += sum(1 for e in batch if e["kind"] == "hit")
                clients[b % 2].post("/v1/events", json=batch).raise_for_status()
                if b % 3 == 0:  # a spool resending after a lost response, to the other replica
                    again = clients[(b + 1) % 2].post("/v1/events", json=batch).json()
                    assert again == {"accepted": 0, "duplicates": BATCH_SIZE, "expired": 0}
            owner = f"client-{n}:{n}:x"
            for r in range(LEASE_ROUNDS):
                name = rng.choice(LEASE_NAMES)
                got = clients[r % 2].post("/v1/leases/acquire", json={"name": name, "owner": owner, "ttl": 30}).json()
                if not got["held"]:
                    assert got["owner"] != owner and got["expires_in"] > 0
                    continue
                with inside_lock:
                    if name in inside:
                        violations.append(f"{name} held by {inside[name]} and {owner}")
                    inside[name] = owner
                    held_count += 1
                time.sleep(rng.uniform(0, 0.004))
                with inside_lock:
                    inside.pop(name, None)
                released = clients[(r + 1) % 2].post("/v1/leases/release", json={"name": name, "owner": owner})
                if released.status_code != 200:  # someone took it while we held it
                    violations.append(f"{name} lost by {owner} while held: {released.text}")
            return BATCHES * BATCH_SIZE, sent_hits
        finally:
            for client in clients:
                client.close()

    with ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(client_work, range(CLIENTS)))

    assert violations == []
    assert held_count > 0
    total_events = sum(r[0] for r in results)
    total_hits = sum(r[1] for r in results)
    with httpx.Client(base_url=servers[0].url, headers=headers) as check:
        totals = check.get("/v1/stats", params={"window": "1d"}).json()["totals"]
        assert totals["hits"] + totals["misses"] == total_events
        assert totals["hits"] == total_hits
        listed = check.get("/v1/entries", params={"limit": 1000}).json()["entries"]
    assert len(listed) == len(entries)
    assert sum(e["hit_count"] for e in listed) == total_hits
    for record in listed:
        assert len(record["stores"]) == CLIENTS

    # Every replica reports the same database-derived counters.
    metrics = [httpx.get(f"{s.url}/metrics", headers=headers).text for s in servers]
    lines = [sorted(line for line in text.splitlines() if line.startswith("neffcache_cache_events_total"))
             for text in metrics]
    assert lines[0] == lines[1] and lines[0]


def _expired_lease_goes_to_exactly_one_racer(servers: list[ServerProcess], tokens: Tokens) -> None:
    headers = {"Authorization": f"Bearer {tokens.write}"}
    for round_ in range(5):
        name = f"contested/{round_}"
        httpx.post(f"{servers[0].url}/v1/leases/acquire", headers=headers,
                   json={"name": name, "owner": "dead-host:1:x", "ttl": 0.3}).raise_for_status()
        time.sleep(0.4)
        barrier = threading.Barrier(CLIENTS)

        def race(n: int, name: str = name, barrier: threading.Barrier = barrier) -> bool:
            with httpx.Client(base_url=servers[n % 2].url, headers=headers, timeout=60) as client:
                client.get("/healthz")  # connection open before the start line
                barrier.wait()
                got = client.post("/v1/leases/acquire", json={"name": name, "owner": f"racer-{n}", "ttl": 60})
                return bool(got.json()["held"])

        with ThreadPoolExecutor(CLIENTS) as pool:
            winners = sum(pool.map(race, range(CLIENTS)))
        assert winners == 1, f"round {round_}: {winners} winners"
