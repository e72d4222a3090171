"""Writes: ``put_file`` from bytes and from a file, overwrite, ``exclusive``, ``expect``, ``move``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from neffcache.errors import CorruptEntry
from neffcache.manifest import FileDigest, sha256_bytes
from neffcache.stores.base import Store


class WriteContract:
    def test_put_from_local_file_and_large(self, store: Store, tmp_path: Path) -> None:
        src = tmp_path / "big.neff"
        data = os.urandom(3 << 20) * 7  # 21 MiB: above any multipart threshold
        src.write_bytes(data)
        assert store.put_file("big/model.neff", src)
        dest = tmp_path / "back"
        store.get_file("big/model.neff", dest)
        assert dest.read_bytes() == data
        assert src.exists(), "put_file without move must not consume the source"

    @pytest.mark.parametrize("size", [5000, 21 << 20])  # one request; multipart on S3
    def test_verified_put_writes_only_what_matches(self, store: Store, tmp_path: Path, size: int) -> None:
        src = tmp_path / "model.neff"
        data = os.urandom(size)
        src.write_bytes(data)
        good = sha256_bytes(data)
        bad = FileDigest("0" * 64, size)
        for exclusive in (False, True):
            with pytest.raises(CorruptEntry):
                store.put_file(f"v{exclusive}/model.neff", src, exclusive=exclusive, expect=bad)
            assert store.stat(f"v{exclusive}/model.neff") is None, "a mismatch must leave nothing visible"
            assert store.put_file(f"v{exclusive}/model.neff", src, exclusive=exclusive, expect=good)
            dest = tmp_path / f"back{exclusive}"
            got = store.get_file(f"v{exclusive}/model.neff", dest)
            assert dest.read_bytes() == data
            assert got is None or got == good, "get_file's digest is of the bytes it wrote"
        with pytest.raises(CorruptEntry):
            store.put_file("b/x", b"bytes", expect=bad)
        assert store.stat("b/x") is None

    def test_overwrite_and_exclusive(self, store: Store) -> None:
        assert store.put_file("x", b"one")
        assert store.put_file("x", b"two")
        assert store.read_bytes("x") == b"two"
        assert store.put_file("x", b"three", exclusive=True) is False
        assert store.read_bytes("x") == b"two"
        assert store.put_file("y", b"first", exclusive=True) is True

    def test_put_with_move_consumes_a_local_source(self, store: Store, tmp_path: Path) -> None:
        src = tmp_path / "moved.neff"
        src.write_bytes(b"moved whole")
        assert store.put_file("mv/model.neff", src, move=True)
        assert store.read_bytes("mv/model.neff") == b"moved whole"
        assert not src.exists() or src.read_bytes() == b"moved whole", "move leaves nothing or the same bytes"
