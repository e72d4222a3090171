"""Failed token checks are limited per client address (server/api/auth_limits.py, issue 41):
past the limit a guesser gets 429 with Retry-After and no further check, while tokens verified
already keep working; the bucket refills."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from neffcache.server.api.auth_limits import FailedTokens
from tests.server.conftest import ADMIN_SECRET, LiveServer, free_port, make_tokens, prepare_database

LIMIT = 5


def test_guessing_tokens_gets_429_after_the_limit(sqlite_url: str, start_server: Callable[..., LiveServer]) -> None:
    server = start_server(sqlite_url, auth_failures_per_minute=LIMIT, token_cache_seconds=60.0)
    tokens = make_tokens(server.db)
    with server.client(tokens.read) as known:
        assert known.get("/v1/whoami").status_code == 200  # verified before the guessing starts
    guesses = []
    for n in range(LIMIT + 3):
        with server.client(f"nfc_{n:012x}_guess") as guesser:
            guesses.append(guesser.get("/v1/whoami"))
    assert [r.status_code for r in guesses] == [401] * LIMIT + [429] * 3
    refused = guesses[-1]
    assert "too many failed token checks" in refused.json()["detail"]
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    # The guesser's address is refused for any token new to the server, the bootstrap admin's
    # secret included (guessing it is guessing too); a token verified already still works.
    for token in (tokens.write, ADMIN_SECRET):
        with server.client(token) as new:
            assert new.get("/v1/whoami").status_code == 429
            assert new.get("/v1/entries/ns/MODULE_1+abcd0000").status_code == 429  # the hot path's answer too
    with server.client(tokens.read) as known:
        assert known.get("/v1/whoami").status_code == 200
        assert known.get("/v1/entries/ns/MODULE_1+abcd0000").status_code == 404
    # Requests without a token are not guesses: they get the usual 401.
    with server.client() as anonymous:
        assert anonymous.get("/v1/whoami").status_code == 401


def test_the_dashboard_counts_failures_too(sqlite_url: str, start_server: Callable[..., LiveServer]) -> None:
    server = start_server(sqlite_url, auth_failures_per_minute=LIMIT)
    statuses = []
    for n in range(LIMIT + 1):
        with server.client(cookies={"neffcache_token": f"nfc_{n:012x}_guess"}) as browser:
            statuses.append(browser.get("/").status_code)
    assert statuses == [401] * LIMIT + [429]


def test_the_bucket_refills_and_memory_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("neffcache.server.api.auth_limits.time.monotonic", lambda: now[0])
    limits = FailedTokens(per_minute=6, max_addresses=4)
    for _ in range(6):
        limits.check("10.0.0.1")
        limits.failed("10.0.0.1")
    with pytest.raises(Exception, match="retry in 10 s") as refused:
        limits.check("10.0.0.1")
    assert getattr(refused.value, "status_code", None) == 429
    now[0] += 10.0  # one failure's worth refilled (6 a minute)
    limits.check("10.0.0.1")
    for n in range(10):  # a flood of distinct failing addresses cannot grow the table past its bound
        limits.failed(f"10.1.0.{n}")
        assert len(limits._buckets) <= 4


@pytest.mark.slow
def test_the_limit_reaches_every_worker_of_serve(tmp_path: Path) -> None:
    """`serve --workers 2 --auth-failures-per-minute 2`: the flag reaches both worker processes
    (which build their app from the environment), so at most 2 failures each before 429."""
    port = free_port()
    prepare_database(f"sqlite:///{tmp_path / 'data' / 'index.db'}")
    proc = subprocess.Popen([sys.executable, "-m", "neffcache.cli.main", "serve", "--port", str(port), "--workers", "2",
                             "--auth-failures-per-minute", "2", "--data-dir", str(tmp_path / "data")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        while True:  # bounded by the test's timeout
            assert proc.poll() is None
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        statuses = []
        for n in range(12):  # a new connection each: the kernel spreads them over both workers
            with httpx.Client(headers={"Authorization": f"Bearer nfc_{n:012x}_guess"}, timeout=30) as guesser:
                statuses.append(guesser.get(f"http://127.0.0.1:{port}/v1/whoami").status_code)
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert statuses[:2] == [401, 401] and set(statuses) == {401, 429}, statuses
    assert statuses.count(401) <= 4, statuses  # 2 per worker at most
