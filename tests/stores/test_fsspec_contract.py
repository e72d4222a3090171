"""The store contract on fsspec's memory:// filesystem, and fsspec URL handling."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from neffcache.errors import ConfigError, InvalidURL
from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.stores.fsspec_store import FsspecStore
from neffcache.testing.store_contract import ReadOnlyContract, StoreContract


def _memory_url() -> str:
    # memory:// is one dictionary per process: a fresh root per test keeps them apart.
    return f"memory://neffcache-{secrets.token_hex(6)}/cache"


def _wipe(store: Store) -> None:
    assert isinstance(store, FsspecStore)
    if store.fs.exists(store.root):
        store.fs.rm(store.root, recursive=True)


class TestMemoryStore(StoreContract, ReadOnlyContract):
    @pytest.fixture
    def store(self) -> Iterator[Store]:
        store = open_store(_memory_url())
        yield store
        _wipe(store)

    @pytest.fixture
    def readonly_store(self) -> Iterator[Store]:
        store = open_store(_memory_url(), read_only=True)
        yield store
        _wipe(store)


def test_memory_store_is_fsspec() -> None:
    store = open_store(_memory_url())
    assert isinstance(store, FsspecStore) and store.exclusive_is_atomic


def test_missing_implementation_has_install_hint() -> None:
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("gcsfs is installed here")
    with pytest.raises(ConfigError, match="gcsfs"):
        open_store("gs://bucket/cache")


def test_unknown_scheme() -> None:
    with pytest.raises(InvalidURL):
        open_store("nosuchfs://x/y")
