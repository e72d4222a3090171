"""The client's questions for plan and why-miss against a real server (SQLite and PostgreSQL):
lookup_many in one request per MAX_LOOKUP_BATCH paths, similar, compile_samples."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from neffcache.errors import InvalidKey
from neffcache.index import CompileSample, IndexClient, NullIndex, queries
from neffcache.index.queries import lookup_chunks
from tests.server.conftest import LiveServer, Tokens
from tests.server.factories import COMPILER, NAMESPACE, digest, entry


class CountingTransport(httpx.HTTPTransport):
    """Real HTTP, and a list of the requests sent (method, path)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.method, request.url.path))
        return super().handle_request(request)


@pytest.fixture
def counted(server: LiveServer, tokens: Tokens, tmp_path: Path) -> Iterator[tuple[IndexClient, CountingTransport]]:
    transport = CountingTransport()
    client = IndexClient(server.url, tokens.read, spool_dir=tmp_path / "spool", retries=0, timeout=60,
                         transport=transport)
    yield client, transport
    client.close()


@pytest.fixture
def held(writer: httpx.Client) -> list[str]:
    """600 entries in the index, the first 50 in two stores."""
    records = [entry(i, hlo_sha256=digest(i), hlo_size=1000 + i, flags=["-O1"]) for i in range(600)]
    writer.post("/v1/entries", json=records).raise_for_status()
    writer.post("/v1/entries", json=[{**r, "store": "fsx:///mnt/fsx"} for r in records[:50]]).raise_for_status()
    return [r["path"] for r in records]


def _asked(held: list[str]) -> list[str]:
    return held + [f"{NAMESPACE}/MODULE_{9000 + i}+00000000" for i in range(400)]


def test_lookup_many_asks_once_for_a_thousand_paths(counted: tuple[IndexClient, CountingTransport],
                                                   held: list[str]) -> None:
    client, transport = counted
    answer = client.lookup_many(_asked(held) + held[:10])  # repeats are asked once

    assert transport.sent == [("POST", "/v1/entries/lookup")]
    assert list(answer) == _asked(held)
    assert sum(record is not None for record in answer.values()) == 600
    first = answer[held[0]]
    assert first is not None and first["stores"] == ["fsx:///mnt/fsx", "s3://bucket/prefix"]
    assert (first["hlo_sha256"], first["hlo_size"], first["flags"]) == (digest(0), 1000, ["-O1"])
    assert answer[f"{NAMESPACE}/MODULE_9000+00000000"] is None


def test_lookup_many_splits_past_the_batch_limit(counted: tuple[IndexClient, CountingTransport], held: list[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    client, transport = counted
    whole = client.lookup_many(_asked(held))
    monkeypatch.setattr(queries, "MAX_LOOKUP_BATCH", 600)
    transport.sent.clear()
    split = client.lookup_many(_asked(held))
    assert transport.sent == [("POST", "/v1/entries/lookup")] * 2
    assert split == whole


def test_lookup_many_splits_long_paths_by_bytes(counted: tuple[IndexClient, CountingTransport], held: list[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    client, transport = counted
    body_bytes = sum(len(path) + 4 for path in _asked(held))
    monkeypatch.setattr(queries, "MAX_LOOKUP_BYTES", body_bytes // 2 + 1000)
    answer = client.lookup_many(_asked(held))
    assert len(transport.sent) == 2
    assert sum(record is not None for record in answer.values()) == 600


def test_lookup_many_answers_in_the_callers_spelling(counted: tuple[IndexClient, CountingTransport],
                                                    held: list[str]) -> None:
    client, _ = counted
    spelled = "./" + held[0].replace("/", "//")
    answer = client.lookup_many([spelled])
    assert list(answer) == [spelled] and answer[spelled] is not None and answer[spelled]["path"] == held[0]


def test_lookup_many_refuses_a_bad_path_before_asking(counted: tuple[IndexClient, CountingTransport]) -> None:
    client, transport = counted
    with pytest.raises(InvalidKey, match=r"'\.\.' is not allowed"):
        client.lookup_many([f"{NAMESPACE}/MODULE_1+abcd0001", "../../etc/passwd"])
    assert transport.sent == []
    assert client.lookup_many([]) == {} and transport.sent == []


def test_similar_and_compile_samples_through_the_client(counted: tuple[IndexClient, CountingTransport],
                                                        held: list[str]) -> None:
    client, _ = counted
    same = client.similar(hlo_sha256=digest(7))
    assert [e["path"] for e in same] == [held[7]]
    tagged = client.similar(model="llama3-8b", limit=5)
    assert len(tagged) == 5 and all(e["tags"]["model"] == "llama3-8b" for e in tagged)
    samples = client.compile_samples("trn2", limit=3)
    assert len(samples) == 3 and all(isinstance(s, CompileSample) for s in samples)
    assert {s.compiler_version for s in samples} == {COMPILER}
    assert all(s.compile_seconds == 120.0 and s.hlo_sha256 == digest(s.hlo_size - 1000) for s in samples)
    assert client.compile_samples("inf2") == []


def test_the_null_index_finds_nothing() -> None:
    null = NullIndex()
    assert null.lookup_many(["a/b", "a/c"]) == {"a/b": None, "a/c": None}
    assert null.similar(hlo_sha256=digest(1)) == [] and null.compile_samples("trn2") == []


def test_lookup_chunks_keep_every_path_once_in_order_within_both_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queries, "MAX_LOOKUP_BATCH", 7)
    monkeypatch.setattr(queries, "MAX_LOOKUP_BYTES", 100)
    paths = [f"ns/{'k' * (i % 13)}{i}" for i in range(50)] + ["ns/" + "x" * 300]  # one above the byte bound
    chunks = list(lookup_chunks(paths))
    assert [p for chunk in chunks for p in chunk] == paths
    assert all(len(chunk) <= 7 for chunk in chunks)
    assert all(sum(len(p) + 4 for p in chunk) <= 100 for chunk in chunks if len(chunk) > 1)
    assert chunks[-1] == ["ns/" + "x" * 300]
