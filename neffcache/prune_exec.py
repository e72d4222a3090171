"""Executing a prune plan: re-check every item right before removing it, markers first.

Per store, under the store-wide ``prune`` lease (two executions never interleave), entries go
in chunks. For each entry of a chunk: exclude publishers (so none writes into it while it is
half-removed: a publisher that finds the marker gone asks for its lease first), list its files
again and compare them with what the plan saw (anything republished, written to or locked
since is skipped), and re-read its last-use stamp for age and size reasons. Publishers are
excluded by each entry's publish lease, or — on a store only this host writes — by the lease
of the chunk's prune group (:func:`neffcache.publish.prune_group_lease`, which publishers
check after taking their own), taken once per chunk, and each entry's publish lease only
looked for: a live one skips the entry, a stale one is taken over as before.
Then the chunk's journal is written (``.neffcache/prune/<plan>-<n>.json``: the files about to
go), and the files are removed in phases across the chunk — see :func:`delete_order` — so at
every instant each entry reads either as it was or as absent (uncommitted), never as a
different entry. A prune killed at any point leaves at most journaled, uncommitted remains,
which the next plan lists as ``interrupted`` and its execution finishes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from neffcache.entry import Entry, EntryState, FileInfo
from neffcache.errors import (
    ConfigError,
    EntryNotFound,
    IndexServerError,
    InvalidKey,
    ReadOnlyStore,
    RefusedPlan,
    StoreUnavailable,
)
from neffcache.history import ActionItem
from neffcache.history import record as record_action
from neffcache.lease import Lease, LeaseRecord, held, lease_path, try_acquire
from neffcache.prune_plan import ItemKind, PruneItem, PrunePlan, Reason, ago
from neffcache.prune_remove import JOURNAL_DIR, delete_order, discard, drop_leases, remove_empty_dirs
from neffcache.prune_rules import index_usage
from neffcache.prune_sweep import LockJudge, lease_stale
from neffcache.publish import PUBLISH_LEASE_TTL, prune_group_lease, prune_uses_group_leases, publish_lease_name
from neffcache.scan import load_entry
from neffcache.stamps import stamp_path
from neffcache.stores.base import Store
from neffcache.stores.local import LocalStore

if TYPE_CHECKING:
    from neffcache.index import Index

log = logging.getLogger(__name__)
PRUNE_LEASE = "prune"
CHUNK = 256
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


@dataclass(frozen=True)
class Skipped:
    store: str
    path: str
    reason: Reason
    why: str


@dataclass(frozen=True)
class PruneResult:
    plan_id: str
    removed: tuple[PruneItem, ...]
    skipped: tuple[Skipped, ...]
    seconds: float
    # Items whose removal failed (an undeletable file, a name no store path may have): the rest
    # were done; ``why`` says what stopped these. A failed entry may be left half-removed, which
    # reads as uncommitted (never served); the next ``prune --garbage`` finds it again.
    failed: tuple[Skipped, ...] = ()

    @property
    def freed_bytes(self) -> int:
        return sum(item.size for item in self.removed)

    def to_json(self, *, items: bool = True) -> dict[str, Any]:
        by_reason: dict[str, dict[str, int]] = {}
        for item in self.removed:
            slot = by_reason.setdefault(item.reason.value, {"items": 0, "bytes": 0})
            slot["items"] += 1
            slot["bytes"] += item.size
        out: dict[str, Any] = {
            "plan": self.plan_id, "freed_bytes": self.freed_bytes, "removed": len(self.removed),
            "removed_entries": sum(1 for i in self.removed if i.kind is ItemKind.ENTRY),
            "by_reason": by_reason, "skipped": [s.__dict__ | {"reason": s.reason.value} for s in self.skipped],
            "failed": [s.__dict__ | {"reason": s.reason.value} for s in self.failed],
            "seconds": round(self.seconds, 3),
        }
        if items:
            out["removed_items"] = [{"store": i.store, "path": i.path, "reason": i.reason.value, "bytes": i.size}
                                    for i in self.removed]
        return out


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


def _stamps_present(store: Store, stamps: list[str]) -> list[str]:
    """``stamps`` less those whose directory a local store does not have: a cache nobody reads
    through neffcache has no stamps, and an unlink that fails still walks the whole path."""
    if not isinstance(store, LocalStore):
        return stamps
    root = str(store.root)
    parents = {p: os.path.isdir(f"{root}/{p}") for p in {s.rpartition("/")[0] for s in stamps}}
    return [s for s in stamps if parents[s.rpartition("/")[0]]]


class _StoreRun:
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
        self.skipped: list[Skipped] = []
        self.failed: list[Skipped] = []
        self.done = 0

    def skip(self, item: PruneItem, why: str) -> None:
        with self.lock:
            self.skipped.append(Skipped(item.store, item.path, item.reason, why))
            self.done += 1

    def fail(self, item: PruneItem, exc: BaseException) -> None:
        log.warning("prune: cannot remove %s: %s", item.path, exc)
        with self.lock:
            self.failed.append(Skipped(item.store, item.path, item.reason, f"{type(exc).__name__}: {exc}"))
            self.done += 1

    def _lease_file_exists(self, name: str) -> bool:
        if isinstance(self.store, LocalStore):  # a path we made: no need to validate it again
            return os.path.lexists(f"{self.store.root}/{lease_path(name)}")
        return self.store.stat(lease_path(name)) is not None

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
            stamp = self.store.stat(stamp_path(item.path))
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
        approved: list[tuple[PruneItem, Entry]] = []
        leases: list[Lease] = []
        group_leases: list[Lease] = []
        blocked: dict[str, str] = {}
        started = time.monotonic()
        try:
            for name in groups:
                got = try_acquire(self.store, name, ttl=PUBLISH_LEASE_TTL)
                if isinstance(got, LeaseRecord):
                    blocked[name] = got.owner
                else:
                    got.keep_alive()
                    group_leases.append(got)
            for item in chunk:
                if groups:
                    holder = blocked.get(prune_group_lease(item.path))
                    if holder is not None:
                        self.skip(item, f"its prune group is held by {holder}")
                        continue
                # Under the group lease a publisher that has not taken its lease yet will wait for
                # ours: only one that already holds it (or left it behind) needs looking at.
                if not groups or self._lease_file_exists(publish_lease_name(item.path)):
                    got = try_acquire(self.store, publish_lease_name(item.path), ttl=PUBLISH_LEASE_TTL)
                    if isinstance(got, LeaseRecord):
                        self.skip(item, f"being published by {got.owner} (live lease)")
                        continue
                    leases.append(got)
                try:
                    current = load_entry(self.store, item.path, read_manifest=False)
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
            if approved and any(lease.lost for lease in group_leases):
                for item, _ in approved:
                    self.skip(item, "a prune group lease was lost (a stalled execution): rerun")
            elif approved:
                self._remove(approved, number)
        finally:
            self._release(leases, started)
            for lease in group_leases:
                lease.release()

    def _remove(self, approved: list[tuple[PruneItem, Entry]], number: int) -> None:
        journal = f"{JOURNAL_DIR}/{self.plan.id}-{number}.json"
        body = {"plan": self.plan.id, "created_at": self.plan.created_at,
                "entries": {e.path: sorted(f.path for f in e.files.values()) for _, e in approved}}
        self.store.put_file(journal, json.dumps(body).encode())
        orders = [delete_order(entry) for _, entry in approved]
        pause = float(os.environ.get(PHASE_PAUSE_ENV) or 0.0)
        try:
            for phase in range(3):
                discard(self.store, [p for order in orders if phase < len(order) for p in order[phase]],
                        prune_dirs=phase == 2)
                if pause:
                    time.sleep(pause)
        except STORE_WIDE:
            raise
        except ENTRY_FAULTS as exc:
            # Some file of the chunk would not go. Find whose, entry by entry (each in its phases,
            # so each still reads as whole or absent); every other entry is removed all the same.
            log.debug("chunk %s: %s; removing entry by entry", number, exc)
            approved = self._remove_each(approved, orders)
        try:
            discard(self.store, _stamps_present(self.store, [stamp_path(item.path) for item, _ in approved]))
        except STORE_WIDE:
            raise
        except ENTRY_FAULTS as exc:  # a stamp left behind only makes the entry look used: harmless
            log.warning("prune: cannot remove a last-use stamp: %s", exc)
        discard(self.store, [journal], prune_dirs=False)  # the journal directory is reused by the next chunk
        with self.lock:
            for item, entry in approved:
                self.removed.append(dataclasses.replace(item, size=entry.size))
                self.done += 1
        if self.index is not None and self.index.enabled:
            for item, entry in approved:
                if entry.committed:
                    self.index.record("evict", path=entry.path, key=entry.key, namespace=entry.namespace.path,
                                      toolchain=entry.toolchain, store=self.store.url,
                                      message=f"prune ({item.reason.value}): {item.detail}")

    def _remove_each(self, approved: list[tuple[PruneItem, Entry]], orders: list[list[list[str]]]
                     ) -> list[tuple[PruneItem, Entry]]:
        """Remove entries one at a time; the ones that fail are recorded. Returns the removed."""
        removed = []
        for (item, entry), order in zip(approved, orders, strict=True):
            try:
                for phase, paths in enumerate(order):
                    discard(self.store, paths, prune_dirs=phase == len(order) - 1)
            except STORE_WIDE:
                raise
            except ENTRY_FAULTS as exc:
                self.fail(item, exc)
                continue
            removed.append((item, entry))
        return removed

    def _release(self, leases: list[Lease], started: float) -> None:
        if not leases:
            return
        if time.monotonic() - started < PUBLISH_LEASE_TTL / 2:
            # Nobody takes over a lease before it expires (we are alive), so they are all still
            # ours: drop them in one call instead of a read and a delete each.
            drop_leases(self.store, [lease.path for lease in leases])
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
            aborter = getattr(self.store, "abort_uploads", None)
            if aborter is None:
                return "this store has no multipart uploads"
            aborted = aborter([_Upload(item.path, item.token or "", item.last_used or 0.0)])
            return None if aborted else "completed or aborted already"
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
                    discard(self.store, [item.path])
                return why
            finally:
                got.release()
        discard(self.store, [item.path])
        return None

    def _lease(self, item: PruneItem) -> str | None:
        # The takeover protocol of neffcache.lease: whoever creates the tombstone for this
        # token owns the stale lease; a host taking it over at this instant loses to us or wins.
        tombstone = f"{item.path}.taken-{item.token}"
        if not self.store.put_file(tombstone, b"", exclusive=True):
            return "someone is taking this lease over right now"
        try:
            record = LeaseRecord.from_bytes(self.store.read_bytes(item.path))
        except EntryNotFound:
            record = None
        try:
            if record is not None and (record.token != item.token or not lease_stale(record, time.time())):
                return "renewed or taken over since the plan"
            if record is not None and lease_path(record.name) != item.path:
                return "not a lease file"
            discard(self.store, [item.path])
            return None
        finally:
            discard(self.store, [tombstone])


@dataclass(frozen=True)
class _Upload:
    path: str
    upload_id: str
    initiated: float


def describe(plan: PrunePlan) -> str:
    """The policy in the words of the prune command's flags, for the action journal."""
    p = plan.policy
    parts = [f"--keep-compiler {v}" for v in p.keep_compilers]
    if p.keep_last is not None:
        parts.append(f"--keep-last {p.keep_last}")
    if p.older_than is not None:
        parts.append(f"--older-than {ago(p.older_than)}")
    parts.extend(f"--max-size {store}={limit}" for store, limit in p.max_size.items())
    parts.extend(f"--{name.replace('_', '-')}" for name in ("failed", "stale_locks", "garbage") if getattr(p, name))
    return " ".join(parts)


def refusal(plan: PrunePlan) -> RefusedPlan:
    why = "; ".join(g.message for g in plan.guards)
    return RefusedPlan(f"the plan {why}: this looks like a mistake. Nothing was changed; check the plan "
                       "and add --force to --yes to carry it out", plan.guards)


def _journal(plan: PrunePlan, run: _StoreRun, command: str | None) -> None:
    if not run.removed:
        return
    items = [ActionItem(i.path, i.reason.value, i.size, i.detail) for i in run.removed]
    details = {"plan": plan.id, "policy": plan.policy.to_json(), "skipped": len(run.skipped),
               "failed": len(run.failed), "forced": [g.rule for g in plan.guards if g.store == run.store.url]}
    record_action(run.store, "prune", describe(plan), items, details=details, command=command)


def execute(plan: PrunePlan, stores: Mapping[str, Store] | Iterable[Store], *, index: Index | None = None,
            workers: int = 4, progress: Callable[[int, int], None] | None = None, force: bool = False,
            command: str | None = None) -> PruneResult:
    """Carry out ``plan`` on ``stores`` (matched by URL). Ctrl-C stops after the chunks in hand.

    A plan that trips the guard rails (``plan.guards``) raises RefusedPlan and changes nothing
    unless ``force``. What each store's run removed is recorded in its action journal
    (:mod:`neffcache.history`; ``command`` defaults to this process's command line), also
    when interrupted.
    """
    if plan.guards and not force:
        raise refusal(plan)
    by_url = dict(stores) if isinstance(stores, Mapping) else {s.url: s for s in stores}
    missing = [url for url in plan.stores if plan.for_store(url) and url not in by_url]
    if missing:
        raise ConfigError(f"the plan is for {', '.join(missing)}, which was not given")
    started = time.monotonic()
    stop = threading.Event()
    runs: list[_StoreRun] = []
    total = len(plan.items)
    interrupted = False
    try:
        for url in plan.stores:
            items = plan.for_store(url)
            store = by_url.get(url)
            if store is None or not (items or plan.journals.get(url)):
                continue
            store.check_writable()
            try:
                usage = index_usage(index, url) if any(i.reason in (Reason.AGE, Reason.SIZE) for i in items) else {}
            except IndexServerError as exc:
                log.warning("index unreachable (%s): re-checking last use by stamps only", exc)
                usage = {}
            run = _StoreRun(plan, store, index, usage, stop)
            runs.append(run)
            with held(store, PRUNE_LEASE, ttl=120.0):
                try:
                    _run_store(run, items, workers, progress, lambda: sum(r.done for r in runs), total)
                finally:
                    _journal(plan, run, command)
                discard(store, list(plan.journals.get(url, ())))
    except KeyboardInterrupt:
        stop.set()
        interrupted = True
        raise
    finally:
        if index is not None and index.enabled:
            index.flush()
        if interrupted:
            log.warning("prune interrupted: rerun it to finish (the journal lists what was in progress)")
    removed = tuple(i for r in runs for i in r.removed)
    skipped = tuple(s for r in runs for s in r.skipped)
    failed = tuple(s for r in runs for s in r.failed)
    return PruneResult(plan.id, removed, skipped, time.monotonic() - started, failed)


def _group_tasks(entries: list[PruneItem]) -> list[list[tuple[list[PruneItem], tuple[str, ...]]]]:
    """Tasks (chunks run one after another) such that no two tasks share a prune group, so the
    workers never wait for each other's group leases: a group of more than a chunk is a task of
    its own, in chunks; smaller groups are packed together into chunks of several groups."""
    groups: dict[str, list[PruneItem]] = {}
    for item in entries:
        groups.setdefault(prune_group_lease(item.path), []).append(item)
    tasks: list[list[tuple[list[PruneItem], tuple[str, ...]]]] = []
    packed: list[PruneItem] = []
    names: list[str] = []
    for name, members in groups.items():
        if len(members) > CHUNK:
            tasks.append([(members[i:i + CHUNK], (name,)) for i in range(0, len(members), CHUNK)])
            continue
        if len(packed) + len(members) > CHUNK:
            tasks.append([(packed, tuple(names))])
            packed, names = [], []
        packed.extend(members)
        names.append(name)
    if packed:
        tasks.append([(packed, tuple(names))])
    return tasks


def _run_store(run: _StoreRun, items: list[PruneItem], workers: int,
               progress: Callable[[int, int], None] | None, done: Callable[[], int], total: int) -> None:
    entries = [i for i in items if i.kind is ItemKind.ENTRY]
    # A task: chunks run one after another, each under its own journal (and group lease).
    tasks: list[list[tuple[list[PruneItem], tuple[str, ...]]]]
    if prune_uses_group_leases(run.store):
        tasks = _group_tasks(entries)
    else:
        tasks = [[(entries[i:i + CHUNK], ())] for i in range(0, len(entries), CHUNK)]
    numbers = iter(range(sum(len(t) for t in tasks)))
    numbers_lock = threading.Lock()

    def one(task: list[tuple[list[PruneItem], tuple[str, ...]]]) -> None:
        for chunk, groups in task:
            if run.stop.is_set():
                return
            with numbers_lock:
                number = next(numbers)
            run.entries(chunk, number, groups)
            if progress is not None:
                progress(done(), total)

    with ThreadPoolExecutor(max(1, workers)) as pool:
        try:
            for _ in pool.map(one, tasks):
                pass
        except BaseException:
            run.stop.set()  # let the chunks in hand finish; start no more
            raise
    # Chunks running side by side each saw the others' entries in a shared directory: now that
    # all are done, remove what they left empty (namespace and shard directories).
    remove_empty_dirs(run.store, {i.path.rpartition("/")[0] for i in run.removed if i.kind is ItemKind.ENTRY})
    # Loose items after the entries: an orphan stamp or lease may belong to an entry above.
    for item in items:
        if item.kind is not ItemKind.ENTRY and not run.stop.is_set():
            run.loose(item)
    if progress is not None:
        progress(done(), total)
