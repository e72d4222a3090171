"""Listing: ``iter_files`` below a prefix, and ``iter_dirs`` as the same files grouped by directory."""

from __future__ import annotations

from neffcache.stores.base import Store

# Nested directories, files beside subdirectories, a file at the root, and names that sort
# between a directory and its children ("a/b.bin" < "a/b/..." < "a/b0"): a grouping by runs
# of consecutive keys must still cover each file exactly once.
TREE = ("top.bin", "a/one.bin", "a/b.bin", "a/b/c/deep.bin", "a/b/two.bin", "a/b0/x.bin", "z/y/x/w.bin")


def _flattened(store: Store, prefix: str = "") -> list[str]:
    return [f.path for listing in store.iter_dirs(prefix) for f in listing.files]


class ListingContract:
    def test_iter_files_below_a_prefix(self, store: Store) -> None:
        for name in TREE:
            assert store.put_file(name, name.encode())
        assert {f.path for f in store.iter_files()} == set(TREE)
        assert {f.path for f in store.iter_files("a/b")} == {"a/b/c/deep.bin", "a/b/two.bin"}
        assert {f.path for f in store.iter_files("z")} == {"z/y/x/w.bin"}
        assert {f.path: f.size for f in store.iter_files()} == {name: len(name) for name in TREE}

    def test_iter_dirs_flattened_is_iter_files(self, store: Store) -> None:
        for name in TREE:
            assert store.put_file(name, name.encode())
        for prefix in ("", "a", "a/b", "z/y", "nope"):
            flat = _flattened(store, prefix)
            assert len(flat) == len(set(flat)), f"iter_dirs({prefix!r}) lists a file twice"
            assert sorted(flat) == sorted(f.path for f in store.iter_files(prefix)), prefix

    def test_iter_dirs_listings_are_consistent(self, store: Store) -> None:
        for name in TREE:
            assert store.put_file(name, name.encode())
        for listing in store.iter_dirs():
            assert len(listing.names) == len(listing.files)
            for name, info in zip(listing.names, listing.files, strict=True):
                assert "/" not in name
                assert info.path == (f"{listing.directory}/{name}" if listing.directory else name)
            assert listing.problems == ()

    def test_empty_store_lists_nothing(self, store: Store) -> None:
        assert list(store.iter_files()) == []
        assert list(store.iter_dirs()) == []
