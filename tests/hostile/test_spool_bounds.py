"""Spool batches from outside (N15): a deeply nested, oversized or malformed batch is moved to
``rejected/`` once, with its reason, and never ends ``flush`` or the command that reports to
the index."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from neffcache.index import spool_dir_for
from neffcache.index.spool import MAX_BATCH_BYTES, MAX_NESTING, Spool, load_batch
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import publish_a
from tests.hostile.trees import neffcache
from tests.server.conftest import ServerProcess, free_port, prepare_database

DOWN = "http://127.0.0.1:9"  # nothing listens (the batches below are read before any send)
DEEP = b'{"kind":"events","items":' + b"[" * 100_000 + b"]" * 100_000 + b"}"

HOSTILE: dict[str, bytes] = {
    "deep-items": DEEP,
    "deep-in-an-item": b'{"kind":"events","items":[{"a":' + b'{"b":' * 5_000 + b"1" + b"}" * 5_000 + b"}]}",
    "not-a-batch": b"[1, 2, 3]",
    "unknown-kind": b'{"kind":"secrets","items":[]}',
    "items-not-objects": b'{"kind":"events","items":[1, "x"]}',
    "not-json": b"\xff\xfe{",
}


def _plant(spool_root: Path, data: bytes, url: str = DOWN) -> Path:
    spool = Spool(spool_dir_for(url, spool_root), url=url)
    path = spool.put("events", [{"kind": "hit"}])
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_bad_batch_is_rejected_once_with_its_reason(tmp_path: Path, name: str) -> None:
    path = _plant(tmp_path, HOSTILE[name])
    spool = Spool(path.parent)
    claimed = spool.claim(path)
    assert claimed is not None and spool.read(claimed) is None
    reasons = list(spool.rejected_dir.glob("*.reason.txt"))
    assert len(reasons) == 1 and reasons[0].read_text().startswith("unreadable: ")
    assert spool.pending() == [] and spool.recover_stale(older_than=0) == 0  # never read again


def test_bounds_are_stated_and_kept(tmp_path: Path) -> None:
    ok = tmp_path / "ok.events.json"
    ok.write_text(json.dumps({"kind": "events", "items": [{"a": {"b": [1, "[[{{"]}}]}))
    assert load_batch(ok) == ("events", [{"a": {"b": [1, "[[{{"]}}])
    nested = tmp_path / "nested.events.json"
    nested.write_bytes(b'{"kind":"events","items":[' + b"[" * MAX_NESTING + b"]" * MAX_NESTING + b"]}")
    with pytest.raises(ValueError, match=f"nested more than {MAX_NESTING}"):
        load_batch(nested)
    big = tmp_path / "big.events.json"
    with open(big, "wb") as fh:
        fh.truncate(MAX_BATCH_BYTES + 1)
    with pytest.raises(ValueError, match="larger than"):
        load_batch(big)
    fifo = tmp_path / "fifo.events.json"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="a FIFO"):
        load_batch(fifo)


def test_flush_and_push_go_on_past_a_deeply_nested_batch(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'index.db'}"
    tokens = prepare_database(db_url)
    server = ServerProcess(db_url, free_port(), tmp_path / "server.log")
    try:
        server.wait_ready()
        _plant(tmp_path / "spool", DEEP, server.url)
        env = {"NEFFCACHE_SPOOL_DIR": str(tmp_path / "spool")}
        src = LocalStore(tmp_path / "src")
        path, _ = publish_a(src, key="MODULE_1+abb26765")
        pushed = neffcache("push", str(src.root), str(tmp_path / "dst"), "--index-url", server.url,
                           "--token", tokens.write, env=env)
        assert "Traceback" not in pushed.stderr and pushed.returncode == 0, pushed.stderr[-3000:]
        assert (tmp_path / "dst" / path / "model.done").exists()
        _plant(tmp_path / "spool", DEEP, server.url)  # and another, for flush
        flushed = neffcache("flush", "--index-url", server.url, "--token", tokens.write, env=env)
        assert "Traceback" not in flushed.stderr and flushed.returncode == 0, flushed.stderr[-3000:]
    finally:
        server.stop()
    spool = Spool(spool_dir_for(server.url, tmp_path / "spool"))
    reasons = sorted(spool.rejected_dir.glob("*.reason.txt"))
    assert len(reasons) == 2 and all("nested more than" in r.read_text() for r in reasons)
    assert spool.pending() == []
