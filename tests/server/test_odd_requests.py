"""No query string or header makes any route answer 500 (issue 41): every route of the app, with
odd query strings (non-Latin-1, invalid UTF-8, NUL, broken escapes, huge numbers, repeats), odd
values for each of its own query parameters, and odd Authorization and Cookie headers, as no
client, a read token and an admin token. ``/?token=<non-Latin-1>`` was a 500 with a traceback,
unauthenticated."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from tests.server.conftest import ADMIN_SECRET, LiveServer, Tokens

pytestmark = pytest.mark.slow

ODD_QUERIES = [
    "token=%C3%A9%E2%82%AC", "token=%FF%FE", "token=%00", "token=" + "A" * 300, "token=a%20b;c",
    "%ZZ=%ZZ", "%%%", "=&=&", "a=1&a=2&a=3", "\u00e9=\u20ac", "x=" + "%F0%9F%92%A9" * 200, "x=" + "y" * 8000,
]
ODD_VALUES = ["%FF", "%00", "%C3%A9%E2%82%AC", "1e999", "nan", "-1", "99999999999999999999999999", "",
              "%E2%80%AE", "..%2F..%2Fetc", "a" * 2000]
ODD_HEADERS: list[dict[str, bytes]] = [
    {"authorization": b"Bearer \xe9\xff\xfe"}, {"authorization": b"Bearer "}, {"authorization": b"Basic Zm9vOmJhcg=="},
    {"authorization": b"Bearer nfc_" + b"0" * 12 + b"_\xc3\xa9"}, {"cookie": b"neffcache_token=\xff\xfe"},
    {"cookie": b"neffcache_token=\"unterminated"}, {"x-forwarded-for": b"\xff, not an address"},
    {"content-type": b"application/json; charset=\xff"}, {"accept": b"\x00"},
]


@pytest.fixture
def server(db_url: str, start_server: Callable[..., LiveServer]) -> LiveServer:
    """A server whose token limit never trips: the odd Authorization headers are failed token
    checks, and past the limit every request would get 429 before reaching its route."""
    return start_server(db_url, auth_failures_per_minute=100_000)


def _routes(server: LiveServer) -> list[tuple[str, str, list[str]]]:
    """(method, concrete path, its query parameter names) for every route the app documents,
    plus the dashboard and the pages FastAPI serves itself."""
    found = [("GET", "/", ["window", "team", "model", "group_by", "token"]), ("GET", "/docs", []),
             ("GET", "/openapi.json", []), ("GET", "/static/missing.css", [])]
    for template, operations in server.app.openapi()["paths"].items():
        path = re.sub(r"\{[^}]+\}", "ns/MODULE_1+abcd0000", template)
        for method, operation in operations.items():
            params = sorted(p["name"] for p in operation.get("parameters", []) if p["in"] == "query")
            found.append((method.upper(), path, params))
    return found


@dataclass(frozen=True)
class Answer:
    status: int
    text: str


def _send(server: LiveServer, method: str, url: str, headers: dict[str, bytes] | None = None) -> Answer:
    """One request written byte for byte (clients refuse to send most of these), answered."""
    host, port = server.url.removeprefix("http://").split(":")
    lines = [f"{method} {url} HTTP/1.1".encode("utf-8", "surrogateescape"), b"Host: " + host.encode(),
             b"Connection: close", b"Content-Length: 0"]
    lines += [name.encode() + b": " + value for name, value in (headers or {}).items()]
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n")
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    status_line, _, rest = received.partition(b"\r\n")
    return Answer(int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2].decode(errors="replace"))


def test_no_route_answers_500(server: LiveServer, tokens: Tokens) -> None:
    routes = _routes(server)
    assert len(routes) > 20, routes
    failures = []
    seen: set[int] = set()
    for method, path, params in routes:
        requests = [(f"{path}?{query}", {}) for query in ODD_QUERIES]
        requests += [(f"{path}?{name}={value}", {}) for name in params for value in ODD_VALUES]
        requests += [(path, headers) for headers in ODD_HEADERS]
        for url, extra in requests:
            for token in (None, tokens.read, ADMIN_SECRET):
                headers = {"authorization": f"Bearer {token}".encode()} if token else {}
                response = _send(server, method, url, {**headers, **extra})
                seen.add(response.status)
                if response.status >= 500:
                    failures.append(f"{method} {url} {extra} as {token and token[:8]}: "
                                    f"{response.status} {response.text[:120]}")
    assert not failures, f"{len(failures)} answers of 500 or more:\n" + "\n".join(failures[:20])
    assert {200, 401, 404, 422} <= seen and 429 not in seen, seen  # the routes themselves answered


def test_a_non_latin1_dashboard_token_is_refused_not_a_500(server: LiveServer) -> None:
    response = _send(server, "GET", "/?token=%C3%A9%E2%82%AC")
    assert response.status == 422
    assert "token" in json.loads(response.text)["detail"]
