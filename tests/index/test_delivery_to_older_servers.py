"""Clients upgraded before the server: an index that does not know the entries' graph inputs
(it forbids unknown fields) gets the batch again without them, and nothing is set aside."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from neffcache.index import IndexClient
from neffcache.index.delivery import NEWER_ENTRY_FIELDS
from tests.server.conftest import LiveServer, Tokens
from tests.server.factories import digest, entry


def test_the_server_names_an_unknown_field_as_extra_forbidden(server: LiveServer, tokens: Tokens) -> None:
    """The refusal an older server gives for a field it does not know: the form the client reads."""
    with server.client(tokens.write) as writer:
        response = writer.post("/v1/entries", json=[entry(1), {**entry(2), "from_the_future": 1}])
    assert response.status_code == 422
    assert response.json()["errors"] == [
        {"loc": ["body", 1, "from_the_future"], "msg": "Extra inputs are not permitted", "type": "extra_forbidden"}]


class OlderServer:
    """POST /v1/entries as an index before the graph inputs answers it (same error body)."""

    def __init__(self) -> None:
        self.bodies: list[list[dict[str, object]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        items = json.loads(request.content)
        self.bodies.append(items)
        errors = [{"loc": ["body", i, name], "msg": "Extra inputs are not permitted", "type": "extra_forbidden"}
                  for i, item in enumerate(items) for name in sorted(item) if name in NEWER_ENTRY_FIELDS]
        errors += [{"loc": ["body", i, "path"], "msg": "Value error, invalid key", "type": "value_error"}
                   for i, item in enumerate(items) if ".." in item["path"]]
        if errors:
            return httpx.Response(422, json={"detail": "invalid", "errors": errors[:50]})
        return httpx.Response(200, json={"registered": len(items)})


def _client(tmp_path: Path, older: OlderServer) -> IndexClient:
    return IndexClient("http://index.invalid", "t", spool_dir=tmp_path / "spool", retries=0, flush_interval=3600,
                       transport=httpx.MockTransport(older))


def test_an_older_server_gets_the_entries_without_their_inputs(tmp_path: Path) -> None:
    older = OlderServer()
    client = _client(tmp_path, older)
    client.register_entries([entry(i, hlo_sha256=digest(i), hlo_size=10, flags=["-O1"]) for i in range(300)])
    report = client.flush()
    assert (report.delivered_entries, report.rejected) == (300, 0)
    assert len(older.bodies) == 2 and not any(NEWER_ENTRY_FIELDS & set(item) for item in older.bodies[-1])
    assert [item["path"] for item in older.bodies[-1]] == [entry(i)["path"] for i in range(300)]
    client.close()
    assert not client.spool.rejected_dir.exists() or not any(client.spool.rejected_dir.iterdir())


def test_an_invalid_entry_is_still_set_aside_alone(tmp_path: Path) -> None:
    older = OlderServer()
    client = _client(tmp_path, older)
    client.register_entries([entry(1, flags=[]), entry(2, path="../escape", flags=[]), entry(3, flags=[])])
    report = client.flush()
    assert (report.delivered_entries, report.rejected) == (2, 1)
    assert [item["path"] for item in older.bodies[-1]] == [entry(1)["path"], entry(3)["path"]]
    client.close()
