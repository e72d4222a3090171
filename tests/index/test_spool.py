"""The on-disk spool: atomic batches, exclusive claims, stale-claim recovery, rejects, size cap."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from neffcache.index.spool import Spool


def test_batches_are_whole_files_entries_first(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s")
    spool.put("events", [{"id": "e1"}])
    spool.put("entries", [{"path": "a"}])
    spool.put("events", [{"id": "e2"}])
    names = [p.name for p in spool.pending()]
    assert [n.split(".")[-2] for n in names] == ["entries", "events", "events"]
    assert not [p for p in (tmp_path / "s").iterdir() if p.name.startswith(".tmp-")]
    batch = spool.read(spool.claim(spool.pending()[1]))  # type: ignore[arg-type]
    assert batch is not None and batch.items == [{"id": "e1"}]


def test_a_claim_is_exclusive_and_can_be_given_back(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    path = spool.put("events", [{"id": "x"}])
    claimed = spool.claim(path)
    assert claimed is not None
    assert spool.claim(path) is None  # another sender lost the race
    assert spool.pending() == []
    spool.unclaim(claimed)
    assert spool.pending() == [path]


def test_stale_claims_and_temp_files_are_recovered(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    claimed = spool.claim(spool.put("events", [{"id": "x"}]))
    assert claimed is not None
    tmp = tmp_path / ".tmp-crashed.events.json"
    tmp.write_text("{half")
    old = time.time() - 3600
    os.utime(claimed, (old, old))
    os.utime(tmp, (old, old))
    assert spool.recover_stale() == 1
    assert len(spool.pending()) == 1
    assert not tmp.exists()


def test_rejected_and_unreadable_batches_are_kept_aside(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    bad = tmp_path / "00000000000000000001-1-deadbeef.events.json"
    bad.write_text("{not json")
    assert spool.read(spool.claim(bad)) is None  # type: ignore[arg-type]
    claimed = spool.claim(spool.put("events", [{"id": "a"}, {"id": "b"}]))
    assert claimed is not None
    spool.reject(claimed, "422: body.1.kind", [{"id": "b"}])
    rejected = sorted(p.name for p in spool.rejected_dir.iterdir())
    assert len(rejected) == 4  # two batches, each with its reason
    kept = [p for p in spool.rejected_dir.iterdir() if p.name.endswith(".json") and "deadbeef" not in p.name]
    assert json.loads(kept[0].read_text())["items"] == [{"id": "b"}]
    assert spool.pending() == []


def test_size_cap_drops_the_oldest(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=3000)
    for i in range(10):
        spool.put("events", [{"id": str(i), "pad": "x" * 500}])
    files, size = spool.size()
    assert size <= 3000 and files < 10
    newest = json.loads(spool.pending()[-1].read_text())["items"][0]["id"]
    assert newest == "9"
