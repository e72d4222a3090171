"""A read-only store refuses every write (the backend's module provides ``readonly_store``)."""

from __future__ import annotations

import pytest

from neffcache.errors import ReadOnlyStore
from neffcache.stores.base import Store


class ReadOnlyContract:
    def test_read_only_refuses_writes(self, readonly_store: Store) -> None:
        with pytest.raises(ReadOnlyStore):
            readonly_store.put_file("x", b"1")
        with pytest.raises(ReadOnlyStore):
            readonly_store.delete(["x"])
