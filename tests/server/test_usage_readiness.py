"""/v1/usage/hits and /v1/usage/misses (hits and misses per entry in a window, paginated) and
/v1/upgrades/readiness (the hit-weighted share of an old toolchain's graphs the new one holds),
on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from neffcache.index import IndexClient
from neffcache.readiness import REWARMED_FROM_TAG
from tests.server.conftest import LiveServer, Tokens
from tests.server.factories import NAMESPACE, TOOLCHAIN, TOOLCHAIN_LABEL, entry, event

NEW = "2.28.1001.0+0badc0de"
NEW_TOOLCHAIN = {**TOOLCHAIN, "compiler_version": NEW}
NEW_NAMESPACE = f"trn2-lnc2/neuronxcc-{NEW}"
OLDER = "2.26.1.0+00000000"


def _hits(path: str, n: int, ts: float, **fields: Any) -> list[dict[str, Any]]:
    return [event("hit", path=path, ts=ts - i, **fields) for i in range(n)]


def test_hits_per_entry_in_a_window_page_by_page(server: LiveServer, tokens: Tokens, writer: httpx.Client,
                                                 tmp_path: Any) -> None:
    now = time.time()
    paths = [f"{NAMESPACE}/MODULE_{i}+abcd0000" for i in range(5)]
    batch = [e for i, p in enumerate(paths) for e in _hits(p, i + 1, now - 3600)]
    batch += _hits(paths[0], 4, now - 40 * 86400)  # before the window
    batch += [event("miss", path=paths[1], ts=now - 60)]  # not a hit
    batch += _hits(paths[2], 2, now - 60, toolchain=NEW_TOOLCHAIN, namespace=NEW_NAMESPACE)  # another toolchain
    writer.post("/v1/events", json=batch).raise_for_status()

    params = {"toolchain": TOOLCHAIN_LABEL, "since": now - 30 * 86400, "until": now, "limit": 2}
    seen: dict[str, int] = {}
    pages = 0
    while True:
        page = writer.get("/v1/usage/hits", params=params).json()
        pages += 1
        assert len(page["hits"]) <= 2
        seen.update({row["path"]: row["hits"] for row in page["hits"]})
        if page["next_cursor"] is None:
            break
        params["cursor"] = page["next_cursor"]
    assert pages == 3
    assert seen == {p: i + 1 for i, p in enumerate(paths)}

    client = IndexClient(server.url, tokens.read, spool_dir=tmp_path / "spool")
    try:
        assert client.usage_hits(TOOLCHAIN_LABEL, since=now - 30 * 86400, until=now) == seen
        assert client.usage_hits(NEW_NAMESPACE, since=now - 30 * 86400, until=now) == {paths[2]: 2}
    finally:
        client.close()


def test_misses_per_entry_with_their_last_miss(server: LiveServer, tokens: Tokens, writer: httpx.Client,
                                              tmp_path: Any) -> None:
    """What ``prune --regret`` matches with eviction tombstones: every toolchain's misses."""
    now = time.time()
    paths = [f"{NAMESPACE}/MODULE_{i}+abcd0000" for i in range(3)]
    batch = [event("miss", path=paths[0], ts=now - 100 - i) for i in range(3)]
    batch += [event("miss", path=paths[1], ts=now - 50, toolchain=NEW_TOOLCHAIN, namespace=NEW_NAMESPACE)]
    batch += [event("miss", path=paths[2], ts=now - 40 * 86400), event("hit", path=paths[2], ts=now - 10)]
    writer.post("/v1/events", json=batch).raise_for_status()
    page = writer.get("/v1/usage/misses", params={"since": now - 86400, "until": now, "limit": 1}).json()
    assert [row["path"] for row in page["misses"]] == [paths[0]] and page["next_cursor"] == paths[0]
    only_new = writer.get("/v1/usage/misses", params={"toolchain": NEW_NAMESPACE, "until": now}).json()
    assert [row["path"] for row in only_new["misses"]] == [paths[1]]
    client = IndexClient(server.url, tokens.read, spool_dir=tmp_path / "spool")
    try:
        found = client.usage_misses(since=now - 86400, until=now)
    finally:
        client.close()
    assert {p: n for p, (n, _) in found.items()} == {paths[0]: 3, paths[1]: 1}
    assert found[paths[0]][1] == pytest.approx(now - 100)
    assert writer.get("/v1/usage/misses", params={"since": 2e9, "until": 1.9e9}).status_code == 422


@pytest.mark.parametrize("params", [
    {},  # the toolchain is required
    {"toolchain": TOOLCHAIN_LABEL, "since": 2e9, "until": 1.9e9},
    {"toolchain": TOOLCHAIN_LABEL, "limit": 10_001},
    {"toolchain": "a\x00b"},
])
def test_usage_refuses_bad_questions(reader: httpx.Client, params: dict[str, Any]) -> None:
    assert reader.get("/v1/usage/hits", params=params).status_code == 422


def _catalog(writer: httpx.Client) -> dict[str, str]:
    """Old graphs a (same key under the new compiler), b (a new key the rewarm tagged), c (its
    successor FAILED), d (no successor); an older compiler and a torchneuron namesake beside them."""
    old = {name: entry(i, key=f"MODULE_{i}+abcd0000") for i, name in enumerate("abcd")}
    new_b = entry(11, key="MODULE_1+feed0000", namespace=NEW_NAMESPACE, toolchain=NEW_TOOLCHAIN,
                  tags={REWARMED_FROM_TAG: old["b"]["key"]})
    records = [
        *old.values(),
        entry(0, key=old["a"]["key"], namespace=NEW_NAMESPACE, toolchain=NEW_TOOLCHAIN),
        new_b,
        entry(2, key=old["c"]["key"], namespace=NEW_NAMESPACE, toolchain=NEW_TOOLCHAIN, state="FAILED"),
        # d's key in torchneuron under the new compiler is another graph: it makes nothing ready.
        entry(3, key="ab" * 16, path=f"{NEW_NAMESPACE.replace('neuronxcc', 'torchneuron')}/neff/ab/ab/{'ab' * 16}",
              layout="torchneuron", namespace=NEW_NAMESPACE.replace("neuronxcc", "torchneuron"),
              toolchain=NEW_TOOLCHAIN),
        entry(9, key="MODULE_9+abcd0000", namespace=f"trn2-lnc2/neuronxcc-{OLDER}",
              toolchain={**TOOLCHAIN, "compiler_version": OLDER}),
    ]
    writer.post("/v1/entries", json=records).raise_for_status()
    return {name: record["path"] for name, record in old.items()}


def test_readiness_weighs_graphs_by_their_hits(writer: httpx.Client) -> None:
    paths = _catalog(writer)
    now = time.time()
    hits = {"a": 5, "b": 3, "c": 2, "d": 0}
    batch = [e for name, n in hits.items() for e in _hits(paths[name], n, now - 7200)]
    batch += _hits(paths["d"], 6, now - 45 * 86400)  # outside the 30-day window
    writer.post("/v1/events", json=batch).raise_for_status()

    got = writer.get("/v1/upgrades/readiness", params={"from_toolchain": TOOLCHAIN_LABEL,
                                                        "to_toolchain": NEW_NAMESPACE, "window": "30d"}).json()
    (pair,) = got["pairs"]
    # weight = hits + 0.1: a and b are ready, c failed, d is missing.
    assert pair["readiness"] == pytest.approx((5.1 + 3.1) / (5.1 + 3.1 + 2.1 + 0.1))
    assert (pair["graphs"], pair["ready_graphs"], pair["hits"], pair["ready_hits"]) == (4, 2, 10, 8)
    assert [m["path"] for m in pair["missing"]] == [paths["c"], paths["d"]]
    assert [m["hits"] for m in pair["missing"]] == [2, 0]

    # Without labels: per target, the newest compiler against the one before it (not the oldest).
    default = writer.get("/v1/upgrades/readiness").json()["pairs"]
    assert [(p["from_toolchain"], p["to_toolchain"]) for p in default] == [(TOOLCHAIN_LABEL, NEW_NAMESPACE)]
    assert default[0]["readiness"] == pytest.approx(pair["readiness"], rel=1e-3)  # the default window is 30d


def test_readiness_refuses_half_a_pair(reader: httpx.Client) -> None:
    reply = reader.get("/v1/upgrades/readiness", params={"from_toolchain": TOOLCHAIN_LABEL})
    assert reply.status_code == 422 and "both" in reply.json()["detail"]
    empty = reader.get("/v1/upgrades/readiness", params={"from_toolchain": TOOLCHAIN_LABEL,
                                                          "to_toolchain": NEW_NAMESPACE}).json()["pairs"][0]
    assert (empty["graphs"], empty["readiness"]) == (0, None)
