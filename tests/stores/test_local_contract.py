"""The store contract on a local directory, plain and in shared-mount (FSx) mode."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import ReadOnlyContract, StoreContract, publish_a


class TestLocalStore(StoreContract, ReadOnlyContract):
    on_local_filesystem = True
    single_writer = True
    created_on_open = True

    @pytest.fixture
    def store(self, tmp_path: Path) -> Store:
        return open_store(str(tmp_path / "cache"))

    @pytest.fixture
    def readonly_store(self, tmp_path: Path) -> Store:
        (tmp_path / "ro").mkdir()
        return open_store(str(tmp_path / "ro"), read_only=True)


class TestSharedStore(StoreContract):
    on_local_filesystem = True
    created_on_open = True  # several hosts write it: never single_writer

    @pytest.fixture
    def store(self, tmp_path: Path) -> Store:
        return open_store(f"fsx://{tmp_path / 'fsx'}")

    def test_group_writable(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        import os

        old = os.umask(0o077)  # a strict umask on one host must not lock the others out
        try:
            path, _ = publish_a(store)
        finally:
            os.umask(old)
        assert isinstance(store, LocalStore) and store.shared
        entry_dir = store.root / path
        assert stat.S_IMODE(entry_dir.stat().st_mode) == 0o2775
        assert stat.S_IMODE((entry_dir / "model.neff").stat().st_mode) == 0o664


def test_open_store_urls(tmp_path: Path) -> None:
    from neffcache.errors import InvalidURL

    assert isinstance(open_store(f"file://{tmp_path}/a"), LocalStore)
    shared = open_store(f"fsx://{tmp_path}/b")
    assert isinstance(shared, LocalStore) and shared.shared
    for bad in ["fsx://relative/path", "file://host/x", "nosuchscheme://x/y", "://x", "   "]:
        with pytest.raises(InvalidURL):
            open_store(bad)


def test_missing_root_read_only(tmp_path: Path) -> None:
    from neffcache.errors import StoreUnavailable

    with pytest.raises(StoreUnavailable, match="does not exist"):
        open_store(str(tmp_path / "missing"), read_only=True)
