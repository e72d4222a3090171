"""Finding what no reader needs: stale locks and leases, temp files, uncommitted writes.

The rules, and why they are sound:

- **Lease files** (``.neffcache/leases/``) are stale when past their expiry or when their
  holder ran on this host and its pid is gone — the same test :func:`neffcache.coordination.lease.try_acquire`
  uses to take one over. Removal goes through the lease's takeover tombstone, so a host taking
  the lease over at the same instant and prune never both act on it.
- **Runtime compile locks** (the lock files a layout names in an entry, :meth:`Layout.locks_of`;
  libneuronxla's is 0 bytes, never refreshed, no owner inside) are stale when all of: older
  than ``lock_age`` (default 6 h, longer than the longest compile), no live neffcache lease on
  the entry, and — on a local or shared mount — no process on this host holds a lock on the
  file (``/proc/locks``). A lock younger than that is left alone even if its compile died: we
  cannot tell, and a duplicate compile costs less than a corrupted one.
- **Garbage** is only what neffcache positively recognises as the debris of its own work, and
  it waits out ``grace`` (default 1 h) so a write in flight is never taken for debris: temp
  files (neffcache's ``.neffcache-tmp-`` names) and leftover staging directories by their
  mtime, uncommitted entries (a manifest or NEFF without the commit marker, in a directory a
  layout classified) by their newest file and only without a live publish lease, stamps of
  entries that no longer exist, dead lease files and takeover tombstones, S3 multipart uploads
  by their start time.
- **Foreign files are never removed.** A cache namespace is shared with other tools that keep
  their own files there (optimum-neuron's ``0_REGISTRY/`` and traced models nested in entry
  directories, NxD's extra files; docs/runtimes.md), and a store URL may point one level too
  high. A file no layout classified and neffcache did not name is therefore not garbage,
  whatever directory it is in: the scan reports it as foreign (``ScanReport.foreign``), the
  plan shows it as kept, and no flag changes that. Removing an entry removes the entry's own
  files only (:meth:`Layout.removal_phases` over the files the scan kept for it), and a
  directory is only removed once empty, so foreign files beside or below an entry survive it.
- **A control directory that cannot be listed** (a symlink, unreadable) is a note of the plan,
  not its end (:func:`control_files`): what the plan would consult there is read again per
  item at execution, where the same fault fails that item and removes nothing.
"""

from __future__ import annotations

import calendar
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from neffcache.coordination.history import HISTORY_DAYS, expired_records
from neffcache.coordination.lease import LEASE_DIR, LeaseRecord
from neffcache.coordination.stamps import STAMP_DIR
from neffcache.coordination.write_leases import publish_lease_name
from neffcache.entry import Entry, FileInfo
from neffcache.errors import EntryNotFound, ReadOnlyStore, StoreUnavailable, UnsafePath
from neffcache.layouts import LAYOUTS, get_layout
from neffcache.operations.verify import QUARANTINE_DIR
from neffcache.prune.model import ItemKind, Kept, PruneItem, PrunePolicy, Reason, ago
from neffcache.scan.report import ScanReport
from neffcache.stores.base import CONTROL_DIR, TEMP_MARKER, Store

STAGING_DIR = f"{CONTROL_DIR}/staging"

_TOMBSTONE = ".taken-"
_STAMP_SUFFIX = ".used"


@dataclass(frozen=True)
class LeaseFile:
    info: FileInfo
    record: LeaseRecord | None  # None for a tombstone


def control_files(store: Store, directory: str, notes: list[str] | None = None) -> list[FileInfo]:
    """The files below one of neffcache's control directories, or none and a note.

    A control directory that is a symlink or unreadable (planted, or swapped for a moment: it
    is listed twice) is reported and left out of the plan, never the end of it. Leaving it
    out is safe: what a plan consults there (leases, last-use stamps) is taken or read again
    per item at execution, where the same fault fails that item, and what it would remove
    there (stale leases, leftovers) simply stays."""
    for attempt in (1, 2):
        try:
            return list(store.iter_files(directory))
        except (StoreUnavailable, ReadOnlyStore):
            raise
        except OSError as exc:
            if attempt == 2:
                if notes is not None:
                    notes.append(f"{store.url}: {directory} not listed ({exc}): what it holds is left out")
                return []
    raise AssertionError("unreachable")  # pragma: no cover


def read_leases(store: Store, notes: list[str] | None = None) -> list[LeaseFile]:
    """Every lease file and takeover tombstone, each lease read once (there are few)."""
    out = []
    for info in control_files(store, LEASE_DIR, notes):
        if _TOMBSTONE in info.path.rsplit("/", 1)[-1]:
            out.append(LeaseFile(info, None))
        elif info.path.endswith(".lease"):
            try:
                raw = store.read_bytes(info.path)
            except (EntryNotFound, FileNotFoundError):
                continue  # released while we listed
            except UnsafePath as exc:  # a FIFO or device at a lease's name: invalid, never read
                out.append(LeaseFile(info, LeaseRecord.invalid("(invalid)", exc.reason)))
                continue
            parsed = LeaseRecord.parse(raw)
            record = parsed if isinstance(parsed, LeaseRecord) else LeaseRecord.invalid("(invalid)", parsed)
            out.append(LeaseFile(info, record))
    return out


def lease_stale(record: LeaseRecord, now: float) -> bool:
    return record.expired(now) or record.holder_dead_here()


def live_holders(leases: Iterable[LeaseFile], now: float) -> dict[str, str]:
    """Lease name -> owner, for every live lease."""
    return {lf.record.name: lf.record.owner for lf in leases
            if lf.record is not None and not lease_stale(lf.record, now)}


def held_file_locks() -> set[tuple[int, int]]:
    """(device, inode) of every file a process on this host holds a POSIX or flock lock on."""
    held: set[tuple[int, int]] = set()
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return held
    for line in lines:
        parts = line.split()
        # "1: POSIX  ADVISORY  WRITE 3776 fe:00:1474578 0 EOF" ("->" marks a blocked waiter)
        fields = [p for p in parts if p.count(":") == 2]
        if not fields:
            continue
        major, minor, inode = fields[0].split(":")
        try:
            held.add((os.makedev(int(major, 16), int(minor, 16)), int(inode)))
        except ValueError:
            continue
    return held


class LockJudge:
    """Decides whether a runtime compile lock is stale (see the module docstring)."""

    def __init__(self, store: Store, policy: PrunePolicy, now: float, live: Mapping[str, str]) -> None:
        self.store = store
        self.policy = policy
        self.now = now
        self.live = live
        self.host_locks = store.host_locks_visible
        self.held = held_file_locks() if self.host_locks else set()

    def why_live(self, entry_path: str, lock: FileInfo) -> str | None:
        """None when the lock is stale, else why it is not."""
        age = self.now - lock.mtime
        if age < self.policy.lock_age:
            return f"lock is {ago(age)} old, younger than --lock-age {ago(self.policy.lock_age)}"
        holder = self.live.get(publish_lease_name(entry_path))
        if holder:
            return f"live lease held by {holder}"
        if self.host_locks:
            try:  # local_path refuses a lock reached through a symlink (UnsafePath, an OSError)
                local = self.store.local_path(lock.path)
                st = os.stat(local) if local is not None else None
            except OSError:
                st = None
            if st is not None and (st.st_dev, st.st_ino) in self.held:
                return "a process on this host holds a lock on the file"
        return None

    def locks(self, entry: Entry) -> list[FileInfo]:
        return [entry.files[name] for name in get_layout(entry.layout).locks_of(entry)]

    def all_stale(self, entry: Entry) -> bool:
        locks = self.locks(entry)
        return bool(locks) and all(self.why_live(entry.path, lock) is None for lock in locks)


@dataclass
class Sweep:
    items: list[PruneItem] = field(default_factory=list)
    protected: list[Kept] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _file(store: Store, info: FileInfo, reason: Reason, detail: str, kind: ItemKind = ItemKind.FILE) -> PruneItem:
    return PruneItem(store.url, info.path, kind, reason, info.size, detail, files=(info,))


def sweep_locks(store: Store, report: ScanReport, leases: list[LeaseFile], judge: LockJudge, now: float,
                policy: PrunePolicy) -> Sweep:
    out = Sweep()
    live_tokens = {lf.record.token for lf in leases if lf.record is not None}
    for lf in leases:
        if lf.record is None:
            # A tombstone outlives its takeover only when the taker died mid-way (takeovers take ms).
            token = lf.info.path.rsplit(_TOMBSTONE, 1)[-1]
            if now - lf.info.mtime > policy.grace or token not in live_tokens:
                out.items.append(_file(store, lf.info, Reason.STALE_LOCK, "lease takeover tombstone left behind"))
        elif lease_stale(lf.record, now):
            rec = lf.record
            why = (f"holder {rec.owner} is gone (pid {rec.pid} not running on this host)" if rec.holder_dead_here()
                   else f"expired {ago(now - rec.expires_at)} ago (owner {rec.owner})")
            out.items.append(PruneItem(store.url, lf.info.path, ItemKind.LEASE, Reason.STALE_LOCK, lf.info.size,
                                       f"lease {rec.name}: {why}", files=(lf.info,), token=rec.token))
    for entry in report.entries:
        for lock in judge.locks(entry):
            live_why = judge.why_live(entry.path, lock)
            if live_why is None:
                out.items.append(PruneItem(
                    store.url, lock.path, ItemKind.LOCK, Reason.STALE_LOCK, lock.size,
                    f"runtime compile lock {ago(now - lock.mtime)} old, no lease, no process holds it",
                    layout=entry.layout, state=entry.state.value, files=(lock,)))
            else:
                out.protected.append(Kept(store.url, lock.path, Reason.STALE_LOCK, live_why))
    return out


def sweep_garbage(store: Store, report: ScanReport, stamps: Mapping[str, FileInfo], live: Mapping[str, str],
                  now: float, policy: PrunePolicy, taken: set[str]) -> tuple[Sweep, list[Entry]]:
    """Loose garbage as items; uncommitted entries old enough to be garbage are returned for the
    caller to turn into entry items (they are removed like entries: under their publish lease)."""
    out = Sweep()
    young = 0
    for info in report.garbage:
        name = info.path.rsplit("/", 1)[-1]
        if now - info.mtime <= policy.grace:
            young += 1
        elif TEMP_MARKER in name:  # the scan's garbage is our temp names; anything else stays
            out.items.append(_file(store, info, Reason.GARBAGE, "temp file of an interrupted write"))
    for info in report.runtime_temp:
        dead_after = _runtime_debris_after(info.path)
        if dead_after is None:
            continue
        if now - info.mtime <= max(policy.grace, dead_after):
            young += 1  # a runtime's write may be in flight: its lock is on another host's disk
        else:
            out.items.append(_file(store, info, Reason.GARBAGE, f"a runtime's temp file, last written "
                                   f"{ago(now - info.mtime)} ago: its writer is gone"))
    for info in control_files(store, STAGING_DIR, out.notes):
        if now - info.mtime > policy.grace:
            out.items.append(_file(store, info, Reason.GARBAGE, "leftover of an interrupted transfer (staging)"))
    existing = {e.path for e in report.entries} | {e.path for e in report.uncommitted}
    for path, info in stamps.items():
        if path not in existing and path not in taken and now - info.mtime > policy.grace:
            out.items.append(_file(store, info, Reason.GARBAGE, "last-use stamp of an entry that is gone"))
    uncommitted = []
    for entry in report.uncommitted:
        if entry.path in taken:
            continue
        holder = live.get(publish_lease_name(entry.path))
        if holder:
            out.protected.append(Kept(store.url, entry.path, Reason.GARBAGE, f"being published by {holder}"))
        elif now - entry.mtime <= policy.grace:
            young += 1
        else:
            uncommitted.append(entry)
    for up in store.incomplete_uploads(policy.grace):
        out.items.append(PruneItem(store.url, up.path, ItemKind.UPLOAD, Reason.GARBAGE, 0,
                                   f"multipart upload started {ago(now - up.initiated)} ago, never completed",
                                   token=up.upload_id, last_used=up.initiated))
    if young:
        out.notes.append(f"{store.url}: {young} temp files or uncommitted writes younger than the "
                         f"{ago(policy.grace)} grace period (a runtime's: the age its layout gives) kept "
                         "(they may be in flight)")
    return out, uncommitted


def _runtime_debris_after(path: str) -> float | None:
    """Seconds after its last write when a runtime's temp file is surely its dead writer's."""
    ages = [age for lay in LAYOUTS.values() if (age := lay.runtime_debris_after(path)) is not None]
    return max(ages) if ages else None


def _quarantine_time(path: str) -> float | None:
    """When an entry was quarantined, from its ``.neffcache/quarantine/<time>/`` directory: the
    files keep their own mtimes when moved, so only the name tells."""
    stamp = path[len(QUARANTINE_DIR) + 1:].split("/", 1)[0]
    try:
        if stamp.endswith("Z"):
            return calendar.timegm(time.strptime(stamp[:-1], "%Y%m%dT%H%M%S"))
        return time.mktime(time.strptime(stamp, "%Y%m%dT%H%M%S"))  # older names: local time
    except ValueError:
        return None


def sweep_retention(store: Store, now: float, policy: PrunePolicy, notes: list[str] | None = None
                    ) -> list[PruneItem]:
    """Quarantined files past ``quarantine_days`` and action records past the journal's
    retention: the only way either leaves a store."""
    out = []
    cutoff = now - policy.quarantine_days * 86400
    for info in control_files(store, QUARANTINE_DIR, notes):
        at = _quarantine_time(info.path)
        if at is not None and at < cutoff:
            out.append(_file(store, info, Reason.QUARANTINE_EXPIRED,
                             f"quarantined {ago(now - at)} ago, past quarantine_days {policy.quarantine_days:g}"))
    try:
        expired = expired_records(store, now)
    except (StoreUnavailable, ReadOnlyStore):
        raise
    except OSError as exc:  # a symlinked or unreadable journal directory: its records stay
        expired = []
        if notes is not None:
            notes.append(f"{store.url}: the action journal not listed ({exc}): its old records stay")
    for info in expired:
        out.append(_file(store, info, Reason.HISTORY_EXPIRED,
                         f"action record older than the journal's {HISTORY_DAYS:g} days"))
    return out


def stamp_files(store: Store, notes: list[str] | None = None) -> dict[str, FileInfo]:
    """Entry path -> its last-use stamp file, from one listing (as :func:`neffcache.coordination.stamps.last_used`).
    Stamps that cannot be listed make entries look unused to the plan; execution reads each
    entry's stamp again, and a stamp it cannot read fails that entry (never removes it)."""
    out = {}
    for info in control_files(store, STAMP_DIR, notes):
        if info.path.endswith(_STAMP_SUFFIX):
            out[info.path[len(STAMP_DIR) + 1 : -len(_STAMP_SUFFIX)]] = info
    return out
