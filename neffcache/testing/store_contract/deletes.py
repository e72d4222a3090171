"""Removal: ``delete`` (counted), ``discard`` (uncounted, optionally pruning directories),
``remove_empty_dirs``, ``exists``, and a ``removal()`` batch (what a prune's chunk goes through)."""

from __future__ import annotations

import pytest

from neffcache.errors import InvalidKey
from neffcache.stores.base import CONTROL_DIR, Store


class DeleteContract:
    def test_delete(self, store: Store) -> None:
        store.put_file("d/1", b"1")
        store.put_file("d/2", b"2")
        assert store.delete(["d/1", "d/2", "d/missing"]) == 2
        assert store.stat("d/1") is None
        assert list(store.iter_files()) == []

    def test_discard(self, store: Store) -> None:
        for name in ("d/e/1.bin", "d/e/2.bin", "d/keep.bin"):
            assert store.put_file(name, name.encode())
        store.discard(["d/e/1.bin", "d/e/2.bin", "d/e/missing.bin"], prune_dirs=True)
        store.discard([])
        assert {f.path for f in store.iter_files()} == {"d/keep.bin"}
        root = store.local_root
        if root is not None:
            assert not (root / "d/e").exists(), "prune_dirs removes the directory the removals emptied"
            assert (root / "d").is_dir()

    def test_remove_empty_dirs(self, store: Store) -> None:
        assert store.put_file("r/s/t.bin", b"x")
        assert store.put_file(f"{CONTROL_DIR}/c/u.bin", b"x")
        store.discard(["r/s/t.bin", f"{CONTROL_DIR}/c/u.bin"])
        root = store.local_root
        if root is not None:
            assert (root / "r/s").is_dir(), "discard without prune_dirs leaves the directory"
        store.remove_empty_dirs(["r/s", f"{CONTROL_DIR}/c"])
        assert list(store.iter_files()) == []
        if root is not None:
            assert not (root / "r").exists() and root.is_dir(), "the parents go, never the root"
            assert (root / CONTROL_DIR / "c").is_dir(), "control directories only with control=True"
            store.remove_empty_dirs([f"{CONTROL_DIR}/c"], control=True)
            assert not (root / CONTROL_DIR).exists()

    def test_removal_batch(self, store: Store) -> None:
        for name in ("b/e/1.bin", "b/e/sub/2.bin", "b/keep.bin"):
            assert store.put_file(name, name.encode())
        with store.removal() as batch:
            assert {f.path for f in batch.list_files("b/e")} == {"b/e/1.bin", "b/e/sub/2.bin"}
            assert batch.list_files("b/none") == []
            got = batch.stat("b/e/1.bin")
            assert got is not None and got.size == len(b"b/e/1.bin")
            assert batch.stat("b/e/missing.bin") is None
            assert batch.exists("b/keep.bin") and not batch.exists("b/e/missing.bin")
            batch.discard(["b/e/1.bin", "b/e/sub/2.bin", "b/e/missing.bin"], prune_dirs=True)
        assert {f.path for f in store.iter_files()} == {"b/keep.bin"}
        root = store.local_root
        if root is not None:
            assert not (root / "b/e").exists() and (root / "b").is_dir()

    def test_remove_empty_dirs_keeps_what_is_not_empty(self, store: Store) -> None:
        assert store.put_file("k/l/m.bin", b"stays")
        store.remove_empty_dirs(["k/l", "k", "no/such/dir"])
        assert store.read_bytes("k/l/m.bin") == b"stays"

    def test_exists(self, store: Store) -> None:
        assert not store.exists("x/y.bin")
        assert store.put_file("x/y.bin", b"1")
        assert store.exists("x/y.bin")
        store.delete(["x/y.bin"])
        assert not store.exists("x/y.bin")
        with pytest.raises(InvalidKey):
            store.exists("../escape")
