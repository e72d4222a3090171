"""POST /v1/entries/lookup on SQLite and PostgreSQL: many entries in one round trip, each with
its stores, the rest listed as missing; hostile batches refused whole, with the bad path named."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.server.conftest import LiveServer, Tokens, make_tokens
from tests.server.factories import NAMESPACE, entry

FSX = "fsx:///mnt/fsx/cache"


def _register(writer: httpx.Client, records: list[dict[str, object]]) -> None:
    for start in range(0, len(records), 5000):
        writer.post("/v1/entries", json=records[start:start + 5000]).raise_for_status()


def _lookup_requests(server: LiveServer, token: str) -> float:
    """How many batch lookups this replica answered (its own request counter, from /metrics)."""
    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {token}"}).text
    lines = [line for line in text.splitlines()
             if line.startswith("neffcache_index_requests_total") and 'op="entries.lookup_many"' in line]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_a_thousand_paths_are_answered_in_one_request(server: LiveServer, tokens: Tokens,
                                                      writer: httpx.Client, reader: httpx.Client) -> None:
    held = [entry(i) for i in range(700)]
    _register(writer, held)
    _register(writer, [{**record, "store": FSX} for record in held[:100]])  # a second tier holds some
    asked = [f"{NAMESPACE}/MODULE_{5000 + i}+00000000" if i % 10 == 3 else held[i % 700]["path"]
             for i in range(1000)]
    asked = list(dict.fromkeys(asked))
    wanted_missing = [path for path in asked if "+00000000" in path]
    before = _lookup_requests(server, tokens.admin)

    response = reader.post("/v1/entries/lookup", json={"paths": asked})

    assert response.status_code == 200, response.text
    assert _lookup_requests(server, tokens.admin) - before == 1
    body = response.json()
    assert [e["path"] for e in body["found"]] == [p for p in asked if p not in wanted_missing]
    assert body["missing"] == wanted_missing
    by_path = {e["path"]: e for e in body["found"]}
    assert by_path[held[0]["path"]]["stores"] == [FSX, "s3://bucket/prefix"]
    assert by_path[held[500]["path"]]["stores"] == ["s3://bucket/prefix"]
    assert by_path[held[500]["path"]]["tags"] == {"bucket": "seq2048", "model": "llama3-8b", "team": "search"}
    single = reader.get(f"/v1/entries/{held[500]['path']}").json()
    assert by_path[held[500]["path"]] == single  # the same record as the single lookup's


def test_repeats_are_answered_once_and_paths_come_back_canonical(writer: httpx.Client) -> None:
    record = entry(1)
    _register(writer, [record])
    slashed = record["path"].replace("/", "//", 1)
    body = writer.post("/v1/entries/lookup", json={"paths": [record["path"], slashed, "ns/x", "ns/x"]}).json()
    assert [e["path"] for e in body["found"]] == [record["path"]]
    assert body["missing"] == ["ns/x"]
    assert writer.post("/v1/entries/lookup", json={"paths": []}).json() == {"found": [], "missing": []}


@pytest.mark.parametrize(("paths", "named"), [
    (["ns/ok", "../etc/passwd"], "paths.1"),
    (["ns/ok", "ns/a\x01b"], "control characters"),
    (["/etc/passwd"], "absolute"),
    (["ns/a\\b"], "backslashes"),
    (["ns/../../x"], "'..'"),
    ([""], "paths.0"),
    (["ns/" + "a" * 1100], "paths.0"),
])
def test_a_bad_path_refuses_the_batch_and_is_named(reader: httpx.Client, paths: list[str], named: str) -> None:
    response = reader.post("/v1/entries/lookup", json={"paths": paths})
    assert response.status_code == 422, response.text
    assert named in response.json()["detail"]
    assert len(response.content) < 2048  # the input is not echoed back at length


def test_more_than_ten_thousand_paths_is_refused_with_the_limit(reader: httpx.Client) -> None:
    response = reader.post("/v1/entries/lookup", json={"paths": [f"ns/k{i}" for i in range(10_001)]})
    assert response.status_code == 422
    assert "at most 10000" in response.json()["detail"]
    assert len(response.content) < 4096  # the 10,001 paths are not echoed back
    at_limit = reader.post("/v1/entries/lookup", json={"paths": [f"ns/k{i}" for i in range(10_000)]})
    assert at_limit.status_code == 200 and len(at_limit.json()["missing"]) == 10_000


def test_a_body_over_the_servers_limit_is_413(reader: httpx.Client) -> None:
    long_paths = [f"ns/{i:04d}" + "a" * 1000 for i in range(5000)]  # ~5 MB, above the 4 MiB default
    assert reader.post("/v1/entries/lookup", json={"paths": long_paths}).status_code == 413


@pytest.mark.parametrize("body", [
    {"paths": "ns/a"}, ["ns/a"], {"paths": [1, 2]}, {"paths": None}, {}, {"paths": ["ns/a"], "more": 1},
    {"paths": [["ns/a"]]}, "paths",
])
def test_a_body_of_the_wrong_shape_is_422(reader: httpx.Client, body: object) -> None:
    response = reader.post("/v1/entries/lookup", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["detail"]


def test_malformed_json_is_422(reader: httpx.Client) -> None:
    response = reader.post("/v1/entries/lookup", content=b'{"paths": ["ns/a",', headers={"Content-Type":
                                                                                            "application/json"})
    assert response.status_code == 422


def test_a_read_token_is_enough_and_no_token_is_refused(server: LiveServer, tokens: Tokens) -> None:
    body = {"paths": ["ns/a"]}
    with server.client() as anonymous:
        assert anonymous.post("/v1/entries/lookup", json=body).status_code == 401
    with server.client("not-a-token") as forged:
        assert forged.post("/v1/entries/lookup", json=body).status_code == 401
    for token in (tokens.read, tokens.write, tokens.admin):
        with server.client(token) as client:
            assert client.post("/v1/entries/lookup", json=body).json() == {"found": [], "missing": ["ns/a"]}


def test_anonymous_reads_may_look_up_in_batches(db_url: str, start_server: Callable[..., LiveServer]) -> None:
    live = start_server(db_url, anonymous_read=True)
    tokens = make_tokens(live.db)
    with live.client(tokens.write) as writer:
        _register(writer, [entry(3)])
    with live.client() as anonymous:
        body = anonymous.post("/v1/entries/lookup", json={"paths": [entry(3)["path"]]}).json()
        assert [e["key"] for e in body["found"]] == [entry(3)["key"]]
        assert anonymous.post("/v1/entries", json=[entry(4)]).status_code == 401  # writing still needs a token
