"""One store's part of a prune: re-check every item right before removing it, markers first.

See :mod:`neffcache.prune.execute` for the protocol a chunk follows (leases, journal, phases).
:class:`StoreRun` holds what one store's run removed, skipped and failed.

A chunk reads and removes through its store's ``removal()``: on a local store, a
:class:`~neffcache.stores.local_remove.LocalRemoval` opened after the chunk's leases are held and
closed with the chunk (each directory walked to once, no symlink followed; what it unlinks in a
directory are names its own listing of that directory found and the plan agreed with). The
re-check (:func:`relist`) is ``load_entry`` without the manifest, run through it, and so is
the look for each entry's publish lease under a group lease: a publisher checks the group lease
after taking its own (neffcache/coordination/write_leases.py), so only a lease that existed
before the chunk's group leases were taken can belong to a publisher that writes, and the
chunk's directories are opened after that. Last-use stamps of age and size reasons are read
afresh (a use recorded during the chunk must count).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from neffcache.coordination.lease import LeaseRecord, StoreLease, lease_path, try_acquire
from neffcache.coordination.stamps import stamp_path
from neffcache.coordination.write_leases import PUBLISH_LEASE_TTL, prune_group_lease, publish_lease_name
from neffcache.entry import Entry, EntryState, FileInfo
from neffcache.errors import EntryNotFound, InvalidKey, ReadOnlyStore, StoreUnavailable, UnsafePath
from neffcache.events import EventKind
from neffcache.index.records import eviction_message
from neffcache.keys import is_canonical_relpath
from neffcache.prune.model import ItemKind, Kept, PruneItem, PrunePlan, Reason, ago
from neffcache.prune.remove import JOURNAL_DIR, delete_order
from neffcache.prune.sweep import LockJudge, lease_stale
from neffcache.scan.report import entry_at
from neffcache.stores.base import IncompleteUpload, Store
from neffcache.stores.removal import Removal

if TYPE_CHECKING:
    from neffcache.index import Index

log = logging.getLogger(__name__)
MTIME_SLACK = 1.0  # clock steps between a store's times and ours (S3 reports whole seconds)


# The crash tests aim a SIGKILL inside a chunk's removal phases by pausing this many seconds
# after each phase (a loaded machine otherwise finishes the phases before the kill lands).
# Unset outside those tests: one environment lookup per chunk.
PHASE_PAUSE_ENV = "NEFFCACHE_TEST_PRUNE_PHASE_PAUSE"

# What one item's removal may fail with and the run survive: an undeletable file (EPERM on
# one directory), a name no store path may have. A store that is down or read-only fails every
# item the same way: those (STORE_WIDE) still stop the run, caught first wherever these are.
ENTRY_FAULTS = (InvalidKey, OSError)
STORE_WIDE = (StoreUnavailable, ReadOnlyStore)


def same_time(a: float, b: float) -> bool:
    """Equal mtimes, where one side may only know whole seconds (S3's HEAD, where its listing and
    local filesystems report fractions): then the seconds must agree."""
    if a == b:
        return True
    return (a.is_integer() or b.is_integer()) and int(a) == int(b)


def _same_files(current: Iterable[FileInfo], planned: Iterable[FileInfo]) -> bool:
    now = {f.path: f for f in current}
    then = {f.path: f for f in planned}
    if now.keys() != then.keys():
        return False
    return all(now[p].size == then[p].size and same_time(now[p].mtime, then[p].mtime) for p in now)


def relist(files: Removal, path: str) -> Entry | None:
    """The entry at ``path`` as it is now, listed again through ``files`` (no manifest read),
    or None when nothing is there."""
    return entry_at(path, files.list_files, files.stat)


class StoreRun:
    """Executes one store's part of a plan."""

    def __init__(self, plan: PrunePlan, store: Store, index: Index | None, usage: Mapping[str, float],
                 stop: threading.Event) -> None:
        self.plan = plan
        self.store = store
        self.index = index
        self.usage = usage
        self.stop = stop
        self.policy = plan.policy
        self.judge = LockJudge(store, self.policy, time.time(), {})
        self.lock = threading.Lock()
        self.removed: list[PruneItem] = []
        self.skipped: list[Kept] = []
        self.failed: list[Kept] = []
        self.done = 0

    def skip(self, item: PruneItem, why: str) -> None:
        with self.lock:
            self.skipped.append(Kept(item.store, item.path, item.reason, why))
            self.done += 1

    def fail(self, item: PruneItem, exc: BaseException) -> None:
        log.warning("prune: cannot remove %s: %s", item.path, exc)
        with self.lock:
            self.failed.append(Kept(item.store, item.path, item.reason, f"{type(exc).__name__}: {exc}"))
            self.done += 1

    def _recheck(self, item: PruneItem, current: Entry | None) -> str | None:
        if current is None:
            return "gone already"
        if item.files:
            if not _same_files(current.files.values(), item.files):
                return "changed since the plan (republished, written to or locked)"
        else:
            marker = current.files.get(current.marker_name)
            if marker is not None and marker.mtime >= self.plan.created_at - MTIME_SLACK:
                return "published after the plan was made"
        if current.state is EntryState.LOCKED and not self.judge.all_stale(current):
            return "locked by a compile that may still run"
        if item.reason in (Reason.AGE, Reason.SIZE):
            now = time.time()
            try:
                stamp = self.store.stat(stamp_path(item.path))
            except InvalidKey:  # a name outside the key set: no use was ever recorded for it
                stamp = None
            used = max((t for t in (stamp.mtime if stamp else None, self.usage.get(item.path)) if t is not None),
                       default=None)
            if used is not None and now - used < self.policy.hit_grace:
                return f"used {ago(now - used)} ago, within the hit grace period"
            if used is not None and (item.last_used is None or (used > item.last_used
                                                                 and not same_time(used, item.last_used))):
                return "used since the plan was made"
        return None

    def entries(self, chunk: Sequence[PruneItem], number: int, groups: Sequence[str] = ()) -> None:
        """Re-check and remove one chunk; ``groups``: the prune group leases its entries are in
        (none: each entry's publish lease instead)."""
        leases: list[StoreLease] = []
        group_leases: list[StoreLease] = []
        blocked: dict[str, LeaseRecord | Exception] = {}
        started = time.monotonic()
        try:
            for name in groups:
                got = self._take(name)
                if isinstance(got, StoreLease):
                    got.keep_alive()
                    group_leases.append(got)
                else:
                    blocked[name] = got
            # The chunk's directories are opened once, after its leases are held, and closed
            # with the chunk: every listing and removal below goes through them.
            with self.store.removal() as files:
                approved = self._approve(chunk, bool(groups), blocked, leases, files)
                if approved and any(lease.lost for lease in group_leases):
                    for item, _ in approved:
                        self.skip(item, "a prune group lease was lost (a stalled execution): rerun")
                elif approved:
                    self._remove(approved, number, files)
        finally:
            self._release(leases, started)
            for lease in group_leases:
                lease.release()

    def _take(self, name: str) -> StoreLease | LeaseRecord | Exception:
        """The lease ``name``, the live record of its holder, or why it could not be taken: a
        lease shard directory that is unreadable or a symlink, tried twice (a swap may be
        brief), is the problem of the items under that lease, never the end of the run."""
        for attempt in (1, 2):
            try:
                return try_acquire(self.store, name, ttl=PUBLISH_LEASE_TTL)
            except STORE_WIDE:
                raise
            except ENTRY_FAULTS as exc:
                if attempt == 2:
                    return exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _approve(self, chunk: Sequence[PruneItem], grouped: bool, blocked: Mapping[str, LeaseRecord | Exception],
                 leases: list[StoreLease], files: Removal) -> list[tuple[PruneItem, Entry]]:
        """The entries of ``chunk`` still as planned (their publish leases, when taken, are
        added to ``leases``); every other is recorded as skipped or failed."""
        approved: list[tuple[PruneItem, Entry]] = []
        for item in chunk:
            if blocked:
                blocker = blocked.get(prune_group_lease(item.path))
                if isinstance(blocker, LeaseRecord):
                    self.skip(item, f"its prune group is held by {blocker.owner}")
                    continue
                if blocker is not None:
                    self.fail(item, blocker)
                    continue
            # Under the group lease a publisher that has not taken its lease yet will wait for
            # ours: only one that already holds it (or left it behind) needs looking at. So the
            # look may go through the chunk's directories, opened after the group leases were
            # taken: a lease (or its shard directory) made since belongs to such a waiter.
            try:
                looked = not grouped or files.exists(lease_path(publish_lease_name(item.path)))
            except STORE_WIDE:
                raise
            except ENTRY_FAULTS as exc:
                self.fail(item, exc)
                continue
            if looked:
                got = self._take(publish_lease_name(item.path))
                if isinstance(got, LeaseRecord):
                    self.skip(item, f"being published by {got.owner} (live lease)")
                    continue
                if not isinstance(got, StoreLease):
                    self.fail(item, got)
                    continue
                leases.append(got)
            try:
                current = relist(files, item.path)
                why = self._recheck(item, current)
            except STORE_WIDE:
                raise
            except ENTRY_FAULTS as exc:
                self.fail(item, exc)
                continue
            if why is not None or current is None:
                self.skip(item, why or "gone already")
                continue
            approved.append((item, current))
        return approved

    def _remove(self, approved: list[tuple[PruneItem, Entry]], number: int, files: Removal) -> None:
        journal = f"{JOURNAL_DIR}/{self.plan.id}-{number}.json"
        body = {"plan": self.plan.id, "created_at": self.plan.created_at,
                "entries": {e.path: sorted(f.path for f in e.files.values()) for _, e in approved}}
        try:
            self.store.put_file(journal, json.dumps(body).encode())
        except STORE_WIDE:
            raise
        except ENTRY_FAULTS as exc:  # no crash journal (its directory a symlink): nothing removed
            for item, _ in approved:
                self.fail(item, exc)
            return
        orders = [delete_order(entry) for _, entry in approved]
        pause = float(os.environ.get(PHASE_PAUSE_ENV) or 0.0)
        try:
            for phase in range(3):
                files.discard([p for order in orders if phase < len(order) for p in order[phase]],
                              prune_dirs=phase == 2)
                if pause:
                    time.sleep(pause)
        except STORE_WIDE:
            raise
        except ENTRY_FAULTS as exc:
            # Some file of the chunk would not go. Find whose, entry by entry (each in its phases,
            # so each still reads as whole or absent); every other entry is removed all the same.
            log.debug("chunk %s: %s; removing entry by entry", number, exc)
            approved = self._remove_each(approved, orders, files)
        try:
            files.discard([stamp_path(item.path) for item, _ in approved], prune_dirs=True)
        except STORE_WIDE:
            raise
        except ENTRY_FAULTS as exc:  # a stamp left behind only makes the entry look used: harmless
            log.warning("prune: cannot remove a last-use stamp: %s", exc)
        self.store.discard([journal])  # its directory stays: the next chunk writes its journal there
        with self.lock:
            for item, entry in approved:
                self.removed.append(item if item.size == entry.size else dataclasses.replace(item, size=entry.size))
                self.done += 1
        if self.index is not None and self.index.enabled:
            for item, entry in approved:
                # A name no index record may have was never registered; its event would get the
                # whole batch of events refused.
                if entry.committed and is_canonical_relpath(entry.path):
                    # A budget's eviction carries the compile seconds it weighed: the index's own
                    # record of what a later miss of it costs (the store keeps a tombstone too).
                    self.index.record(EventKind.EVICT, path=entry.path, key=entry.key, namespace=entry.namespace.path,
                                      toolchain=entry.toolchain, store=self.store.url,
                                      compile_seconds=item.cost.costed_seconds if item.cost else None,
                                      message=eviction_message(item.reason.value, item.cost.policy.value
                                                               if item.cost else None, item.detail))

    def _remove_each(self, approved: list[tuple[PruneItem, Entry]], orders: list[list[list[str]]],
                     files: Removal) -> list[tuple[PruneItem, Entry]]:
        """Remove entries one at a time; the ones that fail are recorded. Returns the removed."""
        removed = []
        for (item, entry), order in zip(approved, orders, strict=True):
            try:
                for phase, paths in enumerate(order):
                    files.discard(paths, prune_dirs=phase == len(order) - 1)
            except STORE_WIDE:
                raise
            except ENTRY_FAULTS as exc:
                self.fail(item, exc)
                continue
            removed.append((item, entry))
        return removed

    def _release(self, leases: list[StoreLease], started: float) -> None:
        if not leases:
            return
        if time.monotonic() - started < PUBLISH_LEASE_TTL / 2:
            # Nobody takes over a lease before it expires (we are alive), so they are all still
            # ours: drop them in one call instead of a read and a delete each.
            # Their shard directories stay: the next lease would make each ``leases/ab/`` again
            # (two directory operations per entry, the slowest calls on a filesystem).
            self.store.discard([lease.path for lease in leases])
        else:
            for lease in leases:
                lease.release()

    def loose(self, item: PruneItem) -> None:
        """A file, runtime lock, lease file or multipart upload."""
        try:
            why = self._loose(item)
        except STORE_WIDE:
            raise
        except ENTRY_FAULTS as exc:
            self.fail(item, exc)
            return
        if why is None:
            with self.lock:
                self.removed.append(item)
                self.done += 1
        else:
            self.skip(item, why)

    def _loose(self, item: PruneItem) -> str | None:
        if item.kind is ItemKind.UPLOAD:
            upload = IncompleteUpload(item.path, item.token or "", item.last_used or 0.0)
            return None if self.store.abort_uploads([upload]) else "completed or aborted already"
        info = self.store.stat(item.path)
        if info is None:
            return "gone already"
        if not _same_files([info], item.files):
            return "changed since the plan"
        if item.kind is ItemKind.LEASE:
            return self._lease(item)
        if item.kind is ItemKind.LOCK:
            entry_path = item.path.rsplit("/", 1)[0]
            got = try_acquire(self.store, publish_lease_name(entry_path), ttl=PUBLISH_LEASE_TTL)
            if isinstance(got, LeaseRecord):
                return f"entry is being published by {got.owner}"
            try:
                why = self.judge.why_live(entry_path, info)
                if why is None:
                    self.store.discard([item.path], prune_dirs=True)
                return why
            finally:
                got.release()
        self.store.discard([item.path], prune_dirs=True)
        return None

    def _lease(self, item: PruneItem) -> str | None:
        # The takeover protocol of neffcache.coordination.lease: whoever creates the tombstone for this
        # token owns the stale lease; a host taking it over at this instant loses to us or wins.
        tombstone = f"{item.path}.taken-{item.token}"
        if not self.store.put_file(tombstone, b"", exclusive=True):
            return "someone is taking this lease over right now"
        try:
            record = LeaseRecord.from_bytes(self.store.read_bytes(item.path))
        except (EntryNotFound, UnsafePath):  # gone, or a FIFO/device: invalid, removed by name
            record = None
        try:
            if record is not None and (record.token != item.token or not lease_stale(record, time.time())):
                return "renewed or taken over since the plan"
            if record is not None and lease_path(record.name) != item.path:
                return "not a lease file"
            self.store.discard([item.path], prune_dirs=True)
            return None
        finally:
            self.store.discard([tombstone], prune_dirs=True)
