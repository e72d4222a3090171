"""Executing a prune plan: :func:`execute_plan`, one :class:`~neffcache.prune.run.StoreRun` per store.

Per store, under the store-wide ``prune`` lease (two executions never interleave), entries go
in chunks. For each entry of a chunk: exclude publishers (so none writes into it while it is
half-removed: a publisher that finds the marker gone asks for its lease first), list its files
again and compare them with what the plan saw (anything republished, written to or locked since
is skipped), and re-read its last-use stamp for age and size reasons. Publishers are excluded
by each entry's publish lease, or — on a store only this host writes (``Store.single_writer``)
— by the lease of the chunk's prune group
(:func:`neffcache.coordination.write_leases.prune_group_lease`, which publishers check after
taking their own), taken once per chunk, and each entry's publish lease only looked for: a live
one skips the entry, a stale one is taken over (neffcache/coordination/lease.py's takeover). On
a full disk the room those leases and journals need comes from the space reserve a previous
prune left (neffcache/prune/reserve.py). Then the chunk's journal is written
(``.neffcache/prune/<plan>-<n>.json``: the files about to go), and the files are removed in
phases across the chunk — see :func:`delete_order` — so at every instant each entry reads
either as it was or as absent (uncommitted), never as a different entry. On a local store the
chunk's re-listings and removals go through directory descriptors opened once for the chunk,
after its leases are held (the store's ``removal()``): each entry directory is
opened once, listed by its descriptor, and its files unlinked and itself removed relative to
the descriptors, as ``rm -rf`` does, instead of a walk from the root per phase; lease files are
still looked up afresh. A prune killed at any point leaves at most journaled, uncommitted
remains, which the next plan lists as ``interrupted`` and its execution finishes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from neffcache.coordination.evictions import Tombstone, write_tombstones
from neffcache.coordination.history import ActionItem
from neffcache.coordination.history import record as record_action
from neffcache.coordination.lease import acquire
from neffcache.coordination.write_leases import prune_group_lease
from neffcache.errors import ConfigError, IndexServerError, NoSpace
from neffcache.prune.candidates import index_usage
from neffcache.prune.guard import refusal
from neffcache.prune.model import ItemKind, PruneItem, PrunePlan, PruneResult, Reason, ago
from neffcache.prune.reserve import SpaceReserve, no_reserve_hint
from neffcache.prune.run import ENTRY_FAULTS, STORE_WIDE, StoreRun
from neffcache.stores.base import Store

if TYPE_CHECKING:
    from neffcache.index import Index

log = logging.getLogger(__name__)
PRUNE_LEASE = "prune"
CHUNK = 256


def describe(plan: PrunePlan) -> str:
    """The policy in the words of the prune command's flags, for the action journal."""
    p = plan.policy
    parts = [f"--keep-compiler {v}" for v in p.keep_compilers]
    if p.keep_last is not None:
        parts.append(f"--keep-last {p.keep_last}")
    if p.older_than is not None:
        parts.append(f"--older-than {ago(p.older_than)}")
    parts.extend(f"--max-size {store}={limit}" for store, limit in p.max_size.items())
    if p.max_size:
        parts.append(f"--policy {p.retention}")
        if p.pins:
            parts.append(f"--pin-from-report ({len(p.pins)} graphs) --pin-max-share {p.pin_max_share:g}")
    parts.extend(f"--{name.replace('_', '-')}" for name in ("failed", "stale_locks", "garbage") if getattr(p, name))
    return " ".join(parts)


def _journal(plan: PrunePlan, run: StoreRun, command: str | None) -> None:
    if not run.removed:
        return
    items = [ActionItem(i.path, i.reason.value, i.size, i.detail) for i in run.removed]
    details = {"plan": plan.id, "policy": plan.policy.to_json(), "skipped": len(run.skipped),
               "failed": len(run.failed), "forced": [g.rule for g in plan.guards if g.store == run.store.url]}
    record_action(run.store, "prune", describe(plan), items, details=details, command=command)


def _tombstones(plan: PrunePlan, run: StoreRun) -> None:
    """Leave a tombstone per entry removed for a budget: a later miss on it is a regretted
    eviction (``prune --regret``)."""
    now = time.time()
    evicted = [Tombstone(run.store.url, i.path, i.size, i.cost.costed_seconds, now, i.cost.policy.value)
               for i in run.removed if i.reason is Reason.SIZE and i.kind is ItemKind.ENTRY and i.cost is not None]
    write_tombstones(run.store, plan.id, evicted, now=now)


# Chunks in flight on a store whose calls wait on a disk or a server: while one thread waits in
# an unlink (ext4's journal, an FSx round trip) the others run (docs/lifecycle.md, "what worker
# threads cost": 1.4x faster on ext4 with four).
DEFAULT_WORKERS = 4


def workers_for(store: Store, requested: int | None) -> int:
    """How many chunks of ``store`` run at once: ``requested`` when given, else one where the
    store's calls do not wait (:attr:`Store.calls_wait`: a memory filesystem, where threads only
    contend for the GIL: twice the CPU and 1.8x the time of one thread, measured), else
    :data:`DEFAULT_WORKERS`. The thread count changes only how fast: every chunk holds its own
    leases and journal either way."""
    if requested is not None:
        return max(1, requested)
    return DEFAULT_WORKERS if store.calls_wait else 1


def execute_plan(plan: PrunePlan, stores: Mapping[str, Store] | Iterable[Store], *, index: Index | None = None,
            workers: int | None = None, progress: Callable[[int, int], None] | None = None, force: bool = False,
            command: str | None = None) -> PruneResult:
    """Carry out ``plan`` on ``stores`` (matched by URL). Ctrl-C stops after the chunks in hand.

    A plan that trips the guard rails (``plan.guards``) raises RefusedPlan and changes nothing
    unless ``force``. ``workers``: chunks in flight per store (None: :func:`workers_for`
    decides by the store's filesystem). What each store's run removed is recorded in its action journal
    (:mod:`neffcache.coordination.history`; ``command`` defaults to this process's command line), also
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
    runs: list[StoreRun] = []
    total = len(plan.items)
    interrupted = False
    try:
        for url in plan.stores:
            items = plan.for_store(url)
            store = by_url.get(url)
            if store is None or not (items or plan.journals.get(url)):
                _leave_reserve(store)
                continue
            store.check_writable()
            try:
                usage = index_usage(index, url) if any(i.reason in (Reason.AGE, Reason.SIZE) for i in items) else {}
            except IndexServerError as exc:
                log.warning("index unreachable (%s): re-checking last use by stamps only", exc)
                usage = {}
            run = StoreRun(plan, store, index, usage, stop)
            runs.append(run)
            with _store_lease(run, items) as ours:
                if not ours:
                    continue
                try:
                    threads = workers_for(store, workers)
                    _run_store(run, items, threads, progress, lambda: sum(r.done for r in runs), total)
                finally:
                    _journal(plan, run, command)
                    _tombstones(plan, run)
                store.discard(list(plan.journals.get(url, ())), prune_dirs=True)
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


def _leave_reserve(store: Store | None) -> None:
    """A store with nothing to remove: still leave the next prune its room (reserve.py)."""
    if store is not None:
        SpaceReserve(store).restore()


@contextlib.contextmanager
def _store_lease(run: StoreRun, items: Sequence[PruneItem]) -> Iterator[bool]:
    """The store-wide prune lease, held (True). On a full disk (or with no room to write it) the
    space reserve is released and the write tried once more (nothing was removed yet: the lease
    comes first); no reserve either is NoSpace for the store, with what to free. The reserve is
    left again once the store's work is done. When the lease directory is a symlink or
    unreadable, every item is failed with why (False): every lease would fail the same way, so
    nothing is removed and the other stores go on."""
    reserve = SpaceReserve(run.store)
    reserve.release_if_low()  # a full disk: its leases and journal need room (reserve.py)
    try:
        try:
            lease = acquire(run.store, PRUNE_LEASE, ttl=120.0)
        except NoSpace as exc:
            if not reserve.release():
                raise NoSpace(run.store.url, path=exc.path,
                              reason=f"{no_reserve_hint()}; nothing was removed") from exc
            lease = acquire(run.store, PRUNE_LEASE, ttl=120.0)
    except (*STORE_WIDE, NoSpace):
        raise
    except ENTRY_FAULTS as exc:
        for item in items:
            run.fail(item, exc)
        yield False
        return
    lease.keep_alive()
    try:
        yield True
    finally:
        lease.release()
    reserve.restore()


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


def _emptied_dirs(removed: Iterable[PruneItem]) -> set[str]:
    """The directories the removed entries' files were in (an entry directory itself left out:
    its last phase removed it) and all their ancestors, deepest tried first by
    ``remove_empty_dirs``. A layout-B entry's files lie in two shard trees (``neff/ab/cd/``,
    ``hlo/ab/cd/``) whose directories, removed or not by the chunks, all need a last look."""
    dirs: set[str] = set()
    for item in removed:
        if item.kind is not ItemKind.ENTRY:
            continue
        heads = {f.path.rpartition("/")[0] for f in item.files} or {item.path.rpartition("/")[0]}
        for head in heads:
            rel = head if head != item.path else head.rpartition("/")[0]
            while rel and rel not in dirs:
                dirs.add(rel)
                rel = rel.rpartition("/")[0]
    return dirs


def _run_store(run: StoreRun, items: list[PruneItem], workers: int,
               progress: Callable[[int, int], None] | None, done: Callable[[], int], total: int) -> None:
    entries = [i for i in items if i.kind is ItemKind.ENTRY]
    # A task: chunks run one after another, each under its own journal (and group lease).
    tasks: list[list[tuple[list[PruneItem], tuple[str, ...]]]]
    if run.store.single_writer:
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
    run.store.remove_empty_dirs(_emptied_dirs(run.removed), control=True)
    # Loose items after the entries: an orphan stamp or lease may belong to an entry above.
    for item in items:
        if item.kind is not ItemKind.ENTRY and not run.stop.is_set():
            run.loose(item)
    if progress is not None:
        progress(done(), total)
