"""Every primitive refuses a path that could leave the store's root."""

from __future__ import annotations

import pytest

from neffcache.errors import InvalidKey
from neffcache.stores.base import Store


class PathContract:
    @pytest.mark.parametrize("bad", ["../etc/passwd", "/abs/path", "a/../../b", "a\\b", "a/\x00", "..", ""])
    def test_path_traversal_rejected(self, store: Store, bad: str) -> None:
        with pytest.raises(InvalidKey):
            store.put_file(bad, b"x")
        with pytest.raises(InvalidKey):
            store.stat(bad)
        with pytest.raises(InvalidKey):
            store.discard([bad], prune_dirs=True)
        with pytest.raises(InvalidKey):
            store.exists(bad)
        assert list(store.iter_files()) == []
