"""``usage_hits``: the index's hit counts weigh a gate, so an answer that is not one is an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from neffcache.errors import IndexServerError
from neffcache.index import IndexClient, NullIndex


def _client(tmp_path: Path, pages: list[dict[str, Any]]) -> tuple[IndexClient, list[httpx.Request]]:
    asked: list[httpx.Request] = []
    answers = iter(pages)

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        return httpx.Response(200, json=next(answers))

    return IndexClient("http://index.invalid", "t", spool_dir=tmp_path, transport=httpx.MockTransport(answer)), asked


def test_pages_are_followed_and_summed(tmp_path: Path) -> None:
    client, asked = _client(tmp_path, [
        {"hits": [{"path": "a/MODULE_1+x", "hits": 3, "last_hit": 1.0}], "next_cursor": "a/MODULE_1+x"},
        {"hits": [{"path": "a/MODULE_2+x", "hits": 1, "last_hit": 1.0}], "next_cursor": None},
    ])
    try:
        assert client.usage_hits("trn2-lnc2/neuronxcc-2.27", since=1e9, until=2e9) == {"a/MODULE_1+x": 3,
                                                                                     "a/MODULE_2+x": 1}
    finally:
        client.close()
    assert [r.url.params.get("cursor") for r in asked] == [None, "a/MODULE_1+x"]
    assert asked[0].url.params["toolchain"] == "trn2-lnc2/neuronxcc-2.27"


@pytest.mark.parametrize("pages", [
    [{"hits": [{"path": "a", "hits": "many"}], "next_cursor": None}],
    [{"hits": [{"path": "a", "hits": -1}], "next_cursor": None}],
    [{"hits": [{"hits": 1}], "next_cursor": None}],
    [{"rows": []}],
    [{"hits": [], "next_cursor": "a"}, {"hits": [], "next_cursor": "a"}],  # a cursor that never moves on
])
def test_a_malformed_answer_is_an_index_error(tmp_path: Path, pages: list[dict[str, Any]]) -> None:
    client, _ = _client(tmp_path, pages)
    try:
        with pytest.raises(IndexServerError):
            client.usage_hits("t", since=1e9, until=2e9)
    finally:
        client.close()


def test_no_index_knows_no_hits() -> None:
    assert NullIndex().usage_hits("t", since=1e9, until=2e9) == {}


@pytest.mark.parametrize("pages", [
    [{"misses": [{"path": "a", "misses": 1, "last_miss": "yesterday"}], "next_cursor": None}],
    [{"misses": [{"path": "a", "misses": -2, "last_miss": 1.0}], "next_cursor": None}],
    [{"misses": [{"path": "a", "misses": True, "last_miss": 1.0}], "next_cursor": None}],
    [{"misses": [{"path": 7, "misses": 1, "last_miss": 1.0}], "next_cursor": None}],
    [{"misses": "all of them"}],
    [{"misses": [], "next_cursor": "a"}, {"misses": [], "next_cursor": "a"}],
])
def test_a_malformed_misses_answer_is_an_index_error(tmp_path: Path, pages: list[dict[str, Any]]) -> None:
    """Misses judge evictions (``prune --regret``): an answer that is not a list of (path,
    count, last miss) is refused, not half-read."""
    client, _ = _client(tmp_path, pages)
    try:
        with pytest.raises(IndexServerError):
            client.usage_misses(since=1e9, until=2e9)
    finally:
        client.close()
    assert NullIndex().usage_misses(since=1e9, until=2e9) == {}
