"""Authentication and scopes: 401 without or with a bad token, 403 with too small a scope."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.server.conftest import ADMIN_SECRET, LiveServer, Tokens, make_tokens
from tests.server.factories import entry, event

# (method, path, json, scope needed)
ROUTES: list[tuple[str, str, object, str]] = [
    ("GET", "/v1/entries", None, "read"),
    ("GET", "/v1/entries/ns/MODULE_1+abcd0000", None, "read"),
    ("GET", "/v1/stats", None, "read"),
    ("GET", "/v1/leases", None, "read"),
    ("GET", "/v1/whoami", None, "read"),
    ("GET", "/metrics", None, "read"),
    ("POST", "/v1/entries", [entry(1)], "write"),
    ("POST", "/v1/events", [event("hit")], "write"),
    ("POST", "/v1/leases/acquire", {"name": "n", "owner": "o", "ttl": 5}, "write"),
    ("DELETE", "/v1/entries/ns/MODULE_1+abcd0000", None, "write"),
    ("GET", "/v1/tokens", None, "admin"),
    ("POST", "/v1/tokens", {"name": "new-one", "scope": "read"}, "admin"),
]
RANK = {"read": 0, "write": 1, "admin": 2}


def _call(server: LiveServer, method: str, path: str, body: object, token: str | None) -> httpx.Response:
    with server.client(token) as client:
        return client.request(method, path, json=body)


@pytest.mark.parametrize(("method", "path", "body", "needed"), ROUTES, ids=[f"{m} {p}" for m, p, _, _ in ROUTES])
def test_scope_matrix(server: LiveServer, tokens: Tokens, method: str, path: str, body: object,
                      needed: str) -> None:
    missing = _call(server, method, path, body, None)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert "authentication required" in missing.json()["detail"]
    for bad in ("nfc_000000000000_wrong", "garbage", tokens.read[:-2] + "xx"):
        assert _call(server, method, path, body, bad).status_code == 401
    for scope in ("read", "write", "admin"):
        response = _call(server, method, path, body, getattr(tokens, scope))
        if RANK[scope] < RANK[needed]:
            assert response.status_code == 403, (scope, response.text)
            assert f"this needs {needed!r}" in response.json()["detail"]
        else:
            assert response.status_code not in (401, 403), (scope, response.text)


def test_nothing_changes_on_a_refused_write(server: LiveServer, tokens: Tokens) -> None:
    record = entry(7)
    assert _call(server, "POST", "/v1/entries", [record], tokens.read).status_code == 403
    assert _call(server, "POST", "/v1/entries", [record], None).status_code == 401
    assert _call(server, "GET", f"/v1/entries/{record['path']}", None, tokens.read).status_code == 404


def test_anonymous_reads_only_when_configured(sqlite_url: str, start_server: Callable[..., LiveServer]) -> None:
    open_server = start_server(sqlite_url, anonymous_read=True)
    with open_server.client() as client:
        assert client.get("/v1/stats").status_code == 200
        assert client.get("/v1/whoami").json() == {"name": "anonymous", "scope": "read", "anonymous": True,
                                                   "team": "", "prefixes": []}
        assert client.post("/v1/events", json=[event("hit")]).status_code == 401
        assert client.get("/v1/tokens").status_code == 401


def test_revoked_token_is_refused(server: LiveServer, tokens: Tokens) -> None:
    with server.client(tokens.admin) as admin:
        created = admin.post("/v1/tokens", json={"name": "short-lived", "scope": "write"}).json()
        assert _call(server, "GET", "/v1/whoami", None, created["token"]).json()["name"] == "short-lived"
        assert admin.delete("/v1/tokens/short-lived").json()["active"] is False
        listed = {t["name"]: t for t in admin.get("/v1/tokens").json()}
    assert listed["short-lived"]["revoked"] is not None
    assert "token" not in listed["short-lived"]  # secrets are never listed
    assert _call(server, "GET", "/v1/whoami", None, created["token"]).status_code == 401


def test_token_names_are_unique(server: LiveServer, tokens: Tokens) -> None:
    with server.client(tokens.admin) as admin:
        assert admin.post("/v1/tokens", json={"name": "dup", "scope": "read"}).status_code == 201
        again = admin.post("/v1/tokens", json={"name": "dup", "scope": "read"})
    assert again.status_code == 409 and "exists already" in again.json()["detail"]


def test_bootstrap_admin_token_from_settings(server: LiveServer) -> None:
    with server.client(ADMIN_SECRET) as admin:
        assert admin.get("/v1/whoami").json()["scope"] == "admin"
        assert admin.post("/v1/tokens", json={"name": "first", "scope": "admin"}).status_code == 201


def test_tokens_are_stored_hashed(server: LiveServer) -> None:
    tokens = make_tokens(server.db)
    from sqlalchemy import text

    with server.db.read() as session:
        stored = " ".join(str(v) for row in session.execute(text("SELECT * FROM tokens")) for v in row)
    for secret in (tokens.read, tokens.write, tokens.admin):
        assert secret.split("_", 2)[2] not in stored


def test_dashboard_cookie_is_read_only(server: LiveServer, tokens: Tokens) -> None:
    with server.client() as browser:
        login = browser.get("/", params={"token": tokens.admin, "team": "x"})
        assert login.status_code == 303 and login.headers["location"] == "/?team=x"
        assert "samesite=strict" in login.headers["set-cookie"].lower()
        assert browser.get("/").status_code == 200
        assert browser.get("/v1/stats").status_code == 200
        # The same (admin) token as a cookie must not authorise writes: a cross-site form could send it.
        assert browser.post("/v1/events", json=[event("hit")]).status_code == 401
        assert browser.get("/v1/tokens").status_code == 401


def test_dashboard_without_token_shows_how_to_get_one(server: LiveServer) -> None:
    with server.client() as browser:
        page = browser.get("/")
    assert page.status_code == 401
    assert "neffcache token create dashboard --scope read" in page.text
