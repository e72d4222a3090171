"""What tells one backend from another, for the code above the stores.

:class:`StoreRoles` is part of :class:`~neffcache.stores.base.Store`, which inherits it. Each
member names one difference that code above the stores acts on, and its docstring says why it
matters. The defaults describe an object store (S3, fsspec); a directory of this host
(:class:`~neffcache.stores.local.LocalStore`) overrides them. They are separate questions, not
one "is it local?", because a backend may answer them differently: a directory a FUSE client
mounts from S3 has a ``runtime_root`` but no ``host_locks_visible``. Code outside ``stores/``
never tests ``local_root`` for None instead (tests/stores/test_interface.py), and the store
contract suite checks each backend's answers (neffcache/testing/store_contract/backend.py).
"""

from __future__ import annotations

from pathlib import Path


class StoreRoles:
    """The defaults: an object store reached over the network."""

    @property
    def local_root(self) -> Path | None:
        """The directory of the store's files on this host's filesystem, if there is one, for
        reaching them by path. To decide what to do with a store, ask the members below."""
        return None

    @property
    def single_writer(self) -> bool:
        """Only this host writes the store (a local, unshared directory). A name another process
        created a moment ago is then never hidden by a stale cache. Prune's group leases rely on
        that (:func:`neffcache.coordination.write_leases.prune_group_lease`)."""
        return False

    @property
    def runtime_root(self) -> Path | None:
        """The directory a compiler or runtime can be pointed at to read and write the entries
        itself (they open files by path, take their own locks and rename). None where there is
        none: a warm job then puts a directory tier in front (warmers/placement.py)."""
        return None

    @property
    def watchable_root(self) -> Path | None:
        """The directory inotify can watch, so a write-back wakes when a compile lands instead
        of at its next poll (neffcache/replication/inotify.py). None: the store is only polled.
        The watch is a hint. It sees only this host's writes, and the write-back still polls
        every interval."""
        return None

    @property
    def host_locks_visible(self) -> bool:
        """A lock a process of this host holds on one of the store's files shows in
        ``/proc/locks``. A prune then keeps a runtime's compile lock that looks old but is
        held (neffcache/prune/sweep.py). Elsewhere the lock's age and leases decide alone."""
        return False

    @property
    def may_be_pruned_by_group(self) -> bool:
        """A prune of these files may hold its prune-group leases instead of each entry's publish
        lease. A publisher must then check its entry's group after it takes its own lease
        (:func:`neffcache.coordination.write_leases.exclusive_write`). This holds for any
        directory of this host, shared or not, because a prune may open the same root unshared
        (:attr:`single_writer`). It never holds for object stores, which are never single-writer."""
        return False

    @property
    def batches_lease_releases(self) -> bool:
        """A push releases the publish leases of finished entries together
        (:class:`neffcache.coordination.releases.BatchedReleases`). Each release is a request
        to a server, and one DeleteObjects removes up to 1,000 keys. On a filesystem an unlink
        costs as little alone, and batching would only hold each lease longer."""
        return True

    @property
    def can_fill(self) -> bool:
        """Writes can fail because the store has no space left (ENOSPC on a filesystem). A prune
        must write leases before it frees anything, so on such a store it keeps a space
        reserve (neffcache/prune/reserve.py). An object store never fills."""
        return False

    def free_bytes(self) -> int | None:
        """The space left to the store's writes, or None when it is not known or never runs out."""
        return None

    @property
    def calls_wait(self) -> bool:
        """The store's calls wait on a disk or a server. While one thread waits, the others run,
        so a prune runs several chunks at once (neffcache/prune/execute.py). This is False on a
        memory filesystem (tmpfs, ramfs), where no call waits and threads only contend for the
        GIL."""
        return True
