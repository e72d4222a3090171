"""Eviction tombstones and regret (issue 40): a budget's evictions leave tombstones in the
store; a later miss the index saw on one is a regretted eviction (``prune --regret``), against
a real index server (SQLite, uvicorn on 127.0.0.1) and ``neffcache`` in its own process."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from neffcache.coordination.evictions import (
    EVICTIONS_DIR,
    MAX_RECORD_BYTES,
    MAX_RECORDS,
    TOMBSTONE_DAYS,
    Tombstone,
    read_tombstones,
    record_files,
    regret,
    write_tombstones,
)
from neffcache.index import IndexClient, open_index
from neffcache.stores import open_store
from tests.prune.test_retention import run_cli, slow_old_fast_new
from tests.server.conftest import LiveServer, Tokens, make_tokens

__all__ = ["slow_old_fast_new"]  # the fixture, shared with test_retention


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[LiveServer, Tokens]]:
    from neffcache.server.config import ServerSettings

    settings = ServerSettings(data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'index.db'}",
                              admin_token="admin-secret-for-regret-tests", token_cache_seconds=0.0)
    with LiveServer(settings) as server:
        yield server, make_tokens(server.db)


def test_a_miss_on_an_evicted_entry_is_a_regretted_eviction(slow_old_fast_new: tuple[Path, list[str], list[str]],
                                                            live: tuple[LiveServer, Tokens], tmp_path: Path) -> None:
    root, slow, fast = slow_old_fast_new
    server, tokens = live
    env = {**os.environ, "NEFFCACHE_INDEX_URL": server.url, "NEFFCACHE_TOKEN": tokens.write}
    done = run_cli("prune", "--store", str(root), "--max-size", "700K", "--yes", "--json", env=env)
    assert done.returncode == 0, done.stderr
    evicted = [i["path"] for i in json.loads(done.stdout)["result"]["removed_items"]]
    assert len(evicted) == 1 and evicted[0] in fast
    store = open_store(str(root))
    (tomb,) = read_tombstones(store)
    assert (tomb.path, tomb.policy, tomb.compile_seconds) == (evicted[0], "value", 2.0)
    from sqlalchemy import select

    from neffcache.server.storage.models import Event

    with server.db.read() as session:  # the index's own record of what the eviction may cost
        rows = session.execute(select(Event.path, Event.compile_seconds).where(Event.kind == "evict")).all()
    assert [tuple(r) for r in rows] == [(evicted[0], 2.0)]

    nothing = run_cli("prune", "--store", str(root), "--regret", "--json", env=env)
    assert nothing.returncode == 0, nothing.stderr
    assert json.loads(nothing.stdout)["regretted"] == 0  # evicted, and nobody missed it (yet)

    client = open_index(server.url, tokens.write, spool_root=tmp_path / "spool")
    assert isinstance(client, IndexClient)
    for path in (evicted[0], evicted[0], slow[0], "trn2-lnc2/neuronxcc-2.27.5334.0+f702b353/MODULE_99+abb26765"):
        client.record("miss", path=path, namespace="trn2-lnc2/neuronxcc-2.27.5334.0+f702b353", job="train")
    assert client.flush().error is None
    client.close()

    found = run_cli("prune", "--store", str(root), "--regret", "--json", env=env)
    assert found.returncode == 0, found.stderr
    data = json.loads(found.stdout)
    assert (data["tombstones"], data["regretted"], data["regret_seconds"]) == (1, 1, 2.0)
    assert data["by_policy"] == {"value": {"regretted": 1, "seconds": 2.0}}
    assert data["evictions"][0]["path"] == evicted[0] and data["evictions"][0]["misses"] == 2
    text = run_cli("prune", "--store", str(root), "--regret", env=env)
    assert "1 evictions on record, 1 regretted" in text.stdout and "policy value: 1 regretted, 2 s" in text.stdout
    # The server counted the same regret as the events arrived (server/services/regret.py).
    stats = run_cli("stats", "--json", "--window", "1d", env={**env, "NEFFCACHE_TOKEN": tokens.read})
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["eviction_regret"] == {"value": {"evictions": 1, "regretted": 1, "seconds": 2.0}}


def test_regret_needs_the_index_and_refuses_other_rules(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEFFCACHE_INDEX")}
    alone = run_cli("prune", "--store", str(tmp_path / "c"), "--regret", env=env)
    assert alone.returncode == 2 and "NEFFCACHE_INDEX_URL" in alone.stderr, alone.stderr
    for other in (["--max-size", "1G"], ["--pin-from-report", str(tmp_path / "plan.json")], ["--yes"]):
        mixed = run_cli("prune", "--store", str(tmp_path / "c"), "--regret", *other, env=env)
        assert mixed.returncode == 2 and "--regret" in mixed.stderr, other


def _tomb(store_url: str, n: int, at: float) -> Tombstone:
    return Tombstone(store_url, f"trn2-lnc2/neuronxcc-2.27.5334.0+f702b353/MODULE_{n}+abb26765", 1000 + n,
                     30.0 + n, at, "value")


def test_tombstones_are_bounded_and_read_as_untrusted_input(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "c"))
    now = time.time()
    assert write_tombstones(store, "a" * 16, [_tomb(store.url, 1, now - 40 * 86400)], now=now - 40 * 86400) == 1
    assert write_tombstones(store, "b" * 16, [_tomb(store.url, 2, now)], now=now) == 1
    # The second write dropped the record past TOMBSTONE_DAYS.
    assert [t.path.split("/")[-1] for t in read_tombstones(store, now=now)] == ["MODULE_2+abb26765"]
    assert len(record_files(store)) == 1

    good = f"{EVICTIONS_DIR}/20991231T000000.000001Z-cafe-1.json"
    items = [_tomb(store.url, 3, now).to_json(), {"path": "../../etc/passwd", "bytes": 1, "compile_seconds": 5,
                                                 "at": now, "policy": "value"},
             {**_tomb(store.url, 4, now).to_json(), "compile_seconds": float("nan")},
             {**_tomb(store.url, 5, now).to_json(), "bytes": True}, {**_tomb(store.url, 6, now).to_json(),
                                                                      "policy": "<script>"}, 42]
    store.put_file(good, json.dumps({"format": 1, "evictions": items}).encode())
    store.put_file(f"{EVICTIONS_DIR}/20991231T000000.000002Z-cafe-1.json", b"{not json")
    store.put_file(f"{EVICTIONS_DIR}/20991231T000000.000003Z-cafe-1.json", b" " * (MAX_RECORD_BYTES + 1))
    store.put_file(f"{EVICTIONS_DIR}/notes.txt", b"someone else's file")  # not a record's name: ignored
    warnings: list[str] = []
    found = read_tombstones(store, now=now, warnings=warnings)
    assert sorted(t.path.split("/")[-1] for t in found) == ["MODULE_2+abb26765", "MODULE_3+abb26765"]
    assert any("5 malformed tombstones skipped" in w for w in warnings)
    assert any("not a tombstone record" in w for w in warnings) and any("too large" in w for w in warnings)
    assert store.exists(f"{EVICTIONS_DIR}/notes.txt")

    for n in range(MAX_RECORDS + 5):
        write_tombstones(store, f"{n:x}", [_tomb(store.url, 100 + n, now + n)], now=now + n)
    assert len(record_files(store)) == MAX_RECORDS  # the oldest records went first
    assert TOMBSTONE_DAYS > 0


def test_one_regret_per_eviction_and_only_for_misses_after_it() -> None:
    now = time.time()
    a, b = _tomb("file:///c", 1, now - 100), _tomb("file:///c", 2, now - 100)
    report = regret([a, b], {a.path: (3, now - 10), b.path: (1, now - 200)})
    assert [r.tombstone.path for r in report.regretted] == [a.path]  # b was missed before its eviction only
    assert report.seconds == a.compile_seconds and report.by_policy() == {"value": {"regretted": 1,
                                                                                   "seconds": a.compile_seconds}}


def test_hits_and_compile_seconds_come_from_the_index(tmp_path: Path, live: tuple[LiveServer, Tokens]) -> None:
    """Two graphs alike but for the index's hits: with the index the hit one stays, although it
    is the older; without the index (no hit counts) it is the one to go."""
    from neffcache.stores.local import LocalStore
    from tests.prune.test_index import register
    from tests.prune.test_retention import entry

    server, tokens = live
    root = tmp_path / "cache"
    store = open_store(str(root))
    assert isinstance(store, LocalStore)
    popular = entry(root, store, 1, size=100_000, seconds=90, age_days=3)
    other = entry(root, store, 2, size=100_000, seconds=90, age_days=2)
    client = open_index(server.url, tokens.write, spool_root=tmp_path / "spool")
    assert isinstance(client, IndexClient)
    register(client, store, popular, other)
    for _ in range(20):  # hit three days ago: the hits, not a recent use, must keep it
        client.record("hit", path=popular, namespace=popular.rsplit("/", 1)[0], ts=time.time() - 3 * 86400)
    assert client.flush().error is None
    client.close()
    env = {**os.environ, "NEFFCACHE_INDEX_URL": server.url, "NEFFCACHE_TOKEN": tokens.read}
    for source in ("store", "index"):  # the index names the candidates; the store confirms them
        with_index = run_cli("prune", "--store", str(root), "--max-size", "150K", "--json", "--source", source,
                             env=env)
        assert with_index.returncode == 0, with_index.stderr
        (item,) = json.loads(with_index.stdout)["plan"]["items"]
        assert item["path"] == other and item["hits"] == 0 and item["compile_seconds"] == 90.0, source
    lru = run_cli("prune", "--store", str(root), "--max-size", "150K", "--json", "--source", "index", "--policy",
                  "lru", env=env)
    (item,) = json.loads(lru.stdout)["plan"]["items"]
    assert item["path"] == popular and item["compile_seconds"] == 90.0  # its victim's own, from the manifest
    without = run_cli("prune", "--store", str(root), "--max-size", "150K", "--json", "--no-index", env=env)
    assert [i["path"] for i in json.loads(without.stdout)["plan"]["items"]] == [popular]
