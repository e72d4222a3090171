"""``move`` within a store: a rename where the backend has one, else copy and delete."""

from __future__ import annotations

import pytest

from neffcache.errors import EntryNotFound
from neffcache.stores.base import Store


class MoveContract:
    def test_move(self, store: Store) -> None:
        assert store.put_file("m/src.bin", b"moving")
        store.move("m/src.bin", "n/o/dst.bin")
        assert store.stat("m/src.bin") is None
        assert store.read_bytes("n/o/dst.bin") == b"moving"
        with pytest.raises(EntryNotFound):
            store.move("m/src.bin", "n/o/again.bin")
        assert store.stat("n/o/again.bin") is None

    def test_move_replaces_the_destination(self, store: Store) -> None:
        assert store.put_file("m/new.bin", b"new")
        assert store.put_file("m/old.bin", b"old")
        store.move("m/new.bin", "m/old.bin")
        assert store.read_bytes("m/old.bin") == b"new"
        assert {f.path for f in store.iter_files()} == {"m/old.bin"}
