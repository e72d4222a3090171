"""Bad input gets a clear 4xx and changes nothing."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.conftest import LiveServer
from tests.server.factories import NAMESPACE, entry, event


def _counts(writer: httpx.Client) -> tuple[int, int]:
    stats = writer.get("/v1/stats", params={"window": "30d"}).json()
    totals = stats["totals"]
    return sum(stats["entries_by_state"].values()), totals["hits"] + totals["misses"] + totals["compiles"]


@pytest.mark.parametrize("path", [
    "../../etc/passwd", "/abs/MODULE_1+abcd0000", "ns/../../x", "ns\\..\\x", "ns/MODULE\x00", ".",
    "ns/a b", "",
])
def test_path_traversal_in_registered_entries(writer: httpx.Client, path: str) -> None:
    response = writer.post("/v1/entries", json=[entry(1, path=path)])
    assert response.status_code == 422
    assert response.json()["detail"].startswith("body.0.path")
    assert _counts(writer) == (0, 0)


@pytest.mark.parametrize("url", ["/v1/entries/ns/%2e%2e/%2e%2e/etc", "/v1/entries/ns/..%2F..%2Fetc",
                                 "/v1/entries/ns/%00", "/v1/entries/ns/a%5Cb"])
def test_path_traversal_in_lookups(writer: httpx.Client, url: str) -> None:
    response = writer.get(url)
    assert response.status_code in (404, 422), response.text
    if response.status_code == 422:
        assert "invalid key" in response.json()["detail"]


def test_traversal_in_event_paths(writer: httpx.Client) -> None:
    response = writer.post("/v1/events", json=[event("hit"), event("hit", path="../../x")])
    assert response.status_code == 422
    assert "body.1.path" in response.json()["detail"]
    assert _counts(writer) == (0, 0)  # the valid event of the batch is not stored either


# Invalid UTF-8 and nesting deeper than the parser's recursion limit were 400s while the docs
# promise 422 for malformed JSON (issue 41): every malformed body is a 422 on every body route.
MALFORMED = [b"{not json", b"[", b"\xff\xfe", b"null", b'{"events": []}', b"[1, 2]", b"\x80abc", b'["\xc3\x28"]',
             b"[" * 100_000, b'{"a":' * 50_000]


@pytest.mark.parametrize("route", ["/v1/events", "/v1/entries", "/v1/entries/lookup", "/v1/leases/acquire"])
@pytest.mark.parametrize("body", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_json(writer: httpx.Client, route: str, body: bytes) -> None:
    response = writer.post(route, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith("body")
    assert _counts(writer) == (0, 0)


def test_unknown_fields_are_refused(writer: httpx.Client) -> None:
    response = writer.post("/v1/entries", json=[{**entry(1), "colour": "blue"}])
    assert response.status_code == 422
    assert "colour" in response.json()["detail"] and "Extra inputs" in response.json()["detail"]
    response = writer.post("/v1/events", json=[{**event("hit"), "extra": 1}])
    assert response.status_code == 422
    response = writer.post("/v1/leases/acquire", json={"name": "n", "owner": "o", "ttl": 5, "force": True})
    assert response.status_code == 422
    assert _counts(writer) == (0, 0)


@pytest.mark.parametrize("bad", [
    {"kind": "teleport"}, {"ts": float("inf")}, {"ts": 1e15}, {"compile_seconds": -1}, {"id": "short"},
    {"toolchain": {"compiler_version": "2.x/../y", "target": "trn2", "lnc": 2}},
    {"toolchain": {"compiler_version": "2.27", "target": "trn9", "lnc": 2}}, {"team": "a\x00b"},
    {"message": "nul\x00byte"},
])
def test_invalid_event_values(writer: httpx.Client, bad: dict[str, object]) -> None:
    body = json.dumps([{**event("hit"), **bad}], allow_nan=True)
    response = writer.post("/v1/events", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert _counts(writer) == (0, 0)


def test_oversized_bodies(server: LiveServer, writer: httpx.Client) -> None:
    limit = server.settings.max_body_bytes
    big = [event("miss", message="x" * 8000) for _ in range(limit // 8000 + 10)]
    response = writer.post("/v1/events", json=big)
    assert response.status_code == 413
    assert "larger than" in response.json()["detail"]

    def chunks():  # no Content-Length: the limit must hold for a streamed body too
        yield b"["
        for _ in range(limit // 1000 + 10):
            yield json.dumps(event("miss", message="y" * 900)).encode() + b","
        yield b"{}]"

    with server.client() as raw:
        streamed = raw.post("/v1/events", content=chunks(), headers={**writer.headers})
    assert streamed.status_code == 413
    too_many = writer.post("/v1/events", json=[event("hit") for _ in range(5001)])
    assert too_many.status_code in (413, 422)
    assert _counts(writer) == (0, 0)


def test_query_parameters_are_checked(reader: httpx.Client) -> None:
    assert reader.get("/v1/stats", params={"window": "forever"}).status_code == 422
    assert reader.get("/v1/entries", params={"limit": 0}).status_code == 422
    assert reader.get("/v1/entries", params={"namespace": f"{NAMESPACE}\x00"}).status_code == 422
    assert reader.get("/v1/entries", params={"tag": "no-equals-sign"}).status_code == 422
    assert reader.get("/v1/entries", params={"cursor": 2**70}).status_code == 422


@pytest.mark.parametrize("where", ["flags", "tags", "message"])
def test_lone_surrogates_are_refused_at_the_door(writer: httpx.Client, where: str) -> None:
    """A lone surrogate (valid as a JSON escape, not as text) would make every later rendering
    of the row fail (orjson refuses to encode it): it is a 422 before anything is stored."""
    if where == "message":
        body = json.dumps([event("error", message="bad \ud800 text")])
        url = "/v1/events"
    else:
        value = {"flags": ["--opt=\ud800"], "tags": {"team": "x\udc00"}}[where]
        body = json.dumps([{**entry(1), where: value}])
        url = "/v1/entries"
    assert "\\ud800" in body or "\\udc00" in body  # sent as the escape a JSON encoder writes
    response = writer.post(url, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert where in response.json()["detail"]
    assert _counts(writer) == (0, 0)
