"""Reads: ``stat``, ``open_read``, ``read_bytes``, ``get_file`` and ``local_path``."""

from __future__ import annotations

from pathlib import Path

import pytest

from neffcache.errors import EntryNotFound
from neffcache.manifest import sha256_bytes
from neffcache.stores.base import Store


class ReadContract:
    on_local_filesystem: bool

    def test_put_read_stat_roundtrip(self, store: Store) -> None:
        assert store.put_file("a/b/c.bin", b"hello")
        info = store.stat("a/b/c.bin")
        assert info is not None and info.size == 5 and info.path == "a/b/c.bin"
        assert store.read_bytes("a/b/c.bin") == b"hello"
        assert {f.path for f in store.iter_files()} == {"a/b/c.bin"}
        assert {f.path for f in store.iter_files("a")} == {"a/b/c.bin"}
        assert list(store.iter_files("nope")) == []

    def test_missing_read_raises(self, store: Store) -> None:
        with pytest.raises(EntryNotFound), store.open_read("no/such"):
            pass
        assert store.stat("no/such") is None

    def test_stat_describes_files_only(self, store: Store) -> None:
        """A directory (an S3 prefix) is not a file: ``stat`` of it is None on every backend."""
        assert store.put_file("d/e/f.bin", b"x")
        assert store.stat("d/e") is None
        assert store.stat("d") is None
        info = store.stat("d/e/f.bin")
        assert info is not None and info.size == 1

    def test_open_read_streams_the_whole_file(self, store: Store) -> None:
        data = bytes(range(256)) * 1024
        assert store.put_file("r/stream.bin", data)
        with store.open_read("r/stream.bin") as stream:
            head = stream.read(1000)
            rest = stream.read()
        assert head + rest == data

    def test_get_file_writes_dest_and_its_digest(self, store: Store, tmp_path: Path) -> None:
        assert store.put_file("g/file.bin", b"get me")
        dest = tmp_path / "dest.bin"
        dest.write_bytes(b"older and longer content")  # get_file replaces what the caller left
        got = store.get_file("g/file.bin", dest)
        assert dest.read_bytes() == b"get me"
        assert got is None or got == sha256_bytes(b"get me")
        with pytest.raises(EntryNotFound):
            store.get_file("g/missing.bin", tmp_path / "missing.bin")

    def test_local_path(self, store: Store) -> None:
        assert store.put_file("p/local.bin", b"zero copy")
        path = store.local_path("p/local.bin")
        if not self.on_local_filesystem:
            assert path is None, "only a store on this host's filesystem has local paths"
            return
        assert path is not None and path.read_bytes() == b"zero copy"
        root = store.local_root
        assert root is not None and path == root / "p/local.bin"
