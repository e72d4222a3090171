"""GET /v1/entries/similar and /v1/entries/compile-samples on SQLite and PostgreSQL: the
entries near a graph (same HLO digest or model tag, newest first) and the compiles a forecast
fits on; both reached although GET /v1/entries/{path} matches any path."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.server.conftest import LiveServer, Tokens
from tests.server.factories import digest, entry

OLD_COMPILER = "2.21.33363.0+82129205"
OLD_NAMESPACE = f"trn1-lnc1/neuronxcc-{OLD_COMPILER}"
OLD_TOOLCHAIN = {"compiler_version": OLD_COMPILER, "target": "trn1", "lnc": 1}


def _similar(client: httpx.Client, **params: object) -> list[dict[str, object]]:
    response = client.get("/v1/entries/similar", params=params)
    assert response.status_code == 200, response.text
    entries: list[dict[str, object]] = response.json()["entries"]
    return entries


def _samples(client: httpx.Client, **params: object) -> list[dict[str, object]]:
    response = client.get("/v1/entries/compile-samples", params=params)
    assert response.status_code == 200, response.text
    samples: list[dict[str, object]] = response.json()["samples"]
    return samples


@pytest.fixture
def fleet(writer: httpx.Client) -> dict[str, dict[str, object]]:
    """One graph (digest 1) compiled three ways, a sibling of the same model, unrelated entries."""
    now = time.time()
    graph = {"hlo_sha256": digest(1), "hlo_size": 5000}
    records = {
        "same, other flags": entry(1, **graph, flags=["-O2"], created=now - 100),
        "same, old compiler": entry(2, **graph, flags=["-O1"], created=now - 300, namespace=OLD_NAMESPACE,
                                    toolchain=OLD_TOOLCHAIN, tags={"model": "other"}),
        "same, newest": entry(3, **graph, flags=["-O1"], created=now - 10, tags={}),
        "sibling": entry(4, hlo_sha256=digest(2), hlo_size=7000, created=now - 200,
                         tags={"model": "llama3-8b", "team": "ads"}),
        "unrelated": entry(5, hlo_sha256=digest(3), created=now - 50, tags={"model": "bert"}),
        "old-style sibling": entry(6, created=now - 400),  # no inputs, only the model tag
    }
    writer.post("/v1/entries", json=list(records.values())).raise_for_status()
    return records


def test_similar_by_digest_is_every_compile_of_the_graph_newest_first(
        reader: httpx.Client, fleet: dict[str, dict[str, object]]) -> None:
    found = _similar(reader, hlo_sha256=digest(1))
    assert [e["path"] for e in found] == [fleet[name]["path"] for name in
                                          ("same, newest", "same, other flags", "same, old compiler")]
    assert found[0]["stores"] == ["s3://bucket/prefix"] and found[2]["flags"] == ["-O1"]
    assert found[2]["toolchain"]["target"] == "trn1"  # type: ignore[index]


def test_similar_by_model_is_every_entry_with_the_tag(reader: httpx.Client,
                                                      fleet: dict[str, dict[str, object]]) -> None:
    found = _similar(reader, model="llama3-8b")
    assert [e["path"] for e in found] == [fleet[name]["path"] for name in
                                          ("same, other flags", "sibling", "old-style sibling")]
    assert found[2]["hlo_sha256"] is None


def test_similar_by_both_is_the_union_once_each_and_bounded(reader: httpx.Client,
                                                            fleet: dict[str, dict[str, object]]) -> None:
    both = _similar(reader, hlo_sha256=digest(1), model="llama3-8b")
    assert [e["path"] for e in both] == [fleet[name]["path"] for name in (
        "same, newest", "same, other flags", "sibling", "same, old compiler", "old-style sibling")]
    assert [e["path"] for e in _similar(reader, hlo_sha256=digest(1), model="llama3-8b", limit=2)] == \
        [e["path"] for e in both[:2]]
    assert _similar(reader, hlo_sha256=digest(99)) == []
    assert _similar(reader, model="no-such-model") == []


@pytest.mark.parametrize("params", [
    {}, {"limit": 5}, {"hlo_sha256": "AB" * 32}, {"hlo_sha256": "ab"}, {"model": ""}, {"model": "a\x00b"},
    {"model": "x" * 257}, {"model": "m", "limit": 0}, {"model": "m", "limit": 501}, {"model": "m", "limit": "x"},
])
def test_similar_refuses_bad_questions(reader: httpx.Client, params: dict[str, object]) -> None:
    response = reader.get("/v1/entries/similar", params=params)
    assert response.status_code == 422, response.text
    assert response.json()["detail"]


def test_compile_samples_are_the_targets_known_compiles_newest_first(writer: httpx.Client) -> None:
    now = time.time()
    records = [
        entry(10, hlo_size=1000, compile_seconds=10.0, hlo_sha256=digest(10), created=now - 30),
        entry(11, hlo_size=4000, compile_seconds=40.0, created=now - 20),
        entry(12, hlo_size=2000, compile_seconds=20.0, hlo_sha256=digest(12), created=now - 10),
        entry(13, hlo_size=3000, compile_seconds=30.0, state="FAILED"),  # not a compile to fit on
        entry(14, hlo_size=3000, compile_seconds=None),  # ingested: compile time unknown
        entry(15, compile_seconds=30.0),  # an older client: HLO size unknown
        entry(16, hlo_size=9000, compile_seconds=90.0, namespace=OLD_NAMESPACE, toolchain=OLD_TOOLCHAIN),
        entry(17, hlo_size=0, compile_seconds=0.0, toolchain=None, namespace="misc"),  # no target at all
    ]
    writer.post("/v1/entries", json=records).raise_for_status()
    samples = _samples(writer, target="trn2")
    assert samples == [
        {"hlo_size": 2000, "compile_seconds": 20.0, "compiler_version": "2.27.5334.0+f702b353",
         "hlo_sha256": digest(12)},
        {"hlo_size": 4000, "compile_seconds": 40.0, "compiler_version": "2.27.5334.0+f702b353", "hlo_sha256": None},
        {"hlo_size": 1000, "compile_seconds": 10.0, "compiler_version": "2.27.5334.0+f702b353",
         "hlo_sha256": digest(10)},
    ]
    assert [s["hlo_size"] for s in _samples(writer, target="trn2", limit=2)] == [2000, 4000]
    assert [s["compiler_version"] for s in _samples(writer, target="trn1")] == [OLD_COMPILER]
    assert _samples(writer, target="inf2") == []


@pytest.mark.parametrize("params", [
    {}, {"target": "trn9"}, {"target": ""}, {"target": "trn2", "limit": 0}, {"target": "trn2", "limit": 10_001},
    {"target": "TRN2"},
])
def test_compile_samples_refuse_bad_questions(reader: httpx.Client, params: dict[str, object]) -> None:
    response = reader.get("/v1/entries/compile-samples", params=params)
    assert response.status_code == 422, response.text


def test_the_questions_need_a_token_of_read_scope(server: LiveServer, tokens: Tokens) -> None:
    questions = (("/v1/entries/similar", {"model": "m"}), ("/v1/entries/compile-samples", {"target": "trn2"}))
    with server.client() as anonymous, server.client(tokens.read) as reader:
        for path, params in questions:
            assert anonymous.get(path, params=params).status_code == 401
            assert reader.get(path, params=params).status_code == 200
