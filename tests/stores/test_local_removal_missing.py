"""A batch of removals (neffcache/stores/local_remove.py) remembers the topmost directory it
found missing, so a missing stamp directory costs one look per batch, not one per entry; a
directory that exists is never taken for missing, and a new batch looks again."""

from __future__ import annotations

from pathlib import Path

from neffcache.stores.local_remove import LocalRemoval
from neffcache.stores.safepath import SafeRoot


def test_the_topmost_missing_directory_is_remembered_for_the_batch(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / ".neffcache" / "leases").mkdir(parents=True)
    (root / "ns" / "neff" / "ab" / "cd").mkdir(parents=True)
    safe = SafeRoot(str(root), f"file://{root}")
    with LocalRemoval(safe) as batch:
        assert batch.directory(".neffcache/stamps/ns/neff/ab/cd") is None
        assert batch.missing == {".neffcache/stamps"}  # not the path asked for: its missing top
        assert batch.directory(".neffcache/stamps/ns/neff/ef/01") is None  # no second look
        assert batch.directory("ns/neff/ab/cd") is not None  # what exists is still found
        assert batch.directory("ns/neff/ab/zz") is None
        assert batch.missing == {".neffcache/stamps", "ns/neff/ab/zz"}
        (root / ".neffcache" / "stamps").mkdir()  # made during the batch: not seen by it
        assert batch.directory(".neffcache/stamps") is None
    with LocalRemoval(safe) as later:
        assert later.directory(".neffcache/stamps") is not None
