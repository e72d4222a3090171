"""Copying entries between stores: ``push`` and ``pull`` (one function, roles swapped).

What it promises:

- *only what DST lacks*: both sides are listed once (one scan each, in parallel) and diffed
  by entry path (any path the entry may lie at: vLLM's two forms are one entry); no per-entry
  HEAD on the destination. What is copied lands where the layout's writers put it (vLLM: flat);
- *verified*: every SUCCESS entry goes through :func:`neffcache.operations.ingest.transfer`, which checks
  the source files against the source manifest (or computes one for entries the runtimes
  wrote) before publishing; a digest mismatch is a failed entry and nothing lands;
- *idempotent*: publishing is atomic and first-writer-wins, so a sync killed at any point
  leaves only invisible garbage, and a rerun copies exactly what is still missing. Concurrent
  syncs of the same entries publish each entry once: the loser of a publish lease waits for
  the winner's commit and reports the entry as skipped;
- *bounded*: ``parallel`` entries in flight (big files are additionally split into parts by
  the S3 store's own pool).

A store that becomes unreachable, refuses access or runs out of space mid-way aborts the sync
with that error (every further entry would fail the same way); what was copied stays copied.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from neffcache.coordination.releases import BatchedReleases
from neffcache.coordination.write_leases import exclusive_write
from neffcache.entry import Entry, EntryState
from neffcache.errors import (
    AccessDenied,
    ConfigError,
    CorruptEntry,
    EntryNotFound,
    InvalidKey,
    NoSpace,
    PlaceholderNeff,
    ReadOnlyStore,
    SourceChanged,
    StoreError,
    StoreUnavailable,
    UntrustedEntry,
)
from neffcache.keys import is_canonical_relpath
from neffcache.layouts import entry_forms, get_layout
from neffcache.layouts.records import Located
from neffcache.manifest import Manifest, read_manifest
from neffcache.operations import claims, publisher
from neffcache.operations.ingest import fetch_file, transfer
from neffcache.outcomes import PublishStatus, TransferOutcome
from neffcache.replication.sync_report import (
    COPYABLE_STATES,
    EntryFilter,
    EntryOutcome,
    SyncProgress,
    SyncReport,
    Tally,
)
from neffcache.scan.report import load_entry, scan
from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.toolchain import Toolchain
from neffcache.trust import TrustPolicy

# The report's names are imported from here too (the CLI, tiers, the tests).
__all__ = ["COPYABLE_STATES", "FATAL", "EntryFilter", "EntryOutcome", "OnCopied", "SyncProgress", "SyncReport",
           "pull", "push", "sync"]

log = logging.getLogger(__name__)
OnCopied = Callable[[Entry, Manifest | None], None]
FATAL = (StoreUnavailable, AccessDenied, ReadOnlyStore, NoSpace)
_FEW_PATHS = 256  # explicit entry lists up to this size are looked up, not listed


def _list(store: Store, flt: EntryFilter, *, every_form: bool = False) -> tuple[list[Entry], list[str]]:
    """The committed entries of ``store`` the filter could select (listing only), and the
    paths of the foreign files the listing found beside them (none for explicit paths).
    ``every_form``: explicit paths are looked up at every path their entry may lie at
    (:func:`~neffcache.layouts.entry_forms`; the destination's side)."""
    if flt.paths is not None and len(flt.paths) <= _FEW_PATHS:
        paths = sorted({form for p in flt.paths for form in entry_forms(p)} if every_form else flt.paths)
        with ThreadPoolExecutor(8) as pool:
            found = list(pool.map(lambda p: load_entry(store, p, read_manifest=False), paths))
        return [e for e in found if e is not None and e.committed], []
    prefixes = [n.strip("/") for n in flt.namespaces] or [""]
    entries: list[Entry] = []
    foreign: list[str] = []
    for prefix in prefixes:
        report = scan(store, prefix=prefix)
        entries.extend(report.entries)
        foreign.extend(f.path for f in report.foreign)
    return entries, foreign


def _without_foreign(entry: Entry) -> tuple[Entry, list[str]]:
    """The entry without the files whose names no store path may have, and those files' paths.

    A local listing yields whatever names a directory holds; such a file is no runtime file
    (the layouts name theirs within the allowed characters), so it is foreign: reported and
    left alone, while the entry itself is copied like any other.
    """
    bad = [name for name in entry.files if not is_canonical_relpath(name)]
    if not bad:
        return entry, []
    kept = {n: f for n, f in entry.files.items() if n not in bad}
    return dataclasses.replace(entry, files=kept), [entry.store_path(n) for n in sorted(bad)]


def _skip_reason(src: Entry, there: Entry | None) -> str | None:
    """Why ``src`` need not (or cannot) be copied over what DST holds, or None to copy."""
    if there is None:
        return None
    if src.state is EntryState.SUCCESS:
        if there.state is EntryState.SUCCESS:
            return "exists"
        if there.state is EntryState.CORRUPT:
            return "corrupt at the destination (neffcache verify --fix, then rerun)"
        if there.state is EntryState.LOCKED:
            return "locked at the destination (a runtime compiles it, or a stale lock: prune --stale-locks)"
        return None  # FAILED or EMPTY there: a NEFF is an improvement
    if src.state is EntryState.FAILED:
        return None if there.state is EntryState.EMPTY else "exists"
    return "exists"


def _with_manifest(src: Store, entry: Entry) -> Entry:
    if not entry.has_manifest:
        return entry
    listed = entry.files.get(entry.manifest_name)
    manifest = read_manifest(src, entry.store_path(entry.manifest_name), where=f"{src.url}/{entry.path}",
                             size=listed.size if listed is not None else None)
    located = Located(entry.namespace, entry.key, entry.path, entry.base, "")
    problems = get_layout(entry.layout).manifest_problems(entry.files, manifest, located)
    if problems:
        raise CorruptEntry(entry.path, problems)
    return dataclasses.replace(entry, manifest=manifest)


def _copy_raw(src: Store, entry: Entry, dst: Store, releases: BatchedReleases | None) -> int | None:
    """FAILED and EMPTY entries have no manifest or marker: copy the files, state file last,
    under the entry's publish lease like any write (None: a publisher or a prune has it)."""
    names = get_layout(entry.layout).raw_copy_order(entry)
    size = 0
    with exclusive_write(dst, entry.path, releases) as lease, dst.staging_dir() as staging:
        if lease is None:
            return None
        for i, name in enumerate(names):
            local = src.local_path(entry.store_path(name))
            if local is None:
                local = staging / f"{i}.part"
                fetch_file(src, entry.store_path(name), local, dst)
            dst.put_file(entry.store_path(name), local)
            size += local.stat().st_size
    return size


def _copy_one(src: Store, dst: Store, entry: Entry, flt: EntryFilter, on_copied: OnCopied | None = None,
              releases: BatchedReleases | None = None) -> tuple[TransferOutcome, EntryOutcome | None]:
    """What became of one entry (never CANCELLED), with its outcome (None when FILTERED)."""
    try:
        if entry.state is not EntryState.SUCCESS:
            copied = _copy_raw(src, entry, dst, releases)
            if copied is None:
                return TransferOutcome.BUSY, EntryOutcome(entry.path, "busy")
            return TransferOutcome.COPIED, EntryOutcome(entry.path, entry.state.value, copied)
        full = _with_manifest(src, entry)
        if not flt.matches_tags(full.manifest):
            return TransferOutcome.FILTERED, None
        refusal = claims.distrust(flt.policy, src.url, full) if flt.policy is not None else None
        if full.manifest is None and flt.lost is not None and (why := flt.lost(src, full)) is not None:
            return TransferOutcome.FAILED, EntryOutcome(entry.path, f"{why}; not pushed (--adopt vouches for it)")
        if refusal is not None:
            return TransferOutcome.FAILED, EntryOutcome(entry.path, f"refused: {refusal}")
        if flt.promote and full.manifest is not None:
            full = dataclasses.replace(full, manifest=publisher.promoted(full.manifest, src.url))
        # Only entries the destination's listing lacked get here: skip the redundant lookups.
        result = transfer(src, full, dst, known_absent=True, releases=releases,
                          vet=claims.contradiction if flt.policy is not None else None)
    except UntrustedEntry as exc:  # its flags contradict its namespace: judged on the verified copies
        return TransferOutcome.FAILED, EntryOutcome(entry.path, f"refused: {'; '.join(exc.problems)}")
    except PlaceholderNeff as exc:  # refused by publish: a placeholder is no NEFF, wherever it lies
        return TransferOutcome.FAILED, EntryOutcome(entry.path, "; ".join(exc.problems))
    except CorruptEntry as exc:
        return TransferOutcome.FAILED, EntryOutcome(entry.path, f"corrupt at the source: {'; '.join(exc.problems)}")
    except SourceChanged as exc:
        return TransferOutcome.FAILED, EntryOutcome(entry.path, f"{exc}; nothing was committed (rerun to copy it)")
    except EntryNotFound as exc:
        return TransferOutcome.FAILED, EntryOutcome(entry.path, f"vanished from the source while copying ({exc})")
    except FATAL:
        raise
    except (StoreError, OSError) as exc:
        return TransferOutcome.FAILED, EntryOutcome(entry.path, f"{type(exc).__name__}: {exc}")
    if result.status is PublishStatus.PUBLISHED:
        if on_copied is not None:
            on_copied(full, result.manifest)
        return TransferOutcome.COPIED, EntryOutcome(entry.path, "", result.bytes or entry.size)
    if result.status is PublishStatus.EXISTS:
        return TransferOutcome.SKIPPED, EntryOutcome(entry.path, "exists")
    return TransferOutcome.BUSY, EntryOutcome(entry.path, "busy")


def _run(src: Store, dst: Store, todo: list[Entry], flt: EntryFilter, tally: Tally, parallel: int,
         busy_wait: float, on_copied: OnCopied | None, releases: BatchedReleases | None) -> None:
    busy: list[Entry] = []
    stop = threading.Event()

    def one(entry: Entry) -> tuple[Entry, TransferOutcome, EntryOutcome | None]:
        if stop.is_set():
            return entry, TransferOutcome.CANCELLED, None
        try:
            kind, outcome = _copy_one(src, dst, entry, flt, on_copied, releases)
        except FATAL:
            raise
        except InvalidKey as exc:
            # A file of the entry named outside what a store may hold ("notes (1).txt", a
            # control character): that entry cannot be copied faithfully, the rest can.
            return entry, TransferOutcome.FAILED, EntryOutcome(entry.path, f"bad file name: {exc}")
        except Exception as exc:  # faults are per entry: report it, go on with the rest
            log.debug("%s failed", entry.path, exc_info=True)
            return entry, TransferOutcome.FAILED, EntryOutcome(entry.path, f"{type(exc).__name__}: {exc}")
        return entry, kind, outcome

    def drain(entries: Iterable[Entry]) -> None:
        with ThreadPoolExecutor(max(1, parallel), thread_name_prefix="neffcache-sync") as pool:
            pending: set[Future[tuple[Entry, TransferOutcome, EntryOutcome | None]]] = {
                pool.submit(one, e) for e in entries}
            try:
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        entry, kind, outcome = future.result()
                        if kind is TransferOutcome.BUSY:
                            busy.append(entry)
                        elif kind is not TransferOutcome.CANCELLED:
                            tally.add(kind, outcome)
            except BaseException:
                # Ctrl-C or a fatal store error: start nothing new; running copies finish whole.
                stop.set()
                for future in pending:
                    future.cancel()
                raise

    drain(todo)
    # Entries another publisher held: wait for its commit (then they are "exists").
    deadline = time.monotonic() + busy_wait
    delay = 0.2
    while busy:
        retry, busy = busy, []
        if time.monotonic() >= deadline:
            for entry in retry:
                tally.add(TransferOutcome.FAILED,
                          EntryOutcome(entry.path, "busy: another publisher holds its lease; rerun later"))
            return
        time.sleep(delay)
        delay = min(delay * 2, 5.0)
        drain(retry)


def sync(src: Store | str, dst: Store | str, *, namespaces: Collection[str] = (),
         compiler_versions: Collection[str] = (), targets: Collection[str] = (),
         states: Collection[EntryState | str] = (EntryState.SUCCESS,), tags: Mapping[str, str] | None = None,
         paths: Collection[str] | None = None, parallel: int = 16, progress: SyncProgress | None = None,
         busy_wait: float = 60.0, store_options: Mapping[str, Any] | None = None,
         on_copied: OnCopied | None = None, adopt_into: Toolchain | None = None,
         policy: TrustPolicy | None = None, lost: Callable[[Store, Entry], str | None] | None = None,
         promote: bool = False) -> SyncReport:
    """Copy the entries of ``src`` that ``dst`` lacks (see the module docstring).

    ``adopt_into``: entries of unknown toolchain at a runtime's own root (:func:`adopted`) are
    published into that toolchain's namespace, the caller vouching for what built them.

    ``on_copied(entry, manifest)`` is called, from a worker thread, for every SUCCESS entry
    published to ``dst`` (with the manifest it was published with), e.g. to register it with
    the index server. ``policy``: copy only entries the reader's trust policy admits and whose
    own inputs agree with their namespace (pull); ``lost``: why an entry without a manifest must
    not get one minted (push without --adopt). Such entries fail, named. ``promote``: each copied
    manifest is signed again by this process's publisher (``neffcache promote``; with ``policy``).
    """
    started = time.monotonic()
    flt = EntryFilter(tuple(namespaces), tuple(compiler_versions), tuple(targets),
                      frozenset(EntryState(s) for s in states), dict(tags or {}),
                      frozenset(paths) if paths is not None else None, policy, lost, promote)
    opened: list[Store] = []
    try:
        src, dst = _open_pair(src, dst, dict(store_options or {}), opened)
        with ThreadPoolExecutor(2) as listing:
            src_future = listing.submit(_list, src, flt)
            dst_future = listing.submit(_list, dst, flt, every_form=True)
            (src_entries, foreign), (dst_entries, _) = src_future.result(), dst_future.result()
        if adopt_into is not None:
            src_entries = [adopted(e, adopt_into) for e in src_entries]
        tally = _plan(src_entries, _by_every_form(dst_entries), flt, foreign, progress)
        if progress is not None:
            progress(0, tally.total, 0)
        # Where each release is a request, the publish leases of done entries are released in
        # batches: a request an entry saved (neffcache/coordination/releases.py says why that is safe).
        releases = BatchedReleases(dst) if dst.batches_lease_releases else None
        try:
            _run(src, dst, tally.todo, flt, tally, parallel, busy_wait, on_copied, releases)
        finally:
            if releases is not None:
                releases.close()
        return tally.report(src.url, dst.url, time.monotonic() - started, foreign, dst.created)
    finally:
        for store in opened:
            store.close()


def _open_pair(src: Store | str, dst: Store | str, options: dict[str, Any],
               opened: list[Store]) -> tuple[Store, Store]:
    """Open the stores given by URL (into ``opened``, for the caller to close), and refuse a
    pair that cannot be synced: the same store twice, a read-only destination."""
    if isinstance(src, str):
        src = open_store(src, read_only=True, create=False, **options)
        opened.append(src)
    if isinstance(dst, str):
        dst = open_store(dst, **options)
        opened.append(dst)
    if src.url == dst.url:
        raise ConfigError(f"source and destination are the same store ({src.url})")
    dst.check_writable()
    return src, dst


def adopted(entry: Entry, toolchain: Toolchain) -> Entry:
    """``entry`` as it is published into ``toolchain``'s namespace, when it lies at a runtime's
    own root (namespace ``""``, toolchain unknown: vLLM's ``neuron/compile_cache/<hash>/``, a
    model's ``neuron-compiled-artifacts/<hash>/``, a ``NEURON_COMPILED_ARTIFACTS`` directory)
    in a layout whose entries are directories; any other entry as it is. Its files are read
    where they lie (``base`` is kept): only the destination's path and namespace change, and
    a computed manifest records that toolchain. A key the path does not name (a root) is read
    from the content when copied (:meth:`Layout.key_from_content`)."""
    layout = get_layout(entry.layout)
    if entry.namespace.path or entry.namespace.toolchain is not None or not layout.entry_is_dir:
        return entry
    namespace = layout.namespace_for(toolchain)
    path = layout.plan_entry(namespace, entry.key).path if entry.key else entry.path
    return dataclasses.replace(entry, namespace=namespace, path=path)


def _by_every_form(entries: list[Entry]) -> dict[str, Entry]:
    """The destination's entries by path and, for layouts whose entries have several forms
    (vLLM's flat shared tier and its local tier), by each other path the entry may lie at: a
    source entry in one form is found present when the destination holds the other. A SUCCESS
    entry wins a path over one in another state."""
    there = {e.path: e for e in entries}
    for entry in entries:
        layout = get_layout(entry.layout)
        if not layout.has_other_forms:
            continue
        for form in layout.entry_paths(entry.namespace, entry.key):
            held = there.get(form)
            if held is None or (held.state is not EntryState.SUCCESS and entry.state is EntryState.SUCCESS):
                there[form] = entry
    return there


def _plan(src_entries: list[Entry], there: dict[str, Entry], flt: EntryFilter, foreign: list[str],
          progress: SyncProgress | None) -> Tally:
    """Decide, per source entry: filtered out, skipped (DST has it, or it cannot be copied), or
    to copy. Foreign files found in the entries to copy are added to ``foreign``."""
    todo: list[Entry] = []
    pre_skipped: list[EntryOutcome] = []
    filtered = 0
    for entry in src_entries:
        if not flt.matches(entry):
            filtered += 1
            continue
        reason = _skip_reason(entry, there.get(entry.path))
        if reason is None:
            clean, bad = _without_foreign(entry)
            foreign.extend(bad)  # a load_entry listing keeps them in the entry
            todo.append(clean)
        else:
            pre_skipped.append(EntryOutcome(entry.path, reason))
    # Big entries first: they dominate the wall time, small ones fill the gaps at the end.
    todo.sort(key=lambda e: e.size, reverse=True)
    tally = Tally(len(todo), progress, todo)
    tally.skipped.extend(pre_skipped)
    tally.filtered = filtered
    return tally


def push(local: Store | str, remote: Store | str, **options: Any) -> SyncReport:
    """Share what this host compiled: ``local``'s entries that ``remote`` (a shared mount, a
    bucket) lacks are published to it. :func:`sync` with the local store as the source; the
    options are :func:`sync`'s."""
    return sync(local, remote, **options)


def pull(remote: Store | str, local: Store | str, **options: Any) -> SyncReport:
    """Fill this host's cache before a job: ``remote``'s entries that ``local`` lacks are
    published to it. :func:`sync` with the remote store as the source; the options are
    :func:`sync`'s."""
    return sync(remote, local, **options)
