"""What a backend says about itself: ``local_root``, ``single_writer``, ``created``, and the
invisible incomplete uploads (empty where the backend has none)."""

from __future__ import annotations

from neffcache.stores.base import IncompleteUpload, Store


class BackendContract:
    # A backend's test class sets the values its store must report.
    on_local_filesystem = False
    single_writer = False
    created_on_open = False

    def test_incomplete_uploads_empty_by_default(self, store: Store) -> None:
        assert store.put_file("whole.bin", b"done in one request")
        assert store.incomplete_uploads() == []
        assert store.incomplete_uploads(older_than=0.0) == []
        assert store.abort_uploads([IncompleteUpload("never/started.bin", "no-such-upload", 0.0)]) == 0

    def test_local_root_and_single_writer(self, store: Store) -> None:
        assert (store.local_root is not None) == self.on_local_filesystem
        assert store.single_writer == self.single_writer
        assert not store.single_writer or store.local_root is not None
        assert store.put_file("p/q.bin", b"here")
        root = store.local_root
        if root is None:
            assert store.local_path("p/q.bin") is None
        else:
            assert (root / "p/q.bin").read_bytes() == b"here"
            assert store.local_path("p/q.bin") == root / "p/q.bin"

    def test_created(self, store: Store) -> None:
        assert store.created is self.created_on_open
