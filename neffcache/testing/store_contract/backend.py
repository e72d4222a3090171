"""What a backend says about itself: ``local_root``, ``single_writer``, ``created``, what sets it
apart from other backends (neffcache/stores/roles.py), and the invisible incomplete uploads
(empty where the backend has none)."""

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

    def test_roles(self, store: Store) -> None:
        """A directory of this host is one runtimes and inotify can use, /proc/locks sees its
        locks, a prune may hold its group leases, it can fill up, and its lease releases do not
        batch; an object store is the opposite on each count."""
        local = self.on_local_filesystem
        assert store.runtime_root == store.local_root
        assert store.watchable_root == store.local_root
        assert store.host_locks_visible is local
        assert store.may_be_pruned_by_group is local
        assert store.batches_lease_releases is not local
        assert store.can_fill is local
        # A prune holds group leases only on a single-writer store: its publishers must check them.
        assert not store.single_writer or store.may_be_pruned_by_group
        free = store.free_bytes()
        assert (free is not None and free > 0) if local else free is None
        # Only a memory filesystem answers without waiting (its root may be on tmpfs here).
        assert isinstance(store.calls_wait, bool) and (local or store.calls_wait)

    def test_created(self, store: Store) -> None:
        assert store.created is self.created_on_open
