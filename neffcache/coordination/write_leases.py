"""The leases that keep the writers of an entry apart: publishers, and the prune removing it.

Two lease names, one rule. A publisher holds the entry's *publish lease* while it writes
(:func:`exclusive_write`), so two publishers never interleave their files; a prune takes the
same lease before it removes the entry, or, on a store one host writes, the lease of the
entry's *prune group* (:func:`prune_group_lease`). Each side checks the other's lease after
taking its own, so one of the two always sees the other. The names and the wait are here, in
one module, because publish (neffcache.operations.publish, neffcache.replication.sync), verify and prune
(neffcache.prune.run, .execute, .plan, .sweep) must agree on them exactly.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Iterator

from neffcache.coordination.lease import StoreLease, read_lease, try_acquire
from neffcache.coordination.releases import BatchedReleases
from neffcache.layouts import prune_group_dir
from neffcache.stores.base import Store

log = logging.getLogger(__name__)
PUBLISH_LEASE_TTL = 300.0
# Groups per directory a prune of a local store locks at a time, and how long a publisher waits
# for one (a prune holds it while it removes at most one chunk, well under a second on a disk).
PRUNE_GROUPS = 64
PRUNE_GROUP_WAIT = 30.0


def publish_lease_name(entry_path: str) -> str:
    return f"publish:{entry_path}"


def prune_group_lease(entry_path: str) -> str:
    """The lease a prune holds while it removes entries of this entry's group, instead of each
    entry's publish lease (a file created, written, linked and removed per entry was half of
    a prune's cost): it checks each entry's publish lease *after* taking the group's, and a
    publisher checks the group's *after* taking its own, so one of the two always sees the
    other. Only on stores one host writes (:attr:`Store.single_writer`): there a lookup of a
    name created a moment ago by another process is never answered from a stale cache (an NFS
    client's negative lookups may be); shared stores keep per-entry publish leases.

    Groups are per directory of entries, as the layout draws them (:func:`prune_group_dir`:
    TorchNeuron's cache holds one or two entries per ``ab/cd/`` or kernel directory at scale,
    and a group per such directory would cost a lease per entry again; its groups are per
    ``<ns>/neff/``). Publisher and prune compute the name with this one function (both sides
    of one version)."""
    directory = prune_group_dir(entry_path)
    raw = entry_path.encode("utf-8", "surrogateescape")  # a non-UTF-8 name: its raw bytes
    group = int(hashlib.sha256(raw).hexdigest()[:8], 16) % PRUNE_GROUPS
    return f"prune-group:{directory}#{group}"


def _prune_group_free(store: Store, entry_path: str) -> bool:
    """Wait (bounded) until no live prune holds this entry's group; False when one still does."""
    deadline = time.monotonic() + PRUNE_GROUP_WAIT
    while True:
        record = read_lease(store, prune_group_lease(entry_path))
        if record is None or record.expired() or record.holder_dead_here():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


@contextlib.contextmanager
def exclusive_write(store: Store, entry_path: str, releases: BatchedReleases | None = None
                    ) -> Iterator[StoreLease | None]:
    """Hold ``entry_path``'s publish lease, kept alive, while writing the entry's files; None
    when another publisher holds it or a prune is removing the entry's group (busy: retry).
    ``releases``: release it with a batch of others (neffcache/coordination/releases.py)."""
    got = try_acquire(store, publish_lease_name(entry_path), ttl=PUBLISH_LEASE_TTL)
    if not isinstance(got, StoreLease):
        log.debug("%s is being published by %s", entry_path, got.owner)
        yield None
        return
    got.keep_alive()
    try:
        # A prune may hold the entry's group lease instead of its publish lease (any directory,
        # shared or not: the prune may have opened this root unshared, as single_writer).
        if store.may_be_pruned_by_group and not _prune_group_free(store, entry_path):
            log.debug("%s: a prune is removing its group", entry_path)
            yield None
        else:
            yield got
    finally:
        if releases is not None:
            releases.release(got)
        else:
            got.release()
