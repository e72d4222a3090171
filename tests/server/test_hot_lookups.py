"""The hot path for single-key lookups (server/api/hot.py) answers exactly what the route does.

A first request with a token goes through the app (the token is verified and stamped); once
the token is settled in the cache the same request is answered by the hot path. Every pair
below must be byte-identical, a miss (404) included, and what the hot path must not answer (a
bad path, a revoked token, another route's path) must still get the app's own answer."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from neffcache.server.api.deps import TOKEN_COOKIE
from neffcache.server.api.hot import HotLookups
from tests.server.conftest import ADMIN_SECRET, LiveServer, make_tokens
from tests.server.factories import entry


@pytest.fixture
def cached(db_url: str, start_server: Callable[..., LiveServer]) -> LiveServer:
    return start_server(db_url, token_cache_seconds=60.0)


def _answer(response: httpx.Response) -> tuple[int, bytes, str | None]:
    return response.status_code, response.content, response.headers.get("content-type")


def _hot_calls(server: LiveServer) -> int:
    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {ADMIN_SECRET}"}).text
    line = next((ln for ln in text.splitlines()
                 if ln.startswith("neffcache_index_requests_total{") and 'op="entries.lookup"' in ln
                 and 'result="ok"' in ln), None)
    return int(float(line.rsplit(" ", 1)[1])) if line else 0


def test_the_hot_path_answers_what_the_route_answers(cached: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = make_tokens(cached.db)
    with cached.client(tokens.write) as writer:
        writer.post("/v1/entries", json=[entry(1), entry(2, tags={"team": "ünïcode ✓"})]).raise_for_status()
    answered: list[str] = []
    original = HotLookups._answer

    async def spy(self: HotLookups, scope: dict) -> object:
        found = await original(self, scope)
        if found is not None:
            answered.append(scope["path"])
        return found

    monkeypatch.setattr(HotLookups, "_answer", spy)
    # The app's answer: the same token as the dashboard's cookie, which the hot path never takes.
    with cached.client(cookies={TOKEN_COOKIE: tokens.read}) as app, cached.client(tokens.read) as reader:
        reader.get("/v1/entries/warm-up")  # the app verifies and stamps the token (a 404)
        answered.clear()
        for i in (1, 2, 99, 100):  # 99 and 100 are misses: as frequent as hits while a cache fills
            path = f"/v1/entries/{entry(i)['path']}"
            expected = app.get(path)
            assert expected.status_code == (200 if i < 99 else 404) and not answered
            got = reader.get(path)
            assert answered == [path], "the settled token's lookup did not take the hot path"
            assert _answer(got) == _answer(expected)
            answered.clear()
        # What the hot path hands on gets the app's own answer, the same as without it.
        for path in ("/v1/entries/ns/..%2F..%2Fetc/passwd",
                     "/v1/entries/similar", "/v1/entries/compile-samples?target=trn2", "/v1/entries/a%00b"):
            expected, got = app.get(path), reader.get(path)
            assert not answered, path
            assert _answer(got) == _answer(expected), path
            assert got.status_code in (404, 422, 200), (path, got.status_code)
    with cached.client(ADMIN_SECRET) as admin:  # the bootstrap token is never cached: always settled
        assert admin.get(f"/v1/entries/{entry(1)['path']}").status_code == 200
        assert answered


def test_a_revoked_token_is_refused_at_once_on_the_replica_that_revoked_it(cached: LiveServer) -> None:
    tokens = make_tokens(cached.db)
    with cached.client(tokens.write) as writer:
        writer.post("/v1/entries", json=[entry(1)]).raise_for_status()
    with cached.client(ADMIN_SECRET) as admin:
        listed = admin.get("/v1/tokens").json()
    reader_id = next(t["id"] for t in (listed["tokens"] if isinstance(listed, dict) else listed)
                     if t["name"] == "test-read")
    path = f"/v1/entries/{entry(1)['path']}"
    with cached.client(tokens.read) as reader:
        assert reader.get(path).status_code == 200
        assert reader.get(path).status_code == 200  # settled: the hot path
        with cached.client(ADMIN_SECRET) as admin:
            admin.delete(f"/v1/tokens/{reader_id}").raise_for_status()
        refused = reader.get(path)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"


def test_hot_lookups_are_counted_under_the_routes_name(cached: LiveServer) -> None:
    tokens = make_tokens(cached.db)
    with cached.client(tokens.write) as writer:
        writer.post("/v1/entries", json=[entry(1)]).raise_for_status()
    before = _hot_calls(cached)
    with cached.client(tokens.read) as reader:
        for _ in range(5):
            reader.get(f"/v1/entries/{entry(1)['path']}").raise_for_status()
    assert _hot_calls(cached) - before == 5
