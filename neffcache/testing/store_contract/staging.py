"""``staging_dir``: a local directory whose files ``put_file(move=True)`` consumes cheaply."""

from __future__ import annotations

import os

from neffcache.stores.base import Store


class StagingContract:
    def test_staged_file_lands_whole_and_staging_is_gone(self, store: Store) -> None:
        data = os.urandom(1 << 20)
        with store.staging_dir() as staging:
            assert staging.is_dir()
            part = staging / "model.neff"
            part.write_bytes(data)
            assert store.put_file("s/t/model.neff", part, move=True)
        assert not staging.exists(), "the staging directory is removed on exit"
        assert store.read_bytes("s/t/model.neff") == data
        assert {f.path for f in store.iter_files()} == {"s/t/model.neff"}, "staging leaves no file behind"

    def test_staging_dir_is_removed_after_an_error(self, store: Store) -> None:
        try:
            with store.staging_dir() as staging:
                (staging / "half.neff").write_bytes(b"half")
                raise RuntimeError("the download failed")
        except RuntimeError:
            pass
        assert not staging.exists()
        assert list(store.iter_files()) == []

    def test_two_staging_dirs_are_distinct(self, store: Store) -> None:
        with store.staging_dir() as first, store.staging_dir() as second:
            assert first != second
