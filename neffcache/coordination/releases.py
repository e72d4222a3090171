"""Releasing many leases in one request: a push's publish leases on a remote store.

A push to S3 held each entry's publish lease for one PUT and one DeleteObjects: two of the
seven requests an entry cost (docs/performance.md, S3 push). :class:`BatchedReleases` keeps
the releases of the entries that are done and deletes their lease files together, one
DeleteObjects for up to :data:`BATCH` leases, sent at most :data:`MAX_DELAY` seconds after
the first of them was released (a timer sends a batch the push's pace leaves short).

Why it cannot release a lease that is not ours, or lose an entry:
- a deferred lease is deleted only while :meth:`StoreLease.ours` holds (heartbeat stopped,
  short of its expiry by the clock-skew margin: before its expiry nobody may take it over);
  one that gets past that point is released as any late release is, by reading it back first
  (:meth:`StoreLease.release_checked`);
- until its release a lease is simply held a little longer, after its entry's commit marker
  exists: another publisher of the entry finds it busy, waits and then sees the entry
  committed (EXISTS); a prune of the entry skips it this round, as it would during the write;
- a process killed with releases pending leaves leases a killed publisher leaves anyway: they
  expire (``PUBLISH_LEASE_TTL``) and ``prune --stale-locks`` removes them;
- a failed batch delete is logged, not raised into whichever entry happened to fill the batch
  (its files are committed): its leases expire as above.
"""

from __future__ import annotations

import logging
import threading
import time

from neffcache.coordination.lease import StoreLease
from neffcache.stores.base import Store

log = logging.getLogger(__name__)
BATCH = 64  # leases per DeleteObjects (S3 takes up to 1,000 keys in one)
MAX_DELAY = 5.0  # seconds a release may wait for its batch, far inside any lease's margin


class BatchedReleases:
    """Release leases of ``store`` in batches; :meth:`close` releases what is left. Thread-safe:
    a sync's entry threads release into one instance."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._pending: list[StoreLease] = []
        self._timer: threading.Timer | None = None  # sends a batch MAX_DELAY after its first release
        self._lock = threading.Lock()
        self.requests = 0  # batches taken, each at most one DeleteObjects (tests count them)

    def release(self, lease: StoreLease) -> None:
        """Release ``lease`` now or with the next batch (its heartbeat stops now)."""
        lease.stop()
        now = time.time()
        if not lease.ours(now + MAX_DELAY):  # too near its expiry to wait for its batch: alone, now
            lease.release()
            return
        with self._lock:
            self._pending.append(lease)
            if len(self._pending) >= BATCH:
                batch = self._take()
            else:
                batch = []
                if self._timer is None:
                    self._timer = threading.Timer(MAX_DELAY, self.close)
                    self._timer.daemon = True
                    self._timer.start()
        self._delete(batch)

    def close(self) -> None:
        """Release every pending lease now (also what the timer does)."""
        with self._lock:
            batch = self._take()
        self._delete(batch)

    def __enter__(self) -> BatchedReleases:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _take(self) -> list[StoreLease]:
        if self._timer is not None:
            self._timer.cancel()  # no-op when it is the timer that called
            self._timer = None
        batch, self._pending = self._pending, []
        if batch:
            self.requests += 1
        return batch

    def _delete(self, batch: list[StoreLease]) -> None:
        if not batch:
            return
        now = time.time()
        fresh = [lease for lease in batch if lease.ours(now)]
        late = [lease for lease in batch if not lease.ours(now)]
        try:
            if fresh:
                self.store.discard([lease.path for lease in fresh])
            for lease in late:
                lease.release_checked()
        except OSError as exc:  # StoreError too: the module docstring's last point
            log.warning("%d publish leases not released (%s): they expire on their own", len(batch), exc)
