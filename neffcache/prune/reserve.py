"""The space a prune keeps in hand to start on a full disk.

A prune must write before it removes anything: the store-wide ``prune`` lease, each chunk's
group or publish leases and its journal. On a full filesystem those writes fail (ENOSPC) and
the one tool that frees space would refuse exactly when it is needed. So every prune execution
of a store on a local filesystem leaves behind a preallocated *reserve* file,
``.neffcache/prune-reserve`` (:data:`RESERVE_BYTES` of real blocks, not a sparse file), and the
next execution removes it before its first write when the filesystem is nearly full
(:meth:`SpaceReserve.release_if_low`), or when a write of its store-wide lease fails with
NoSpace anyway (:meth:`SpaceReserve.release`, then one retry). Its coordination files then fit
in the space given back; when it is done, the reserve is made again from the space it freed
(:meth:`SpaceReserve.restore`: best effort, a full disk just leaves it absent).

Why this is safe: the reserve holds no data anyone reads, lives in the control directory (no
layout lists it, no scan counts it, no prune rule removes it), and is written like any store
file (temp name, then rename), so a crash leaves either the whole reserve or none. Limit: a
store no prune has executed on since it was filled holds no reserve; there the prune still
fails with NoSpace, changing nothing, and the message says how much to free by hand. Another
writer may take the space back between the release and the prune's writes: the prune then
fails the same way, having removed nothing (the lease comes before every removal).
"""

from __future__ import annotations

import logging

from neffcache.errors import NoSpace
from neffcache.stores.base import CONTROL_DIR, Store

log = logging.getLogger(__name__)
RESERVE = f"{CONTROL_DIR}/prune-reserve"
# The store-wide lease, up to 64 group leases (or 256 publish leases on a shared store) of a
# chunk and its journal, at a filesystem block each: well under a MiB.
RESERVE_BYTES = 1 << 20


def no_reserve_hint() -> str:
    return (f"the filesystem is full and holds no prune space reserve (any prune run with room leaves one): "
            f"free {RESERVE_BYTES >> 10} KiB by hand, then run the prune again")


class SpaceReserve:
    """The reserve of one store (a no-op on a read-only store and on a store that never fills:
    :attr:`Store.can_fill`)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.kept = store.can_fill and not store.read_only

    def free_bytes(self) -> int | None:
        return self.store.free_bytes()

    def present(self) -> bool:
        return self.kept and self.store.stat(RESERVE) is not None

    def release(self) -> bool:
        """Remove the reserve; True when there was one to give back."""
        if not self.present():
            return False
        self.store.discard([RESERVE])
        log.info("%s: released the prune's space reserve (%d bytes) to write its leases", self.store.url,
                 RESERVE_BYTES)
        return True

    def release_if_low(self) -> bool:
        """Release the reserve when the filesystem has less than twice its size free."""
        free = self.free_bytes()
        return free is not None and free < 2 * RESERVE_BYTES and self.release()

    def restore(self) -> None:
        """Make the reserve again if it is absent and there is room for it (never an error)."""
        if not self.kept or self.present():
            return
        free = self.free_bytes()
        if free is not None and free < 2 * RESERVE_BYTES:
            return  # leave the space to the store: a later prune with more room makes it
        try:
            self.store.put_file(RESERVE, bytes(RESERVE_BYTES))
        except (NoSpace, OSError) as exc:  # a reserve is a convenience: its absence only costs a full-disk prune
            log.debug("%s: no prune space reserve made: %s", self.store.url, exc)
